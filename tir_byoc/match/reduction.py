"""The reduction (GEMM) analysis: is a block ``Y[i, j] = init + sum_k X[i, k] * W``?

Entry point: :func:`analyze_reduction`, which returns a :class:`Reduction` (layout, buffers,
extents, dtypes, a bias the output starts from) or raises :class:`~.records.Refused` with the
first condition that failed.  :func:`looks_like_gemm` says which blocks are candidates at all.
Called by :mod:`.scan`; reads :mod:`.stir` and :mod:`.exprs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, tirx

from ..signature import WIDENINGS, DtypeSignature
from .exprs import (
    const_value,
    dtype_of,
    element_of,
    expr_text,
    index_text,
    is_element,
    is_var,
    is_zero,
    operation_text,
    shape_of,
)
from .records import Refused
from .stir import (
    COMM_REDUCE,
    DATA_PAR,
    Extents,
    FunctionIndex,
    Nest,
    check_binding,
    check_covers,
    check_shape,
    compact_global,
    is_spatial,
)


@dataclass(frozen=True)
class Reduction:
    nest: Nest
    layout: str
    x: ir.Var
    w: ir.Var
    out: ir.Var
    m: tvm.ir.PrimExpr
    n: tvm.ir.PrimExpr
    k: tvm.ir.PrimExpr
    dtype: DtypeSignature
    bias: ir.Var | None = None  # a bias vector the output is initialised with
    init_nest: Nest | None = None  # the init as a block of its own (decompose_reduction)


@dataclass(frozen=True)
class Init:
    """How a reduction's output is initialised: the store and the iterators of its row/column."""

    store: tirx.BufferStore
    row: tirx.Var
    col: tirx.Var
    nest: Nest | None = None  # None for the reduction block's own init


def looks_like_gemm(block) -> bool:
    """A reduction that multiplies two buffer elements (through casts): a GEMM candidate.

    Anything else (a sum, a variance's ``(x - mean) * (x - mean)``, a product of computed
    values) is not a GEMM, so its refusal is not worth a user's attention.
    """
    if not any(iv.iter_type == COMM_REDUCE for iv in block.iter_vars):
        return False
    found = []

    def on_product(product):
        if is_element(product.a) and is_element(product.b):
            found.append(product)

    tvm_ffi.structural_walk(block.body, (tirx.Mul, on_product))
    return bool(found)


def _not_2d_reason(block, spatial) -> str:
    """Why a multiply-reduce block with other than 2 spatial axes is refused, by its form."""
    counted = f"block has {len(spatial)} spatial axes; the family is 2-D"
    if len(spatial) < 2:
        return f"{counted} (a reduction to fewer than two axes is not a matrix product)"
    operands = []

    def on_product(product):
        if is_element(product.a) and is_element(product.b):
            operands.extend(element_of(e).source for e in (product.a, product.b))

    tvm_ffi.structural_walk(block.body, (tirx.Mul, on_product))
    ranks = sorted(len(shape_of(buffer)) for buffer in operands[:2])
    if ranks and ranks[0] == 2:
        weight = next(b for b in operands if len(shape_of(b)) == 2)
        return (
            f"{counted}: an N-D activation over the 2-D weight {weight.name} (an N-D Linear); "
            "folding its leading dims into M is not supported yet"
        )
    if ranks and ranks[0] > 2:
        return (
            f"{counted}: both operands carry batch dims (a batched matmul, as attention's); "
            "batched matmuls are not supported yet"
        )
    return counted


def unpack_operand(expr, acc_dtype):
    """(load, source dtype) of a reduction operand: a load, possibly widened by a cast."""
    if isinstance(expr, tirx.Cast):
        inner = expr.value
        if not isinstance(inner, ir.TensorLoad):
            raise Refused(f"operand {expr} is a cast of a computed value, not of a buffer")
        source = dtype_of(inner.source)
        target = dtype_of(expr)
        if target != acc_dtype:
            raise Refused(f"operand is cast to {target}, but the accumulator is {acc_dtype}")
        if source != target and target not in WIDENINGS.get(source, ()):
            raise Refused(
                f"operand {inner.source.name} is cast from {source} to {target}, which is not "
                "an exact widening"
            )
        return inner, source
    if isinstance(expr, ir.TensorLoad):
        source = dtype_of(expr.source)
        if source != acc_dtype:
            raise Refused(
                f"operand {expr.source.name} is {source} but the accumulator is {acc_dtype}"
            )
        return expr, source
    raise Refused(f"operand {expr} is not a buffer element")


def analyze_reduction(
    nest: Nest, extents: Extents, index: FunctionIndex, init_nest: Nest | None = None
) -> Reduction:
    """Read ``nest`` as ``Y[i, j] = sum_k X[i, k] * W`` (initialised in ``init_nest`` if given)."""
    block = nest.block
    spatial = [iv for iv in block.iter_vars if iv.iter_type == DATA_PAR]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == COMM_REDUCE]

    # Step 1. Shape of the iteration space and of the loops around it.
    if len(reduce) != 1:
        raise Refused(f"block reduces over {len(reduce)} axes; the family reduces over one (k)")
    if len(spatial) != 2 or len(block.iter_vars) != 3:
        raise Refused(_not_2d_reason(block, spatial))
    check_binding(nest, extents)
    if block.match_buffers or block.alloc_buffers:
        raise Refused("block declares its own buffers")

    # Step 2. The update: C[i, j] = C[i, j] + A * B.
    store = block.body
    out = store.buffer
    if len(store.indices) != 2 or not all(isinstance(e, tirx.Var) for e in store.indices):
        raise Refused(f"output {out.name} is not indexed by two plain iterators")
    vi, vj = store.indices
    iter_i = next((iv for iv in spatial if iv.var.same_as(vi)), None)
    iter_j = next((iv for iv in spatial if iv.var.same_as(vj)), None)
    if iter_i is None or iter_j is None or vi.same_as(vj):
        raise Refused(f"output {out.name} is not indexed by the block's two spatial iterators")
    vk = reduce[0].var
    value = store.value
    if not isinstance(value, tirx.Add):
        raise Refused(
            f"the reduction combines with {operation_text(value)}, not + (a sum of products)"
        )
    product = split_accumulate(value, out, vi, vj)
    if not isinstance(product, tirx.Mul):
        raise Refused(
            f"the reduction accumulates {operation_text(product)}, not a product of two buffers"
        )
    acc_dtype = dtype_of(out)
    if dtype_of(value) != acc_dtype:
        raise Refused(f"the update is computed in {dtype_of(value)}, the output is {acc_dtype}")

    # Step 3. The init: C[i, j] = 0 or b[j], in the block or in a block of its own before it.
    if block.init is not None:
        init = Init(block.init, vi, vj)
    elif init_nest is not None:
        init = init_block(init_nest, out, extents)
    else:
        raise Refused(
            f"the reduction has no init, and the block before it does not set {out.name} "
            "to 0, so it is not reset"
        )
    check_init(init, out)

    # Step 4. Operands: which one is X[i, k], and how the weight is indexed.
    a, a_dtype = unpack_operand(product.a, acc_dtype)
    b, b_dtype = unpack_operand(product.b, acc_dtype)
    roles = [operand_role(op, vi, vj, vk) for op in (a, b)]
    if roles[0] == "x" and roles[1] in ("nk", "kn"):
        (x, x_dtype), (w, w_dtype), layout_key = (a, a_dtype), (b, b_dtype), roles[1]
    elif roles[1] == "x" and roles[0] in ("nk", "kn"):
        (x, x_dtype), (w, w_dtype), layout_key = (b, b_dtype), (a, a_dtype), roles[0]
    else:
        described = ", ".join(f"{op.source.name}{index_text(op)}" for op in (a, b))
        raise Refused(
            f"operands {described} do not read X[i, k] and W[j, k] or W[k, j] "
            f"(i = {vi.name}, j = {vj.name}, k = {vk.name})"
        )
    layout = "dense" if layout_key == "nk" else "matmul"

    try:
        return check_reduction_buffers(
            nest,
            layout,
            out,
            x,
            w,
            (iter_i, iter_j, reduce[0]),
            init,
            DtypeSignature(x_dtype, w_dtype, acc_dtype),
            extents,
            index,
        )
    except Refused as refused:
        nearest = refused.nearest or (layout if is_zero(init.store.value) else f"{layout}_bias")
        raise Refused(refused.reason, nearest) from None


def check_reduction_buffers(
    nest, layout, out, x, w, iters, init, dtype, extents, index
) -> Reduction:
    """Steps 5 to 7 of :func:`analyze_reduction`, once the operand roles are known."""
    iter_i, iter_j, iter_k = iters
    # Step 5. Extents: the loops cover the whole output and the whole K.
    m, n, k = iter_i.dom.extent, iter_j.dom.extent, iter_k.dom.extent
    check_shape(out, (m, n), ("M", "N"), extents)
    check_shape(x.source, (m, k), ("M", "K"), extents, what="input")
    w_dims = ((n, k), ("N", "K")) if layout == "dense" else ((k, n), ("K", "N"))
    check_shape(w.source, *w_dims, extents, what="weight")
    if init.nest is not None:
        check_covers(init.nest.block, (init.row, init.col), (m, n), extents)

    # Step 6. Buffers a C kernel can take: distinct, compact, in global memory.
    for buf in (out, x.source, w.source):
        reason = compact_global(buf)
        if reason:
            raise Refused(reason)
        if buf in index.views:
            raise Refused(f"buffer {buf.name} is a view of another buffer and may alias it")
    if out.same_as(x.source) or out.same_as(w.source):
        raise Refused(f"output {out.name} is also read as an operand (in-place update)")

    # Step 7. A bias the output starts from: b[j] or b[0, j], like an epilogue's.
    bias = None
    if not is_zero(init.store.value):
        bias = bias_vector(init.store.value, init.row, init.col, n, dtype.out, extents)
    return Reduction(nest, layout, x.source, w.source, out, m, n, k, dtype, bias, init.nest)


def init_block(nest: Nest, out, extents: Extents) -> Init:
    """The init of a reduction as a block of its own: ``out[i, j] = 0`` (or ``b[j]``)."""
    block = nest.block
    if not is_spatial(block) or block.init is not None or len(block.iter_vars) != 2:
        raise Refused(
            f"the reduction has no init, and block {block.name_hint} before it is not a "
            f"2-D elementwise init of {out.name}"
        )
    check_binding(nest, extents)
    store = block.body
    iters = [iv.var for iv in block.iter_vars]
    if len(store.indices) != 2 or not all(isinstance(e, tirx.Var) for e in store.indices):
        raise Refused(f"init block {block.name_hint} does not write {out.name}[i, j]")
    row, col = store.indices
    if row.same_as(col) or not all(any(v.same_as(i) for i in iters) for v in (row, col)):
        raise Refused(f"init block {block.name_hint} does not write {out.name}[i, j]")
    return Init(store, row, col, nest)


def check_init(init: Init, out) -> None:
    """The init writes ``out[row, col]`` with 0 or with a plain read (a bias, checked later)."""
    store = init.store
    if (
        not isinstance(store, tirx.BufferStore)
        or not store.buffer.same_as(out)
        or len(store.indices) != 2
        or not (store.indices[0].same_as(init.row) and store.indices[1].same_as(init.col))
    ):
        raise Refused(f"the init does not write {out.name}[{init.row.name}, {init.col.name}]")
    if not is_zero(store.value) and not isinstance(store.value, ir.TensorLoad):
        value = const_value(store.value)
        shown = value if value is not None else store.value
        raise Refused(f"the reduction is initialised to {shown}, not 0 or a bias b[j]")


def bias_vector(load, row, col, n, out_dtype, extents: Extents):
    """The buffer of a bias read ``b[j]`` or ``b[0, j]`` (``row``, ``col`` = i, j); else refused."""
    buf, indices = load.source, list(load.indices)
    shape = shape_of(buf)
    if len(shape) == 2 and len(indices) == 2 and is_var(indices[0], row):
        raise Refused(f"bias {buf.name} has a full (M, N) shape; the pattern needs (N,) or (1, N)")
    j_index = indices[-1] if indices else None
    if indices and is_var(j_index, row):
        raise Refused(
            f"bias {buf.name} is indexed by the row {row.name}; "
            f"the pattern needs the column {col.name}"
        )
    if not is_var(j_index, col) or (len(indices) == 2 and not is_zero(indices[0])):
        raise Refused(f"bias {buf.name}{index_text(load)} is not indexed as b[j] or b[0, j]")
    if len(shape) not in (1, 2) or len(indices) != len(shape):
        raise Refused(f"bias {buf.name} has shape {list(shape)}, expected (N,) or (1, N)")
    if len(shape) == 2 and not extents.equal(shape[0], 1):
        raise Refused(f"bias {buf.name} has shape {list(shape)}, expected (1, N)")
    if not extents.equal(shape[-1], n):
        raise Refused(
            f"bias {buf.name} has {expr_text(shape[-1])} elements, expected N = {expr_text(n)}"
        )
    if dtype_of(buf) != out_dtype:
        raise Refused(f"bias {buf.name} is {dtype_of(buf)}, expected {out_dtype}")
    reason = compact_global(buf)
    if reason:
        raise Refused(reason)
    return buf


def split_accumulate(value, out, vi, vj):
    for acc, other in ((value.a, value.b), (value.b, value.a)):
        if (
            isinstance(acc, ir.TensorLoad)
            and acc.source.same_as(out)
            and len(acc.indices) == 2
            and acc.indices[0].same_as(vi)
            and acc.indices[1].same_as(vj)
        ):
            return other
    raise Refused(f"the update does not add to {out.name}[{vi.name}, {vj.name}] itself")


def operand_role(load, vi, vj, vk) -> str | None:
    """'x' for [i, k], 'nk' for [j, k], 'kn' for [k, j]; None otherwise."""
    indices = list(load.indices)
    if len(indices) != 2:
        return None
    first, second = indices
    if is_var(first, vi) and is_var(second, vk):
        return "x"
    if is_var(first, vj) and is_var(second, vk):
        return "nk"
    if is_var(first, vk) and is_var(second, vj):
        return "kn"
    return None
