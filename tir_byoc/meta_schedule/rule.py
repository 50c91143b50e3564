"""The schedule rule that keeps MetaSchedule's rules off the chains chosen for offload.

Entry point: :class:`OffloadRule`.  The module also owns what the rule writes and what the
rest of the package reads back: the block annotation :data:`CHOICE_ATTR` (read by
:func:`block_choices` on a function and by :func:`recorded_choice` on a trace), the loop
annotation :data:`KEEP_LOOP_ATTR`, and the no-op custom rule registered under
:data:`CUSTOM_RULE` for the target's keys (:func:`register_custom_rule`).  The target checks
(:func:`cpu_target`) and the offload modes (:data:`MODES`) live here because the rule is the
first to need them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule

from ..planning import Plan, plan
from ..registry import REGISTRY, Registry

# Every module of the package logs on the one logger "tir_byoc.meta_schedule".
logger = logging.getLogger(__package__)

#: Block annotation recording the decision for a chain: ``"offload"`` or ``"native"``.
CHOICE_ATTR = "tir_byoc.choice"
#: Loop annotation on offloaded chains; MetaSchedule's postprocs leave annotated loops alone.
KEEP_LOOP_ATTR = "tir_byoc.keep_loop"
#: Value of the ``schedule_rule`` annotation that keeps MetaSchedule's rules off a chain.
CUSTOM_RULE = "tir_byoc_offload"
#: How chains enter the design space: offloaded and native both measured, always offloaded, or
#: never (plain MetaSchedule, for comparison).
MODES = ("choice", "always", "never")

_SUPPORTED_KINDS = ("llvm",)


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`; ValueError otherwise."""
    if mode not in MODES:
        raise ValueError(f"tir_byoc.meta_schedule: expected offload in {MODES}, got {mode!r}")
    return mode


def cpu_target(target) -> tvm.target.Target:
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


def only_function(mod: tvm.IRModule) -> tuple[tvm.ir.GlobalVar, tirx.PrimFunc]:
    """The single PrimFunc a MetaSchedule schedule works on."""
    funcs = [(g, f) for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        raise ValueError(
            f"tir_byoc.meta_schedule: expected a schedule over one PrimFunc, got {len(funcs)}"
        )
    return funcs[0]


def block_choices(func: tirx.PrimFunc) -> dict[str, str]:
    """Block name -> recorded choice, for blocks annotated by :class:`OffloadRule`."""
    choices = {}

    def on_block(block):
        if block.annotations and CHOICE_ATTR in block.annotations:
            choices[block.name_hint] = str(block.annotations[CHOICE_ATTR])

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return choices


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


def _keep_loops(sch: s_tir.Schedule, _block: s_tir.SBlockRV) -> list[s_tir.Schedule]:
    """The custom rule behind ``schedule_rule = "tir_byoc_offload"``: leave the block alone."""
    return [sch]


def register_custom_rule(target) -> None:
    """Register the no-op custom rule for every key of ``target`` (idempotent)."""
    for key in cpu_target(target).keys:
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
        self.offload = check_mode(offload)
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
        gvar, func = only_function(sch.mod)
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
