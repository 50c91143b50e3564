"""Which functions become which tuning tasks, each function planned once.

Entry point: :func:`plan_tasks`.  A function holding a chain an intrinsic serves becomes one
task per variant it is tuned in (``<name>@offload``, ``<name>@native``), the two workloads told
apart by the function attribute :data:`VARIANT_ATTR`; functions equal up to their name share a
task; and a function that gets no task says why.  The plans it returns are the ones
``tune.py`` offloads whole functions with.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from ..match import is_s_tir
from ..planning import Plan, plan
from ..registry import Choice
from .options import TuneOptions

#: Function attribute telling the two workloads of a function apart in the database.
VARIANT_ATTR = "tir_byoc.variant"


@dataclass
class Task:
    """One tuning task: a distinct workload (in one variant) and the functions sharing it."""

    name: str
    key: tvm.IRModule  # the workload named "main", to find functions equal up to their name
    workload: tvm.IRModule
    variant: str  # "offload", "native", or "plain" for functions without a served chain
    members: list[str]
    whole: bool = False  # an offload variant with no block left to TVM: one candidate


def _leaf_blocks(func: tirx.PrimFunc) -> set[str]:
    """Names of the blocks whose body is a single store: the function's computations."""
    names = set()

    def on_block(block):
        if isinstance(block.body, tirx.BufferStore):
            names.add(block.name_hint)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return names


def _whole(func: tirx.PrimFunc, matches: list[Choice]) -> bool:
    """Whether the served chains of ``func`` are all of its computations."""
    served = {b for m in matches if m.intrinsic is not None for b in m.blocks}
    return bool(served) and _leaf_blocks(func) <= served


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
        return "whole function offloaded" if _whole(func, matches) else ("offload",)
    return ("offload", "native")


def plan_tasks(
    functions: dict[str, tirx.PrimFunc], options: TuneOptions
) -> tuple[list[Task], dict[str, str], dict[str, Plan]]:
    """The tasks to tune, the functions that get none (with the reason), and every plan."""
    tasks: list[Task] = []
    untuned: dict[str, str] = {}
    plans = {}
    for name, func in functions.items():
        plans[name] = plan(func, backends=options.backends, registry=options.registry)
        variants = _variants(func, plans[name].choices, options.offload)
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
            whole = variant == "offload" and _whole(func, plans[name].choices)
            tasks.append(Task(task_name, key, workload, variant, [name], whole))
    return tasks, untuned, plans
