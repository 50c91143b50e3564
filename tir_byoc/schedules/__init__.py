"""The default CPU schedule of what tir_byoc leaves to TVM: dlight's CPU rules and four
dlight-style rules of this package, one that vectorises what dlight's reduction rule leaves
serial and three for the blocks dlight's do not cover.

Entry point: :func:`default_schedule`, which tries :data:`RULES` in order on each PrimFunc that
calls no intrinsic and reports, per PrimFunc, the rule that scheduled it, or why none did, and
the blocks a rule left on one thread with the reason (:class:`ScheduleReport`).

TVM 0.27's dlight has two CPU rules, GEMV and Reduction (softmax and norms whose blocks share
their leading spatial axes); every other block would run as TVM wrote it, a loop nest on one
thread.  The rules here, one per module, decline with ``None`` as dlight's do:

- :class:`~.window.SlidingWindow`: one reduction that reads along its output's rows (a
  depthwise convolution, a pooling): the window's loops outside, each row in vectors, the
  rows in parallel; tried right after dlight's GEMV, before ``VectorRows``, which would take
  it and reduce each element's window in lanes of a strided gather;
- :class:`~.rows.VectorRows`: softmax and norms, as dlight's ``Reduction`` schedules them, with
  each row's sum or maximum in vector registers (``rfactor``); tried before dlight's;
- :class:`~.elementwise.Elementwise`: functions of spatial blocks only (elementwise, broadcast,
  transpose, reshape, gather): inlined into one loop nest per output where TVM allows, the
  outer loops fused and run in parallel, the innermost loop vectorised;
- :class:`~.reduction.RowReduction`: functions with reductions dlight declines: each block
  parallel over its leading spatial loops, each row reduced in vector lanes where it is longer
  than the vector width, else serially in TVM's order.

Whatever the rule, a parallel loop nest of fewer than ``MIN_PARALLEL_WORK`` iterations then
runs on one thread (:mod:`.small_nests`): at build time where its extents are static, by a
test of its iteration count at run time where they are symbolic.

A schedule that runs a whole reduction again on each iteration of a loop it does not index
(:func:`recomputed_reduction`) counts as the rule declining: dlight's ``Reduction`` does that
to LLaMA's RMSNorm of a single token, which then took 0.5 ms per call instead of 3 us.  A
function with a reduction over a single element (:func:`single_element_reduction`: a 1 x 1
pooling, a mean over an axis of 1) is left to no rule: inlining into it computed a wrong result.

``VectorRows`` and ``RowReduction`` reorder a sum over a row into vector-wide partial sums (a
maximum is the same in any order; a row they cannot split keeps TVM's order, and says so).  In
every function a rule schedules, float32 ``exp`` and ``erf`` are written out in vector
arithmetic (:mod:`.vector_math`: within one ulp, and two) when the target has vector rounding.
Inlining puts an elementwise block's expression into its consumer's, where LLVM may contract
a multiply and an add into one fused multiply-add (TVM's LLVM code generator allows it within
one expression anyway), so results can differ from the unscheduled function's in the last bit;
`tests/models/test_real_models.py` checks whole models against torch, and
`tests/properties/test_default_schedules.py` drawn programs against TVM's own build.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func

from ..calls import INTRINSIC_ATTR, intrinsic_calls
from ..frontend import first_line
from ..match.exprs import const_value
from . import vector_math
from .elementwise import Elementwise
from .reduction import RowReduction
from .rows import VectorRows
from .small_nests import serial_when_small
from .window import SlidingWindow

logger = logging.getLogger("tir_byoc")

#: Tried in order on every PrimFunc tir_byoc did not offload; the first that applies wins.
RULES = (
    dlight.cpu.GEMV,
    SlidingWindow,
    VectorRows,
    dlight.cpu.Reduction,
    RowReduction,
    Elementwise,
)

_SCHEDULED_ATTR = "tirx.is_scheduled"

#: Set by a tuner that kept a rule's schedule for a function: the rule's name, which
#: :func:`default_schedule` reports for it instead of ``scheduled_by``.
RULE_ATTR = "tir_byoc.rule"


def is_scheduled(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` carries ``tirx.is_scheduled`` (a rule or a tuner has scheduled it)."""
    return bool(func.attrs) and _SCHEDULED_ATTR in func.attrs and bool(func.attrs[_SCHEDULED_ATTR])


@dataclass(frozen=True)
class ScheduleReport:
    """What :func:`default_schedule` did to each PrimFunc.

    Attributes
    ----------
    module : tvm.IRModule
        The scheduled module.
    rules : Mapping[str, str]
        PrimFuncs a rule scheduled, with the rule's name (``"Reduction"``, ``"Elementwise"``...).
    unscheduled : Mapping[str, str]
        PrimFuncs that call no intrinsic and that no rule scheduled, with the reason.
    failures : Mapping[str, str]
        PrimFuncs a rule raised on (the first line of the error); they are also in
        ``unscheduled``.
    serial_blocks : Mapping[str, Mapping[str, str]]
        Per PrimFunc, the blocks that run on one thread and why: those a rule left serial
        (too little work, no spatial loop) and the TVM blocks left beside an offloaded call;
        the reductions that add up each row serially, not in vector lanes, and the windows
        whose rows are not vectorised, and why.
    """

    module: tvm.IRModule
    rules: Mapping[str, str] = field(default_factory=dict)
    unscheduled: Mapping[str, str] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)
    serial_blocks: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def _tvm_blocks(func: tirx.PrimFunc) -> list[str]:
    """The blocks of an offloaded ``func`` other than its root and its intrinsic calls."""
    names = []

    def on_block(block):
        if not (block.annotations and INTRINSIC_ATTR in block.annotations):
            names.append(block.name_hint)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block)])
    return [n for n in names if n != "root"]


def _why_no_rule(func: tirx.PrimFunc) -> str:
    """Why no rule of :data:`RULES` applies to ``func`` (which calls no intrinsic)."""
    blocks = normalize_prim_func(s_tir.Schedule(func))
    if blocks is None:
        return (
            "not in dlight's normal form (a block is opaque, or its loops do not map one to "
            "one onto its iterators): runs as TVM wrote it"
        )
    if not blocks:
        return "has no block to schedule"
    single = single_element_reduction(func)
    if single is not None:
        return (
            f"block {single} reduces over a single element (each of its reduction iterators "
            "spans 1), which TVM's inlining takes for an elementwise block and gets wrong: "
            "runs as TVM wrote it"
        )
    for block in blocks:
        if "O" in block.dom_kind():
            return (
                f"block {block.name} has an iterator that is neither spatial nor a reduction: "
                "runs as TVM wrote it"
            )
    return "no rule applies: runs as TVM wrote it"


def single_element_reduction(func: tirx.PrimFunc) -> str | None:
    """The name of a block of ``func`` that reduces over a single element, or None.

    Such a block has an init, but dlight's normal form drops its reduction iterators (each
    spans 1), so the rules would see a spatial block; TVM's ``reverse_compute_inline`` then
    folds the blocks after it into its update and its init alike.  A 1 x 1 average pooling
    followed by ``exp`` computed ``exp(1 + x)``: the init wrote ``exp(0)``, and the update
    added ``x`` to it before its own ``exp``.
    """
    # Step 1. A walk first: only a block with an init whose other iterators than the spatial
    # ones all span 1 can lose them all, and normalising is a dearer question (73 ms for the
    # 25 PrimFuncs of a BERT-like model, against 553 ms for all of their scheduling).
    candidates = []

    def on_block(block):
        if block.init is not None and all(
            iv.iter_type == tirx.IterVar.DataPar or const_value(iv.dom.extent) == 1
            for iv in block.iter_vars
        ):
            candidates.append(block)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block)])
    if not candidates:
        return None
    # Step 2. The blocks as the rules see them.
    sch = s_tir.Schedule(func)
    for block in normalize_prim_func(sch) or ():
        if block.is_injective() and sch.get(block.block_rv).init is not None:
            return block.name
    return None


def recomputed_reduction(func: tirx.PrimFunc) -> str | None:
    """A reduction of ``func`` that runs whole again on each iteration of a loop its iterators
    do not read, said in words; None if there is none.

    dlight's CPU ``Reduction`` rule does this to a norm whose output has more spatial
    iterations than its reduction (LLaMA's RMSNorm of one token: the 768-element sum of
    squares computed again for each of the 768 outputs, 0.5 ms instead of a microsecond).
    """

    def visit(stmt, loops):
        if isinstance(stmt, tirx.For):
            return visit(stmt.body, [*loops, stmt])
        if isinstance(stmt, tirx.SeqStmt):
            return next((r for r in (visit(s, loops) for s in stmt.seq) if r), None)
        if isinstance(stmt, tirx.IfThenElse):
            return visit(stmt.then_case, loops) or (
                visit(stmt.else_case, loops) if stmt.else_case is not None else None
            )
        if isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            if any(v.iter_type == tirx.IterVar.CommReduce for v in block.iter_vars):
                read = []
                for value in stmt.iter_values:
                    tvm_ffi.structural_walk(value, (tirx.Var, read.append))
                for loop in loops:
                    if isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1:
                        continue
                    if not any(v.same_as(loop.loop_var) for v in read):
                        extent = const_value(loop.extent)
                        return (
                            f"reduction {block.name_hint} runs whole for each of the "
                            f"{loop.extent if extent is None else extent} iterations of loop "
                            f"{loop.loop_var.name}"
                        )
            return visit(block.body, loops)
        body = getattr(stmt, "body", None)
        return visit(body, loops) if isinstance(body, tirx.Stmt) else None

    return visit(func.body, [])


def first_rule(func: tirx.PrimFunc, target: tvm.target.Target):
    """The first rule of :data:`RULES` that schedules ``func``: (rule name, function, notes),
    or None.  The function is marked scheduled, its float32 ``exp`` not yet written out.

    A rule whose schedule repeats a whole reduction (:func:`recomputed_reduction`) counts as
    declining, and the next one is tried.  A function with a reduction over a single element
    (:func:`single_element_reduction`) is left to no rule."""
    if single_element_reduction(func) is not None:
        return None
    for rule_type in RULES:
        rule = rule_type()
        with target:
            schedule = rule.apply(func, target, False)
        if schedule is None:
            continue
        if isinstance(schedule, list):
            schedule = schedule[0]
        scheduled = schedule.mod["main"].with_attr(_SCHEDULED_ATTR, True)
        repeated = recomputed_reduction(scheduled)
        if repeated is not None:
            logger.info("%s declined: its schedule %s", rule_type.__name__, repeated)
            continue
        return rule_type.__name__, scheduled, dict(getattr(rule, "notes", {}))
    return None


def rule_schedule(func: tirx.PrimFunc, target: tvm.target.Target, expand_math: bool):
    """``func`` as the default schedule writes it: (the :func:`first_rule`'s name, the
    function, its blocks left on one thread with why), or None if no rule applies.  With
    ``expand_math`` (:func:`.vector_math.applies` to the target) its float32 ``exp`` and
    ``erf`` are written out; its small nests run on one thread (:func:`serial_when_small`)."""
    applied = first_rule(func, target)
    if applied is None:
        return None
    rule, scheduled, notes = applied
    if expand_math:
        scheduled = vector_math.expand(scheduled)
    scheduled, threads = serial_when_small(scheduled)
    for block, why in threads.items():
        notes[block] = f"{notes[block]}; {why}" if block in notes else why
    return rule, scheduled, notes


def default_schedule(
    mod: tvm.IRModule, target: tvm.target.Target, scheduled_by: str = "scheduled before"
) -> ScheduleReport:
    """Schedule each PrimFunc of ``mod`` that calls no intrinsic with the first of :data:`RULES`
    that applies; a PrimFunc already scheduled (``tirx.is_scheduled``) keeps its schedule (its
    float32 ``exp`` written out as the rules' is) and is reported in
    :attr:`ScheduleReport.rules` as ``scheduled_by`` (or as the rule named by its
    :data:`RULE_ATTR`).

    A rule that raises leaves its function as it was (recorded in
    :attr:`ScheduleReport.failures`); ``mod`` itself is not changed.
    """
    result = mod.clone()
    rules, unscheduled, failures, serial = {}, {}, {}, {}
    vector_math_applies = vector_math.applies(target)  # the same for every function
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        name, offloaded = gvar.name_hint, bool(intrinsic_calls(func))
        if is_scheduled(func):
            if not offloaded:
                rules[name] = str(func.attrs.get(RULE_ATTR, scheduled_by))
                if vector_math_applies:  # a tuner's schedule, with the rules' exp and erf
                    result.update_func(gvar, vector_math.expand(func))
            continue
        if offloaded:
            left = _tvm_blocks(func)
            if left:
                serial[name] = {
                    b: "TVM code beside an offloaded call: runs as TVM wrote it" for b in left
                }
            continue
        try:
            applied = rule_schedule(func, target, vector_math_applies)
        except Exception as error:  # a rule's bug must not stop the build
            failures[name] = unscheduled[name] = first_line(error)
            continue
        if applied is None:
            unscheduled[name] = _why_no_rule(func)
            continue
        rules[name], scheduled, notes = applied
        result.update_func(gvar, scheduled)
        if notes:
            serial[name] = notes
    return ScheduleReport(
        result,
        MappingProxyType(rules),
        MappingProxyType(unscheduled),
        MappingProxyType(failures),
        MappingProxyType({k: MappingProxyType(v) for k, v in serial.items()}),
    )


__all__ = [
    "RULES",
    "RULE_ATTR",
    "Elementwise",
    "RowReduction",
    "ScheduleReport",
    "SlidingWindow",
    "VectorRows",
    "default_schedule",
    "first_rule",
    "recomputed_reduction",
    "rule_schedule",
    "single_element_reduction",
]
