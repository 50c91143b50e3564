"""The reduction (GEMM) analysis: is a block ``Y[..., i, j] = init + sum_k X[..., i, k] * W``?

Entry point: :func:`analyze_reduction`, which returns a :class:`Reduction` (layout, buffers,
extents, dtypes, a bias the output starts from, batch dims) or raises
:class:`~tir_byoc.decline.Declined` with the first condition that failed.
:func:`looks_like_gemm` says which blocks are candidates at all; :func:`.batch.batch_of` reads
the batch dims the output's leading iterators give each operand.  Called by :mod:`.scan`;
reads :mod:`.stir` and :mod:`.exprs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import ir, tirx

from ..decline import Declined
from ..patterns import pattern_for
from ..signature import WIDENINGS, DtypeSignature
from .batch import batch_of
from .exprs import (
    const_value,
    dtype_of,
    expr_text,
    index_text,
    is_element,
    is_var,
    is_zero,
    operation_text,
    shape_of,
)
from .extents import Extents, check_shape, dim_names
from .records import Batch
from .stir import (
    COMM_REDUCE,
    DATA_PAR,
    FunctionIndex,
    Nest,
    check_binding,
    check_covers,
    compact_global,
    fact,
    is_spatial,
)
from .traversal import elements, walk


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
    batch: Batch | None = None  # the batch dims; None for a 2-D product

    @fact
    def out_shape(self) -> tuple:
        """The output's shape: its batch dims, then (M, N)."""
        return (*shape_of(self.out)[:-2], self.m, self.n)

    @property
    def form(self) -> str:
        """The batch form of :mod:`tir_byoc.patterns`: none, leading or batched."""
        return self.batch.form if self.batch is not None else "none"


@dataclass(frozen=True)
class Init:
    """How a reduction's output is initialised: the store and the iterators of its axes."""

    store: tirx.BufferStore
    indices: tuple[tirx.Var, ...]
    nest: Nest | None = None  # None for the reduction block's own init

    @property
    def row(self) -> tirx.Var:
        return self.indices[-2]

    @property
    def col(self) -> tirx.Var:
        return self.indices[-1]


def looks_like_gemm(block) -> bool:
    """A reduction that multiplies two buffer elements (through casts): a GEMM candidate.

    Anything else (a sum, a variance's ``(x - mean) * (x - mean)``, a product of computed
    values) is not a GEMM, so its refusal is not worth a user's attention.
    """
    if not any(iv.iter_type == COMM_REDUCE for iv in elements(block.iter_vars)):
        return False
    return multiplies_elements(block.body)


def multiplies_elements(stmt) -> bool:
    """Whether ``stmt`` multiplies two buffer elements (through casts)."""
    products = []
    walk(stmt, tirx.Mul, products.append)
    return any(is_element(product.a) and is_element(product.b) for product in products)


def unpack_operand(expr, acc_dtype):
    """(load, source dtype) of a reduction operand: a load, possibly widened by a cast."""
    if isinstance(expr, tirx.Cast):
        inner = expr.value
        if not isinstance(inner, ir.TensorLoad):
            raise Declined(f"operand {expr} is a cast of a computed value, not of a buffer")
        source = dtype_of(inner.source)
        target = dtype_of(expr)
        if target != acc_dtype:
            raise Declined(f"operand is cast to {target}, but the accumulator is {acc_dtype}")
        if source != target and target not in WIDENINGS.get(source, ()):
            raise Declined(
                f"operand {inner.source.name} is cast from {source} to {target}, which is not "
                "an exact widening"
            )
        return inner, source
    if isinstance(expr, ir.TensorLoad):
        source = dtype_of(expr.source)
        if source != acc_dtype:
            raise Declined(
                f"operand {expr.source.name} is {source} but the accumulator is {acc_dtype}"
            )
        return expr, source
    raise Declined(f"operand {expr} is not a buffer element")


def _is_window(block, spatial, reduce) -> bool:
    """Whether ``block`` reads a buffer at an index that adds a spatial and a reduction
    iterator (``x[b, c, p * stride + r]``): a convolution's window."""
    spatial_vars = {it.handle for it in spatial}
    reduce_vars = {it.handle for it in reduce}
    loads = []
    walk(block.body, ir.TensorLoad, loads.append)
    for load in loads:
        for index in elements(load.indices):
            if isinstance(index, tirx.Var):
                continue
            used = []
            walk(index, tirx.Var, used.append)
            handles = {v.__chandle__() for v in used}
            if handles & spatial_vars and handles & reduce_vars:
                return True
    return False


def analyze_reduction(
    nest: Nest, extents: Extents, index: FunctionIndex, init_nest: Nest | None = None
) -> Reduction:
    """Read ``nest`` as ``Y[..., i, j] = sum_k X[..., i, k] * W`` (initialised in ``init_nest``)."""
    block = nest.block
    iterators = nest.iterators
    spatial = [it for it in iterators if it.iter_type == DATA_PAR]
    reduce = [it for it in iterators if it.iter_type == COMM_REDUCE]

    # Step 1. Shape of the iteration space and of the loops around it.
    if len(reduce) != 1:
        reason = f"block reduces over {len(reduce)} axes; the family reduces over one (k)"
        if _is_window(block, spatial, reduce):
            reason += (
                ". It reads an input at an output position plus a window offset, as a "
                "convolution does: tir_byoc serves a convolution before lowering, as a GEMM, "
                "and tir_byoc.relax.convolutions.find(mod) says why this one is not"
            )
        raise Declined(reason)
    if len(spatial) < 2:
        raise Declined(
            f"block has {len(spatial)} spatial axes: a reduction to fewer than two axes is not "
            "a matrix product"
        )
    if len(iterators) != len(spatial) + 1:
        raise Declined(f"block {block.name_hint} has iterators that are neither spatial nor k")
    check_binding(nest, extents)
    if block.match_buffers or block.alloc_buffers:
        raise Declined("block declares its own buffers")

    # Step 2. The update: C[..., i, j] = C[..., i, j] + A * B.
    store = block.body
    out = store.buffer
    indices = elements(store.indices)
    iters = [
        next((it for it in spatial if is_var(e, it.var)), None) if isinstance(e, tirx.Var) else None
        for e in indices
    ]
    if len(indices) != len(spatial) or None in iters or len({iv.var for iv in iters}) != len(iters):
        raise Declined(
            f"output {out.name} is not indexed by the block's {len(spatial)} spatial iterators, "
            "one per axis"
        )
    *batch_iters, iter_i, iter_j = iters
    vi, vj, vk = iter_i.var, iter_j.var, reduce[0].var
    value = store.value
    if not isinstance(value, tirx.Add):
        raise Declined(
            f"the reduction combines with {operation_text(value)}, not + (a sum of products)"
        )
    product = split_accumulate(value, out, indices)
    if not isinstance(product, tirx.Mul):
        raise Declined(
            f"the reduction accumulates {operation_text(product)}, not a product of two buffers"
        )
    acc_dtype = dtype_of(out)
    if dtype_of(value) != acc_dtype:
        raise Declined(f"the update is computed in {dtype_of(value)}, the output is {acc_dtype}")

    # Step 3. The init: C[..., i, j] = 0 or b[j], in the block or in a block of its own.
    if block.init is not None:
        init = Init(block.init, indices)
    elif init_nest is not None:
        init = init_block(init_nest, out, len(indices), extents)
    else:
        raise Declined(
            f"the reduction has no init, and the block before it does not set {out.name} "
            "to 0, so it is not reset"
        )
    check_init(init, out)

    # Step 4. Operands: which one is X[..., i, k], and how the weight is indexed.
    a, a_dtype = unpack_operand(product.a, acc_dtype)
    b, b_dtype = unpack_operand(product.b, acc_dtype)
    roles = [operand_role(op, vi, vj, vk) for op in (a, b)]
    if roles[0] == "x" and roles[1] in ("nk", "kn"):
        (x, x_dtype), (w, w_dtype), layout_key = (a, a_dtype), (b, b_dtype), roles[1]
    elif roles[1] == "x" and roles[0] in ("nk", "kn"):
        (x, x_dtype), (w, w_dtype), layout_key = (b, b_dtype), (a, a_dtype), roles[0]
    else:
        described = ", ".join(f"{op.source.name}{index_text(op)}" for op in (a, b))
        lead = "..., " if batch_iters else ""
        raise Declined(
            f"operands {described} do not read X[{lead}i, k] and W[{lead}j, k] or "
            f"W[{lead}k, j] (i = {vi.name}, j = {vj.name}, k = {vk.name})"
        )
    layout = "dense" if layout_key == "nk" else "matmul"

    try:
        return check_reduction_buffers(
            nest,
            layout,
            out,
            x,
            w,
            (batch_iters, iter_i, iter_j, reduce[0]),
            init,
            DtypeSignature(x_dtype, w_dtype, acc_dtype),
            extents,
            index,
        )
    except Declined as refused:
        form = "none" if not batch_iters else ("batched" if len(w.indices) > 2 else "leading")
        ops = () if is_zero(init.store.value) else ("bias",)
        nearest = refused.nearest or _name(layout, ops, form)
        raise Declined(refused.reason, nearest) from None


def _name(layout, ops, form) -> str:
    return pattern_for(layout, ops, form).name


def check_reduction_buffers(
    nest, layout, out, x, w, iters, init, dtype, extents, index
) -> Reduction:
    """Steps 5 to 8 of :func:`analyze_reduction`, once the operand roles are known."""
    batch_iters, iter_i, iter_j, iter_k = iters
    # Step 5. Extents: the loops cover the whole output and the whole K.
    m, n, k = iter_i.extent, iter_j.extent, iter_k.extent
    counts = tuple(it.extent for it in batch_iters)
    out_shape = (*counts, m, n)
    check_shape(out, out_shape, dim_names(len(out_shape)), extents)
    check_trailing(x.source, (m, k), ("M", "K"), extents, what="input")
    w_dims = ((n, k), ("N", "K")) if layout == "dense" else ((k, n), ("K", "N"))
    check_trailing(w.source, *w_dims, extents, what="weight")
    if init.nest is not None:
        check_covers(init.nest, init.indices, out_shape, extents)

    # Step 6. Buffers a C kernel can take: distinct, compact, in global memory.
    for buf in (out, x.source, w.source):
        reason = compact_global(buf)
        if reason:
            raise Declined(reason)
        if buf in index.views:
            raise Declined(f"buffer {buf.name} is a view of another buffer and may alias it")
    if out.same_as(x.source) or out.same_as(w.source):
        raise Declined(f"output {out.name} is also read as an operand (in-place update)")

    # Step 7. The batch dims: which matrix of X and of W each batch index reads.
    batch = batch_of(batch_iters, x, w, (m, k), extents) if batch_iters else None

    # Step 8. A bias the output starts from: b[j] or b[0, j], like an epilogue's.
    bias = None
    if not is_zero(init.store.value):
        bias = bias_vector(init.store.value, init.row, init.col, n, dtype.out, extents)
    return Reduction(nest, layout, x.source, w.source, out, m, n, k, dtype, bias, init.nest, batch)


def check_trailing(buf, dims, names, extents: Extents, what):
    """``buf``'s last two dims are ``dims`` (its leading dims are batch dims, read elsewhere)."""
    shape = extents.shape(buf)
    if len(shape) < 2:
        raise Declined(f"{what} {buf.name} has {len(shape)} dimensions, expected at least 2")
    leading = tuple(f"B{d}" for d in range(len(shape) - 2))
    check_shape(buf, (*shape[:-2], *dims), (*leading, *names), extents, what)


def init_block(nest: Nest, out, rank: int, extents: Extents) -> Init:
    """The init of a reduction as a block of its own: ``out[..., i, j] = 0`` (or ``b[j]``)."""
    block = nest.block
    if not is_spatial(block) or block.init is not None or len(nest.iterators) != rank:
        raise Declined(
            f"the reduction has no init, and block {block.name_hint} before it is not a "
            f"{rank}-D elementwise init of {out.name}"
        )
    check_binding(nest, extents)
    store = block.body
    iters = [it.var for it in nest.iterators]
    indices = elements(store.indices)
    if (
        len(indices) != rank
        or not all(isinstance(e, tirx.Var) and any(e.same_as(i) for i in iters) for e in indices)
        or len(set(indices)) != rank
    ):
        raise Declined(f"init block {block.name_hint} does not write each element of {out.name}")
    return Init(store, indices, nest)


def check_init(init: Init, out) -> None:
    """The init writes ``out[..., i, j]`` with 0 or with a plain read (a bias, checked later)."""
    store = init.store
    indices = elements(store.indices) if isinstance(store, tirx.BufferStore) else ()
    if (
        not isinstance(store, tirx.BufferStore)
        or not store.buffer.same_as(out)
        or len(indices) != len(init.indices)
        or not all(a.same_as(b) for a, b in zip(indices, init.indices))
    ):
        names = ", ".join(v.name for v in init.indices)
        raise Declined(f"the init does not write {out.name}[{names}]")
    if not is_zero(store.value) and not isinstance(store.value, ir.TensorLoad):
        value = const_value(store.value)
        shown = value if value is not None else store.value
        raise Declined(f"the reduction is initialised to {shown}, not 0 or a bias b[j]")


def bias_vector(load, row, col, n, out_dtype, extents: Extents, role: str = "bias"):
    """The buffer of a bias read ``b[j]`` or ``b[0, j]`` (``row``, ``col`` = i, j); else refused.
    ``role`` names the vector in the refusal (a layer scale is read the same way)."""
    buf, indices = load.source, list(elements(load.indices))
    shape = shape_of(buf)
    if len(shape) == 2 and len(indices) == 2 and is_var(indices[0], row):
        what = "a full (M, N)" if is_var(indices[1], col) else f"an (M, {expr_text(shape[1])})"
        raise Declined(
            f"{role} {buf.name} has {what} shape, read along the rows; the pattern needs (N,) "
            "or (1, N)"
        )
    j_index = indices[-1] if indices else None
    if indices and is_var(j_index, row):
        raise Declined(
            f"{role} {buf.name} is indexed by the row {row.name}; "
            f"the pattern needs the column {col.name}"
        )
    if not is_var(j_index, col) or (len(indices) == 2 and not is_zero(indices[0])):
        raise Declined(f"{role} {buf.name}{index_text(load)} is not indexed as b[j] or b[0, j]")
    if len(shape) not in (1, 2) or len(indices) != len(shape):
        raise Declined(f"{role} {buf.name} has shape {list(shape)}, expected (N,) or (1, N)")
    if len(shape) == 2 and not extents.equal(shape[0], 1):
        raise Declined(f"{role} {buf.name} has shape {list(shape)}, expected (1, N)")
    if not extents.equal(shape[-1], n):
        raise Declined(
            f"{role} {buf.name} has {expr_text(shape[-1])} elements, expected N = {expr_text(n)}"
        )
    if dtype_of(buf) != out_dtype:
        raise Declined(f"{role} {buf.name} is {dtype_of(buf)}, expected {out_dtype}")
    reason = compact_global(buf)
    if reason:
        raise Declined(reason)
    return buf


def split_accumulate(value, out, indices):
    for acc, other in ((value.a, value.b), (value.b, value.a)):
        if isinstance(acc, ir.TensorLoad) and acc.source.same_as(out):
            acc_indices = elements(acc.indices)
            if len(acc_indices) == len(indices) and all(
                a.same_as(b) for a, b in zip(acc_indices, indices)
            ):
                return other
    names = ", ".join(v.name for v in indices)
    raise Declined(f"the update does not add to {out.name}[{names}] itself")


def operand_role(load, vi, vj, vk) -> str | None:
    """'x' for [..., i, k], 'nk' for [..., j, k], 'kn' for [..., k, j]; None otherwise."""
    indices = elements(load.indices)
    if len(indices) < 2:
        return None
    first, second = indices[-2:]
    if is_var(first, vi) and is_var(second, vk):
        return "x"
    if is_var(first, vj) and is_var(second, vk):
        return "nk"
    if is_var(first, vk) and is_var(second, vj):
        return "kn"
    return None
