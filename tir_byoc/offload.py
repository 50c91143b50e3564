"""The driver: views of a :class:`~tir_byoc.planning.Plan`, and the rewrite it plans.

Entry points: :func:`scan` (what would be offloaded, with the intrinsic chosen or the reason
none was), :func:`offload` and its module-pass form :class:`Offload`.  Each computes one plan,
:func:`offload_plan`, and reads it; :func:`offload` then hands the planned matches to
:func:`tir_byoc.rewrite.rewrite_function` (:func:`apply`).  :func:`offload_reported` also returns
what the offload decided beyond the plan (:class:`OffloadReport`: the pairs fused, the weights
packed, and the declines of both).  :func:`tir_byoc.explain`
(:mod:`tir_byoc.explanation`) lists the same plan's declines.

The offload runs in this order (:mod:`tir_byoc.relax.pipeline` places it in the whole
pipeline): for a Relax module, the weight copies folded into the GEMMs that read them
(:mod:`tir_byoc.relax.weight_copies`, each callee judged by the plan it would get); the plan of
the module that leaves (:func:`tir_byoc.planning.plan`, a view); the rewrite of each planned
match; for a Relax module, its 1 x 1 + depthwise convolution pairs fused
(:mod:`tir_byoc.conv_pairs`) and its constant weights packed (:mod:`tir_byoc.packing`).

All of them accept an ``IRModule`` (TIR-only or Relax with PrimFuncs) or a single ``PrimFunc``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import tvm
from tvm import relax

from . import toolchain
from .conv_pairs import pair_convolutions
from .decline import Decline
from .packing import pack_constant_weights
from .planning import Choice, Plan, Planner, as_module
from .registry import REGISTRY, Registry
from .relax import weight_copies
from .rewrite import rewrite_function

logger = logging.getLogger("tir_byoc")


def offload_plan(
    mod_or_func,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
    fold_transposes: bool = True,
) -> Plan:
    """The plan of what :func:`offload` rewrites: :func:`tir_byoc.plan` of the module it
    rewrites.

    For a Relax module (with ``fold_transposes``), that is the module with its weight copies
    folded (:func:`tir_byoc.relax.weight_copies.find`, then ``rewrite``), each callee judged by
    the plan of this call's :class:`~tir_byoc.planning.Planner`, which then plans the folded
    module: no function is scanned twice.  The copies left are the plan's
    :attr:`~tir_byoc.planning.Plan.declines`.  ``mod_or_func`` is not modified.

    Parameters
    ----------
    mod_or_func, backends, registry, fold_transposes
        As for :func:`offload`.

    Returns
    -------
    Plan
    """
    mod, wrapped = as_module(mod_or_func)
    planner = Planner(backends, registry)
    refusals = ()
    if (
        fold_transposes
        and not wrapped
        and any(isinstance(f, relax.Function) for f in mod.functions.values())
    ):
        folds, refusals = weight_copies.find(mod, planner.plan_function)
        for refusal in refusals:
            logger.info("%s", refusal)
        mod = weight_copies.rewrite(mod, folds)
    return planner.plan(mod, wrapped, refusals)


def scan(
    mod_or_func,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
    fold_transposes: bool = True,
) -> list[Choice]:
    """Find every dense / bias / relu chain and the intrinsic that would serve it.

    Parameters
    ----------
    mod_or_func : tvm.IRModule or tvm.tirx.PrimFunc
        What to scan; not modified.
    backends : str or iterable of str, optional
        Backends allowed, most preferred first (default: ``$TIR_BYOC_BACKENDS``, else all by
        intrinsic priority).
    registry : Registry, optional
        Where intrinsics are looked up.
    fold_transposes : bool
        Relax modules: report a GEMM whose weight is a copy of another tensor (``transpose``,
        ``broadcast_to``) as the match :func:`offload` makes of it on that tensor (see
        :mod:`tir_byoc.relax.weight_copies`).

    Returns
    -------
    list of Choice
        One per match, in module order: the match's fields (``pattern``, ``blocks``, ...)
        with ``intrinsic`` set, or ``intrinsic=None`` and ``reason``.
    """
    return offload_plan(
        mod_or_func, backends=backends, registry=registry, fold_transposes=fold_transposes
    ).choices


def offload(
    mod_or_func,
    *,
    backends: Iterable[str] | str | None = None,
    strict: bool = False,
    registry: Registry = REGISTRY,
    fold_transposes: bool = True,
    pack_weights: bool = True,
):
    """Replace every matched chain by a call to its intrinsic.

    The intrinsic libraries used are compiled (on first use) and loaded before anything is
    rewritten, so that a plain ``tvm.compile`` of the result runs in this process; if that
    fails, the error says why and nothing is returned half-rewritten.

    Parameters
    ----------
    mod_or_func : tvm.IRModule or tvm.tirx.PrimFunc
        TIR or Relax module, or one PrimFunc.  Not modified.
    backends : str or iterable of str, optional
        See :func:`scan`.
    strict : bool
        Raise ``ValueError`` if some match has no intrinsic, instead of leaving it to TVM.
    registry : Registry, optional
        Where intrinsics are looked up.
    fold_transposes : bool
        Relax modules: serve a GEMM whose weight is a copy of another tensor (``transpose``,
        ``broadcast_to``) with an intrinsic on that tensor, and drop the copy when nothing
        else uses it (see :mod:`tir_byoc.relax.weight_copies`).
    pack_weights : bool
        Relax modules: a GEMM whose weight is a constant of the model, served by a backend
        that packs (oneDNN), gets the weight packed once, here, into the library's preferred
        layout (see :mod:`tir_byoc.packing`); and a 1 x 1 convolution with the depthwise one
        that alone reads its output becomes one fused oneDNN call where that is faster (see
        :mod:`tir_byoc.conv_pairs`).

    Returns
    -------
    tvm.IRModule or tvm.tirx.PrimFunc
        The same kind as the input.  Unmatched blocks and functions are kept as they were.
    """
    planned = offload_plan(
        mod_or_func, backends=backends, registry=registry, fold_transposes=fold_transposes
    )
    return apply(planned, strict=strict, pack_weights=pack_weights)


#: The keyword options of :func:`offload`, which :func:`offload_reported` takes too.
_OFFLOAD_OPTIONS = tuple(inspect.signature(offload).parameters)[1:]


def offload_reported(mod_or_func, **options):
    """:func:`offload` (``options`` as for it), and what it decided beyond the plan:
    ``(result, OffloadReport)``.  :func:`tir_byoc.build_model` keeps the report's declines in
    :attr:`tir_byoc.Model.declines`."""
    unknown = sorted(set(options) - set(_OFFLOAD_OPTIONS))
    if unknown:
        raise TypeError(
            f"tir_byoc.offload_reported: unexpected option(s) {', '.join(unknown)}; expected "
            f"those of tir_byoc.offload: {', '.join(_OFFLOAD_OPTIONS)}"
        )
    apply_options = {k: options.pop(k) for k in ("strict", "pack_weights") if k in options}
    return apply_reported(offload_plan(mod_or_func, **options), **apply_options)


@dataclass(frozen=True)
class OffloadReport:
    """What the offload of a Relax module decided beyond its plan, by timing or by the weights'
    values (so :func:`tir_byoc.explain` cannot tell it from the module).

    Attributes
    ----------
    paired : tuple of str
        Each 1 x 1 + depthwise pair fused into one call (:mod:`tir_byoc.conv_pairs`):
        ``main: lv12 -> lv13 -> fused_conv2d1_pair``.
    packed : tuple of str
        Each call site given packed weights (:mod:`tir_byoc.packing`).
    declines : tuple of Decline
        Each pair considered and not fused (:data:`~tir_byoc.decline.CONV_PAIR`), then each
        offloaded call's weight left plain (:data:`~tir_byoc.decline.WEIGHT_PACK`).
    """

    paired: tuple[str, ...] = ()
    packed: tuple[str, ...] = ()
    declines: tuple[Decline, ...] = ()

    @classmethod
    def of(cls, pairs, packs) -> OffloadReport:
        """The report of a :class:`~tir_byoc.conv_pairs.PairReport` and the
        :class:`~tir_byoc.packing.PackReport` that followed it."""
        return cls(tuple(pairs.paired), tuple(packs.packed), (*pairs.kept, *packs.kept))


def apply(planned, *, strict: bool = False, pack_weights: bool = True):
    """Rewrite what ``planned`` (a :class:`~tir_byoc.planning.Plan`) chose; see :func:`offload`."""
    return apply_reported(planned, strict=strict, pack_weights=pack_weights)[0]


def apply_reported(planned, *, strict: bool = False, pack_weights: bool = True):
    """:func:`apply`, and what it decided beyond the plan: ``(result, OffloadReport)``."""
    # Step 1. Every match gets an intrinsic, or (strict) nothing happens.
    missing = [c for c in planned.choices if c.intrinsic is None]
    if strict and missing:
        first = missing[0]
        raise ValueError(
            f"tir_byoc: {len(missing)} match(es) have no intrinsic; first: {first.func} "
            f"blocks {', '.join(first.blocks)} ({first.pattern}, {first.dtype}): {first.reason}"
        )
    for c in missing:
        logger.info("%s: %s left to TVM: %s", c.func, ", ".join(c.blocks), c.reason)
    # Step 2. Build and load the libraries before touching the IR.
    for backend in sorted(planned.backends):
        toolchain.load_backend(backend, planned.registry)
    # Step 3. Rewrite.
    result = planned.module.clone() if not planned.wrapped else planned.module
    rewritten = []
    for function in planned.functions:
        offloaded = list(planned.offloaded(function))
        if not offloaded:
            continue
        for m, intrinsic in offloaded:
            logger.info("%s: %s -> %s", m.func, ", ".join(m.blocks), intrinsic.name)
        result.update_func(function.gvar, rewrite_function(function.func, offloaded))
        rewritten.append((function.gvar, function.func, offloaded))
    if planned.wrapped:
        return next(iter(result.functions.values())), OffloadReport()
    # Step 4. Relax modules: each 1 x 1 + depthwise pair of constant weights made one call
    # where oneDNN's fused primitive is faster, then the other constant weights packed once,
    # here, into the library's layout.
    if pack_weights and any(isinstance(f, relax.Function) for f in result.functions.values()):
        result, pairs = pair_convolutions(result, rewritten, planned.registry)
        result, packs = pack_constant_weights(result, rewritten, rewrite_function, planned.registry)
        for decline in packs.kept:
            logger.info("not packed: %s: %s", decline.where, decline.reason)
        return result, OffloadReport.of(pairs, packs)
    return result, OffloadReport()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.Offload")
class Offload:
    """:func:`offload` as a module pass, for ``tvm.transform.Sequential`` pipelines.

    Parameters
    ----------
    backends, strict, registry, fold_transposes, pack_weights
        As for :func:`offload`.
    """

    def __init__(
        self,
        backends=None,
        strict: bool = False,
        registry: Registry = REGISTRY,
        fold_transposes: bool = True,
        pack_weights: bool = True,
    ):
        self.backends = backends
        self.strict = strict
        self.registry = registry
        self.fold_transposes = fold_transposes
        self.pack_weights = pack_weights

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return offload(
            mod,
            backends=self.backends,
            strict=self.strict,
            registry=self.registry,
            fold_transposes=self.fold_transposes,
            pack_weights=self.pack_weights,
        )
