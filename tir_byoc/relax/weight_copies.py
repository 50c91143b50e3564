"""Fold weight copies into the GEMMs that read them: a Relax matmul on a transposed or broadcast
weight served by an intrinsic on the weight itself.

Relax copies a weight before multiplying by it in two forms.  ``nn.Linear`` lowers to a
``transpose`` PrimFunc that copies the (N, K) weight W into a (K, N) tensor, and a Linear on a
non-contiguous input (``torch.export`` writes ``expand`` + ``bmm``) to
``fused_transpose_broadcast_to``, which copies W into a (B, K, N) tensor T with
``T[b, k, j] = W[j, k]``.  Both run on every call; the second makes the GEMM a batched matmul.
Read through the copy, the GEMM is ``Y[..., i, j] += X[..., i, k] * W[j, k]``: a ``dense``
(or ``batch_dense``, leading batch dims folded into M) on W, with no copy at all.

Entry point: :func:`fold_weight_copies`.  For each ``R.call_tir(callee, (..., t, ...))``
whose argument ``t`` is bound to ``R.call_tir(copy, (w,))`` and read by a GEMM-like block of
``callee`` (a reduction of a product of two buffer elements), it

1. proves that ``copy`` makes ``T[e] = W[f(e)]`` for every index ``e`` of T, where ``f``
   permutes axes and drops broadcast ones (:func:`copy_map`);
2. rewrites ``callee`` to read W instead of T, every ``T[e]`` becoming ``W[f(e)]``
   (:func:`read_through_copy`), and keeps that only if each GEMM-like block that read T is
   then part of a match reading W that an intrinsic serves;
3. passes ``w`` instead of ``t`` at every call site of ``callee`` (all of them must pass such
   a copy, made by the same ``f``), and drops the binding of ``t`` when nothing else uses it.

A 2-D transpose is the case ``f(k, j) = (j, k)``.

What the proof of step 1 requires of ``copy`` (anything else is refused, with the condition
that failed):

- two buffer parameters, an input W (any Relax value: a constant, a parameter, a computed
  tensor) and an output T, of the same dtype, compact, in global memory, of static shapes
  (symbolic shapes are not proven yet);
- an S-TIR body made of allocations (``T.sblock_alloc_buffer`` or ``T.alloc_buffer``) and
  loop nests, each around one spatial block without init whose iterators are bound to loops
  of their own over their whole domains (:func:`tir_byoc.match.stir.check_binding`);
- each block stores ``Dst[v...] = Src[g(v...)]``: Dst is T or a buffer of the function's
  own, written by no other block, indexed by each iterator exactly once over its whole axis
  (so every element is written exactly once); Src is W or a buffer an earlier block wrote;
  the value is the element itself (no arithmetic, no cast); each index of Src is an iterator
  (each at most once) running over that whole axis, or 0 on an axis of extent 1 (so the block
  reads no slice);
- the blocks compose: following each element of T back through the blocks reaches W, which
  gives ``f``; every axis of W is either read whole or has extent 1.

Step 2 requires the callee to do nothing with T but read its elements (no store, no address
taken), and only in its GEMM-like blocks, and T's parameter to be a compact buffer of the
copy's shape and dtype.  Then each read ``T[e]`` of an index within T is ``W[f(e)]`` by step
1, so the rewrite computes what the callee computed; and since no other block changes, no
other chain of the callee can match differently.

Every refusal is kept as a :class:`Refusal` (:attr:`FoldReport.refusals`), which reads like a
:class:`~tir_byoc.match.Rejection` (``func``, ``blocks``, ``nearest``, ``reason``) so that
:func:`tir_byoc.explain` and ``tir-byoc explain`` list it next to the matcher's.  A producer
that is not a proven copy is not a candidate at all (most are reshapes or arithmetic on
activations); :func:`copy_map` says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from ..match.exprs import (
    const_value,
    dtype_of,
    expr_text,
    index_text,
    is_var,
    is_zero,
    operation_text,
    shape_of,
)
from ..match.records import Refused
from ..match.reduction import looks_like_gemm
from ..match.stir import (
    Extents,
    FunctionIndex,
    Nest,
    check_binding,
    compact_global,
    is_s_tir,
    is_spatial,
    unwrap_nest,
)

_CALL_TIR = ir.Op.get("relax.call_tir")


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CopyMap:
    """What :func:`copy_map` proves: ``T[e] = W[f(e)]`` for every index ``e`` of T.

    Attributes
    ----------
    dtype : str
        The element type of W and T.
    source_shape, shape : tuple of int
        The shapes of W and of T.
    dims : tuple of int or None
        ``f``, one entry per axis of W: the axis of T whose index it takes, or None for an
        axis of extent 1, read at 0.  Axes of T that no entry names are broadcast.
    """

    dtype: str
    source_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dims: tuple[int | None, ...]

    def source_indices(self, indices, zero) -> list:
        """``f(indices)``: the index of W holding the element of T at ``indices``."""
        return [zero if d is None else indices[d] for d in self.dims]

    @property
    def text(self) -> str:
        """``f`` as TVMScript reads it, e.g. ``T[e0, e1, e2] = W[e2, e1]``."""
        index = ", ".join(f"e{d}" for d in range(len(self.shape)))
        source = ", ".join("0" if d is None else f"e{d}" for d in self.dims)
        return f"T[{index}] = W[{source}]"


@dataclass(frozen=True)
class NotACopy:
    """Why a PrimFunc is not provably a copy (falsy, like the matcher's rejections)."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Refusal:
    """A copy that still feeds a GEMM, and why it was not folded.

    It reads like a :class:`~tir_byoc.match.Rejection`, so :func:`tir_byoc.explain` and the
    command line list it with the matcher's refusals.

    Attributes
    ----------
    func : str
        The PrimFunc that reads the copy (the callee).
    blocks : tuple of str
        Its GEMM-like blocks that read the copy.
    param : str
        The callee's parameter the copy is passed to.
    producer : str
        The PrimFunc that makes the copy.
    caller : str
        The Relax function that calls both.
    why : str
        The first condition that failed.
    nearest : str or None
        The pattern the callee came closest to when reading the tensor copied, if it got
        that far.
    """

    func: str
    blocks: tuple[str, ...]
    param: str
    producer: str
    caller: str
    why: str
    nearest: str | None = None

    @property
    def reason(self) -> str:
        return (
            f"reads {self.param}, a copy that {self.producer} makes on every call of "
            f"{self.caller}; not folded: {self.why}"
        )

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"{self.func}: block {', '.join(self.blocks)} {self.reason}"


@dataclass(frozen=True)
class FoldReport:
    """What :func:`fold_weight_copies` did.

    Attributes
    ----------
    folded : tuple of (str, int)
        PrimFuncs rewritten to read the tensor copied, with the parameter index.
    dropped : int
        Copy bindings removed because nothing used them any more.
    refusals : tuple of Refusal
        Copies that still feed a GEMM, with the reason.
    """

    folded: tuple[tuple[str, int], ...] = ()
    dropped: int = 0
    refusals: tuple[Refusal, ...] = field(default=())


# --------------------------------------------------------------------------------------
# Step 1. Is a PrimFunc a copy through a permutation and a broadcast?
# --------------------------------------------------------------------------------------


def copy_map(func: tirx.PrimFunc) -> CopyMap | NotACopy:
    """The map ``f`` with ``T[e] = W[f(e)]`` that ``func(W, T)`` computes, or why there is none.

    The conditions are those of the module docstring; the loop nests and the buffers are read
    with the matcher's own S-TIR facts (:mod:`tir_byoc.match.stir`), so the fold and the
    matcher agree on what they accept.
    """
    try:
        return _prove_copy(func)
    except Refused as refused:
        return NotACopy(refused.reason)


def _prove_copy(func: tirx.PrimFunc) -> CopyMap:
    # Step 1. The signature: one input and one output, plain arrays of one dtype.
    params = list(func.params)
    if len(params) != 2 or not all(tirx.is_buffer_var(p) for p in params):
        raise Refused(f"takes {len(params)} parameters; a copy takes two buffers (W, T)")
    source, out = params
    if dtype_of(source) != dtype_of(out):
        raise Refused(f"converts {dtype_of(source)} to {dtype_of(out)}")
    for buf in params:
        _plain_array(buf)
    if not is_s_tir(func):
        raise Refused("not an S-TIR function")
    # Step 2. The body: allocations and loop nests around one block each, nothing else.
    root = func.body.block
    if root.match_buffers or root.init is not None:
        raise Refused("its root block declares buffer views or an init")
    local = set(root.alloc_buffers)
    nests = []
    for stmt in _statements(root.body):
        if isinstance(stmt, tirx.AllocBuffer):
            local.add(stmt.buffer)
            continue
        found = unwrap_nest(stmt)
        if found is None:
            kind = type(stmt).__name__
            raise Refused(f"its body holds a {kind} that is not a loop nest around one block")
        loops, realize = found
        nests.append(Nest(stmt, loops, realize, realize.block, -1, len(nests)))
    # Step 3. Each block copies a buffer whole into a fresh one; the maps compose.
    extents = Extents()
    maps = {source: tuple(range(len(shape_of(source))))}
    for nest in nests:
        dst, src, dims = _copy_block(nest, local | {out}, maps, extents)
        maps[dst] = tuple(None if axis is None else dims[axis] for axis in maps[src])
    if out not in maps:
        raise Refused(f"no block writes its output {out.name}")
    copy = CopyMap(dtype_of(out), _static(source), _static(out), maps[out])
    # Step 4. Every axis of W is read whole or has extent 1 (by construction; checked).
    for axis, dim in enumerate(copy.dims):
        expected = 1 if dim is None else copy.shape[dim]
        if copy.source_shape[axis] != expected:
            raise Refused(f"axis {axis} of {source.name} is not read whole")
    return copy


def _statements(stmt) -> list:
    return list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]


def _static(buf) -> tuple[int, ...]:
    values = tuple(const_value(d) for d in shape_of(buf))
    if None in values:
        shape = ", ".join(expr_text(d) for d in shape_of(buf))
        raise Refused(
            f"buffer {buf.name} has a symbolic shape ({shape}); only static shapes are proven"
        )
    return values


def _plain_array(buf) -> None:
    reason = compact_global(buf)
    if reason:
        raise Refused(reason)
    _static(buf)


def _copy_block(nest: Nest, writable: set, maps: dict, extents: Extents):
    """``(Dst, Src, dims)`` of a block ``Dst[v...] = Src[g(v...)]``: per axis of Src, the
    axis of Dst whose iterator indexes it, or None for 0 on an axis of extent 1."""
    block = nest.block
    name = block.name_hint
    if (
        not is_spatial(block)
        or block.init is not None
        or block.alloc_buffers
        or block.match_buffers
    ):
        raise Refused(f"block {name} is not a plain elementwise block")
    store = block.body
    dst, load = store.buffer, store.value
    # Step 1. The value is an element of the input or of a buffer written whole before.
    if not isinstance(load, ir.TensorLoad):
        raise Refused(f"block {name} stores {operation_text(load)}, not an element it copies")
    src = load.source
    if src not in maps:
        raise Refused(f"block {name} reads {src.name}, which no earlier block wrote")
    if dtype_of(src) != dtype_of(dst):
        raise Refused(f"block {name} converts {dtype_of(src)} to {dtype_of(dst)}")
    # Step 2. The block writes each element of a fresh buffer exactly once.
    check_binding(nest, extents)
    if dst not in writable:
        raise Refused(f"block {name} writes {dst.name}, which is neither the output nor its own")
    if dst in maps:
        raise Refused(f"block {name} writes {dst.name}, which an earlier block wrote")
    _plain_array(dst)
    iters = {iv.var: iv.dom.extent for iv in block.iter_vars}
    written = {}
    for axis, (index, extent) in enumerate(zip(store.indices, shape_of(dst))):
        var = _iterator(index, iters)
        if var is None or var in written:
            raise Refused(
                f"block {name} writes {dst.name}{index_text(store)}, not one iterator per axis"
            )
        if not extents.equal(iters[var], extent):
            raise Refused(f"block {name} writes part of axis {axis} of {dst.name}")
        written[var] = axis
    if len(written) != len(iters):
        raise Refused(f"block {name} writes elements of {dst.name} more than once")
    # Step 3. Each index of Src is an iterator over its whole axis, or 0 on an axis of 1.
    dims, read = [], set()
    for axis, (index, extent) in enumerate(zip(load.indices, shape_of(src))):
        if is_zero(index) and extents.equal(extent, 1):
            dims.append(None)
            continue
        var = _iterator(index, iters)
        if var is None or var in read:
            raise Refused(
                f"block {name} reads {src.name} indexed by {expr_text(index)} on axis {axis}, "
                "not by an iterator of its own or by 0 on an axis of 1"
            )
        if not extents.equal(iters[var], extent):
            raise Refused(
                f"block {name} reads a slice of {src.name}: {var.name} runs over "
                f"{expr_text(iters[var])} of {expr_text(extent)} on axis {axis}"
            )
        read.add(var)
        dims.append(written[var])
    return dst, src, tuple(dims)


def _iterator(index, iters) -> tirx.Var | None:
    return next((v for v in iters if is_var(index, v)), None)


# --------------------------------------------------------------------------------------
# Step 2. Rewrite a callee to read the tensor copied.
# --------------------------------------------------------------------------------------


def _source_param(old, copy: CopyMap):
    ty = old.ty
    index_dtype = dtype_of(ty.shape[0]) if len(ty.shape) else "int64"
    buffer_type = _tirx_ffi.BufferType(
        ty.storage_scope,
        ty.dtype,
        [tirx.IntImm(index_dtype, extent) for extent in copy.source_shape],
        [],
        ty.elem_offset,
        ty.data_alignment,
        ty.offset_factor,
        None,
        (),
        None,
    )
    return _tirx_ffi.BufferVar(old.name, buffer_type, None)


def read_through_copy(func: tirx.PrimFunc, index: int, copy: CopyMap) -> tirx.PrimFunc:
    """``func`` with parameter ``index`` (the output T of ``copy``) replaced by its input W.

    Every ``T[e]`` becomes ``W[f(e)]``, and every region of T the region of W it reads.

    Raises
    ------
    ValueError
        If the parameter is not a compact buffer of the copy's shape and dtype, or ``func``
        does anything with it but read its elements.
    """
    old = func.params[index]
    if not tirx.is_buffer_var(old):
        raise ValueError(f"parameter {index} of the callee is not a buffer")
    reason = compact_global(old)
    if reason:
        raise ValueError(reason)
    shape = tuple(const_value(d) for d in shape_of(old))
    if None in shape:
        raise ValueError(f"parameter {old.name} has a symbolic shape")
    if shape != copy.shape or dtype_of(old) != copy.dtype:
        raise ValueError(
            f"parameter {old.name} is {dtype_of(old)} {list(shape)}, the copy makes "
            f"{copy.dtype} {list(copy.shape)}"
        )
    new = _source_param(old, copy)

    def on_load(load, mutator):
        load = mutator.default_mutate(load)
        if not load.source.same_as(old):
            return load
        zero = tirx.IntImm(dtype_of(load.indices[0]) if len(load.indices) else "int64", 0)
        return tirx.BufferLoad(new, copy.source_indices(list(load.indices), zero))

    def on_region(region, mutator):
        if not region.source.same_as(old):
            return mutator.default_mutate(region)
        ranges = list(region.region)
        dtype = dtype_of(ranges[0].min) if ranges else "int64"
        whole = ir.Range.from_min_extent(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, 1))
        return tirx.BufferRegion(new, copy.source_indices(ranges, whole))

    body = tvm_ffi.structural_mutate(
        func.body, [(ir.TensorLoad, on_load), (ir.TensorRegion, on_region)]
    )
    left = []
    tvm_ffi.structural_walk(body, (ir.Var, lambda v: left.append(v) if v.same_as(old) else None))
    if left:
        raise ValueError(f"the callee writes {old.name} or takes its address, not only reads it")
    params = [new if i == index else p for i, p in enumerate(func.params)]
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs, func.span)


# --------------------------------------------------------------------------------------
# Step 3. The Relax side: find copies feeding GEMMs, fold, drop.
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Copy:
    """A binding ``t = call_tir(producer, (source,))`` whose producer is a proven copy."""

    source: relax.Expr
    producer: str
    block: int  # index of the binding block holding it
    copy: CopyMap


@dataclass(frozen=True)
class _Site:
    """One call_tir argument bound to a copy, read by GEMM-like blocks of the callee."""

    caller: str
    binding: relax.VarBinding
    arg: int
    made: _Copy
    copied: relax.Var
    blocks: tuple[str, ...]  # the callee's GEMM-like blocks that read the copy
    others: tuple[str, ...]  # what else in the callee uses it ("block X", "other code")
    out_of_scope: bool  # the source is a dataflow variable of another block

    @property
    def callee(self) -> str:
        return self.binding.value.args[0].name_hint


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


class _Finder:
    """The copies and the GEMM readers of a module, each PrimFunc analysed once, and only
    when a call passes it what might be a copy: most producers are not worth proving."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self._maps: dict[str, CopyMap | NotACopy] = {}
        self._readers: dict[str, dict[int, tuple[str, ...]]] = {}
        self._indexes: dict[str, FunctionIndex] = {}

    def copy_of(self, gvar) -> CopyMap | NotACopy:
        name = gvar.name_hint
        if name not in self._maps:
            func = self.mod[gvar]
            is_prim = isinstance(func, tirx.PrimFunc)
            self._maps[name] = copy_map(func) if is_prim else NotACopy("not a PrimFunc")
        return self._maps[name]

    def gemm_readers(self, gvar) -> dict[int, tuple[str, ...]]:
        """Parameter index -> the GEMM-like blocks of the PrimFunc ``gvar`` that read it."""
        name = gvar.name_hint
        if name not in self._readers:
            func = self.mod[gvar]
            self._readers[name] = _gemm_readers(func) if isinstance(func, tirx.PrimFunc) else {}
        return self._readers[name]

    def other_users(self, gvar, arg: int, blocks) -> tuple[str, ...]:
        """What uses parameter ``arg`` of ``gvar`` besides ``blocks``."""
        name = gvar.name_hint
        if name not in self._indexes:
            self._indexes[name] = FunctionIndex(self.mod[gvar])
        index = self._indexes[name]
        positions = [p for p, nest in enumerate(index.nests) if nest.name in blocks]
        return tuple(sorted(set(index.other_users(self.mod[gvar].params[arg], *positions))))

    @staticmethod
    def producers(func: relax.Function) -> dict[relax.Var, tuple]:
        """Vars of ``func`` bound to a call_tir of one tensor: ``(callee, input, block)``."""
        found = {}
        for block, binding in _bindings(func):
            value = binding.value
            if isinstance(binding, relax.VarBinding) and _call_tir(value):
                if len(value.args[1].fields) == 1:
                    found[binding.var] = (value.args[0], value.args[1].fields[0], block)
        return found


def _gemm_readers(func: tirx.PrimFunc) -> dict[int, tuple[str, ...]]:
    if is_s_tir(func):
        blocks = []
        tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
    else:
        blocks = [nest.block for nest in FunctionIndex(func).nests]
    readers: dict[int, list[str]] = {}
    for block in blocks:
        if not looks_like_gemm(block):
            continue
        loaded = []
        tvm_ffi.structural_walk(block.body, (ir.TensorLoad, lambda ld: loaded.append(ld.source)))
        for i, param in enumerate(func.params):
            if any(param.same_as(source) for source in loaded):
                readers.setdefault(i, []).append(block.name_hint)
    return {i: tuple(names) for i, names in readers.items()}


def _sites(mod: tvm.IRModule):
    """Every call_tir argument bound to a copy that a GEMM reads; every call_tir by callee."""
    finder = _Finder(mod)
    sites, calls = [], {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        producers = finder.producers(func)
        for block, binding in _bindings(func):
            value = binding.value
            if not _call_tir(value):
                continue
            callee = value.args[0]
            calls.setdefault(callee.name_hint, []).append(binding)
            for i, arg in enumerate(value.args[1].fields):
                if not (isinstance(arg, relax.Var) and arg in producers):
                    continue
                blocks = finder.gemm_readers(callee).get(i)
                producer, source, defined_in = producers[arg]
                made = finder.copy_of(producer) if blocks else None
                if not made:
                    continue
                copy = _Copy(source, producer.name_hint, defined_in, made)
                others = finder.other_users(callee, i, blocks)
                hidden = isinstance(source, relax.DataflowVar) and defined_in != block
                sites.append(_Site(gvar.name_hint, binding, i, copy, arg, blocks, others, hidden))
    return sites, calls


def _references(mod: tvm.IRModule) -> Counter:
    """How often each global function is named in the module's Relax functions."""
    counts = Counter()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, (ir.GlobalVar, lambda g: counts.update([g.name_hint])))
    return counts


def fold_weight_copies(
    mod: tvm.IRModule, plan_function: Callable[[str, tirx.PrimFunc], object]
) -> tuple[tvm.IRModule, FoldReport]:
    """Serve GEMMs on copied weights (transposed, broadcast) by intrinsics on the weights.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module with PrimFuncs (e.g. after ``FuseTIR``).  Not modified.
    plan_function : callable
        ``plan_function(name, func)``: the :class:`~tir_byoc.planning.FunctionPlan` of the
        PrimFunc ``func`` named ``name`` (its ``choices`` and its ``scan``).
        :func:`tir_byoc.plan` passes its own planner, so each callee is scanned once.

    Returns
    -------
    (tvm.IRModule, FoldReport)
        The module (``mod`` itself if nothing was folded) and what was done.
    """
    sites, calls = _sites(mod)
    references = _references(mod)
    by_callee: dict[str, dict[int, list[_Site]]] = {}
    for site in sites:
        by_callee.setdefault(site.callee, {}).setdefault(site.arg, []).append(site)
    # Step 1. Decide, per callee parameter, whether folding is proven and useful.
    refusals, rewritten, folded = [], {}, []
    for callee in sorted(by_callee):
        groups = by_callee[callee]
        if references[callee] != len(calls[callee]):
            why = Refused(f"{callee} is used other than by call_tir with tensor arguments")
            refusals += [_refusal(s, mod[callee], why) for g in groups.values() for s in g]
            continue
        func, args, refused = _fold_parameters(mod[callee], callee, groups, calls, plan_function)
        if args:
            rewritten[callee] = func
            folded += [(callee, arg) for arg in args]
        refusals += refused
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
    done = [s for s in sites if (s.callee, s.arg) in chosen]
    dropped = 0
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            own = [s for s in done if s.caller == gvar.name_hint]
            new_func, count = _rewrite_relax(func, own, gvars)
            if new_func is not func:
                result.update_func(result.get_global_var(gvar.name_hint), new_func)
            dropped += count
    return result, FoldReport(tuple(folded), dropped, tuple(refusals))


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
            except Refused as why:
                refused[arg] = (func, why)
        if len(refused) in (0, len(pending)):
            break
        pending = {arg: pending[arg] for arg in refused}
    refusals = [_refusal(s, base, why) for arg, (base, why) in refused.items() for s in groups[arg]]
    return func, sorted(args), refusals


def _refusal(site: _Site, func, refused: Refused) -> Refusal:
    param = func.params[site.arg].name if site.arg < len(func.params) else f"argument {site.arg}"
    return Refusal(
        site.callee,
        site.blocks,
        param,
        site.made.producer,
        site.caller,
        refused.reason,
        refused.nearest,
    )


def _fold_callee(func, callee, arg, group, calls, plan_function) -> tirx.PrimFunc:
    """``func`` reading the tensor copied at parameter ``arg``, or Refused saying why not."""
    # Step 1. Every call passes a copy made by the same map, whose source is in scope.
    sites = {s.binding.var for s in group}
    if any(b.var not in sites for b in calls[callee]):
        raise Refused(f"{callee} is also called with an argument {arg} that is not such a copy")
    maps = {s.made.copy for s in group}
    if len(maps) > 1:
        described = "; ".join(sorted(m.text for m in maps))
        raise Refused(f"the calls of {callee} pass copies made by different maps ({described})")
    hidden = next((s for s in group if s.out_of_scope), None)
    if hidden is not None:
        raise Refused(
            f"{hidden.made.source.name} is a dataflow variable of another block than the call"
        )
    # Step 2. Rewrite; only the GEMMs read the copy, so no other block can change.
    try:
        after = read_through_copy(func, arg, group[0].made.copy)
    except ValueError as err:
        raise Refused(str(err)) from None
    others = group[0].others
    if others:
        raise Refused(
            f"{func.params[arg].name} is also used by {', '.join(others)}, not only read by GEMMs"
        )
    # Step 3. Keep it only if each of those GEMMs is offloaded reading the tensor copied.
    _judge(callee, plan_function(callee, after), after.params[arg], group[0].blocks)
    return after


def _judge(callee: str, after, source, blocks) -> None:
    """Raise Refused unless each block of ``blocks`` (the GEMM-like blocks that read the copy)
    is part of a match of ``after`` that reads ``source`` and that an intrinsic serves."""
    what = f"reading the tensor copied, {callee}"
    reading = [c for c in after.choices if source.same_as(c.match.x) or source.same_as(c.match.w)]
    served = {b for c in reading if c.intrinsic for b in c.match.blocks}
    missing = [b for b in blocks if b not in served]
    if not missing:
        return
    unserved = next((c for c in reading if not c.intrinsic and missing[0] in c.match.blocks), None)
    if unserved is not None:
        raise Refused(
            f"{what} matches {unserved.pattern}, but no intrinsic serves it: {unserved.reason}",
            unserved.pattern,
        )
    rejection = next((r for r in after.scan.rejections if missing[0] in r.blocks), None)
    if rejection is not None:
        raise Refused(f"{what} is not matched: {rejection.reason}", rejection.nearest)
    raise Refused(f"{what} has no match of block {missing[0]} that reads it")


def _rewrite_relax(func: relax.Function, sites: list[_Site], gvars) -> tuple[relax.Function, int]:
    """Pass each site's copied tensor instead of the copy; drop copies left unused.

    ``sites`` are the folded call sites in ``func``.
    """
    replace: dict[relax.Var, dict[int, relax.Expr]] = {}
    for site in sites:
        replace.setdefault(site.binding.var, {})[site.arg] = site.made.source
    if not any(b.var in replace for _, b in _bindings(func)):
        return func, 0
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
    return relax.BlockBuilder().normalize(new_func), len(dead)


__all__ = [
    "CopyMap",
    "FoldReport",
    "NotACopy",
    "Refusal",
    "copy_map",
    "fold_weight_copies",
    "read_through_copy",
]
