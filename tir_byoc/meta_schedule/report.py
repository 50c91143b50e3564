"""Which variant won, per function: the report a tuning run writes into its ``work_dir``.

Entry points: :class:`TuningReport` (made of one :class:`FunctionReport` per function; ``tune.py``
saves it as :data:`REPORT_FILE`) and :func:`load_report`, which reads it back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: File in ``work_dir`` where the helpers write their :class:`TuningReport`.
REPORT_FILE = "tir_byoc_report.json"


def duration(ms: float) -> str:
    """A latency in ms for the report: ``0.0133 ms``, or ``3.20 us`` below 0.01 ms (a small
    function's time would read ``0.0000 ms``)."""
    return f"{ms * 1e3:.2f} us" if ms < 0.01 else f"{ms:.4f} ms"


@dataclass(frozen=True)
class FunctionReport:
    """How one function of the tuned module was decided.

    Attributes
    ----------
    name : str
        The function's name in the module.
    choice : str
        ``"offload"`` (chains call intrinsics), ``"native"`` (the tuned schedule was faster),
        ``"mixed"`` (several chains, decided differently), ``"none"`` (no chain to offload),
        ``"offload-untuned"`` (the whole function is offloaded; not tuned), ``"default"`` (no
        chain; the default rule's schedule measured faster than the best record),
        ``"by-size"`` (a symbolic function that runs the static copies of ``sizes`` where its
        dims take their values; :mod:`~.sizes`) or ``"unchanged"``.
    trials : int
        Candidates measured for it (0 when it was not tuned).
    best_ms : float or None
        Latency of the chosen candidate.
    best_offload_ms, best_native_ms : float or None
        Best latency measured for each variant by the search.
    best_packed_ms : float or None
        The best offloaded candidate measured again with its constant weights packed; when
        set, it is the offloaded time the choice compared.
    default_rule : str
        The default rule of :mod:`tir_byoc.schedules` measured against the best record
        (``TuneOptions.default_rules``), or ``""``.
    best_default_ms : float or None
        That rule's schedule, measured in one batch with the best record measured again.
    sizes : tuple of str
        ``"by-size"``: the static copies it dispatches to, in the order it tests them, each
        reported under its own name (``layer_norm__batch_1_seq_128``).
    symbolic_ms : float or None
        A static copy's: the default rules' symbolic schedule at its size, measured in one
        batch with the copy's schedule measured again (:mod:`~.dispatch`).
    packed : tuple of str
        The forms of the weights packed in the final function (``"transposed"``,
        ``"library"``); empty if none was.
    intrinsics : tuple of str
        Intrinsics the final function calls.
    note : str
        Why it was not tuned, or what went wrong.
    """

    name: str
    choice: str
    trials: int = 0
    best_ms: float | None = None
    best_offload_ms: float | None = None
    best_native_ms: float | None = None
    best_packed_ms: float | None = None
    default_rule: str = ""
    best_default_ms: float | None = None
    sizes: tuple[str, ...] = ()
    symbolic_ms: float | None = None
    packed: tuple[str, ...] = ()
    intrinsics: tuple[str, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        parts = [f"{self.name}: {self.choice}"]
        if self.trials:
            parts.append(f"{self.trials} trials")
        if self.best_ms is not None:
            parts.append(f"best {duration(self.best_ms)}")
        plain = self.best_offload_ms  # the offloaded variant with its weights as given
        packed = self.best_packed_ms
        offload = packed if plain is not None and packed is not None else plain
        compared = [
            f"{label} {duration(ms_)}"
            for label, ms_ in (("offload", offload), ("native", self.best_native_ms))
            if ms_ is not None
        ]
        if len(compared) == 2:
            parts.append("measured " + " vs ".join(compared))
        if packed is not None:
            as_given = "" if plain is None else f", {duration(plain)} plain"
            parts.append(f"offload measured packed ({', '.join(self.packed)}{as_given})")
        elif self.packed:
            parts.append(f"weights packed ({', '.join(self.packed)})")
        if self.intrinsics:
            parts.append("calls " + ", ".join(self.intrinsics))
        if self.note:
            parts.append(self.note)
        return "; ".join(parts)


@dataclass(frozen=True)
class TuningReport:
    """Per function: which variant won, and the rejected candidates with their reasons."""

    functions: tuple[FunctionReport, ...]
    rejected: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, name: str) -> FunctionReport:
        for function in self.functions:
            if function.name == name:
                return function
        raise KeyError(f"no function named {name!r} in the report")

    def __str__(self) -> str:
        lines = ["tir_byoc tuning report:", *(f"  {f}" for f in self.functions)]
        for reason, count in sorted(self.rejected.items()):
            lines.append(f"  rejected {count} candidate(s): {reason}")
        return "\n".join(lines)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def load_report(work_dir: str | os.PathLike) -> TuningReport:
    """The report :func:`tune_tir` or :func:`tune_relax` wrote into ``work_dir``."""
    path = Path(work_dir) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"tir_byoc.meta_schedule: expected a report at {path}; run tune_tir or tune_relax "
            "with this work_dir first"
        )
    data = json.loads(path.read_text())
    functions = tuple(
        FunctionReport(
            **{
                **f,
                "intrinsics": tuple(f["intrinsics"]),
                "packed": tuple(f.get("packed", ())),
                "sizes": tuple(f.get("sizes", ())),
            }
        )
        for f in data["functions"]
    )
    return TuningReport(functions, data.get("rejected", {}))
