"""Serve a Relax matmul on a transposed weight with the dense intrinsic on the original weight.

Relax lowers ``nn.Linear`` to two PrimFuncs: a ``transpose`` of the (N, K) weight into a fresh
(K, N) tensor, run on every call, and a matmul against that tensor.  Offloaded as it is, the
matmul calls a ``matmul`` intrinsic and the transpose stays, copying the weight each time.

Entry point: :func:`fold_weight_transposes`.  For each ``R.call_tir(callee, (..., t, ...))``
whose argument ``t`` is bound to ``R.call_tir(transpose, (w,))``, it

1. proves that ``transpose`` is a full 2-D transpose (``B[i, j] = A[j, i]`` over the whole of
   ``B``, nothing else), by the semantics of its single block, as the matcher does;
2. rewrites ``callee`` to read the weight through a parameter of the original (N, K) layout
   (every ``W[a, b]`` becomes ``W'[b, a]``; the weight must only be read), and keeps that only
   if the rewritten reduction is matched as a ``dense`` pattern that an intrinsic serves;
3. passes ``w`` instead of ``t`` at every call site of ``callee`` (all of them must be such
   transposes), and drops the binding of ``t`` when nothing else uses it.

Anything that cannot be proven is left as it was, with the reason in :class:`Refusal` records
(:attr:`FoldReport.refusals`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import ir, relax, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from .match.records import Refused
from .match.stir import (
    Extents,
    Nest,
    check_binding,
    compact_global,
    is_s_tir,
    is_spatial,
    unwrap_nest,
)

_CALL_TIR = ir.Op.get("relax.call_tir")


@dataclass(frozen=True)
class Refusal:
    """A transpose feeding a PrimFunc that was not folded, and why."""

    func: str
    transpose: str
    callee: str
    reason: str

    def __str__(self) -> str:
        return f"{self.func}: {self.transpose} -> {self.callee} kept the transpose: {self.reason}"


@dataclass(frozen=True)
class FoldReport:
    """What :func:`fold_weight_transposes` did.

    Attributes
    ----------
    folded : tuple of (str, int)
        PrimFuncs rewritten to take their weight untransposed, with the parameter index.
    dropped : int
        ``transpose`` call bindings removed because nothing used them any more.
    refusals : tuple of Refusal
        Transposes that still feed a PrimFunc, with the reason.
    """

    folded: tuple[tuple[str, int], ...] = ()
    dropped: int = 0
    refusals: tuple[Refusal, ...] = field(default=())


# --------------------------------------------------------------------------------------
# Step 1. Is a PrimFunc a full 2-D transpose?
# --------------------------------------------------------------------------------------


def _compact_2d(var) -> bool:
    return len(var.ty.shape) == 2 and compact_global(var) is None


def transpose_refusal(func: tirx.PrimFunc) -> str | None:
    """Why ``func`` is not provably ``B[i, j] = A[j, i]`` over all of B, or None if it is.

    The loop nest, its binding and the buffers are read with the matcher's own S-TIR facts
    (:mod:`tir_byoc.match.stir`), so the fold and the matcher agree on what they accept.
    """
    params = list(func.params)
    if len(params) != 2 or not all(tirx.is_buffer_var(p) for p in params):
        return f"takes {len(params)} parameters, a transpose takes two buffers"
    a, b = params
    if not (_compact_2d(a) and _compact_2d(b)):
        return "its buffers are not compact 2-D global arrays"
    if str(a.ty.dtype) != str(b.ty.dtype):
        return f"converts {a.ty.dtype} to {b.ty.dtype}"
    extents = Extents()
    (a_rows, a_cols), (b_rows, b_cols) = a.ty.shape, b.ty.shape
    if not (extents.equal(a_rows, b_cols) and extents.equal(a_cols, b_rows)):
        return f"shapes {list(a.ty.shape)} -> {list(b.ty.shape)} are not transposed"
    if not is_s_tir(func):
        return "not an S-TIR function"
    block = func.body.block
    if block.alloc_buffers or block.match_buffers or block.init is not None:
        return "its root block allocates or declares buffers"
    found = unwrap_nest(block.body)
    if found is None:
        return "its body is not one loop nest around one block"
    nest = Nest(block.body, *found, block=found[1].block, seq=-1, index=0)
    leaf = nest.block
    if (
        len(leaf.iter_vars) != 2
        or not is_spatial(leaf)
        or leaf.init is not None
        or leaf.alloc_buffers
        or leaf.match_buffers
    ):
        return f"block {leaf.name_hint} is not a plain 2-D elementwise block"
    # The iterators are bound to loops of their own, covering the whole of B in order.
    try:
        check_binding(nest, extents)
    except Refused as refused:
        return refused.reason
    for iter_var, extent in zip(leaf.iter_vars, (b_rows, b_cols)):
        if not extents.equal(iter_var.dom.extent, extent):
            return f"iterator {iter_var.var.name} does not cover the whole axis of {b.name}"
    vi, vj = (iv.var for iv in leaf.iter_vars)
    store, load = leaf.body, leaf.body.value
    if not (
        store.buffer.same_as(b)
        and len(store.indices) == 2
        and store.indices[0].same_as(vi)
        and store.indices[1].same_as(vj)
    ):
        return f"block {leaf.name_hint} does not write {b.name}[i, j]"
    if not (
        isinstance(load, ir.TensorLoad)
        and load.source.same_as(a)
        and len(load.indices) == 2
        and load.indices[0].same_as(vj)
        and load.indices[1].same_as(vi)
    ):
        return f"block {leaf.name_hint} does not store {a.name}[j, i] unchanged"
    return None


# --------------------------------------------------------------------------------------
# Step 2. Rewrite a callee to read its weight untransposed.
# --------------------------------------------------------------------------------------


def _transposed_param(var):
    ty = var.ty
    shape = [ty.shape[1], ty.shape[0]]
    buffer_type = _tirx_ffi.BufferType(
        ty.storage_scope,
        ty.dtype,
        shape,
        [],
        ty.elem_offset,
        ty.data_alignment,
        ty.offset_factor,
        None,
        (),
        None,
    )
    return _tirx_ffi.BufferVar(var.name, buffer_type, None)


def read_weight_untransposed(func: tirx.PrimFunc, index: int) -> tirx.PrimFunc:
    """``func`` with parameter ``index`` (a (K, N) buffer) replaced by its (N, K) transpose.

    Raises
    ------
    ValueError
        If the parameter is not a compact 2-D buffer that ``func`` only reads.
    """
    old = func.params[index]
    if not (tirx.is_buffer_var(old) and _compact_2d(old)):
        raise ValueError(f"parameter {index} of the callee is not a compact 2-D buffer")
    new = _transposed_param(old)

    def on_load(load, mutator):
        load = mutator.default_mutate(load)
        if load.source.same_as(old):
            return tirx.BufferLoad(new, [load.indices[1], load.indices[0]])
        return load

    def on_region(region, mutator):
        if region.source.same_as(old):
            return tirx.BufferRegion(new, [region.region[1], region.region[0]])
        return mutator.default_mutate(region)

    body = tvm_ffi.structural_mutate(
        func.body, [(ir.TensorLoad, on_load), (ir.TensorRegion, on_region)]
    )
    left = []
    tvm_ffi.structural_walk(body, (ir.Var, lambda v: left.append(v) if v.same_as(old) else None))
    if left:
        raise ValueError(f"the callee writes or takes the address of {old.name}, not only reads it")
    params = [new if i == index else p for i, p in enumerate(func.params)]
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs, func.span)


# --------------------------------------------------------------------------------------
# Step 3. The Relax side: find transposes feeding call_tir, fold, drop.
# --------------------------------------------------------------------------------------


@dataclass
class _Site:
    """One call_tir argument bound to a transpose's output."""

    func: str
    binding: relax.VarBinding
    arg: int
    transposed: relax.Var
    source: relax.Expr
    transpose: str
    out_of_scope: bool  # the source is a dataflow variable of another block


def _call_tir(value) -> bool:
    """A ``call_tir(gvar, (args...))`` without symbolic-shape arguments."""
    return (
        isinstance(value, ir.Call)
        and value.op.same_as(_CALL_TIR)
        and len(value.args) == 2
        and isinstance(value.args[1], relax.Tuple)
    )


def _bindings(func: relax.Function):
    """(block index, binding) for every binding of ``func``'s body."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [(i, b) for i, block in enumerate(body.blocks) for b in block.bindings]


def _transposes(mod: tvm.IRModule, func: relax.Function) -> dict:
    """Vars bound to ``call_tir`` of a proven transpose -> (input, transpose name, block)."""
    found = {}
    for block, binding in _bindings(func):
        value = binding.value
        if not (isinstance(binding, relax.VarBinding) and _call_tir(value)):
            continue
        if len(value.args[1].fields) != 1:
            continue
        callee = mod[value.args[0]]
        if isinstance(callee, tirx.PrimFunc) and transpose_refusal(callee) is None:
            found[binding.var] = (value.args[1].fields[0], value.args[0].name_hint, block)
    return found


def _sites(mod: tvm.IRModule):
    """Every call_tir argument bound to a transpose, and every call_tir site by callee."""
    sites, calls = [], {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        transposed = _transposes(mod, func)
        for block, binding in _bindings(func):
            value = binding.value
            if not _call_tir(value):
                continue
            calls.setdefault(value.args[0].name_hint, []).append(binding)
            for i, arg in enumerate(value.args[1].fields):
                if isinstance(arg, relax.Var) and arg in transposed:
                    source, name, defined_in = transposed[arg]
                    hidden = isinstance(source, relax.DataflowVar) and defined_in != block
                    sites.append(_Site(gvar.name_hint, binding, i, arg, source, name, hidden))
    return sites, calls


def fold_weight_transposes(
    mod: tvm.IRModule, served: Callable[[str, tirx.PrimFunc, tvm.ir.Var], bool]
) -> tuple[tvm.IRModule, FoldReport]:
    """Serve matmuls on transposed weights by dense intrinsics on the original weights.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module with PrimFuncs (e.g. after ``FuseTIR``).  Not modified.
    served : callable
        ``served(name, func, weight)``: True if ``func`` (named ``name``) has a match reading
        the buffer ``weight`` that an intrinsic serves.  :func:`tir_byoc.offload` passes its
        own scan.

    Returns
    -------
    (tvm.IRModule, FoldReport)
        The module (``mod`` itself if nothing was folded) and what was done.
    """
    sites, calls = _sites(mod)
    by_callee: dict[str, dict[int, list[_Site]]] = {}
    for site in sites:
        callee = site.binding.value.args[0].name_hint
        by_callee.setdefault(callee, {}).setdefault(site.arg, []).append(site)
    # Step 1. Decide, per callee parameter, whether folding is proven and useful; the folds
    # of several parameters of one callee compose.
    refusals, rewritten, folded = [], {}, []
    for callee in sorted(by_callee):
        for arg, group in sorted(by_callee[callee].items()):
            try:
                base = rewritten.get(callee, mod[callee])
                rewritten[callee] = _fold_callee(base, callee, arg, group, calls[callee], served)
                folded.append((callee, arg))
            except ValueError as refused:
                for site in group:
                    refusals.append(Refusal(site.func, site.transpose, callee, str(refused)))
    if not folded:
        return mod, FoldReport(refusals=tuple(refusals))
    # Step 2. Replace the callees; their new signatures need new, re-typed global vars.
    result = mod.clone()
    for callee in rewritten:
        del result[callee]
    builder = relax.BlockBuilder(result)
    gvars = {callee: builder.add_func(func, callee) for callee, func in rewritten.items()}
    result = builder.get()
    # Step 3. Rewrite the Relax functions that call them.
    chosen = set(folded)
    done = [s for s in sites if (s.binding.value.args[0].name_hint, s.arg) in chosen]
    dropped = 0
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new_func, count = _rewrite_relax(func, done, gvars)
            if new_func is not func:
                result.update_func(result.get_global_var(gvar.name_hint), new_func)
            dropped += count
    return result, FoldReport(tuple(folded), dropped, tuple(refusals))


def _fold_callee(func, callee, arg, group, calls, served) -> tirx.PrimFunc:
    """``func`` reading parameter ``arg`` untransposed, or ValueError saying why not."""
    if not isinstance(func, tirx.PrimFunc):
        raise ValueError(f"{callee} is not a PrimFunc")
    # Every call of the callee must pass a transpose at this position, or it cannot change.
    sites = {s.binding.var for s in group}
    if any(b.var not in sites for b in calls):
        raise ValueError(f"{callee} is also called with an untransposed argument {arg}")
    hidden = next((s for s in group if s.out_of_scope), None)
    if hidden is not None:
        raise ValueError(
            f"{hidden.source.name} is a dataflow variable of another block than the call"
        )
    if arg >= len(func.params):
        raise ValueError(f"{callee} has no parameter {arg}")
    rewritten = read_weight_untransposed(func, arg)
    if not served(callee, rewritten, rewritten.params[arg]):
        raise ValueError(
            f"no intrinsic serves {callee} with weight {func.params[arg].name} untransposed"
        )
    return rewritten


def _rewrite_relax(func: relax.Function, sites: list[_Site], gvars) -> tuple[relax.Function, int]:
    """Pass each site's transpose input instead of its output; drop transposes left unused."""
    replace: dict[relax.Var, dict[int, relax.Expr]] = {}
    for site in sites:
        replace.setdefault(site.binding.var, {})[site.arg] = site.source
    if not any(b.var in replace for _, b in _bindings(func)):
        return func, 0
    candidates = {s.transposed for s in sites}
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
    # Step 2. Drop the transposes nothing uses any more.
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
    return relax.BlockBuilder().normalize(new_func), len(dead)


__all__ = [
    "FoldReport",
    "Refusal",
    "fold_weight_transposes",
    "read_weight_untransposed",
    "transpose_refusal",
]
