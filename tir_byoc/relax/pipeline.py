"""tir_byoc's Relax pipeline: the whole order, from a Relax module to what the Relax VM runs.

1. :data:`BEFORE_LEGALIZE`, the Relax rewrites that put each GEMM next to its epilogue:
   shapes proved under the bounds of their symbolic dims (so that none is lost), negative
   gather indices read as torch reads them (TVM 0.27's import reads them out of bounds),
   each convolution of one group as im2col and a GEMM, the reshapes around each
   Linear on an N-D activation folded away (so its activation or residual add fuses with the
   GEMM), a packed q/k/v split read as slices, attention's ``q @ k^T`` on K as it is; and,
   before the convolutions, each pooling window clipped to its input (:mod:`.pooling`), a
   CNN's convolutions and the work between them put in channels-last layout where a library
   convolution serves them (:mod:`.channels_last`), and each eval-mode batch norm folded into
   the convolution or Linear before it (:mod:`.batch_norm`).
2. :data:`LOWERING`: operators to TIR (on symbolic shapes, their indices simplified and a
   reshape marked injective, as on static ones), fused into PrimFuncs, each elementwise op
   before a row reduction fused into it.  :func:`lower` runs 1 and 2.
3. The offload, :func:`tir_byoc.offload` (:class:`~tir_byoc.offload.Offload`), which runs, in
   this order: the weight copies folded into the GEMMs that read them
   (:class:`~tir_byoc.relax.weight_copies.FoldWeightCopies`, judged by the plan it shares),
   the plan, the rewrite of each match, the constant weights packed
   (:mod:`tir_byoc.packing`).  :func:`tir_byoc.build_model` with ``tune_trials`` tunes here
   instead (:func:`tir_byoc.meta_schedule.tune_relax`, which folds the copies with
   :func:`fold_weight_copies`).
4. :data:`AFTER_OFFLOAD`: each PrimFunc that only reshapes a value made Relax's view
   (``R.reshape``) while TVM still recognises it, then dead code eliminated, so the copies
   folded away are not built.
5. :func:`schedule`: the default CPU schedule for what TVM keeps (:mod:`tir_byoc.schedules`),
   and the check that no intrinsic is called from inside a parallel loop.
6. TVM's default Relax build pipeline (``relax.get_pipeline("default")``), without the
   functions it writes and leaves uncalled.

:func:`tir_byoc.build_model` runs the stages one by one (it keeps the schedule report, and
tunes instead of offloading when asked); :class:`TirByocPipeline` runs all six as one module
pass, registered with TVM as ``"tir_byoc"`` when ``tir_byoc`` is imported, so that a TVM user
who never calls ``build_model`` gets the same module::

    ex = tvm.compile(mod, target="llvm", relax_pipeline=relax.get_pipeline("tir_byoc"))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import tvm
import tvm_ffi
from tvm import ir, relax, tirx

from .. import schedules
from ..offload import offload
from ..planning import Planner
from ..registry import REGISTRY, Registry
from ..rewrite import calls_in_parallel_loops
from . import channels_last
from .batch_norm import FoldBatchNorms
from .bounded_shapes import BoundShapes
from .channels_last import ChannelsLast
from .convolutions import ConvolutionsAsGemms
from .fuse_rows import FuseIntoRows
from .linear_reshapes import FoldLinearReshapes
from .pooling import ClipPoolWindows
from .slice_splits import SliceSplits
from .symbolic_indices import MarkSymbolicCopies, SimplifyIndices
from .untranspose import UntransposeBatchMatmuls
from .weight_copies import FoldWeightCopies
from .wrap_indices import WrapIndices

#: The name :class:`TirByocPipeline` is registered under (``relax.get_pipeline(NAME)``).
NAME = "tir_byoc"


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.RemoveDeadCode")
class RemoveDeadCode:
    """Relax's ``DeadCodeElimination`` with every Relax function of the module as an entry:
    what no Relax function calls any more (a weight copy the offload folded away) is dropped."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        entries = [g.name_hint for g, f in mod.functions_items() if isinstance(f, relax.Function)]
        return relax.transform.DeadCodeElimination(entries)(mod)


#: Why a build that offloads nothing keeps its convolutions' layouts (:mod:`.channels_last`).
NO_LIBRARY = (
    "the build offloads nothing (offload=False): no library convolution takes NHWC, and TVM's "
    "own loops run NCHW faster"
)

#: Stage 1, before ``LegalizeOps``: the Relax rewrites, in order.
BEFORE_LEGALIZE = (
    BoundShapes,
    WrapIndices,
    ClipPoolWindows,
    ChannelsLast,
    FoldBatchNorms,
    ConvolutionsAsGemms,
    FoldLinearReshapes,
    SliceSplits,
    UntransposeBatchMatmuls,
)
#: Stage 2: operators to TIR, fused into PrimFuncs.
LOWERING = (
    relax.transform.LegalizeOps,
    SimplifyIndices,
    relax.transform.AnnotateTIROpPattern,
    MarkSymbolicCopies,
    relax.transform.FuseOps,
    FuseIntoRows,
    relax.transform.FuseTIR,
)
#: Stage 4, after the offload: a PrimFunc that only reshapes a value (``has_reshape_pattern``)
#: becomes Relax's ``R.reshape``, a view of the same memory, before the default schedule
#: rewrites its loops out of the form TVM recognises (TVM's own build runs the same pass,
#: after the schedule); then what no Relax function calls any more is dropped.
AFTER_OFFLOAD = (relax.transform.RewriteDataflowReshape, RemoveDeadCode)


def lowering_passes() -> tuple:
    """Stages 1 and 2: every pass (its class or maker) from a Relax module to fused PrimFuncs,
    in order.  Read when called, so that a change to either tuple takes effect."""
    return (*BEFORE_LEGALIZE, *LOWERING)


def lower(mod: tvm.IRModule, library: bool = True) -> tvm.IRModule:
    """Stages 1 and 2 on a Relax module: its operators as fused PrimFuncs.  ``library=False``
    (a build that offloads nothing) keeps the convolutions' layouts (:data:`NO_LIBRARY`)."""
    kept = contextlib.nullcontext() if library else channels_last.kept_as_given(NO_LIBRARY)
    with kept:
        return tvm.transform.Sequential([make_pass() for make_pass in lowering_passes()])(mod)


def after_offload(mod: tvm.IRModule) -> tvm.IRModule:
    """Stage 4 on an offloaded (or tuned) Relax module."""
    return tvm.transform.Sequential([make_pass() for make_pass in AFTER_OFFLOAD])(mod)


def fold_weight_copies(
    mod: tvm.IRModule,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
) -> tvm.IRModule:
    """A lowered Relax module with its weight copies folded as the offload folds them, and, if
    any was, stage 4, so that the copies no longer called are gone: what tuning starts from, so
    that the copies are not tuned.  ``mod`` itself when nothing folds."""
    folded = FoldWeightCopies(Planner(backends, registry).plan_function)(mod)
    if folded.same_as(mod):
        return mod
    return after_offload(folded)


def schedule(
    mod: tvm.IRModule, target: tvm.target.Target, caller: str = "tir_byoc.build_model"
) -> schedules.ScheduleReport:
    """Stage 5: the default CPU schedule for every PrimFunc tir_byoc leaves to TVM
    (:func:`tir_byoc.schedules.default_schedule`; its report holds the module).

    Raises
    ------
    ValueError
        If a PrimFunc calls an intrinsic from inside a parallel loop (the intrinsics share
        their work among TVM's threads themselves); ``caller`` names who asked.
    """
    report = schedules.default_schedule(mod, target, scheduled_by="MetaSchedule")
    for gvar, func in report.module.functions_items():
        if isinstance(func, tirx.PrimFunc) and (blocks := calls_in_parallel_loops(func)):
            raise ValueError(
                f"{caller}: {gvar.name_hint} calls an intrinsic from inside a "
                f"parallel loop (block {blocks[0]}); expected every offloaded block outside "
                "parallel loops, as the offload leaves it (the intrinsics share their work "
                "among TVM's threads themselves)"
            )
    return report


def build(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Stage 6: TVM's default Relax build pipeline, as ``tvm.compile`` runs it, for
    ``target``, without the PrimFuncs it writes that nothing calls.

    Its ``LegalizeOps`` writes each ``R.reshape`` of stage 4 out as a copy again, and its
    ``RewriteDataflowReshape`` makes the call a view once more: the copy is left uncalled, and
    would be compiled (and reported as a function the default rules never saw)."""
    with target:
        built = relax.get_pipeline("default")(mod)
    return _without_uncalled(built, before=mod)


def _without_uncalled(mod: tvm.IRModule, before: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without the PrimFuncs that are not in ``before`` and that no function refers
    to."""
    referred: set[str] = set()
    for _, func in mod.functions_items():
        tvm_ffi.structural_walk(func, (ir.GlobalVar, lambda gvar: referred.add(gvar.name_hint)))
    known = {gvar.name_hint for gvar in before.get_global_vars()}
    uncalled = [
        gvar
        for gvar, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
        and gvar.name_hint not in known
        and gvar.name_hint not in referred
    ]
    if not uncalled:
        return mod
    kept = {gvar: func for gvar, func in mod.functions_items() if gvar not in uncalled}
    return tvm.IRModule(kept, attrs=mod.attrs, global_infos=mod.global_infos)


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.Pipeline")
class TirByocPipeline:
    """Stages 1 to 6 on a Relax module, for the target in scope (``tvm.compile`` puts its
    target in scope): what :func:`tir_byoc.build_model` builds, without tuning.

    Parameters
    ----------
    backends, fold_transposes, pack_weights
        As for :func:`tir_byoc.offload`.
    offload : bool
        ``False`` leaves stage 3 out (the same pipeline without tir_byoc, for comparing).
    """

    def __init__(
        self,
        backends: Iterable[str] | str | None = None,
        fold_transposes: bool = True,
        pack_weights: bool = True,
        offload: bool = True,
    ):
        self.backends = backends
        self.fold_transposes = fold_transposes
        self.pack_weights = pack_weights
        self.offload = offload

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None or target.kind.name != "llvm":
            found = "none" if target is None else target.kind.name
            raise ValueError(
                f"tir_byoc pipeline: expected an llvm (CPU) target in scope, as "
                f"tvm.compile(mod, target, relax_pipeline=...) or `with target:` gives, got {found}"
            )
        mod = lower(mod, library=self.offload)
        if self.offload:
            mod = offload(
                mod,
                backends=self.backends,
                fold_transposes=self.fold_transposes,
                pack_weights=self.pack_weights,
            )
        mod = after_offload(mod)
        mod = schedule(mod, target, caller="tir_byoc pipeline").module
        return build(mod, target)


def tir_byoc_pipeline(**options) -> tvm.transform.Pass:
    """:class:`TirByocPipeline` with ``options``: what ``relax.get_pipeline("tir_byoc",
    **options)`` returns."""
    return TirByocPipeline(**options)


if NAME not in relax.pipeline.PIPELINE_MAP:  # registered once per process
    relax.register_pipeline(NAME)(tir_byoc_pipeline)


__all__ = [
    "AFTER_OFFLOAD",
    "BEFORE_LEGALIZE",
    "LOWERING",
    "NAME",
    "RemoveDeadCode",
    "TirByocPipeline",
    "after_offload",
    "build",
    "fold_weight_copies",
    "lower",
    "lowering_passes",
    "schedule",
    "tir_byoc_pipeline",
]
