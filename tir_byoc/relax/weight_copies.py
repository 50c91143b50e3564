"""Fold weight copies into the GEMMs that read them: a Relax matmul on a transposed or broadcast
weight served by an intrinsic on the weight itself.

Relax copies a weight before multiplying by it in two forms.  ``nn.Linear`` lowers to a
``transpose`` PrimFunc that copies the (N, K) weight W into a (K, N) tensor, and a Linear on a
non-contiguous input (``torch.export`` writes ``expand`` + ``bmm``) to
``fused_transpose_broadcast_to``, which copies W into a (B, K, N) tensor T with
``T[b, k, j] = W[j, k]``.  Both run on every call; the second makes the GEMM a batched matmul.
Read through the copy, the GEMM is ``Y[..., i, j] += X[..., i, k] * W[j, k]``: a ``dense``
(or ``batch_dense``, leading batch dims folded into M) on W, with no copy at all.

Entry point: :class:`FoldWeightCopies`, the module pass, run by :func:`tir_byoc.offload` on a
lowered Relax module before it plans (:mod:`tir_byoc.relax.pipeline`).  :func:`find` gives the
folds (:class:`WeightCopyFold`) and the refusals (:class:`~tir_byoc.decline.Decline`),
:func:`rewrite` makes the folds.  For each ``R.call_tir(callee, (..., t, ...))`` whose
argument ``t`` is bound to ``R.call_tir(copy, (w,))`` and read by a GEMM-like block of
``callee`` (:func:`tir_byoc.relax.copy_sites.copy_sites`), the fold

1. proves that ``copy`` makes ``T[e] = W[f(e)]`` for every index ``e`` of T, where ``f``
   permutes axes and drops broadcast ones (:func:`tir_byoc.relax.copy_map.copy_map`);
2. rewrites ``callee`` to read W instead of T, every ``T[e]`` becoming ``W[f(e)]``
   (:func:`tir_byoc.relax.copy_map.read_through_copy`), and keeps that only if each
   GEMM-like block that read T is then part of a match reading W that an intrinsic serves
   (the ``plan_function`` given to :func:`find` says);
3. passes ``w`` instead of ``t`` at every call site of ``callee`` (all of them must pass such
   a copy, made by the same ``f``), and drops the binding of ``t`` when nothing else uses it.

Step 2 also requires T to be read only in the callee's GEMM-like blocks: since no other block
changes, no other chain of the callee can match differently.

Every refusal is kept as a :class:`~tir_byoc.decline.Decline` of kind
:data:`~tir_byoc.decline.WEIGHT_COPY` (``func``: the callee, ``blocks``: its GEMM blocks that
read the copy, ``reason``: what they read, who makes it, and the first condition that failed,
``nearest``: the pattern the callee came closest to when reading the tensor copied), which
:func:`tir_byoc.explain` and ``tir-byoc explain`` list next to the matcher's.  A producer
that is not a proven copy is not a candidate at all (most are reshapes or arithmetic on
activations); :func:`~tir_byoc.relax.copy_map.copy_map` says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax, tirx

from ..decline import WEIGHT_COPY, Decline, Declined
from .copy_map import read_through_copy
from .copy_sites import CopySite, copy_sites, indexed_bindings, references

logger = logging.getLogger("tir_byoc")

#: ``plan_function(name, func)``: the :class:`~tir_byoc.planning.FunctionPlan` of the PrimFunc
#: ``func`` named ``name`` (its ``choices`` and its ``scan``).
PlanFunction = Callable[[str, tirx.PrimFunc], object]


@dataclass(frozen=True)
class WeightCopyFold:
    """A callee that reads the tensors copied instead of the copies.

    Attributes
    ----------
    callee : str
        The PrimFunc rewritten.
    args : tuple of int
        Its parameters that now take the tensor copied, in order.
    func : tvm.tirx.PrimFunc
        The callee rewritten (:func:`~tir_byoc.relax.copy_map.read_through_copy`).
    sites : tuple of CopySite
        The call sites that pass a copy for one of ``args``: each passes the tensor copied.
    """

    callee: str
    args: tuple[int, ...]
    func: tirx.PrimFunc
    sites: tuple[CopySite, ...]


def find(
    mod: tvm.IRModule, plan_function: PlanFunction
) -> tuple[tuple[WeightCopyFold, ...], tuple[Decline, ...]]:
    """``(sites, declines)``: the callees of ``mod`` whose copied weights fold, and the copies
    that still feed a GEMM, each with the reason, by callee name.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module with PrimFuncs (e.g. after ``FuseTIR``).
    plan_function : callable
        ``plan_function(name, func)``: the :class:`~tir_byoc.planning.FunctionPlan` of the
        PrimFunc ``func`` named ``name`` (its ``choices`` and its ``scan``).
        :func:`tir_byoc.offload` passes its planner's, so each callee is scanned once.
    """
    sites, calls = copy_sites(mod)
    counts = references(mod)
    by_callee: dict[str, dict[int, list[CopySite]]] = {}
    for site in sites:
        by_callee.setdefault(site.callee, {}).setdefault(site.arg, []).append(site)
    # Decide, per callee parameter, whether folding is proven and useful.
    refusals, folds = [], []
    for callee in sorted(by_callee):
        groups = by_callee[callee]
        if counts[callee] != len(calls[callee]):
            why = Declined(f"{callee} is used other than by call_tir with tensor arguments")
            refusals += [_refusal(s, mod[callee], why) for g in groups.values() for s in g]
            continue
        func, args, refused = _fold_parameters(mod[callee], callee, groups, calls, plan_function)
        if args:
            folded = tuple(s for s in sites if s.callee == callee and s.arg in args)
            folds.append(WeightCopyFold(callee, tuple(args), func, folded))
        refusals += refused
    return tuple(folds), tuple(refusals)


def rewrite(mod: tvm.IRModule, sites: tuple[WeightCopyFold, ...]) -> tvm.IRModule:
    """``mod`` with the callees of ``sites`` replaced and their call sites passing the tensors
    copied; copies nothing uses any more are dropped.  ``mod`` itself when there is none;
    ``mod`` is never modified."""
    if not sites:
        return mod
    # Step 1. Replace the callees; their new signatures need new, re-typed global vars.
    result = mod.clone()
    for fold in sites:
        del result[fold.callee]
    builder = relax.BlockBuilder(result)
    gvars = {fold.callee: builder.add_func(fold.func, fold.callee) for fold in sites}
    result = builder.get()
    # Step 2. Rewrite the Relax functions that call them.
    done = [site for fold in sites for site in fold.sites]
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            own = [s for s in done if s.caller == gvar.name_hint]
            new_func = _rewrite_relax(func, own, gvars)
            if new_func is not func:
                result.update_func(result.get_global_var(gvar.name_hint), new_func)
    return result


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.FoldWeightCopies")
class FoldWeightCopies:
    """GEMMs on copied weights read the weights: :func:`find` (the refusals logged), then
    :func:`rewrite`.

    Parameters
    ----------
    plan_function : callable
        As for :func:`find`.
    """

    def __init__(self, plan_function: PlanFunction):
        self.plan_function = plan_function

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, refusals = find(mod, self.plan_function)
        for refusal in refusals:
            logger.info("%s", refusal)
        return rewrite(mod, sites)


def _fold_parameters(func, callee, groups, calls, plan_function):
    """``(func, args folded, refusals)``: the folds of one callee's parameters, composed.

    A parameter refused is tried again after another one was folded, since the callee it is
    judged on has changed (its weight may be what kept it from matching); the refusals are
    those of the last round.
    """
    pending, args = dict(sorted(groups.items())), []
    while True:
        refused = {}
        for arg, group in pending.items():
            try:
                func = _fold_callee(func, callee, arg, group, calls, plan_function)
                args.append(arg)
            except Declined as why:
                refused[arg] = (func, why)
        if len(refused) in (0, len(pending)):
            break
        pending = {arg: pending[arg] for arg in refused}
    refusals = [_refusal(s, base, why) for arg, (base, why) in refused.items() for s in groups[arg]]
    return func, sorted(args), refusals


def _refusal(site: CopySite, func, refused: Declined) -> Decline:
    """The GEMM blocks of ``site``'s callee still read the copy: what they read, who makes it
    on every call of whom, and ``refused``'s reason."""
    param = func.params[site.arg].name if site.arg < len(func.params) else f"argument {site.arg}"
    reason = (
        f"reads {param}, a copy that {site.made.producer} makes on every call of "
        f"{site.caller}; not folded: {refused.reason}"
    )
    return Decline(site.callee, site.blocks, WEIGHT_COPY, reason, refused.nearest)


def _fold_callee(func, callee, arg, group, calls, plan_function) -> tirx.PrimFunc:
    """``func`` reading the tensor copied at parameter ``arg``, or Declined saying why not."""
    # Step 1. Every call passes a copy made by the same map, whose source is in scope.
    sites = {s.binding.var for s in group}
    if any(b.var not in sites for b in calls[callee]):
        raise Declined(f"{callee} is also called with an argument {arg} that is not such a copy")
    maps = {s.made.copy for s in group}
    if len(maps) > 1:
        described = "; ".join(sorted(m.text for m in maps))
        raise Declined(f"the calls of {callee} pass copies made by different maps ({described})")
    hidden = next((s for s in group if s.out_of_scope), None)
    if hidden is not None:
        raise Declined(
            f"{hidden.made.source.name} is a dataflow variable of another block than the call"
        )
    # Step 2. Rewrite; only the GEMMs read the copy, so no other block can change.
    try:
        after = read_through_copy(func, arg, group[0].made.copy)
    except ValueError as err:
        raise Declined(str(err)) from None
    others = group[0].others
    if others:
        raise Declined(
            f"{func.params[arg].name} is also used by {', '.join(others)}, not only read by GEMMs"
        )
    # Step 3. Keep it only if each of those GEMMs is offloaded reading the tensor copied.
    _judge(callee, plan_function(callee, after), after.params[arg], group[0].blocks)
    return after


def _judge(callee: str, after, source, blocks) -> None:
    """Raise Declined unless each block of ``blocks`` (the GEMM-like blocks that read the copy)
    is part of a match of ``after`` that reads ``source`` and that an intrinsic serves."""
    what = f"reading the tensor copied, {callee}"
    reading = [c for c in after.choices if source.same_as(c.match.x) or source.same_as(c.match.w)]
    served = {b for c in reading if c.intrinsic for b in c.match.blocks}
    missing = [b for b in blocks if b not in served]
    if not missing:
        return
    unserved = next((c for c in reading if not c.intrinsic and missing[0] in c.match.blocks), None)
    if unserved is not None:
        raise Declined(
            f"{what} matches {unserved.pattern}, but no intrinsic serves it: {unserved.reason}",
            unserved.pattern,
        )
    rejection = next((r for r in after.scan.rejections if missing[0] in r.blocks), None)
    if rejection is not None:
        raise Declined(f"{what} is not matched: {rejection.reason}", rejection.nearest)
    raise Declined(f"{what} has no match of block {missing[0]} that reads it")


def _rewrite_relax(func: relax.Function, sites: list[CopySite], gvars) -> relax.Function:
    """Pass each site's copied tensor instead of the copy; drop copies left unused.

    ``sites`` are the folded call sites in ``func``.
    """
    replace: dict[relax.Var, dict[int, relax.Expr]] = {}
    for site in sites:
        replace.setdefault(site.binding.var, {})[site.arg] = site.made.source
    if not any(b.var in replace for _, b in indexed_bindings(func)):
        return func
    candidates = {s.copied for s in sites}
    # Step 1. New call_tir values.
    blocks = []
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            if binding.var in replace:
                value = binding.value
                fields = list(value.args[1].fields)
                for i, source in replace[binding.var].items():
                    fields[i] = source
                gvar = gvars[value.args[0].name_hint]
                call = relax.op.call_tir(gvar, relax.Tuple(fields), list(value.ty_args))
                call = relax.BlockBuilder().normalize(call)  # deduces the call's type
                binding = relax.VarBinding(binding.var, call, binding.span)
            bindings.append(binding)
        blocks.append((block, bindings))
    # Step 2. Drop the copies nothing uses any more.
    used = set()
    for _, bindings in blocks:
        for binding in bindings:
            used.update(relax.analysis.free_vars(binding.value))
    used.update(relax.analysis.free_vars(func.body.body))
    dead = {v for v in candidates if v not in used}
    new_blocks = []
    for block, bindings in blocks:
        kept = [b for b in bindings if b.var not in dead]
        new_blocks.append(type(block)(kept, block.span))
    body = relax.SeqExpr(new_blocks, func.body.body, func.body.span)
    new_func = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
    return relax.BlockBuilder().normalize(new_func)


__all__ = ["FoldWeightCopies", "WeightCopyFold", "find", "rewrite"]
