"""MetaSchedule integration: offload inside tuning, measured against the natively tuned schedule.

Entry points: :func:`tune_tir` and :func:`tune_relax` (one call: tune, then return the final
module ready for ``tvm.compile``), :func:`offload_space` (a space generator usable as ``space=``
of ``ms.tune_tir``), its parts :class:`OffloadRule` and :class:`OffloadPostproc`,
:func:`candidate_builder` (a ``LocalBuilder`` whose artifacts carry the intrinsic code) and
:func:`load_report` (which variant won, per function).

How a matched chain travels through the search:

1. :class:`OffloadRule` runs first among the schedule rules.  For the blocks of a chain that an
   intrinsic can serve it returns the offloaded variant, the native one, or both
   (``offload="always" | "never" | "choice"``).  Offloaded blocks are annotated
   ``tir_byoc.choice = "offload"`` and ``schedule_rule = "tir_byoc_offload"``, so every later
   rule leaves their loops alone (MetaSchedule skips blocks carrying ``schedule_rule``;
   ``ApplyCustomRule`` calls the registered no-op
   ``s_tir.meta_schedule.<target key>.tir_byoc_offload``), and their loops are annotated
   ``tir_byoc.keep_loop`` so that ``RewriteParallelVectorizeUnroll`` skips them; native ones
   are annotated ``tir_byoc.choice = "native"`` and tuned like any other block.  The
   annotations are traced, so every record in the tuning database says which variant it
   measured.
2. :class:`OffloadPostproc` runs among the postprocs, right before ``RewriteReductionBlock``
   (see :func:`offload_space` for why there).  It applies the matcher and
   :func:`tir_byoc.rewrite.rewrite_function` (the same core as :func:`tir_byoc.offload`) to
   every candidate and replaces the schedule's function body; a candidate whose chosen chain no
   longer matches or cannot be rewritten is rejected, with the reason logged.
3. Candidates are built by :func:`candidate_builder` into shared libraries that link the
   intrinsic objects, so ``LocalRunner`` and ``RPCRunner`` workers load them without tir_byoc.
4. :func:`tune_tir` and :func:`tune_relax` (``offload="choice"``, the default) tune each
   function with chains as two tasks, ``<name>@offload`` and ``<name>@native``, whose
   workloads differ only by the function attribute ``tir_byoc.variant``: the task scheduler
   gives both trials, so both are measured, and the faster best record is replayed (with the
   postproc applied again, :func:`apply_record`) into the final module.  With
   ``offload="always"`` a function made only of offloaded chains gets no task at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import LocalBuilder
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.postproc import PyPostproc
from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from . import toolchain
from .export import export_library
from .match import is_s_tir
from .offload import apply
from .planning import Plan, plan
from .registry import REGISTRY, Choice, Registry
from .rewrite import INTRINSIC_ATTR, RewriteError, rewrite_function

__all__ = [
    "CHOICE_ATTR",
    "MODES",
    "REPORT_FILE",
    "VARIANT_ATTR",
    "FunctionReport",
    "OffloadPostproc",
    "OffloadRule",
    "Progress",
    "TuningReport",
    "apply_record",
    "candidate_builder",
    "load_report",
    "offload_space",
    "recorded_choice",
    "tune_relax",
    "tune_tir",
]

logger = logging.getLogger("tir_byoc.meta_schedule")

#: Block annotation recording the decision for a chain: ``"offload"`` or ``"native"``.
CHOICE_ATTR = "tir_byoc.choice"
#: Loop annotation on offloaded chains; MetaSchedule's postprocs leave annotated loops alone.
KEEP_LOOP_ATTR = "tir_byoc.keep_loop"
#: Value of the ``schedule_rule`` annotation that keeps MetaSchedule's rules off a chain.
CUSTOM_RULE = "tir_byoc_offload"
#: How chains enter the design space: offloaded and native both measured, always offloaded, or
#: never (plain MetaSchedule, for comparison).
MODES = ("choice", "always", "never")
#: Function attribute telling the two workloads of a function apart in the database.
VARIANT_ATTR = "tir_byoc.variant"
#: File in ``work_dir`` where the helpers write their :class:`TuningReport`.
REPORT_FILE = "tir_byoc_report.json"

_SUPPORTED_KINDS = ("llvm",)
_FAILED_RUN = 1e9  # seconds; MetaSchedule records failed runs as 1e10


# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"tir_byoc.meta_schedule: expected offload in {MODES}, got {mode!r}")
    return mode


def _only_function(mod: tvm.IRModule) -> tuple[tvm.ir.GlobalVar, tirx.PrimFunc]:
    """The single PrimFunc a MetaSchedule schedule works on."""
    funcs = [(g, f) for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        raise ValueError(
            f"tir_byoc.meta_schedule: expected a schedule over one PrimFunc, got {len(funcs)}"
        )
    return funcs[0]


def _block_choices(func: tirx.PrimFunc) -> dict[str, str]:
    """Block name -> recorded choice, for blocks annotated by :class:`OffloadRule`."""
    choices = {}

    def on_block(block):
        if block.annotations and CHOICE_ATTR in block.annotations:
            choices[block.name_hint] = str(block.annotations[CHOICE_ATTR])

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return choices


def _leaf_blocks(func: tirx.PrimFunc) -> set[str]:
    names = set()

    def on_block(block):
        if isinstance(block.body, tirx.BufferStore):
            names.add(block.name_hint)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return names


def _target(target) -> tvm.target.Target:
    """``target`` as a Target, with ``num-cores`` (which MetaSchedule requires) filled in."""
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    if target.kind.name not in _SUPPORTED_KINDS:
        raise ValueError(
            f"tir_byoc.meta_schedule: expected a CPU target of kind {_SUPPORTED_KINDS} (the "
            f"intrinsics are host C code), got {target.kind.name!r}"
        )
    if "num-cores" not in target.attrs:
        cores = ms.utils.cpu_count(logical=False)
        target = tvm.target.Target({**target.export(), "num-cores": cores})
    return target


# --------------------------------------------------------------------------------------
# The schedule rule
# --------------------------------------------------------------------------------------


def _keep_loops(sch: s_tir.Schedule, _block: s_tir.SBlockRV) -> list[s_tir.Schedule]:
    """The custom rule behind ``schedule_rule = "tir_byoc_offload"``: leave the block alone."""
    return [sch]


def register_custom_rule(target) -> None:
    """Register the no-op custom rule for every key of ``target`` (idempotent)."""
    for key in _target(target).keys:
        tvm_ffi.register_global_func(
            f"s_tir.meta_schedule.{key}.{CUSTOM_RULE}", _keep_loops, override=True
        )


@derived_object
class OffloadRule(PyScheduleRule):
    """Schedule rule offering each matched chain offloaded and natively tuned.

    Parameters
    ----------
    offload : {"choice", "always", "never"}
        ``"choice"``: two schedules per chain, to be measured against each other;
        ``"always"``: only the offloaded one; ``"never"``: only the native one.
    backends : str or iterable of str, optional
        Backends allowed, as for :func:`tir_byoc.scan`.
    registry : Registry, optional
        Where intrinsics are looked up.
    """

    def __init__(
        self,
        offload: str = "choice",
        backends: Iterable[str] | str | None = None,
        registry: Registry = REGISTRY,
    ):
        super().__init__()
        self.offload = _check_mode(offload)
        self.backends = backends
        self.registry = registry
        self._plans: dict[tirx.PrimFunc, Plan] = {}  # the last function's plan, for its blocks

    def _initialize_with_tune_context(self, context) -> None:
        return None

    def _plan(self, func: tirx.PrimFunc) -> Plan:
        """The plan of ``func``, computed once while the rule visits the blocks of one state."""
        planned = self._plans.get(func)
        if planned is None:
            planned = plan(func, backends=self.backends, registry=self.registry)
            self._plans = {func: planned}
        return planned

    def apply(self, sch: s_tir.Schedule, block: s_tir.SBlockRV) -> list[s_tir.Schedule]:
        # Step 1. Only the first block of a chain that reaches the rule decides for the chain.
        stmt = sch.get(block)
        if stmt.annotations and CHOICE_ATTR in stmt.annotations:
            return [sch]
        gvar, func = _only_function(sch.mod)
        choices = self._plan(func).choices
        match = next((m for m in choices if stmt.name_hint in m.blocks), None)
        if match is None:
            return [sch]
        if match.intrinsic is None:
            logger.debug("%s: %s tuned natively: %s", gvar.name_hint, match.blocks, match.reason)
            return [sch]
        # Step 2. The offloaded variant: rules skip the chain, the postproc replaces it.
        variants = []
        if self.offload != "never":
            offloaded = sch.copy() if self.offload == "choice" else sch
            for name in match.blocks:
                rv = offloaded.get_sblock(name)
                offloaded.annotate(rv, CHOICE_ATTR, "offload")
                offloaded.annotate(rv, "schedule_rule", CUSTOM_RULE)
                for loop in offloaded.get_loops(rv):  # RewriteParallelVectorizeUnroll skips them
                    offloaded.annotate(loop, KEEP_LOOP_ATTR, 1)
            variants.append(offloaded)
        # Step 3. The native variant: marked, then tuned by the rules that follow.
        if self.offload != "always":
            for name in match.blocks:
                sch.annotate(sch.get_sblock(name), CHOICE_ATTR, "native")
            variants.append(sch)
        return variants

    def clone(self) -> OffloadRule:
        return OffloadRule(self.offload, self.backends, self.registry)


# --------------------------------------------------------------------------------------
# The postproc
# --------------------------------------------------------------------------------------


class _Rejections:
    """Counts rejected candidates per reason; logs each reason once at WARNING, then DEBUG."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def record(self, task: str, reason: str, *, traceback: bool = False) -> None:
        with self._lock:
            first = reason not in self.counts
            self.counts[reason] = self.counts.get(reason, 0) + 1
        level = logging.WARNING if first else logging.DEBUG
        logger.log(level, "%s: candidate rejected: %s", task, reason, exc_info=traceback and first)


class CandidateRejected(Exception):
    """Internal: why :class:`OffloadPostproc` refuses a candidate (caught and logged)."""


@derived_object
class OffloadPostproc(PyPostproc):
    """Postproc that replaces matched chains of each candidate by intrinsic calls.

    Chains that :class:`OffloadRule` marked ``offload`` must still match and be rewritten, or
    the candidate is rejected (``apply`` returns False) with the reason logged on the
    ``tir_byoc.meta_schedule`` logger; chains marked ``native`` are left to TVM.  Without
    marks (the postproc used on its own) every match with an intrinsic is offloaded, as
    :func:`tir_byoc.offload` would.

    Parameters
    ----------
    backends : str or iterable of str, optional
        Backends allowed, as for :func:`tir_byoc.scan`.
    registry : Registry, optional
        Where intrinsics are looked up.
    """

    def __init__(
        self,
        backends: Iterable[str] | str | None = None,
        registry: Registry = REGISTRY,
        _rejections: _Rejections | None = None,
    ):
        super().__init__()
        self.backends = backends
        self.registry = registry
        self.rejections = _rejections if _rejections is not None else _Rejections()
        self.task = "main"

    def _initialize_with_tune_context(self, context) -> None:
        self.task = str(context.task_name) if context.task_name else "main"

    def apply(self, sch: s_tir.Schedule) -> bool:
        try:
            func = _only_function(sch.mod)[1]
            rewritten = self._rewrite(func)
        except (CandidateRejected, RewriteError) as reason:
            self.rejections.record(self.task, str(reason))
            return False
        except Exception as error:  # MetaSchedule would drop it silently; say what it was.
            reason = f"unexpected {type(error).__name__}: {error}"
            self.rejections.record(self.task, reason, traceback=True)
            return False
        if rewritten is not func:
            root = func.body.block
            sch.state.replace(
                sch.state.get_sref(root), rewritten.body.block, {root: rewritten.body.block}
            )
        return True

    def _rewrite(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` with its chosen chains offloaded; CandidateRejected if one cannot be."""
        if not is_s_tir(func):
            return func
        # Step 1. What the rule chose, and what the matcher finds now.
        choices = _block_choices(func)
        if choices and "offload" not in choices.values():
            return func  # every chain was left to TVM: nothing to match
        found = plan(func, backends=self.backends, registry=self.registry)
        chosen = {b for b, choice in choices.items() if choice == "offload"}
        # Step 2. Each match is offloaded if chosen (or, unmarked, if it has an intrinsic).
        planned = []
        for match in found.choices:
            marks = {choices.get(b) for b in match.blocks} - {None}
            if "native" in marks and "offload" not in marks:
                continue
            if match.intrinsic is None:
                if marks:
                    raise CandidateRejected(
                        f"blocks {', '.join(match.blocks)} were chosen for offload but no "
                        f"intrinsic serves them: {match.reason}"
                    )
                continue
            planned.append((match.match, self.registry[match.intrinsic]))
        # Step 3. A chosen block the matcher no longer covers: the candidate is scrambled.
        covered = {b for match, _ in planned for b in match.blocks}
        lost = sorted(chosen - covered)
        if lost:
            why = [r.reason for r in found.rejections if set(r.blocks) & set(lost)]
            detail = why[0] if why else "they no longer form a chain with the same blocks"
            raise CandidateRejected(
                f"blocks {', '.join(lost)} were chosen for offload but do not match any more: "
                f"{detail}"
            )
        return rewrite_function(func, planned)

    def clone(self) -> OffloadPostproc:
        return OffloadPostproc(self.backends, self.registry, self.rejections)


# --------------------------------------------------------------------------------------
# The space generator and the builder
# --------------------------------------------------------------------------------------


def offload_space(
    target="llvm",
    *,
    offload: str = "choice",
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
) -> ms.space_generator.PostOrderApply:
    """The target's default design space with tir_byoc's rule (first) and postproc added.

    The postproc goes right before ``RewriteReductionBlock``: records then replay without it
    (``JSONDatabase`` loading, ``ms.tir_integration.compile_tir``) to the schedule with the
    chain still in place and marked, and :class:`OffloadPostproc` applied to that schedule
    (which is what :func:`apply_record` does) gives the measured candidate.

    Parameters
    ----------
    target : str, dict or tvm.target.Target
        An llvm (CPU) target; its default rules, postprocs and mutators are used.
    offload : {"choice", "always", "never"}
        See :class:`OffloadRule`.  With ``"choice"`` both variants share one design space and
        the search may not measure both within a small budget; :func:`tune_tir` and
        :func:`tune_relax` give each variant its own task instead.
    backends, registry
        As for :func:`tir_byoc.scan`.

    Returns
    -------
    tvm.s_tir.meta_schedule.space_generator.PostOrderApply
        Pass it as ``space=`` to ``ms.tune_tir``.  Build candidates with
        :func:`candidate_builder`, and turn the best record into a module with
        :func:`apply_record` (``ms.tir_integration.compile_tir`` replays the trace but does
        not run Python postprocs).
    """
    return _space(target, offload, backends, registry, _Rejections())


def _space(target, offload, backends, registry, rejections) -> ms.space_generator.PostOrderApply:
    target = _target(target)
    register_custom_rule(target)
    kind = target.kind.name
    return ms.space_generator.PostOrderApply(
        sch_rules=[OffloadRule(offload, backends, registry), *ms.ScheduleRule.create(kind)],
        postprocs=_with_offload(
            ms.Postproc.create(kind), OffloadPostproc(backends, registry, rejections)
        ),
        mutator_probs=ms.Mutator.create(kind),
    )


def _with_offload(postprocs: list, offload_postproc: OffloadPostproc) -> list:
    """``postprocs`` with ``offload_postproc`` right before ``RewriteReductionBlock``.

    The place matters because the postproc's replacement is not a traced instruction: the
    database replays records without it.  Before it, ``RewriteParallelVectorizeUnroll``
    addresses blocks by position, so it must still see the chain (whose loops the rule
    annotated so that it leaves them alone); after it, ``RewriteReductionBlock`` would split
    the chain's init off, so it must no longer see the chain (it addresses blocks by name).
    """
    kinds = [type(p).__name__ for p in postprocs]
    at = kinds.index("RewriteReductionBlock") if "RewriteReductionBlock" in kinds else len(kinds)
    return [*postprocs[:at], offload_postproc, *postprocs[at:]]


def build_candidate(mod: tvm.IRModule, target, _params=None):
    """``f_build`` of :func:`candidate_builder`: MetaSchedule's default build, minus one import.

    The default imports ``tvm.s_tir.tensor_intrin`` in every builder process, which takes
    10-30 s on a loaded 2-core machine; candidates of :func:`offload_space` on llvm are never
    tensorized, so the registrations it makes are not needed.
    """
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.compile(mod, target=target)


def export_candidate(module) -> str:
    """``f_export`` of :func:`candidate_builder`: a shared library with the intrinsics linked.

    Runs in MetaSchedule's builder workers; the runners only load the file it returns.
    """
    path = Path(tempfile.mkdtemp(prefix="tir_byoc_candidate_")) / "candidate.so"
    return str(export_library(module, path))


def candidate_builder(**kwargs) -> LocalBuilder:
    """A ``LocalBuilder`` whose artifacts link the intrinsic code they call.

    Parameters
    ----------
    **kwargs
        Passed to ``LocalBuilder`` (``max_workers``, ``timeout_sec``, ...); ``f_build``
        defaults to :func:`build_candidate`.
    """
    if "f_export" in kwargs:
        raise TypeError("tir_byoc.meta_schedule.candidate_builder: f_export is fixed, got one")
    kwargs.setdefault("f_build", build_candidate)
    return LocalBuilder(f_export=export_candidate, **kwargs)


# --------------------------------------------------------------------------------------
# Records and progress display
# --------------------------------------------------------------------------------------


def recorded_choice(trace) -> str:
    """What a schedule's trace (e.g. a database record's) chose for its chains.

    Returns
    -------
    str
        ``"offload"`` or ``"native"``, ``"mixed"`` if chains were decided differently, or
        ``"none"`` if the trace holds no decision (no chain, or not tuned with
        :class:`OffloadRule`).
    """
    found = set()
    for inst in trace.insts:
        if inst.kind.name == "Annotate" and len(inst.attrs) and str(inst.attrs[0]) == CHOICE_ATTR:
            found.add(str(inst.inputs[1]))
    if not found:
        return "none"
    return found.pop() if len(found) == 1 else "mixed"


def _mean_seconds(run_secs) -> float:
    values = [float(s) for s in run_secs] if run_secs else []
    return sum(values) / len(values) if values else float("inf")


@derived_object
class Progress(PyMeasureCallback):
    """Measure callback printing, per task, the trials done and the best latency so far.

    Parameters
    ----------
    display : bool
        Print a line after each measured batch; False only counts (for the report).
    stream : text stream, optional
        Where lines go (default ``sys.stderr``).
    """

    def __init__(self, display: bool = True, stream: TextIO | None = None):
        super().__init__()
        self.display = display
        self.stream = stream
        self.trials: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.best: dict[str, tuple[float, str]] = {}

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        task = str(task_scheduler.tasks_[task_id].ctx.task_name)
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results):
            self.trials[task] = self.trials.get(task, 0) + 1
            seconds = _mean_seconds(ran.run_secs) if ran.error_msg is None else float("inf")
            if built.error_msg is not None or seconds >= _FAILED_RUN:
                self.failed[task] = self.failed.get(task, 0) + 1
                continue
            if seconds < self.best.get(task, (float("inf"), ""))[0]:
                self.best[task] = (seconds, recorded_choice(candidate.sch.trace))
        if self.display and len(measure_candidates):
            self._print(task)

    def _print(self, task: str) -> None:
        seconds, choice = self.best.get(task, (float("inf"), "none"))
        best = f"{seconds * 1e3:.4f} ms" if seconds != float("inf") else "none yet"
        variant = f" ({choice})" if choice != "none" else ""
        total = sum(self.trials.values())
        print(
            f"[tir_byoc] {task}: {self.trials[task]} trials ({self.failed.get(task, 0)} failed), "
            f"best {best}{variant}; {total} trials in all",
            file=self.stream or sys.stderr,
            flush=True,
        )


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------


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
        ``"offload-untuned"`` (the whole function is offloaded; not tuned) or ``"unchanged"``.
    trials : int
        Candidates measured for it (0 when it was not tuned).
    best_ms : float or None
        Latency of the chosen candidate.
    best_offload_ms, best_native_ms : float or None
        Best latency measured for each variant (what the choice compared).
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
    intrinsics: tuple[str, ...] = ()
    note: str = ""

    def __str__(self) -> str:
        parts = [f"{self.name}: {self.choice}"]
        if self.trials:
            parts.append(f"{self.trials} trials")
        if self.best_ms is not None:
            parts.append(f"best {self.best_ms:.4f} ms")
        compared = [
            f"{label} {ms_:.4f} ms"
            for label, ms_ in (("offload", self.best_offload_ms), ("native", self.best_native_ms))
            if ms_ is not None
        ]
        if len(compared) == 2:
            parts.append("measured " + " vs ".join(compared))
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
        FunctionReport(**{**f, "intrinsics": tuple(f["intrinsics"])}) for f in data["functions"]
    )
    return TuningReport(functions, data.get("rejected", {}))


# --------------------------------------------------------------------------------------
# Applying the database
# --------------------------------------------------------------------------------------


def apply_record(
    database: ms.database.Database,
    func: tirx.PrimFunc | tvm.IRModule,
    target,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
) -> tirx.PrimFunc | None:
    """The best schedule of ``func`` in ``database``, with its chosen chains offloaded.

    Parameters
    ----------
    database : tvm.s_tir.meta_schedule.database.Database
        Records of a tuning run that used :func:`offload_space`.
    func : tvm.tirx.PrimFunc or tvm.IRModule
        The workload as it was tuned (a PrimFunc is normalized the way ``ms.tune_tir`` does).
    target : str, dict or tvm.target.Target
        The target it was tuned for.
    backends, registry
        As for :func:`tir_byoc.scan`.

    Returns
    -------
    tvm.tirx.PrimFunc or None
        None when the database has no valid record for ``func``.
    """
    target = _target(target)
    workload = _normalize_mod(func)
    record = database.query_tuning_record(workload, target, "main")
    if record is None:
        return None
    # Step 1. Replay the record: the chain comes back marked and untouched, since the
    # offload itself is not a traced instruction (see offload_space).
    sch = s_tir.Schedule(workload)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    # Step 2. The postproc again, as on the measured candidate.
    postproc = OffloadPostproc(backends, registry)
    if not postproc.apply(sch):
        reasons = "; ".join(postproc.rejections.counts)
        raise RuntimeError(
            f"tir_byoc.meta_schedule: the best record of "
            f"{_only_function(workload)[0].name_hint} does not offload any more: {reasons}"
        )
    return _only_function(sch.mod)[1]


# --------------------------------------------------------------------------------------
# One-call helpers
# --------------------------------------------------------------------------------------

#: Options passed on to MetaSchedule (``ms.tune.tune_tasks`` and ``TuneContext``).
_MS_OPTIONS = (
    "max_trials_per_task",
    "num_trials_per_iter",
    "builder",
    "runner",
    "database",
    "cost_model",
    "measure_callbacks",
    "task_scheduler",
    "module_equality",
)
_CONTEXT_OPTIONS = ("strategy", "num_tuning_cores", "seed")
_OWN_OPTIONS = ("offload", "backends", "registry", "progress")


@dataclass
class _Task:
    """One tuning task: a distinct workload (in one variant) and the functions sharing it."""

    name: str
    key: tvm.IRModule  # the workload named "main", to find functions equal up to their name
    workload: tvm.IRModule
    variant: str  # "offload", "native", or "plain" for functions without a served chain
    members: list[str]


def _split_options(options: dict) -> tuple[dict, dict, dict]:
    known = (*_MS_OPTIONS, *_CONTEXT_OPTIONS, *_OWN_OPTIONS)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(
            f"tir_byoc.meta_schedule: unknown option(s) {unknown}; expected some of {list(known)}"
        )
    own = {"offload": "choice", "backends": None, "registry": REGISTRY, "progress": True}
    own.update({k: options[k] for k in _OWN_OPTIONS if k in options})
    _check_mode(own["offload"])
    context = {k: options[k] for k in _CONTEXT_OPTIONS if k in options}
    return own, context, {k: options[k] for k in _MS_OPTIONS if k in options}


def _variants(func: tirx.PrimFunc, matches: list[Choice], offload: str) -> tuple[str, ...] | str:
    """The variants to tune ``func`` in, or why it gets no task."""
    if not is_s_tir(func):
        return "not an S-TIR function"
    if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
        return "already scheduled"
    served = {b for m in matches if m.intrinsic is not None for b in m.blocks}
    if not served or offload == "never":
        return ("native",) if served else ("plain",)
    if offload == "always":
        return "whole function offloaded" if _leaf_blocks(func) <= served else ("offload",)
    return ("offload", "native")


def _plan_tasks(functions: dict, own: dict) -> tuple[list[_Task], dict[str, str], dict]:
    """The tasks to tune, the functions that get none (with the reason), and every plan."""
    tasks: list[_Task] = []
    untuned: dict[str, str] = {}
    plans = {}
    for name, func in functions.items():
        plans[name] = plan(func, backends=own["backends"], registry=own["registry"])
        variants = _variants(func, plans[name].choices, own["offload"])
        if isinstance(variants, str):
            untuned[name] = variants
            continue
        # Functions equal up to their name share a task (the first one names it).
        key = _normalize_mod(func.with_attr("global_symbol", "main"))
        base = _normalize_mod(func.with_attr("global_symbol", name))
        for variant in variants:
            same = next(
                (t for t in tasks if t.variant == variant and tvm_ffi.structural_equal(t.key, key)),
                None,
            )
            if same is not None:
                same.members.append(name)
                continue
            workload = base
            if variant != "plain":  # each variant is its own workload in the database
                workload = _normalize_mod(base["main"].with_attr(VARIANT_ATTR, variant))
            task_name = name if variant == "plain" else f"{name}@{variant}"
            tasks.append(_Task(task_name, key, workload, variant, [name]))
    return tasks, untuned, plans


def _database(ms_options: dict, work_dir: str) -> ms.database.Database:
    database = ms_options.get("database", "json")
    equality = ms_options.get("module_equality", "structural")
    if isinstance(database, ms.database.Database):
        return database
    if database == "json":
        return ms.database.Database.create("json", work_dir=work_dir, module_equality=equality)
    return ms.database.Database.create(database, module_equality=equality)


@contextlib.contextmanager
def _task_loggers(work_dir: str, names: list[str]):
    """One DEBUG file logger per task in ``work_dir/logs``, closed on exit.

    MetaSchedule's own ``get_loggers_from_work_dir`` fails on its second call in a process
    whose MetaSchedule logger carries an unnamed handler (pytest adds some), and it prints
    every task table to stdout; these loggers keep the per-task files without either.
    """
    log_dir = Path(work_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    loggers, handlers = [], []
    for i, name in enumerate(names):
        task_logger = logging.getLogger(f"{logger.name}.task.{i}_{name}")
        handler = logging.FileHandler(log_dir / f"task_{i:02d}_{name[:100]}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        task_logger.addHandler(handler)
        task_logger.setLevel(logging.DEBUG)
        task_logger.propagate = False
        loggers.append(task_logger)
        handlers.append(handler)
    try:
        yield loggers
    finally:
        for task_logger, handler in zip(loggers, handlers):
            task_logger.removeHandler(handler)
            handler.close()


def _run_search(tasks, target, work_dir, max_trials_global, own, context, ms_options, rejections):
    """Tune ``tasks`` in one search; returns the database and the trial counter."""
    # Step 1. MetaSchedule's callbacks, plus ours (which also counts trials for the report).
    progress = own["progress"]
    counter = Progress(progress is not False, None if isinstance(progress, bool) else progress)
    callbacks = ms_options.get("measure_callbacks", "default")
    if callbacks == "default":
        callbacks = ms.MeasureCallback.create("default")
    elif isinstance(callbacks, ms.MeasureCallback):
        callbacks = [callbacks]
    database = _database(ms_options, work_dir)
    options = {k: v for k, v in ms_options.items() if k not in ("database", "measure_callbacks")}
    options.setdefault("builder", candidate_builder())
    # Step 2. One context per task, with the rule told which variant it tunes; then tune.
    rule_mode = {"offload": "always", "native": "never", "plain": "never"}
    seeds = ms.utils.fork_seed(context.get("seed"), n=len(tasks))
    with _task_loggers(work_dir, [t.name for t in tasks]) as loggers:
        contexts = [
            ms.TuneContext(
                mod=task.workload,
                target=target,
                space_generator=_space(
                    target, rule_mode[task.variant], own["backends"], own["registry"], rejections
                ),
                search_strategy=context.get("strategy", "evolutionary"),
                task_name=task.name,
                rand_state=seed,
                num_threads=context.get("num_tuning_cores", "physical"),
                logger=task_logger,
            ).clone()
            for task, task_logger, seed in zip(tasks, loggers, seeds)
        ]
        ms.tune.tune_tasks(
            tasks=contexts,
            task_weights=[float(len(t.members)) for t in tasks],
            work_dir=work_dir,
            max_trials_global=max_trials_global,
            database=database,
            measure_callbacks=[*callbacks, counter],
            **options,
        )
    return database, counter


def _intrinsics(func: tirx.PrimFunc) -> tuple[str, ...]:
    names = []

    def on_block(block):
        if block.annotations and INTRINSIC_ATTR in block.annotations:
            names.append(str(block.annotations[INTRINSIC_ATTR]))

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return tuple(sorted(names))


def _best_ms(database, task: _Task, target) -> float | None:
    record = database.query_tuning_record(task.workload, target, "main")
    if record is None:
        return None
    seconds = _mean_seconds(record.run_secs)
    return seconds * 1e3 if seconds < _FAILED_RUN else None


def _decide(name, tasks, functions, database, target, counter, own, planned) -> FunctionReport:
    """Replay the faster variant's best record into ``functions[name]``; report the choice."""
    best = {t.variant: _best_ms(database, t, target) for t in tasks}
    measured = {v: ms_ for v, ms_ in best.items() if ms_ is not None}
    trials = sum(counter.trials.get(t.name, 0) for t in tasks)
    original = functions[name]
    if not measured:
        note = "no valid measured candidate; chains offloaded, the rest left unscheduled"
        logger.warning("%s: %s", name, note)
        functions[name] = apply(planned)
        intrinsics = _intrinsics(functions[name])
        return FunctionReport(
            name, "offload" if intrinsics else "none", trials, intrinsics=intrinsics, note=note
        )
    winner = min(measured, key=measured.get)
    task = next(t for t in tasks if t.variant == winner)
    scheduled = apply_record(
        database, task.workload, target, backends=own["backends"], registry=own["registry"]
    )
    functions[name] = tirx.PrimFunc(
        scheduled.params, scheduled.body, scheduled.ret_type, attrs=original.attrs
    ).with_attr("tirx.is_scheduled", True)
    return FunctionReport(
        name,
        choice="none" if winner == "plain" else winner,
        trials=trials,
        best_ms=measured[winner],
        best_offload_ms=best.get("offload"),
        best_native_ms=best.get("native"),
        intrinsics=_intrinsics(scheduled),
    )


def _tune_functions(functions, target, work_dir, max_trials_global, options):
    """The core of :func:`tune_tir` and :func:`tune_relax`: named PrimFuncs in, tuned out."""
    own, context, ms_options = _split_options(options)
    target = _target(target)
    os.makedirs(work_dir, exist_ok=True)
    functions = dict(functions)
    # Step 1. Which functions are tuned (in which variants), offloaded whole, or left alone.
    tasks, untuned, plans = _plan_tasks(functions, own)
    reports = {}
    for name, reason in untuned.items():
        choice = "unchanged"
        if reason == "whole function offloaded":
            functions[name] = apply(plans[name])
            choice = "offload-untuned"
        reports[name] = FunctionReport(
            name, choice, intrinsics=_intrinsics(functions[name]), note=reason
        )
    # Step 2. Tune every task in one search; then keep the faster variant per function.
    rejections = _Rejections()
    if tasks:
        database, counter = _run_search(
            tasks, target, work_dir, max_trials_global, own, context, ms_options, rejections
        )
        for name in functions:
            mine = [t for t in tasks if name in t.members]
            if mine:
                reports[name] = _decide(
                    name, mine, functions, database, target, counter, own, plans[name]
                )
    # Step 3. Load the libraries the result calls, so that tvm.compile resolves them here.
    registry = own["registry"]
    for backend in sorted({registry[i].backend for r in reports.values() for i in r.intrinsics}):
        toolchain.load_backend(backend, registry)
    report = TuningReport(tuple(reports[n] for n in functions), dict(rejections.counts))
    report.save(Path(work_dir) / REPORT_FILE)
    logger.info("%s", report)
    if own["progress"] is not False:
        stream = sys.stderr if isinstance(own["progress"], bool) else own["progress"]
        print(report, file=stream, flush=True)
    return functions


def tune_tir(mod, target, work_dir: str, max_trials_global: int, **options):
    """Tune a TIR module with tir_byoc's offload in the design space.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.tirx.PrimFunc
        S-TIR functions to tune.  Not modified.
    target : str, dict or tvm.target.Target
        An llvm (CPU) target.
    work_dir : str
        Where MetaSchedule's database and logs go, and :data:`REPORT_FILE`.
    max_trials_global : int
        Trials for all functions together.
    **options
        ``offload``: ``"choice"`` (default; offloaded and native variants both measured),
        ``"always"`` (chains always offloaded; functions made only of chains not tuned at
        all) or ``"never"`` (plain MetaSchedule); ``backends``, ``registry``,
        ``progress`` (True: lines on stderr; False: silent; or a text stream); MetaSchedule's
        ``max_trials_per_task``, ``num_trials_per_iter``, ``builder`` (default
        :func:`candidate_builder`), ``runner``, ``database``, ``cost_model``,
        ``measure_callbacks``, ``task_scheduler``, ``module_equality``, ``strategy``,
        ``num_tuning_cores`` and ``seed``.

    Returns
    -------
    tvm.IRModule or tvm.tirx.PrimFunc
        The same kind as ``mod``: every function scheduled by its best record, with the chains
        that won offloaded.  The intrinsic libraries are loaded, so ``tvm.compile`` of it runs
        here; :func:`load_report` tells which variant won per function.
    """
    if isinstance(mod, tirx.PrimFunc):
        name = (
            str(mod.attrs["global_symbol"])
            if mod.attrs and "global_symbol" in mod.attrs
            else "main"
        )
        return _tune_functions({name: mod}, target, work_dir, max_trials_global, options)[name]
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"tir_byoc.meta_schedule.tune_tir: expected a tvm.IRModule or tvm.tirx.PrimFunc, "
            f"got {type(mod).__name__}"
        )
    return _tune_module(mod, target, work_dir, max_trials_global, options)


def tune_relax(mod, target, work_dir: str, max_trials_global: int, **options):
    """Tune the PrimFuncs of a lowered Relax module with tir_byoc's offload in the design space.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module after ``LegalizeOps`` (and usually ``FuseOps`` and ``FuseTIR``), so that
        its operators are PrimFuncs called with ``call_tir``.  Not modified.
    target, work_dir, max_trials_global, **options
        As for :func:`tune_tir`.

    Returns
    -------
    tvm.IRModule
        The Relax module with its PrimFuncs scheduled and offloaded, ready for
        ``tvm.compile(mod, target)`` and the Relax VM.
    """
    from tvm import relax

    if not isinstance(mod, tvm.IRModule) or not any(
        isinstance(f, relax.Function) for f in mod.functions.values()
    ):
        raise TypeError(
            "tir_byoc.meta_schedule.tune_relax: expected a tvm.IRModule with Relax functions, "
            f"got {type(mod).__name__} without any"
        )
    if not any(isinstance(f, tirx.PrimFunc) for f in mod.functions.values()):
        raise ValueError(
            "tir_byoc.meta_schedule.tune_relax: expected PrimFuncs to tune, found none; run "
            "relax.transform.LegalizeOps (and FuseOps, FuseTIR) first"
        )
    return _tune_module(mod, target, work_dir, max_trials_global, options)


def _tune_module(mod, target, work_dir, max_trials_global, options) -> tvm.IRModule:
    primfuncs = {
        gvar.name_hint: func
        for gvar, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }
    tuned = _tune_functions(primfuncs, target, work_dir, max_trials_global, options)
    result = mod.clone()
    for gvar, _ in mod.functions_items():
        if gvar.name_hint in tuned:
            result.update_func(gvar, tuned[gvar.name_hint])
    return result
