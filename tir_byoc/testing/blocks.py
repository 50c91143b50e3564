"""The function under construction: buffers, perfect loop nests, and the distractor blocks.

Entry point: :class:`FunctionBuilder`, which :func:`tir_byoc.testing.builder.build_program`
fills chain by chain and :meth:`~FunctionBuilder.finish` turns into a PrimFunc;
:func:`distractor` emits the unrelated blocks of a :class:`~.specs.DistractorSpec`.
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx
from tvm.s_tir import analysis

from .batches import BATCH_AXES
from .distractors import DistractorSpec
from .specs import ProgramSpec


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


class FunctionBuilder:
    """Accumulates buffers and root-level statements of one PrimFunc."""

    def __init__(self, spec: ProgramSpec):
        self.spec = spec
        self.index_dtype = spec.index_dtype
        if spec.symbolic_m:
            self.m = tirx.Var("m", spec.index_dtype)
            self.bindings = {self.m: spec.m}
        else:
            self.m = self.const(spec.m)
            self.bindings = {}
        self.params: list = []
        self.buffers: dict = {}
        self.root_allocs: list = []
        self.body: list = []
        self.pending: dict = {}  # buffer -> AllocBuffer to emit before its first writer

    def const(self, value: int):
        return tirx.IntImm(self.index_dtype, value)

    def batch_extents(self, c: int, values) -> tuple:
        """Chain ``c``'s batch extents: constants, or variables bound to ``values``."""
        if not self.spec.symbolic_batch:
            return tuple(self.const(v) for v in values)
        extents = tuple(tirx.Var(f"B{c}_{d}", self.index_dtype) for d in range(len(values)))
        self.bindings.update(zip(extents, values))
        return extents

    # Step 1. Buffers.
    def buffer(self, name, shape, dtype, *, param=True, alloc="sblock", offset=False, strides=None):
        shape = [self.const(s) if isinstance(s, int) else s for s in shape]
        elem_offset = tirx.Var(f"{name}_offset", self.index_dtype) if offset else None
        var = tirx.decl_buffer(
            shape,
            dtype,
            name=name,
            strides=strides,
            layout=None,
            elem_offset=elem_offset,
            offset_factor=1 if offset else 0,
        )
        self.buffers[var] = var
        if param:
            self.params.append(var)
        elif alloc == "sblock":
            self.root_allocs.append(var)
        else:
            self.pending[var] = tirx.AllocBuffer(var)
        return var

    # Step 2. Blocks in perfect loop nests.
    def nest(self, name, axes, store, *, init=None, loop_order=None, iter_order=None):
        """Emit ``for ...: with sblock(name)`` over ``axes`` = [(axis, extent, reduce)].

        ``store(iters)`` and ``init(iters)`` build the BufferStores from the block's
        iterators, given by axis name.
        """
        names = [axis for axis, _, _ in axes]
        iter_names = list(iter_order or names)
        loop_names = list(loop_order or names)
        extent = {axis: ext for axis, ext, _ in axes}
        reduce = {axis: red for axis, _, red in axes}
        iters = {axis: tirx.Var(f"v{axis}", self.index_dtype) for axis in names}
        loops = {axis: tirx.Var(axis, self.index_dtype) for axis in names}
        iter_vars = [
            tirx.IterVar(
                ir.Range.from_min_extent(self.const(0), extent[a]),
                iters[a],
                tirx.IterVar.CommReduce if reduce[a] else tirx.IterVar.DataPar,
            )
            for a in iter_names
        ]
        body = store(iters)
        init_stmt = init(iters) if init is not None else None
        draft = s_tir.SBlock(iter_vars, [], [], name, body, init_stmt)
        reads, writes = analysis.get_sblock_read_write_region(draft, self.buffers)
        block = s_tir.SBlock(iter_vars, reads, writes, name, body, init_stmt)
        stmt = s_tir.SBlockRealize([loops[a] for a in iter_names], True, block)
        for axis in reversed(loop_names):
            stmt = tirx.For(loops[axis], self.const(0), extent[axis], tirx.ForKind.SERIAL, stmt)
        self.emit(stmt, body.buffer)
        return stmt

    def emit(self, stmt, written):
        if written in self.pending:
            self.body.append(self.pending.pop(written))
        self.body.append(stmt)

    # Step 3. The function.
    def finish(self) -> tirx.PrimFunc:
        self.body.extend(self.pending.values())  # allocated but never written (none today)
        body = self.body[0] if len(self.body) == 1 else tirx.SeqStmt(self.body)
        root = s_tir.SBlock([], [], [], "root", body, None, self.root_allocs)
        func = tirx.PrimFunc(self.params, s_tir.SBlockRealize([], True, root))
        return func.with_attr("global_symbol", self.spec.name).with_attr("s_tir", True)


def zero(dtype):
    return tirx.const(0, dtype)


def _elementwise_op(value, dtype):
    """|x| for floats, ``x % 7`` for integers: nothing overflows.

    Neither is an epilogue op of the family (tanh is one now, and min(., 100) after a relu is
    a clip), so a distractor that updates a chain's output in place never joins the chain.
    The value may be one a chain computed, which the offloaded function computes with other
    rounding errors, and may flow on into another chain: exp of it can reach inf (and inf -
    inf in the next reduction gives NaN), and exp, tanh or sin of a large value turns a small
    error of its input into a large one of its result, which no tolerance tells from a wrong
    result.  |x| does neither.
    """
    if not is_float(dtype):
        return tirx.FloorMod(value, tirx.const(7, dtype))
    return tirx.abs(value)


def _abs_x(b, chain, tag):
    elementwise(b, f"abs_x{tag}", chain.x, b.buffer(f"E{tag}", chain.x.shape, chain.x.dtype))


def _transpose_w_in(b, chain, tag):
    *lead, rows, cols = chain.w.shape
    source = b.buffer(f"Wt{chain.c}", (*lead, cols, rows), chain.w.dtype)
    _transpose(b, f"transpose_w{tag}", source, chain.w)


def _bias_in(b, chain, tag):
    source = b.buffer(f"bsrc{chain.c}", chain.bias.shape, chain.bias.dtype)
    elementwise(b, f"make_b{tag}", source, chain.bias)


def _row_sum_out(b, chain, tag):
    sums = b.buffer(f"R{tag}", chain.out.shape[:-1], chain.out.dtype)
    _row_sum(b, f"row_sum{tag}", chain.out, sums)


def _transpose_out(b, chain, tag):
    *lead, rows, cols = chain.out.shape
    target = b.buffer(f"Zt{tag}", (*lead, cols, rows), chain.out.dtype)
    _transpose(b, f"transpose_out{tag}", chain.out, target)


def _unrelated(b, chain, tag):
    source = b.buffer(f"U{tag}", (b.m, b.const(3)), "float32")
    elementwise(b, f"unrelated{tag}", source, b.buffer(f"V{tag}", (b.m, b.const(3)), "float32"))


#: The blocks of each distractor kind, emitted next to a chain (a ``ChainBuilder``).
_DISTRACTOR_BLOCKS = {
    "abs_x": _abs_x,
    "transpose_w_in": _transpose_w_in,
    "bias_in": _bias_in,
    "row_sum_out": _row_sum_out,
    "transpose_out": _transpose_out,
    "inplace_out": lambda b, chain, tag: elementwise(b, f"inplace{tag}", chain.out, chain.out),
    "unrelated": _unrelated,
    "overwrite_x": lambda b, chain, tag: elementwise(b, f"overwrite_x{tag}", chain.x, chain.x),
}


def distractor(b: FunctionBuilder, d: DistractorSpec, chain, tag: str):
    """Emit the blocks of distractor ``d`` next to ``chain`` (its ``ChainBuilder``)."""
    _DISTRACTOR_BLOCKS[d.kind](b, chain, tag)


def axis_names(rank: int) -> str:
    """The axes of a rank-``rank`` buffer: batch axes (:data:`~.specs.BATCH_AXES`), then i, j."""
    lead = max(rank - 2, 0)
    if lead > len(BATCH_AXES):
        raise ValueError(f"expected at most {len(BATCH_AXES) + 2} dimensions, got {rank}")
    return BATCH_AXES[:lead] + "ij"[: rank - lead]


def _axes(shape):
    return [(a, e, False) for a, e in zip(axis_names(len(shape)), shape)]


def elementwise(b: FunctionBuilder, name, source, target):
    def store(v):
        idx = [v[a] for a in axis_names(len(target.shape))]
        value = _elementwise_op(tirx.BufferLoad(source, idx), target.dtype)
        return tirx.BufferStore(target, value, idx)

    b.nest(name, _axes(target.shape), store)


def _transpose(b: FunctionBuilder, name, source, target):
    """``target[..., i, j] = source[..., j, i]``."""

    def store(v):
        lead = [v[a] for a in axis_names(len(target.shape))[:-2]]
        load = tirx.BufferLoad(source, [*lead, v["j"], v["i"]])
        return tirx.BufferStore(target, load, [*lead, v["i"], v["j"]])

    b.nest(name, _axes(target.shape), store)


def _row_sum(b: FunctionBuilder, name, source, target):
    """``target[..., i] = sum_j source[..., i, j]``."""
    names = axis_names(len(source.shape))

    def store(v):
        row = [v[a] for a in names[:-1]]
        acc = tirx.BufferLoad(target, row)
        return tirx.BufferStore(target, acc + tirx.BufferLoad(source, [*row, v["j"]]), row)

    def init(v):
        return tirx.BufferStore(target, zero(target.dtype), [v[a] for a in names[:-1]])

    axes = [(a, e, a == "j") for a, e in zip(names, source.shape)]
    b.nest(name, axes, store, init=init)


__all__ = ["FunctionBuilder", "axis_names", "distractor", "elementwise", "is_float", "zero"]
