"""Applying a tuning database: a function's best record replayed, its chosen chains offloaded.

Entry point: :func:`apply_record` (public, :mod:`tir_byoc.meta_schedule`); :func:`replay_best`
is the replay it and the decision per function (:mod:`.decide`) share.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from ..registry import REGISTRY, Registry
from ..rewrite import RewriteError, intrinsic_calls, rewrite_function
from .postproc import CandidateRejected, OffloadPostproc
from .rule import cpu_target, only_function


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
        Records of a tuning run that used :func:`~.space.offload_space`.
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
    replayed = replay_best(database, func, target, backends, registry)
    if replayed is None:
        return None
    before, offloaded = replayed
    try:
        return rewrite_function(before, offloaded)
    except RewriteError as reason:
        raise RuntimeError(
            f"tir_byoc.meta_schedule: the best record of {before.attrs['global_symbol']} "
            f"does not offload any more: {reason}"
        ) from None


def replay_best(database, func, target, backends, registry):
    """The best record of ``func`` replayed, and the chains to offload in it; or None."""
    target = cpu_target(target)
    workload = _normalize_mod(func)
    record = database.query_tuning_record(workload, target, "main")
    if record is None:
        return None
    # Step 1. Replay the record: the chain comes back marked and untouched, since the
    # offload itself is not a traced instruction (see offload_space).
    sch = s_tir.Schedule(workload)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    before = only_function(sch.mod)[1]
    # Step 2. What the postproc offloaded in the measured candidate.
    try:
        return before, OffloadPostproc(backends, registry).offloaded(before)
    except CandidateRejected as reason:
        raise RuntimeError(
            f"tir_byoc.meta_schedule: the best record of "
            f"{only_function(workload)[0].name_hint} does not offload any more: {reason}"
        ) from None


def called_intrinsics(func: tirx.PrimFunc) -> tuple[str, ...]:
    """The intrinsics ``func`` calls, once per offloaded block, sorted: the report's form."""
    return tuple(sorted(collections.Counter(intrinsic_calls(func)).elements()))


def as_scheduled(func: tirx.PrimFunc, original: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a replayed record) under ``original``'s attributes, marked scheduled."""
    return tirx.PrimFunc(func.params, func.body, func.ret_type, attrs=original.attrs).with_attr(
        "tirx.is_scheduled", True
    )


__all__ = ["apply_record", "as_scheduled", "called_intrinsics", "replay_best"]
