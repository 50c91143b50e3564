"""The rewriter: turn matches into sequential extern calls.

Entry point: :func:`rewrite_function` (:func:`~tir_byoc.calls.intrinsic_calls` counts
what a rewritten function calls).  Each :class:`~tir_byoc.match.Match` becomes one opaque
SBlock, at the place of the last block of its chain::

    with T.sblock("dense_bias_relu_ref"):
        T.reads(X[0:M, 0:K], W[0:N, 0:K], b[0:N])
        T.writes(Y[0:M, 0:N])
        T.block_attr({"tir_byoc.intrinsic": "ref.dense_bias_relu", ...})
        status: T.int32 = T.call_extern("int32", "tir_byoc_ref_dense_bias_relu",
                                        X.data, W.data, b.data, Y.data, M, N, K, signature)
        assert status == 0, "tir_byoc intrinsic ref.dense_bias_relu ... failed"

The other blocks of the chain are removed, and so are the intermediates nothing reads any
more.  Every statement the matches do not cover is kept as it is (the same objects).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from .calls import (
    BLOCKS_ATTR,
    INTRINSIC_ATTR,
    RewriteError,
    calls_in_parallel_loops,
    epilogue_arguments,
    intrinsic_calls,
)
from .epilogues import MAX_TENSORS
from .match import RELU_KEEPS_NAN, Match
from .match.conv_records import ConvMatch
from .match.exprs import as_int64
from .registry import Intrinsic
from .signature import PACKED_WEIGHT_FLAG, RELU_KEEPS_NAN_FLAG


def _zero(dtype: str):
    return tirx.IntImm(dtype, 0)


def _pointer(buffer: ir.Var):
    """Pointer to ``buffer``'s first element, in a form that lowering keeps correct.

    ``B.data`` marks the whole buffer as used, so ``CompactBufferAllocation`` keeps a local
    intermediate whole (``address_of(B[0, 0])`` would shrink it to the one element it names,
    which the kernel then writes past); it is element 0 when the element offset is 0, as it
    always is for allocations.  A buffer with another offset (a parameter bound with one) is
    never compacted, and ``address_of`` adds its offset.  (``tvm_access_ptr`` would say both,
    but TVM's bfloat16 legalization leaves its element type stale and lowering fails.)
    """
    offset = buffer.ty.elem_offset
    if offset is None or (isinstance(offset, tirx.IntImm) and offset.value == 0):
        return tirx.buffer_data(buffer)
    index_dtype = str(buffer.ty.shape[0].ty.dtype) if buffer.ty.shape else "int32"
    return tirx.address_of(tirx.BufferLoad(buffer, [_zero(index_dtype) for _ in buffer.ty.shape]))


def _whole(buffer: ir.Var):
    ranges = [ir.Range.from_min_extent(_zero(str(e.ty.dtype)), e) for e in buffer.ty.shape]
    return tirx.BufferRegion(buffer, ranges)


def batch_arguments(match: Match) -> list:
    """The batch arguments of a ``bmm_`` call: counts, then X's and W's strides, two each.

    A match with one batch dim passes it as the inner one, with an outer dim of 1.
    """
    batch = match.batch
    pad = 2 - len(batch.counts)
    one, zero = tirx.IntImm("int64", 1), tirx.IntImm("int64", 0)
    counts = [one] * pad + [as_int64(c) for c in batch.counts]
    x_strides = [zero] * pad + [as_int64(s) for s in batch.x_strides]
    w_strides = [zero] * pad + [as_int64(s) for s in batch.w_strides]
    return counts + x_strides + w_strides


def fixed_arguments(match: Match) -> list:
    """The arguments of a fixed entry point (``dense_bias_relu``, ``bmm_matmul``, ...)."""
    operands = [match.x, match.w] + ([match.bias] if match.bias is not None else [])
    args = [_pointer(b) for b in [*operands, match.out]]
    args += [as_int64(e) for e in (match.rows, match.n, match.k)]
    flags = RELU_KEEPS_NAN_FLAG if match.relu_nan == RELU_KEEPS_NAN else 0
    args.append(tirx.IntImm("int32", match.dtype.code | flags))
    if match.batch is not None and match.batch.form == "batched":
        args += batch_arguments(match)
    return args


def _null():
    return tirx.reinterpret("handle", tirx.IntImm("uint64", 0))


def _float64(value):
    if isinstance(value, (int, float)):
        return tirx.FloatImm("float64", float(value))
    return tirx.Cast("float64", value)


def gemm_arguments(match: Match, packing=None) -> list:
    """The arguments of the ``gemm`` entry point: the epilogue as data (see ``tir_byoc.h``);
    with a :class:`~tir_byoc.packing.Packing`, the packed weight's block instead of W."""
    weight = match.w if packing is None else packing.param
    args = [_pointer(b) for b in (match.x, weight, match.out)]
    args += [as_int64(e) for e in (match.rows, match.n, match.k)]
    flags = 0 if packing is None else PACKED_WEIGHT_FLAG
    args.append(tirx.IntImm("int32", match.dtype.code | flags))
    args.append(tirx.IntImm("int32", 0 if match.layout == "dense" else 1))
    if match.batch is not None and match.batch.form == "batched":
        args += batch_arguments(match)
    else:
        one, zero = tirx.IntImm("int64", 1), tirx.IntImm("int64", 0)
        args += [one, one, zero, zero, zero, zero]
    codes, constants = epilogue_arguments(match)
    tensors = list(match.tensors)
    if len(tensors) > MAX_TENSORS:
        raise RewriteError(f"{match.func}: the epilogue of {match.pattern} does not fit one call")
    args.append(tirx.IntImm("int64", codes))
    args += [_float64(c) for c in constants]
    args += [_pointer(t) for t in tensors] + [_null()] * (MAX_TENSORS - len(tensors))
    return args


def conv_arguments(match: ConvMatch, packing=None) -> list:
    """The arguments of the conv entry point: pointers, dtypes, layouts, the geometry, then
    the epilogue as data (as for the gemm entry point); with a packing, the weight's block."""
    weight = match.w if packing is None else packing.param
    args = [_pointer(b) for b in (match.x, weight, match.out)]
    flags = 0 if packing is None else PACKED_WEIGHT_FLAG
    args.append(tirx.IntImm("int32", match.dtype.code | flags))
    geometry = match.conv.call_arguments()
    args += [tirx.IntImm("int32", v) for v in geometry[:2]]
    args += [as_int64(v) for v in geometry[2:]]  # every dim static but a symbolic batch
    codes, constants = epilogue_arguments(match)
    tensors = list(match.tensors)
    if len(tensors) > MAX_TENSORS:
        raise RewriteError(f"{match.func}: the epilogue of {match.pattern} does not fit one call")
    args.append(tirx.IntImm("int64", codes))
    args += [_float64(c) for c in constants]
    args += [_pointer(t) for t in tensors] + [_null()] * (MAX_TENSORS - len(tensors))
    return args


def call_block(match: Match, intrinsic: Intrinsic, name: str, packing=None) -> s_tir.SBlockRealize:
    """The opaque block that calls ``intrinsic`` for ``match`` (with a packed weight, the
    packing's gemm intrinsic)."""
    scalars = [
        c.source for s in match.epilogue for c in s.constants if isinstance(c, ir.TensorLoad)
    ]
    weight = match.w if packing is None else packing.param
    operands = [match.x, weight, *match.tensors, *scalars]
    if isinstance(match, ConvMatch):
        intrinsic = intrinsic if packing is None else packing.intrinsic
        args = conv_arguments(match, packing)
    elif packing is not None:
        intrinsic = packing.intrinsic
        args = gemm_arguments(match, packing)
    elif intrinsic.takes_epilogue:
        args = gemm_arguments(match)
    else:
        args = fixed_arguments(match)
    return extern_block(
        intrinsic,
        intrinsic.extern_symbol,
        args,
        operands,
        match.out,
        name,
        match.blocks,
        match.func,
    )


def extern_block(
    intrinsic, symbol: str, args, operands, out, name: str, blocks, func: str
) -> s_tir.SBlockRealize:
    """The opaque block ``status = symbol(*args); assert status == 0`` that reads ``operands``
    and writes ``out``, annotated with ``intrinsic`` (an :class:`Intrinsic` or its name) and
    the ``blocks`` of ``func`` it replaces."""
    name_of = intrinsic if isinstance(intrinsic, str) else intrinsic.name
    call = tirx.call_extern("int32", symbol, *args)
    status = tirx.Var("status", "int32")
    message = (
        f"tir_byoc intrinsic {name_of} ({symbol}) returned a non-zero "
        f"status for blocks {', '.join(blocks)} of {func}; the codes are listed in "
        "intrinsics/include/tir_byoc.h"
    )
    # The Python AssertStmt wrapper of TVM 0.27 passes its arguments to the FFI constructor in
    # the wrong order; call the constructor (condition, kind, message parts, span) directly.
    check = _tirx_ffi.AssertStmt(
        status == tirx.IntImm("int32", 0),
        ir.StringImm("RuntimeError"),
        [ir.StringImm(message)],
        None,
    )
    block = s_tir.SBlock(
        iter_vars=[],
        reads=[_whole(b) for b in operands],
        writes=[_whole(out)],
        name_hint=name,
        body=tirx.SeqStmt([tirx.Bind(status, call), check]),
        annotations={INTRINSIC_ATTR: name_of, BLOCKS_ATTR: ",".join(blocks)},
    )
    return s_tir.SBlockRealize([], True, block)


def _block_names(func: tirx.PrimFunc) -> set[str]:
    names = set()
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: names.add(b.name_hint)))
    return names


def _referenced(stmt, buffers) -> set:
    """Which of ``buffers`` are used in ``stmt``, not counting their own allocations."""
    wanted = set(buffers)
    found = set()

    def on_var(var, _visitor):
        if var in wanted:
            found.add(var)

    def on_block(block, visitor):
        for part in (block.reads, block.writes, block.match_buffers, block.init, block.body):
            if part is not None:
                visitor.visit(part)

    def on_allocation(_alloc, _visitor):
        return None

    tvm_ffi.structural_visit(
        stmt, [(ir.Var, on_var), (s_tir.SBlock, on_block), (tirx.AllocBuffer, on_allocation)]
    )
    return found


def rewrite_function(
    func: tirx.PrimFunc, planned: Sequence[tuple[Match, Intrinsic]], packings=None
) -> tirx.PrimFunc:
    """Replace each planned match in ``func`` by a call to its intrinsic.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        The function the matches were found in.
    planned : sequence of (Match, Intrinsic)
        The matches to offload and the intrinsic serving each.
    packings : dict of Match to tir_byoc.packing.Packing, optional
        Matches whose weight parameter becomes the block of its packed weight.

    Returns
    -------
    tvm.tirx.PrimFunc
        The rewritten function; ``func`` itself if ``planned`` is empty.
    """
    if not planned:
        return func
    # Step 1. Decide, per statement, what replaces it (a call) or whether it goes.
    taken = _block_names(func)
    replacement, dropped = {}, set()
    for match, intrinsic in planned:
        name = _unique(f"{match.pattern}_{intrinsic.backend}", taken)
        *earlier, last = match.stmts
        packing = (packings or {}).get(match)
        replacement[last] = call_block(match, intrinsic, name, packing)
        dropped.update(earlier)
    found = []

    # Step 2. Rebuild the statement lists that hold them.
    def on_seq(seq, mutator):
        items = []
        for stmt in seq.seq:
            if stmt in replacement:
                found.append(stmt)
                items.append(replacement[stmt])
            elif stmt in dropped:
                found.append(stmt)
            else:
                items.append(mutator.mutate(stmt))
        return items[0] if len(items) == 1 else tirx.SeqStmt(items)

    def on_loop(loop, mutator):
        if loop in replacement:  # a chain that is the whole body of its parent
            found.append(loop)
            return replacement[loop]
        return mutator.default_mutate(loop)

    body = tvm_ffi.structural_mutate(func.body, [(tirx.SeqStmt, on_seq), (tirx.For, on_loop)])
    expected = len(replacement) + len(dropped)
    if len(found) != expected or len(set(found)) != expected:
        raise RewriteError(
            f"{planned[0][0].func}: expected to replace {expected} loop nests once each, "
            f"found {len(found)} (the matches do not come from this function)"
        )
    # Step 3. Drop the intermediates nothing uses any more.
    intermediates = {v for match, _ in planned for v in match.intermediates}
    dead = intermediates - _referenced(body, intermediates)
    if dead:
        body = _drop_allocations(body, dead)
    if not packings:
        return func.with_body(body)
    swap = {p.match.w: p.param for p in packings.values()}
    params = [swap.get(p, p) for p in func.params]
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs, func.span)


def _unique(name: str, taken: set[str]) -> str:
    candidate, suffix = name, 0
    while candidate in taken:
        suffix += 1
        candidate = f"{name}_{suffix}"
    taken.add(candidate)
    return candidate


def _drop_allocations(body, dead):
    def on_block(block, mutator):
        block = mutator.default_mutate(block)
        kept = [b for b in block.alloc_buffers if b not in dead]
        if len(kept) == len(block.alloc_buffers):
            return block
        return s_tir.SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            block.body,
            block.init,
            kept,
            block.match_buffers,
            block.annotations,
            block.span,
        )

    def on_seq(seq, mutator):
        items = [
            mutator.mutate(s)
            for s in seq.seq
            if not (isinstance(s, tirx.AllocBuffer) and s.buffer in dead)
        ]
        return items[0] if len(items) == 1 else tirx.SeqStmt(items)

    return tvm_ffi.structural_mutate(body, [(s_tir.SBlock, on_block), (tirx.SeqStmt, on_seq)])


__all__ = [
    "BLOCKS_ATTR",
    "INTRINSIC_ATTR",
    "RewriteError",
    "call_block",
    "calls_in_parallel_loops",
    "extern_block",
    "gemm_arguments",
    "intrinsic_calls",
    "rewrite_function",
]
