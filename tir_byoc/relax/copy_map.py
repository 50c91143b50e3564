"""Is a PrimFunc a copy of a weight, and a GEMM's callee read through it: the S-TIR half of the
fold of weight copies (:mod:`tir_byoc.relax.weight_copies`).

Entry points: :func:`copy_map`, which proves that ``copy(W, T)`` makes ``T[e] = W[f(e)]`` for
every index ``e`` of T, where ``f`` permutes axes and drops broadcast ones (a 2-D transpose is
the case ``f(k, j) = (j, k)``), and :func:`read_through_copy`, which rewrites a callee to read W
instead of T, every ``T[e]`` becoming ``W[f(e)]``.

What the proof requires of ``copy`` (anything else is a :class:`~tir_byoc.decline.Decline`,
with the condition that failed):

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

The rewrite requires the callee to do nothing with T but read its elements (no store, no
address taken), and T's parameter to be a compact buffer of the copy's shape and dtype.  Then
each read ``T[e]`` of an index within T is ``W[f(e)]`` by the proof, so the rewrite computes
what the callee computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import ir, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from ..decline import COPY_PROOF, Decline, Declined
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
from ..match.stir import (
    Extents,
    Nest,
    check_binding,
    compact_global,
    is_s_tir,
    is_spatial,
    unwrap_nest,
)


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


# --------------------------------------------------------------------------------------
# Is a PrimFunc a copy through a permutation and a broadcast?
# --------------------------------------------------------------------------------------


def copy_map(func: tirx.PrimFunc, name: str = "copy") -> CopyMap | Decline:
    """The map ``f`` with ``T[e] = W[f(e)]`` that ``func(W, T)`` computes, or why there is none
    (a :class:`~tir_byoc.decline.Decline` of kind :data:`~tir_byoc.decline.COPY_PROOF`, naming
    the PrimFunc ``name``).

    The conditions are those of the module docstring; the loop nests and the buffers are read
    with the matcher's own S-TIR facts (:mod:`tir_byoc.match.stir`), so the fold and the
    matcher agree on what they accept.
    """
    try:
        return _prove_copy(func)
    except Declined as refused:
        return Decline(name, (), COPY_PROOF, refused.reason)


def _prove_copy(func: tirx.PrimFunc) -> CopyMap:
    # Step 1. The signature: one input and one output, plain arrays of one dtype.
    params = list(func.params)
    if len(params) != 2 or not all(tirx.is_buffer_var(p) for p in params):
        raise Declined(f"takes {len(params)} parameters; a copy takes two buffers (W, T)")
    source, out = params
    if dtype_of(source) != dtype_of(out):
        raise Declined(f"converts {dtype_of(source)} to {dtype_of(out)}")
    for buf in params:
        _plain_array(buf)
    if not is_s_tir(func):
        raise Declined("not an S-TIR function")
    # Step 2. The body: allocations and loop nests around one block each, nothing else.
    root = func.body.block
    if root.match_buffers or root.init is not None:
        raise Declined("its root block declares buffer views or an init")
    local = set(root.alloc_buffers)
    nests = []
    for stmt in _statements(root.body):
        if isinstance(stmt, tirx.AllocBuffer):
            local.add(stmt.buffer)
            continue
        found = unwrap_nest(stmt)
        if found is None:
            kind = type(stmt).__name__
            raise Declined(f"its body holds a {kind} that is not a loop nest around one block")
        loops, realize = found
        nests.append(Nest(stmt, loops, realize, realize.block, -1, len(nests)))
    # Step 3. Each block copies a buffer whole into a fresh one; the maps compose.
    extents = Extents()
    maps = {source: tuple(range(len(shape_of(source))))}
    for nest in nests:
        dst, src, dims = _copy_block(nest, local | {out}, maps, extents)
        maps[dst] = tuple(None if axis is None else dims[axis] for axis in maps[src])
    if out not in maps:
        raise Declined(f"no block writes its output {out.name}")
    copy = CopyMap(dtype_of(out), _static(source), _static(out), maps[out])
    # Step 4. Every axis of W is read whole or has extent 1 (by construction; checked).
    for axis, dim in enumerate(copy.dims):
        expected = 1 if dim is None else copy.shape[dim]
        if copy.source_shape[axis] != expected:
            raise Declined(f"axis {axis} of {source.name} is not read whole")
    return copy


def _statements(stmt) -> list:
    return list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]


def _static(buf) -> tuple[int, ...]:
    values = tuple(const_value(d) for d in shape_of(buf))
    if None in values:
        shape = ", ".join(expr_text(d) for d in shape_of(buf))
        raise Declined(
            f"buffer {buf.name} has a symbolic shape ({shape}); only static shapes are proven"
        )
    return values


def _plain_array(buf) -> None:
    reason = compact_global(buf)
    if reason:
        raise Declined(reason)
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
        raise Declined(f"block {name} is not a plain elementwise block")
    store = block.body
    dst, load = store.buffer, store.value
    # Step 1. The value is an element of the input or of a buffer written whole before.
    if not isinstance(load, ir.TensorLoad):
        raise Declined(f"block {name} stores {operation_text(load)}, not an element it copies")
    src = load.source
    if src not in maps:
        raise Declined(f"block {name} reads {src.name}, which no earlier block wrote")
    if dtype_of(src) != dtype_of(dst):
        raise Declined(f"block {name} converts {dtype_of(src)} to {dtype_of(dst)}")
    # Step 2. The block writes each element of a fresh buffer exactly once.
    check_binding(nest, extents)
    if dst not in writable:
        raise Declined(f"block {name} writes {dst.name}, which is neither the output nor its own")
    if dst in maps:
        raise Declined(f"block {name} writes {dst.name}, which an earlier block wrote")
    _plain_array(dst)
    iters = {iv.var: iv.dom.extent for iv in block.iter_vars}
    written = {}
    for axis, (index, extent) in enumerate(zip(store.indices, shape_of(dst))):
        var = _iterator(index, iters)
        if var is None or var in written:
            raise Declined(
                f"block {name} writes {dst.name}{index_text(store)}, not one iterator per axis"
            )
        if not extents.equal(iters[var], extent):
            raise Declined(f"block {name} writes part of axis {axis} of {dst.name}")
        written[var] = axis
    if len(written) != len(iters):
        raise Declined(f"block {name} writes elements of {dst.name} more than once")
    # Step 3. Each index of Src is an iterator over its whole axis, or 0 on an axis of 1.
    dims, read = [], set()
    for axis, (index, extent) in enumerate(zip(load.indices, shape_of(src))):
        if is_zero(index) and extents.equal(extent, 1):
            dims.append(None)
            continue
        var = _iterator(index, iters)
        if var is None or var in read:
            raise Declined(
                f"block {name} reads {src.name} indexed by {expr_text(index)} on axis {axis}, "
                "not by an iterator of its own or by 0 on an axis of 1"
            )
        if not extents.equal(iters[var], extent):
            raise Declined(
                f"block {name} reads a slice of {src.name}: {var.name} runs over "
                f"{expr_text(iters[var])} of {expr_text(extent)} on axis {axis}"
            )
        read.add(var)
        dims.append(written[var])
    return dst, src, tuple(dims)


def _iterator(index, iters) -> tirx.Var | None:
    return next((v for v in iters if is_var(index, v)), None)


# --------------------------------------------------------------------------------------
# A callee read through the copy
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


__all__ = ["CopyMap", "copy_map", "read_through_copy"]
