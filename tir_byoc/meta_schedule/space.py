"""The design space with offload in it, and the builder whose artifacts link the intrinsics.

Entry points: :func:`offload_space` (the target's default space generator with
:class:`~.rule.OffloadRule` first among the rules and :class:`~.postproc.OffloadPostproc`
among the postprocs; usable as ``space=`` of ``ms.tune_tir``) and :func:`candidate_builder`
(a :class:`~.builder.CandidateBuilder` of :func:`build_candidate` and
:func:`export_candidate`).
:func:`design_space` is the same space with a shared rejection counter, for ``tune.py``.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from ..export import export_library
from ..registry import REGISTRY, Registry
from .builder import CandidateBuilder
from .intrinsics_import import import_tensor_intrinsics
from .postproc import OffloadPostproc, Rejections
from .rule import OffloadRule, cpu_target, register_custom_rule


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
    return design_space(target, offload, backends, registry, Rejections())


def design_space(
    target, offload, backends, registry, rejections: Rejections
) -> ms.space_generator.PostOrderApply:
    """:func:`offload_space`, its postproc counting rejections into ``rejections``."""
    import_tensor_intrinsics()  # before TuneContext does, slowly
    target = cpu_target(target)
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
    tens of seconds; candidates of :func:`offload_space` on llvm are never
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


def candidate_builder(**kwargs) -> CandidateBuilder:
    """A builder whose artifacts link the intrinsic code they call, its worker processes kept
    from one batch to the next (:class:`~.builder.CandidateBuilder`).

    Parameters
    ----------
    **kwargs
        ``max_workers``, ``timeout_sec``, ``initializer``, ``process_uses``; ``f_build``
        defaults to :func:`build_candidate`.
    """
    if "f_export" in kwargs:
        raise TypeError("tir_byoc.meta_schedule.candidate_builder: f_export is fixed, got one")
    kwargs.setdefault("f_build", build_candidate)
    return CandidateBuilder(f_export=export_candidate, **kwargs)


@contextlib.contextmanager
def call_workers(builder, runner, measures: bool = True) -> Iterator[tuple]:
    """The builder and runner of one tuning call, each with its worker processes started once.

    ``builder`` None becomes a :func:`candidate_builder` and, if the call ``measures``
    anything, ``runner`` ``"local"`` a ``LocalRunner``; those made here are shut down on exit,
    the caller's are left running.  Otherwise MetaSchedule's search and every measurement
    after it (:mod:`.measure`) would each start their own, and each new worker imports TVM:
    about 5 s of CPU on the 2-vCPU VMs.  (A ``LocalRunner`` starts its worker when it is
    made; a builder's start with their first candidate.)
    """
    made = []
    if builder is None:
        builder = candidate_builder()
        made.append(builder.close)
    if measures and isinstance(runner, str) and runner == "local":
        runner = ms.runner.LocalRunner()
        made.append(runner.pool.shutdown)
    try:
        yield builder, runner
    finally:
        for close in made:
            close()
