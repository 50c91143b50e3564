"""Where a built model's time goes: each PrimFunc's time, call count and share.

Entry point: :func:`time_calls`, which :func:`tir_byoc.profile` and
:meth:`tir_byoc.Model.profile` call (:mod:`tir_byoc.built_model`), and which returns a
:class:`Profile`: one :class:`FunctionTime` record per PrimFunc the entry calls, a text table
(:meth:`Profile.table`) and, when matplotlib is installed, a bar chart (:meth:`Profile.chart`).
This module does not import the model's: it reads what a built model offers (its executable,
entry, VM and the way each PrimFunc runs, :data:`OFFLOADED`, :data:`DLIGHT` or
:data:`UNSCHEDULED`).

TVM 0.27's Relax VM has no profiler; it has ``VirtualMachine.set_instrument``, a callback the VM
calls before and after each call it makes (PrimFuncs and its own builtins: allocation, shape
checks, tuples).  The profile times each call between the two callbacks with
``time.perf_counter_ns``, on a VM of its own, and runs the model ``repeat`` times on it
alternating with as many runs on a plain VM (Python's garbage collector off during both, as
``timeit`` does), so that the cost of the instrument is measured in the same conditions rather
than guessed: :attr:`Profile.overhead_us` is the difference of
the two medians per instrumented call.

The instrument costs a few microseconds per call (the Python callback, twice, with the call's
arguments wrapped), and part of that falls inside the timed intervals: the cheapest builtin
call, which does nearly nothing, measures :attr:`Profile.floor_us`, and the PrimFuncs' times
summed exceed a whole plain run by about that much per PrimFunc call (docs/model-flow.md has
the figures).  A PrimFunc measured at a few microseconds per call is therefore largely
instrument; compare :attr:`Profile.total_ms` with
:attr:`Profile.run_ms` before reading much into small rows.  Warm-up matters here: the first
runs of a process were up to 2x slower, hence ``warmup=10``.

A TIR model's profile has its one entry PrimFunc, timed with ``time_evaluator``.

Every figure is a median over ``repeat`` runs; nothing here asserts or compares timings.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import relax

#: How a PrimFunc of a built model runs (:attr:`tir_byoc.Model.schedules`): it calls an
#: intrinsic, a default rule scheduled it (dlight's or :mod:`tir_byoc.schedules`'), or it runs as
#: TVM wrote it.
OFFLOADED, DLIGHT, UNSCHEDULED = "tir_byoc", "dlight", "unscheduled"
#: How the table names each way a PrimFunc runs.
CODE_LABELS = {OFFLOADED: "tir_byoc", DLIGHT: "TVM, scheduled", UNSCHEDULED: "TVM, unscheduled"}


@dataclass(frozen=True)
class FunctionTime:
    """One PrimFunc's part of one run of the model.

    Attributes
    ----------
    name : str
    calls : int
        Calls per run.
    time_ms : float
        Median over the runs of the time spent in it per run (all its calls).
    share : float
        ``time_ms`` over the sum of every PrimFunc's ``time_ms`` (the shares sum to 1).
    schedule : str
        ``"tir_byoc"`` (it calls an intrinsic), ``"dlight"`` (a default rule of
        :mod:`tir_byoc.schedules` scheduled it) or ``"unscheduled"``.
    intrinsics : tuple of str
        The intrinsics it calls (empty unless offloaded).
    rule : str
        The default rule that scheduled it (``"Reduction"``, ``"Elementwise"``...), or ``""``.
    """

    name: str
    calls: int
    time_ms: float
    share: float
    schedule: str
    intrinsics: tuple[str, ...] = ()
    rule: str = ""

    @property
    def offloaded(self) -> bool:
        return bool(self.intrinsics)

    @property
    def per_call_us(self) -> float:
        return 1000.0 * self.time_ms / self.calls if self.calls else 0.0

    @property
    def code(self) -> str:
        """Who computes it: ``tir_byoc: <intrinsics>``, ``TVM, <rule>`` or ``TVM, unscheduled``."""
        if self.intrinsics:
            return f"tir_byoc: {', '.join(self.intrinsics)}"
        if self.rule:
            return f"TVM, {self.rule}"
        return CODE_LABELS.get(self.schedule, self.schedule)


@dataclass(frozen=True)
class Profile:
    """Per-PrimFunc times of a built model, medians of ``repeat`` runs.

    Attributes
    ----------
    functions : tuple of FunctionTime
        Every PrimFunc the entry called, the most time first.
    repeat : int
        Runs measured, with the instrument and without it each.
    run_ms : float
        Median time of one run without the instrument.
    instrumented_run_ms : float
        Median time of one run with it.
    builtin_ms : float
        Median time per run in the VM's own builtins (allocation, shape checks, tuples).
    calls_per_run : int
        Calls the instrument saw per run, PrimFuncs and builtins.
    floor_us : float or None
        Median time of the cheapest builtin call: roughly the instrument's share of every
        timed interval (None when the VM called no builtin).
    """

    functions: tuple[FunctionTime, ...]
    repeat: int
    run_ms: float
    instrumented_run_ms: float
    builtin_ms: float = 0.0
    calls_per_run: int = 0
    floor_us: float | None = None

    @property
    def total_ms(self) -> float:
        """The PrimFuncs' time per run (sum of the medians)."""
        return sum(f.time_ms for f in self.functions)

    @property
    def offloaded_share(self) -> float:
        """The share of the PrimFuncs' time spent in those that call an intrinsic."""
        return sum(f.share for f in self.functions if f.offloaded)

    @property
    def overhead_us(self) -> float | None:
        """The instrument's measured cost per call (None for a TIR model)."""
        if not self.calls_per_run:
            return None
        return 1000.0 * (self.instrumented_run_ms - self.run_ms) / self.calls_per_run

    def table(self, top: int | None = None, bar_width: int = 20) -> str:
        """The records as an aligned text table, with a bar per share and a summary line."""
        shown = self.functions[:top] if top else self.functions
        rows = [("PrimFunc", "calls", "ms/run", "us/call", "share", "code", "")]
        for f in shown:
            bar = "#" * max(1, round(f.share * bar_width)) if f.share > 0 else ""
            rows.append(
                (
                    f.name,
                    str(f.calls),
                    f"{f.time_ms:.3f}",
                    f"{f.per_call_us:.1f}",
                    f"{100 * f.share:.1f}%",
                    f.code,
                    bar,
                )
            )
        if len(shown) < len(self.functions):
            rest = self.functions[len(shown) :]
            rows.append(
                (
                    f"({len(rest)} more)",
                    str(sum(f.calls for f in rest)),
                    f"{sum(f.time_ms for f in rest):.3f}",
                    "",
                    f"{100 * sum(f.share for f in rest):.1f}%",
                    "",
                    "",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        right = {1, 2, 3, 4}
        lines = [
            "  ".join(
                cell.rjust(w) if i in right else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]
        return "\n".join([*lines, self.summary()])

    def summary(self) -> str:
        """One line: totals, the offloaded share, the uninstrumented run and the overhead."""
        text = (
            f"PrimFuncs {self.total_ms:.3f} ms per run, {100 * self.offloaded_share:.1f}% of it "
            f"offloaded; one run {self.run_ms:.3f} ms"
        )
        if self.overhead_us is not None:
            text += (
                f" ({self.instrumented_run_ms:.3f} ms instrumented: {self.calls_per_run} calls, "
                f"{self.overhead_us:.1f} us each; VM builtins {self.builtin_ms:.3f} ms"
            )
            if self.floor_us is not None:
                text += f", timer floor {self.floor_us:.1f} us per call"
            text += ")"
        return f"{text}; medians of {self.repeat} runs"

    def __str__(self) -> str:
        return self.table()

    def chart(self, path: str | os.PathLike, top: int = 15, title: str | None = None) -> Path:
        """Write a horizontal bar chart of the PrimFuncs' times as a PNG (needs matplotlib).

        Offloaded PrimFuncs, those a default rule scheduled and unscheduled ones get a colour
        each; past ``top``, the rest is one bar.

        Raises
        ------
        ImportError
            matplotlib is not installed (it is in the ``bench`` extra).
        """
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
            from matplotlib.patches import Patch
        except ImportError as error:
            raise ImportError(
                "tir_byoc.Profile.chart: expected matplotlib to be installed (pip install "
                "matplotlib, or the project's bench extra), got none"
            ) from error
        colours = {OFFLOADED: "#2a9d8f", DLIGHT: "#e9c46a", UNSCHEDULED: "#e76f51"}
        shown = list(self.functions[:top])
        names = [f.name for f in shown]
        times = [f.time_ms for f in shown]
        colour = [colours.get(f.schedule, "#999999") for f in shown]
        rest = self.functions[top:]
        if rest:
            names.append(f"({len(rest)} more)")
            times.append(sum(f.time_ms for f in rest))
            colour.append("#999999")
        figure = Figure(figsize=(9, 0.35 * len(names) + 1.6))
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        axes.barh(range(len(names)), times, color=colour)
        axes.set_yticks(range(len(names)), names, fontsize=8)
        axes.invert_yaxis()
        axes.set_xlabel(f"ms per run (median of {self.repeat})")
        axes.set_title(title or self.summary().split(";")[0], fontsize=9)
        axes.set_xlim(left=0)
        legend = [Patch(color=c, label=CODE_LABELS[s]) for s, c in colours.items()]
        axes.legend(handles=legend, fontsize=8, loc="lower right")
        figure.tight_layout()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(target, dpi=110)
        return target


class _Recorder:
    """The instrument: per run, the time and number of calls of each function the VM calls."""

    def __init__(self):
        self.runs: list[dict[str, list[int]]] = []
        self._started = 0

    def new_run(self) -> None:
        self.runs.append({})

    def __call__(self, _func, symbol, before_run, _ret, *_args):
        now = time.perf_counter_ns()
        if before_run:
            self._started = time.perf_counter_ns()
            return 0
        entry = self.runs[-1].setdefault(str(symbol), [0, 0])
        entry[0] += now - self._started
        entry[1] += 1
        return 0


def _median_ms(samples_ns) -> float:
    return statistics.median(samples_ns) / 1e6


def _relax_profile(model, tensors, repeat: int, warmup: int) -> Profile:
    plain = model.vm()
    recorder = _Recorder()
    instrumented = relax.VirtualMachine(model.executable, tvm.cpu())
    instrumented.set_instrument(recorder)
    entry_plain, entry_instrumented = plain[model.entry], instrumented[model.entry]
    # Step 1. Warm both up (first-touch allocation, the pooled allocator, caches).
    for _ in range(warmup):
        recorder.new_run()
        entry_plain(*tensors)
        entry_instrumented(*tensors)
    recorder.runs.clear()
    # Step 2. Alternate plain and instrumented runs, so that both see the same machine; the
    # collector off, as timeit does (the callback allocates, and a full collection over the
    # objects a build leaves behind took milliseconds).
    plain_ns, instrumented_ns = [], []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter_ns()
            entry_plain(*tensors)
            plain_ns.append(time.perf_counter_ns() - start)
            recorder.new_run()
            start = time.perf_counter_ns()
            entry_instrumented(*tensors)
            instrumented_ns.append(time.perf_counter_ns() - start)
    finally:
        if collecting:
            gc.enable()
    # Step 3. Medians per function; PrimFuncs are records, builtins a total.
    primfuncs = set(model.schedules)
    names = {name for run in recorder.runs for name in run}
    median = {n: _median_ms([run.get(n, [0, 0])[0] for run in recorder.runs]) for n in names}
    calls = {n: max(run.get(n, [0, 0])[1] for run in recorder.runs) for n in names}
    total = sum(median[n] for n in names if n in primfuncs) or 1.0
    functions = sorted(
        (
            FunctionTime(
                n,
                calls[n],
                median[n],
                median[n] / total,
                model.schedules[n],
                model.intrinsics.get(n, ()),
                model.rules.get(n, ""),
            )
            for n in names
            if n in primfuncs
        ),
        key=lambda f: (-f.time_ms, f.name),
    )
    builtins = [n for n in names if n not in primfuncs]
    floor = min((1000.0 * median[n] / calls[n] for n in builtins if calls[n]), default=None)
    return Profile(
        tuple(functions),
        repeat,
        _median_ms(plain_ns),
        _median_ms(instrumented_ns),
        builtin_ms=sum(median[n] for n in builtins),
        calls_per_run=sum(calls.values()),
        floor_us=floor,
    )


def _tir_profile(model, tensors, repeat: int, warmup: int) -> Profile:
    timer = model.executable.mod.time_evaluator(model.entry, tvm.cpu(), number=1, repeat=repeat)
    for _ in range(warmup):
        model.executable[model.entry](*tensors)
    run_ms = 1000.0 * statistics.median(timer(*tensors).results)
    record = FunctionTime(
        model.entry,
        1,
        run_ms,
        1.0,
        model.schedules[model.entry],
        model.intrinsics.get(model.entry, ()),
        model.rules.get(model.entry, ""),
    )
    return Profile((record,), repeat, run_ms, run_ms)


def time_calls(model, tensors, repeat: int, warmup: int) -> Profile:
    """Time each PrimFunc one run of ``model`` calls, and count its calls.

    Parameters
    ----------
    model : tir_byoc.Model
        What :func:`tir_byoc.build_model` returned.
    tensors : list of tvm.runtime.Tensor
        The inputs, as :meth:`tir_byoc.Model.arguments` gives them.
    repeat : int
        Runs measured (each with and without the instrument); figures are their medians.
    warmup : int
        Runs before measuring, not counted.

    Returns
    -------
    Profile
    """
    if model.is_relax:
        return _relax_profile(model, tensors, repeat, warmup)
    return _tir_profile(model, tensors, repeat, warmup)


__all__ = ["DLIGHT", "OFFLOADED", "UNSCHEDULED", "FunctionTime", "Profile", "time_calls"]
