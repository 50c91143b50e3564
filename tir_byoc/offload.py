"""The driver: scan a module, choose intrinsics, and rewrite.  Thin wrappers over one core.

Entry points: :func:`scan` (what would be offloaded, with the intrinsic chosen or the reason
none was), :func:`explain` (blocks that looked like candidates and why they were refused),
:func:`offload` and its module-pass form :class:`Offload`.

All three accept an ``IRModule`` (TIR-only or Relax with PrimFuncs) or a single ``PrimFunc``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from . import relax_transpose, toolchain
from .match import FunctionScan, Match, Rejection, scan_function
from .registry import REGISTRY, Registry, backend_order, choose
from .rewrite import rewrite_function

logger = logging.getLogger("tir_byoc")


@dataclass(frozen=True)
class _Plan:
    """Per PrimFunc: its global var, the scan, and the matches with intrinsics chosen."""

    gvar: tvm.ir.GlobalVar
    func: tirx.PrimFunc
    scan: FunctionScan
    matches: tuple[Match, ...]


def _as_module(mod_or_func) -> tuple[tvm.IRModule, bool]:
    if isinstance(mod_or_func, tirx.PrimFunc):
        name = (
            mod_or_func.attrs["global_symbol"]
            if mod_or_func.attrs and ("global_symbol" in mod_or_func.attrs)
            else "main"
        )
        return tvm.IRModule({str(name): mod_or_func}), True
    if isinstance(mod_or_func, tvm.IRModule):
        return mod_or_func, False
    raise TypeError(
        f"tir_byoc: expected a tvm.IRModule or a tvm.tirx.PrimFunc, "
        f"got {type(mod_or_func).__name__}"
    )


def _plan(mod: tvm.IRModule, backends, registry: Registry, scans: dict) -> list[_Plan]:
    """Each PrimFunc's scan and the intrinsic chosen per match.

    ``scans`` ({(name, func): FunctionScan}, keyed by object identity) carries scans across
    calls: the transpose fold scans each folded callee once, and the module plan reuses it.
    """
    order = backend_order(backends, registry)

    def unavailable(backend):
        return toolchain.unavailable(backend, registry)

    plans = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        key = (gvar.name_hint, func)
        found = scans.get(key)
        if found is None:
            found = scans[key] = scan_function(gvar.name_hint, func)
        matches = tuple(choose(m, registry, unavailable, order) for m in found.matches)
        plans.append(_Plan(gvar, func, found, matches))
    return plans


def _fold_transposes(mod: tvm.IRModule, backends, registry: Registry, scans) -> tvm.IRModule:
    """Relax modules: matmuls on a transposed weight become dense on the original weight."""
    if not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        return mod

    def served(name, func, weight) -> bool:
        plan = _plan(tvm.IRModule({name: func}), backends, registry, scans)[0]
        return any(m.intrinsic and m.w.same_as(weight) for m in plan.matches)

    folded, report = relax_transpose.fold_weight_transposes(mod, served)
    for refusal in report.refusals:
        logger.info("%s", refusal)
    return folded


def scan(
    mod_or_func,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
    fold_transposes: bool = True,
) -> list[Match]:
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
        Relax modules: report a matmul whose weight is a ``transpose`` of another tensor as
        the dense match :func:`offload` makes of it (see :mod:`tir_byoc.relax_transpose`).

    Returns
    -------
    list of Match
        Each with ``intrinsic`` set, or ``intrinsic=None`` and ``reason``.
    """
    mod, _ = _as_module(mod_or_func)
    scans = {}
    if fold_transposes:
        mod = _fold_transposes(mod, backends, registry, scans)
    return [m for plan in _plan(mod, backends, registry, scans) for m in plan.matches]


def explain(mod_or_func) -> list[Rejection]:
    """Blocks that looked like part of a chain but were not matched, with the reason.

    Returns
    -------
    list of Rejection
        Each names the function, the block, the nearest pattern and the first failed
        condition.
    """
    mod, _ = _as_module(mod_or_func)
    return [
        r
        for gvar, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
        for r in scan_function(gvar.name_hint, func).rejections
    ]


def offload(
    mod_or_func,
    *,
    backends: Iterable[str] | str | None = None,
    strict: bool = False,
    registry: Registry = REGISTRY,
    fold_transposes: bool = True,
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
        Relax modules: serve a matmul whose weight is a ``transpose`` of another tensor with
        the dense intrinsic on that tensor, and drop the transpose when nothing else uses it
        (see :mod:`tir_byoc.relax_transpose`).

    Returns
    -------
    tvm.IRModule or tvm.tirx.PrimFunc
        The same kind as the input.  Unmatched blocks and functions are kept as they were.
    """
    mod, wrapped = _as_module(mod_or_func)
    scans = {}
    if fold_transposes and not wrapped:
        mod = _fold_transposes(mod, backends, registry, scans)
    plans = _plan(mod, backends, registry, scans)
    # Step 1. Every match gets an intrinsic, or (strict) nothing happens.
    missing = [m for p in plans for m in p.matches if m.intrinsic is None]
    if strict and missing:
        first = missing[0]
        raise ValueError(
            f"tir_byoc: {len(missing)} match(es) have no intrinsic; first: {first.func} "
            f"blocks {', '.join(first.blocks)} ({first.pattern}, {first.dtype}): {first.reason}"
        )
    for m in missing:
        logger.info("%s: %s left to TVM: %s", m.func, ", ".join(m.blocks), m.reason)
    # Step 2. Build and load the libraries before touching the IR.
    used = {registry[m.intrinsic].backend for p in plans for m in p.matches if m.intrinsic}
    for backend in sorted(used):
        toolchain.load_backend(backend, registry)
    # Step 3. Rewrite.
    result = mod.clone() if not wrapped else mod
    for plan in plans:
        planned = [(m, registry[m.intrinsic]) for m in plan.matches if m.intrinsic]
        if not planned:
            continue
        for m, intrinsic in planned:
            logger.info("%s: %s -> %s", m.func, ", ".join(m.blocks), intrinsic.name)
        result.update_func(plan.gvar, rewrite_function(plan.func, planned))
    if wrapped:
        return next(iter(result.functions.values()))
    return result


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.Offload")
class Offload:
    """:func:`offload` as a module pass, for ``tvm.transform.Sequential`` pipelines.

    Parameters
    ----------
    backends, strict, registry, fold_transposes
        As for :func:`offload`.
    """

    def __init__(
        self,
        backends=None,
        strict: bool = False,
        registry: Registry = REGISTRY,
        fold_transposes: bool = True,
    ):
        self.backends = backends
        self.strict = strict
        self.registry = registry
        self.fold_transposes = fold_transposes

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return offload(
            mod,
            backends=self.backends,
            strict=self.strict,
            registry=self.registry,
            fold_transposes=self.fold_transposes,
        )
