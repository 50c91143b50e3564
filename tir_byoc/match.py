"""The matcher: find dense / bias / relu chains in S-TIR PrimFuncs, by semantics.

Entry point: :func:`scan_function`, which returns a :class:`FunctionScan` holding one
:class:`Match` per chain found and one :class:`Rejection` per block that looked like part of
a chain but was refused, with the reason.

A chain is a reduction block computing ``Y[i, j] = sum_k X[i, k] * W[., .]`` followed by zero
or more epilogue blocks (bias add, relu, or both folded into one), linked through
intermediate buffers that nothing else touches.  Each block is reduced to what it computes
(roles of its indices, operations, dtypes), never to how it is spelled, and that summary is
compared with :data:`tir_byoc.patterns.PATTERNS`.  Anything that cannot be proven to compute a
pattern exactly is refused: a wrong offload is worse than a missed one.

The matcher only reads IR; :mod:`tir_byoc.rewrite` builds the replacement from a Match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import ir, s_tir, sym, tirx
from tvm.tirx.layout import TileLayout

from .patterns import PATTERNS, pattern_for
from .plain_loops import lift_nest
from .signature import WIDENINGS, DtypeSignature

_DATA_PAR = 0

#: What a relu makes of NaN (:attr:`Match.relu_nan`): TVM's ``max(z, 0)`` gives 0,
#: ``max(0, z)`` and ``select(z < 0, 0, z)`` keep NaN.  Intrinsics are told which.
RELU_NAN_TO_ZERO = "zero"
RELU_KEEPS_NAN = "keep"
_INT_LITERAL = re.compile(r"T\.u?int[0-9]+\((-?[0-9]+)\)")
_COMM_REDUCE = 2


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """One chain of blocks that computes a pattern of the family.

    Attributes
    ----------
    func : str
        Name of the PrimFunc in its module.
    pattern : str
        One of :data:`tir_byoc.patterns.PATTERNS`.
    blocks : tuple of str
        Names of the SBlocks the chain covers, in execution order.
    dtype : DtypeSignature
        Input, weight and output dtypes.
    m, n, k : tvm.ir.PrimExpr
        Extents (static ``IntImm`` or symbolic).
    x, w, bias, out : tvm.ir.Var
        The buffers: input (M, K), weight, bias (None without one) and output (M, N).
    intermediates : tuple of tvm.ir.Var
        Buffers written and read only inside the chain; dead once it is offloaded.
    stmts : tuple of tvm.tirx.Stmt
        The loop nests of ``blocks``, siblings in one ``SeqStmt``; the rewrite replaces them.
    relu_nan : str or None
        For a pattern with relu: what its TIR spelling makes of a NaN,
        :data:`RELU_NAN_TO_ZERO` (``max(z, 0)``) or :data:`RELU_KEEPS_NAN` (``max(0, z)``).
    """

    func: str
    pattern: str
    blocks: tuple[str, ...]
    dtype: DtypeSignature
    m: tvm.ir.PrimExpr
    n: tvm.ir.PrimExpr
    k: tvm.ir.PrimExpr
    x: ir.Var
    w: ir.Var
    bias: ir.Var | None
    out: ir.Var
    intermediates: tuple[ir.Var, ...] = ()
    stmts: tuple[tirx.Stmt, ...] = field(default=(), repr=False, compare=False)
    relu_nan: str | None = None

    @property
    def shape(self) -> tuple[str, str, str]:
        """M, N, K as text (symbolic extents by name)."""
        return tuple(_expr_text(e) for e in (self.m, self.n, self.k))

    @property
    def buffers(self) -> dict[str, str]:
        """Role -> buffer name."""
        roles = {"x": self.x, "w": self.w, "bias": self.bias, "out": self.out}
        return {role: var.name for role, var in roles.items() if var is not None}


@dataclass(frozen=True)
class Rejection:
    """A block that looked like part of a chain but was not matched.

    Attributes
    ----------
    func : str
        Name of the PrimFunc.
    blocks : tuple of str
        The refused block (and, for a chain cut short, nothing else).
    nearest : str or None
        The pattern the block came closest to.
    reason : str
        The first condition that failed, in words.
    """

    func: str
    blocks: tuple[str, ...]
    nearest: str | None
    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        near = f" (nearest pattern: {self.nearest})" if self.nearest else ""
        return f"{self.func}: block {', '.join(self.blocks)} not offloaded{near}: {self.reason}"


@dataclass(frozen=True)
class FunctionScan:
    """Everything the matcher found in one PrimFunc."""

    func: str
    matches: tuple[Match, ...] = ()
    rejections: tuple[Rejection, ...] = ()


class _Refused(Exception):
    """Internal control flow: a block is not what the pattern needs (caught in this module)."""

    def __init__(self, reason: str, nearest: str | None = None, op: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.nearest = nearest
        self.op = op  # the epilogue operation ("bias", "relu") being read when refused


# --------------------------------------------------------------------------------------
# Small helpers on IR
# --------------------------------------------------------------------------------------


def _expr_text(expr) -> str:
    if isinstance(expr, tirx.IntImm):
        return str(expr.value)
    if isinstance(expr, tirx.Var):
        return expr.name
    return str(expr)


_OPERATION_WORDS = {
    tirx.Add: "a sum (+)",
    tirx.Sub: "a difference (-)",
    tirx.Mul: "a product (*)",
    tirx.Div: "a quotient (/)",
    tirx.FloorDiv: "a floor division (//)",
    tirx.FloorMod: "a remainder (%)",
    tirx.Max: "max()",
    tirx.Min: "min()",
    tirx.Select: "select()",
}


def _operation_text(expr) -> str:
    """What an expression computes, in the words of a TVMScript reader."""
    for kind, words in _OPERATION_WORDS.items():
        if isinstance(expr, kind):
            return words
    if isinstance(expr, ir.TensorLoad):
        return f"a plain read of {expr.source.name}"
    if isinstance(expr, tirx.Cast):
        return f"a cast to {_dtype(expr)}"
    if isinstance(expr, tvm.ir.Call):
        return f"a call to {getattr(expr.op, 'name', expr.op)}"
    value = _const_value(expr)
    if value is not None:
        return f"the constant {value}"
    return type(expr).__name__


def _const_value(expr):
    """The value of a numeric constant (also through casts), else None."""
    if isinstance(expr, (int, float)):
        return expr
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    if isinstance(expr, (tirx.FloatImm, tirx.IntImm)):
        return expr.value
    return None


def _is_zero(expr) -> bool:
    value = _const_value(expr)
    return value is not None and value == 0


def _is_buffer(var) -> bool:
    return isinstance(var, ir.Var) and isinstance(var.ty, tirx.BufferType)


def _dtype(node) -> str:
    """Element dtype of a buffer Var, or dtype of a scalar expression."""
    return str(node.ty.dtype)


def _shape(var) -> tuple:
    return tuple(var.ty.shape)


def _is_var(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


class _Extents:
    """Proves extents equal: integers directly, symbolic ones with the arithmetic analyzer."""

    def __init__(self):
        self._analyzer = None

    def equal(self, a, b) -> bool:
        a_value, b_value = _const_value(a), _const_value(b)
        if a_value is not None or b_value is not None:
            return a_value is not None and a_value == b_value
        if a.same_as(b):
            return True
        if self._analyzer is None:
            self._analyzer = sym.Analyzer()
        a, b = _same_index_dtype(a, b)
        return bool(self._analyzer.can_prove_equal(a, b))


def _same_index_dtype(a, b):
    if _dtype(a) == _dtype(b):
        return a, b
    return tirx.Cast("int64", a), tirx.Cast("int64", b)


def _compact_global(var) -> str | None:
    """Why a buffer cannot be handed to a C kernel as a dense row-major array, or None."""
    ty = var.ty
    # Buffers of functions without SBlocks carry their row-major layout explicitly.
    if ty.layout is not None and not (isinstance(ty.layout, TileLayout) and ty.layout.is_trivial()):
        return f"buffer {var.name} has a custom layout"
    if str(ty.storage_scope) not in ("global", ""):
        return f"buffer {var.name} lives in scope {ty.storage_scope!r}, not global memory"
    strides = tuple(ty.strides)
    if strides:
        shape = _shape(var)
        expected = 1
        for dim in reversed(range(len(shape))):
            value = _const_value(strides[dim])
            if value is None or value != expected:
                return f"buffer {var.name} has non-compact strides {list(strides)}"
            extent = _const_value(shape[dim])
            if extent is None and dim > 0:
                return f"buffer {var.name} has explicit strides with a symbolic shape"
            expected *= extent if extent is not None else 1
    return None


# --------------------------------------------------------------------------------------
# Loop nests
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Nest:
    """A leaf SBlock with the perfectly nested loops directly around it."""

    stmt: tirx.Stmt
    loops: tuple[tirx.For, ...]
    realize: s_tir.SBlockRealize
    block: s_tir.SBlock
    seq: int  # id of the enclosing statement list (-1 when not in a SeqStmt)
    index: int  # position in that list

    @property
    def name(self) -> str:
        return self.block.name_hint


def _unwrap_nest(stmt):
    """(loops, realize) if ``stmt`` is a perfect loop nest around a leaf SBlock."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
        if isinstance(stmt, tirx.SeqStmt) and len(stmt.seq) == 1:
            stmt = stmt.seq[0]
    if isinstance(stmt, s_tir.SBlockRealize) and _is_leaf(stmt.block):
        return tuple(loops), stmt
    return None


def _is_leaf(block) -> bool:
    return isinstance(block.body, tirx.BufferStore)


class _FunctionIndex:
    """One pass over a PrimFunc: its leaf nests, allocations, views and buffer uses.

    In a function without SBlocks (plain loops, as TVM's lowering leaves them), each perfect
    loop nest around one store is read as the SBlock it denotes (:mod:`tir_byoc.plain_loops`).
    """

    def __init__(self, func: tirx.PrimFunc):
        self.params = {p for p in func.params if _is_buffer(p)}
        self.local = set()  # buffers allocated inside the function
        self.views = set()  # buffers declared over another's storage
        self.nests: list[_Nest] = []
        self.inner_blocks: list[s_tir.SBlock] = []  # blocks that are not single-store leaves
        self.owners: dict[ir.Var, dict[int, int]] = {}  # buffer -> {nest index or -1: count}
        self.uses: dict[int, set[ir.Var]] = {}  # nest index -> the buffers it uses
        self.sequences: dict[int, list[tirx.Stmt]] = {}
        self._lifted_names = set() if not is_s_tir(func) else None
        self._visit(func.body, seq=-1, index=0)
        self._positions = {(n.seq, n.index): p for p, n in enumerate(self.nests) if n.seq >= 0}

    # Step 1. Structure: find nests and allocations; count buffer uses per owner.
    def _visit(self, stmt, seq, index):
        nest = _unwrap_nest(stmt)
        if nest is None and self._lifted_names is not None:
            nest = lift_nest(stmt, self._lifted_names)
        if nest is not None:
            loops, realize = nest
            position = len(self.nests)
            self.nests.append(_Nest(stmt, loops, realize, realize.block, seq, index))
            self._count_uses(stmt, position)
            return
        if isinstance(stmt, tirx.SeqStmt):
            key = len(self.sequences)
            self.sequences[key] = list(stmt.seq)
            for i, child in enumerate(stmt.seq):
                self._visit(child, key, i)
        elif isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            self.inner_blocks.append(block)
            self.local.update(block.alloc_buffers)
            self.views.update(m.buffer for m in block.match_buffers)
            for region in (*block.reads, *block.writes):
                self._count_var(region.source, -1)
            self._count_uses(stmt.iter_values, -1)
            self._count_uses(stmt.predicate, -1)
            if block.init is not None:
                self._visit(block.init, -1, 0)
            self._visit(block.body, -1, 0)
        elif isinstance(stmt, tirx.For):
            self._count_uses([stmt.min, stmt.extent], -1)
            self._visit(stmt.body, -1, 0)
        elif isinstance(stmt, tirx.AllocBuffer):
            self.local.add(stmt.buffer)
        elif isinstance(stmt, tirx.DeclBuffer):
            self.views.add(stmt.buffer)
            self._count_uses(stmt.data, -1)
        elif isinstance(stmt, tirx.IfThenElse):
            self._count_uses(stmt.condition, -1)
            self._visit(stmt.then_case, -1, 0)
            if stmt.else_case is not None:
                self._visit(stmt.else_case, -1, 0)
        else:
            self._count_uses(stmt, -1)

    def _count_uses(self, node, owner):
        def on_var(var):
            if _is_buffer(var):
                self._count_var(var, owner)

        tvm_ffi.structural_walk(node, (ir.Var, on_var))

    def _count_var(self, var, owner):
        counts = self.owners.setdefault(var, {})
        counts[owner] = counts.get(owner, 0) + 1
        if owner >= 0:
            self.uses.setdefault(owner, set()).add(var)

    # Step 2. Queries.
    def only_used_by(self, buffer, *positions) -> bool:
        return set(self.owners.get(buffer, {})) <= set(positions)

    def other_users(self, buffer, *positions) -> list[str]:
        names = []
        for owner in self.owners.get(buffer, {}):
            if owner in positions:
                continue
            names.append(f"block {self.nests[owner].name}" if owner >= 0 else "other code")
        return names

    def siblings_after(self, nest: _Nest):
        """(position or None, statement) of each statement after ``nest`` in its list.

        The position is the nest's index in :attr:`nests`, None for a statement that is not a
        leaf nest; allocation statements are left out (they only declare a buffer).
        """
        stmts = self.sequences.get(nest.seq, []) if nest.seq >= 0 else []
        for following in range(nest.index + 1, len(stmts)):
            if not isinstance(stmts[following], tirx.AllocBuffer):
                yield self._positions.get((nest.seq, following)), stmts[following]

    def sibling_before(self, nest: _Nest) -> int | None:
        """Position of the nest that directly precedes ``nest`` in its statement list."""
        stmts = self.sequences.get(nest.seq, []) if nest.seq >= 0 else []
        before = nest.index - 1
        while before >= 0 and isinstance(stmts[before], tirx.AllocBuffer):
            before -= 1
        return self._positions.get((nest.seq, before)) if before >= 0 else None


def _check_binding(nest: _Nest, extents: _Extents) -> None:
    """Each block iterator is one loop of the nest, running over the iterator's whole domain."""
    block, realize = nest.block, nest.realize
    if _const_value(realize.predicate) != 1:
        raise _Refused(f"block {block.name_hint} has a predicate, so it skips part of its domain")
    if len(nest.loops) != len(block.iter_vars):
        raise _Refused(
            f"block {block.name_hint} has {len(block.iter_vars)} iterators but "
            f"{len(nest.loops)} loops around it (the loop nest is scheduled or shared)"
        )
    loop_by_var = {loop.loop_var: loop for loop in nest.loops}
    used = set()
    for iter_var, value in zip(block.iter_vars, realize.iter_values):
        loop = loop_by_var.get(value) if isinstance(value, tirx.Var) else None
        if loop is None or value in used:
            raise _Refused(
                f"iterator {iter_var.var.name} of block {block.name_hint} is bound to "
                f"{value}, not to a loop of its own nest (split, fused or shared loops)"
            )
        used.add(value)
        dom = iter_var.dom
        if not _is_zero(dom.min) or not _is_zero(loop.min):
            raise _Refused(f"iterator {iter_var.var.name} does not start at 0")
        if not extents.equal(loop.extent, dom.extent):
            raise _Refused(
                f"loop {loop.loop_var.name} runs over {_expr_text(loop.extent)} iterations, "
                f"but iterator {iter_var.var.name} spans {_expr_text(dom.extent)}"
            )
        if loop.kind == tirx.ForKind.THREAD_BINDING or (
            loop.step is not None and _const_value(loop.step) != 1
        ):
            raise _Refused(f"loop {loop.loop_var.name} is thread-bound or strided")


# --------------------------------------------------------------------------------------
# The reduction block
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reduction:
    nest: _Nest
    layout: str
    x: ir.Var
    w: ir.Var
    out: ir.Var
    m: tvm.ir.PrimExpr
    n: tvm.ir.PrimExpr
    k: tvm.ir.PrimExpr
    dtype: DtypeSignature
    bias: ir.Var | None = None  # a bias vector the output is initialised with
    init_nest: _Nest | None = None  # the init as a block of its own (decompose_reduction)


@dataclass(frozen=True)
class _Init:
    """How a reduction's output is initialised: the store and the iterators of its row/column."""

    store: tirx.BufferStore
    row: tirx.Var
    col: tirx.Var
    nest: _Nest | None = None  # None for the reduction block's own init


def _is_element(expr) -> bool:
    """True for a buffer element, possibly through casts."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return isinstance(expr, ir.TensorLoad)


def _looks_like_gemm(block) -> bool:
    """A reduction that multiplies two buffer elements (through casts): a GEMM candidate.

    Anything else (a sum, a variance's ``(x - mean) * (x - mean)``, a product of computed
    values) is not a GEMM, so its refusal is not worth a user's attention.
    """
    if not any(iv.iter_type == _COMM_REDUCE for iv in block.iter_vars):
        return False
    found = []

    def on_product(product):
        if _is_element(product.a) and _is_element(product.b):
            found.append(product)

    tvm_ffi.structural_walk(block.body, (tirx.Mul, on_product))
    return bool(found)


def _unpack_operand(expr, acc_dtype):
    """(load, source dtype) of a reduction operand: a load, possibly widened by a cast."""
    if isinstance(expr, tirx.Cast):
        inner = expr.value
        if not isinstance(inner, ir.TensorLoad):
            raise _Refused(f"operand {expr} is a cast of a computed value, not of a buffer")
        source = _dtype(inner.source)
        target = _dtype(expr)
        if target != acc_dtype:
            raise _Refused(f"operand is cast to {target}, but the accumulator is {acc_dtype}")
        if source != target and target not in WIDENINGS.get(source, ()):
            raise _Refused(
                f"operand {inner.source.name} is cast from {source} to {target}, which is not "
                "an exact widening"
            )
        return inner, source
    if isinstance(expr, ir.TensorLoad):
        source = _dtype(expr.source)
        if source != acc_dtype:
            raise _Refused(
                f"operand {expr.source.name} is {source} but the accumulator is {acc_dtype}"
            )
        return expr, source
    raise _Refused(f"operand {expr} is not a buffer element")


def _analyze_reduction(
    nest: _Nest, extents: _Extents, index: _FunctionIndex, init_nest: _Nest | None = None
) -> _Reduction:
    """Read ``nest`` as ``Y[i, j] = sum_k X[i, k] * W`` (initialised in ``init_nest`` if given)."""
    block = nest.block
    spatial = [iv for iv in block.iter_vars if iv.iter_type == _DATA_PAR]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == _COMM_REDUCE]

    # Step 1. Shape of the iteration space and of the loops around it.
    if len(reduce) != 1:
        raise _Refused(f"block reduces over {len(reduce)} axes; the family reduces over one (k)")
    if len(spatial) != 2 or len(block.iter_vars) != 3:
        raise _Refused(
            f"block has {len(spatial)} spatial axes; the family is 2-D "
            "(batched matmul is not part of it)"
        )
    _check_binding(nest, extents)
    if block.match_buffers or block.alloc_buffers:
        raise _Refused("block declares its own buffers")

    # Step 2. The update: C[i, j] = C[i, j] + A * B.
    store = block.body
    out = store.buffer
    if len(store.indices) != 2 or not all(isinstance(e, tirx.Var) for e in store.indices):
        raise _Refused(f"output {out.name} is not indexed by two plain iterators")
    vi, vj = store.indices
    iter_i = next((iv for iv in spatial if iv.var.same_as(vi)), None)
    iter_j = next((iv for iv in spatial if iv.var.same_as(vj)), None)
    if iter_i is None or iter_j is None or vi.same_as(vj):
        raise _Refused(f"output {out.name} is not indexed by the block's two spatial iterators")
    vk = reduce[0].var
    value = store.value
    if not isinstance(value, tirx.Add):
        raise _Refused(
            f"the reduction combines with {_operation_text(value)}, not + (a sum of products)"
        )
    product = _split_accumulate(value, out, vi, vj)
    if not isinstance(product, tirx.Mul):
        raise _Refused(
            f"the reduction accumulates {_operation_text(product)}, not a product of two buffers"
        )
    acc_dtype = _dtype(out)
    if _dtype(value) != acc_dtype:
        raise _Refused(f"the update is computed in {_dtype(value)}, the output is {acc_dtype}")

    # Step 3. The init: C[i, j] = 0 or b[j], in the block or in a block of its own before it.
    if block.init is not None:
        init = _Init(block.init, vi, vj)
    elif init_nest is not None:
        init = _init_block(init_nest, out, extents)
    else:
        raise _Refused(
            f"the reduction has no init, and the block before it does not set {out.name} "
            "to 0, so it is not reset"
        )
    _check_init(init, out)

    # Step 4. Operands: which one is X[i, k], and how the weight is indexed.
    a, a_dtype = _unpack_operand(product.a, acc_dtype)
    b, b_dtype = _unpack_operand(product.b, acc_dtype)
    roles = [_operand_role(op, vi, vj, vk) for op in (a, b)]
    if roles[0] == "x" and roles[1] in ("nk", "kn"):
        (x, x_dtype), (w, w_dtype), layout_key = (a, a_dtype), (b, b_dtype), roles[1]
    elif roles[1] == "x" and roles[0] in ("nk", "kn"):
        (x, x_dtype), (w, w_dtype), layout_key = (b, b_dtype), (a, a_dtype), roles[0]
    else:
        described = ", ".join(f"{op.source.name}{_index_text(op)}" for op in (a, b))
        raise _Refused(
            f"operands {described} do not read X[i, k] and W[j, k] or W[k, j] "
            f"(i = {vi.name}, j = {vj.name}, k = {vk.name})"
        )
    layout = "dense" if layout_key == "nk" else "matmul"

    try:
        return _check_reduction_buffers(
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
    except _Refused as refused:
        nearest = refused.nearest or (layout if _is_zero(init.store.value) else f"{layout}_bias")
        raise _Refused(refused.reason, nearest) from None


def _check_reduction_buffers(
    nest, layout, out, x, w, iters, init, dtype, extents, index
) -> _Reduction:
    """Steps 5 to 7 of :func:`_analyze_reduction`, once the operand roles are known."""
    iter_i, iter_j, iter_k = iters
    # Step 5. Extents: the loops cover the whole output and the whole K.
    m, n, k = iter_i.dom.extent, iter_j.dom.extent, iter_k.dom.extent
    _check_shape(out, (m, n), ("M", "N"), extents)
    _check_shape(x.source, (m, k), ("M", "K"), extents, what="input")
    w_dims = ((n, k), ("N", "K")) if layout == "dense" else ((k, n), ("K", "N"))
    _check_shape(w.source, *w_dims, extents, what="weight")
    if init.nest is not None:
        _check_covers(init.nest.block, (init.row, init.col), (m, n), extents)

    # Step 6. Buffers a C kernel can take: distinct, compact, in global memory.
    for buf in (out, x.source, w.source):
        reason = _compact_global(buf)
        if reason:
            raise _Refused(reason)
        if buf in index.views:
            raise _Refused(f"buffer {buf.name} is a view of another buffer and may alias it")
    if out.same_as(x.source) or out.same_as(w.source):
        raise _Refused(f"output {out.name} is also read as an operand (in-place update)")

    # Step 7. A bias the output starts from: b[j] or b[0, j], like an epilogue's.
    bias = None
    if not _is_zero(init.store.value):
        bias = _bias_vector(init.store.value, init.row, init.col, n, dtype.out, extents)
    return _Reduction(nest, layout, x.source, w.source, out, m, n, k, dtype, bias, init.nest)


def _init_block(nest: _Nest, out, extents: _Extents) -> _Init:
    """The init of a reduction as a block of its own: ``out[i, j] = 0`` (or ``b[j]``)."""
    block = nest.block
    if not _is_spatial(block) or block.init is not None or len(block.iter_vars) != 2:
        raise _Refused(
            f"the reduction has no init, and block {block.name_hint} before it is not a "
            f"2-D elementwise init of {out.name}"
        )
    _check_binding(nest, extents)
    store = block.body
    iters = [iv.var for iv in block.iter_vars]
    if len(store.indices) != 2 or not all(isinstance(e, tirx.Var) for e in store.indices):
        raise _Refused(f"init block {block.name_hint} does not write {out.name}[i, j]")
    row, col = store.indices
    if row.same_as(col) or not all(any(v.same_as(i) for i in iters) for v in (row, col)):
        raise _Refused(f"init block {block.name_hint} does not write {out.name}[i, j]")
    return _Init(store, row, col, nest)


def _check_init(init: _Init, out) -> None:
    """The init writes ``out[row, col]`` with 0 or with a plain read (a bias, checked later)."""
    store = init.store
    if (
        not isinstance(store, tirx.BufferStore)
        or not store.buffer.same_as(out)
        or len(store.indices) != 2
        or not (store.indices[0].same_as(init.row) and store.indices[1].same_as(init.col))
    ):
        raise _Refused(f"the init does not write {out.name}[{init.row.name}, {init.col.name}]")
    if not _is_zero(store.value) and not isinstance(store.value, ir.TensorLoad):
        value = _const_value(store.value)
        shown = value if value is not None else store.value
        raise _Refused(f"the reduction is initialised to {shown}, not 0 or a bias b[j]")


def _bias_vector(load, row, col, n, out_dtype, extents: _Extents):
    """The buffer of a bias read ``b[j]`` or ``b[0, j]`` (``row``, ``col`` = i, j); else refused."""
    buf, indices = load.source, list(load.indices)
    shape = _shape(buf)
    if len(shape) == 2 and len(indices) == 2 and _is_var(indices[0], row):
        raise _Refused(f"bias {buf.name} has a full (M, N) shape; the pattern needs (N,) or (1, N)")
    j_index = indices[-1] if indices else None
    if indices and _is_var(j_index, row):
        raise _Refused(
            f"bias {buf.name} is indexed by the row {row.name}; "
            f"the pattern needs the column {col.name}"
        )
    if not _is_var(j_index, col) or (len(indices) == 2 and not _is_zero(indices[0])):
        raise _Refused(f"bias {buf.name}{_index_text(load)} is not indexed as b[j] or b[0, j]")
    if len(shape) not in (1, 2) or len(indices) != len(shape):
        raise _Refused(f"bias {buf.name} has shape {list(shape)}, expected (N,) or (1, N)")
    if len(shape) == 2 and not extents.equal(shape[0], 1):
        raise _Refused(f"bias {buf.name} has shape {list(shape)}, expected (1, N)")
    if not extents.equal(shape[-1], n):
        raise _Refused(
            f"bias {buf.name} has {_expr_text(shape[-1])} elements, expected N = {_expr_text(n)}"
        )
    if _dtype(buf) != out_dtype:
        raise _Refused(f"bias {buf.name} is {_dtype(buf)}, expected {out_dtype}")
    reason = _compact_global(buf)
    if reason:
        raise _Refused(reason)
    return buf


def _split_accumulate(value, out, vi, vj):
    for acc, other in ((value.a, value.b), (value.b, value.a)):
        if (
            isinstance(acc, ir.TensorLoad)
            and acc.source.same_as(out)
            and len(acc.indices) == 2
            and acc.indices[0].same_as(vi)
            and acc.indices[1].same_as(vj)
        ):
            return other
    raise _Refused(f"the update does not add to {out.name}[{vi.name}, {vj.name}] itself")


def _index_text(load) -> str:
    return "[" + ", ".join(_expr_text(e) for e in load.indices) + "]"


def _operand_role(load, vi, vj, vk) -> str | None:
    """'x' for [i, k], 'nk' for [j, k], 'kn' for [k, j]; None otherwise."""
    indices = list(load.indices)
    if len(indices) != 2:
        return None
    first, second = indices
    if _is_var(first, vi) and _is_var(second, vk):
        return "x"
    if _is_var(first, vj) and _is_var(second, vk):
        return "nk"
    if _is_var(first, vk) and _is_var(second, vj):
        return "kn"
    return None


def _check_shape(buf, dims, names, extents: _Extents, what="output"):
    shape = _shape(buf)
    if len(shape) != len(dims):
        raise _Refused(f"{what} {buf.name} has {len(shape)} dimensions, expected {len(dims)}")
    for axis, (actual, expected, name) in enumerate(zip(shape, dims, names)):
        if not extents.equal(actual, expected):
            iterator = {"M": "i", "N": "j", "K": "k"}[name]
            raise _Refused(
                f"{iterator} runs over 0..{_last_index(expected)} of {_expr_text(actual)} "
                f"(axis {axis} of {what} {buf.name}): the loops do not cover it whole"
            )


def _last_index(extent) -> str:
    value = _const_value(extent)
    if value is not None:
        return str(value - 1)
    text = _INT_LITERAL.sub(r"\1", _expr_text(extent))
    return f"({text})-1"


# --------------------------------------------------------------------------------------
# Epilogue blocks
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Epilogue:
    nest: _Nest
    ops: tuple[str, ...]
    bias: ir.Var | None
    out: ir.Var
    relu_nan: str | None  # what the relu's spelling makes of NaN (RELU_NAN_TO_ZERO, ...)


def _analyze_epilogue(nest: _Nest, chain: _Reduction, source, extents, index) -> _Epilogue:
    """Read ``nest`` as ``out[i, j] = f(source[i, j])`` with f made of bias adds and relus."""
    block = nest.block
    if any(iv.iter_type != _DATA_PAR for iv in block.iter_vars) or block.init is not None:
        raise _Refused(f"block {block.name_hint} is a reduction, not an elementwise epilogue")
    if len(block.iter_vars) != 2:
        raise _Refused(f"block {block.name_hint} has {len(block.iter_vars)} axes, expected 2")
    _check_binding(nest, extents)
    store = block.body
    out = store.buffer
    if len(store.indices) != 2 or not all(isinstance(e, tirx.Var) for e in store.indices):
        raise _Refused(f"output {out.name} is not indexed by two plain iterators")
    vi, vj = store.indices
    if vi.same_as(vj) or not all(
        any(iv.var.same_as(v) for iv in block.iter_vars) for v in (vi, vj)
    ):
        raise _Refused(f"output {out.name} is not indexed by the block's two iterators")
    _check_shape(out, (chain.m, chain.n), ("M", "N"), extents)
    _check_covers(block, (vi, vj), (chain.m, chain.n), extents)
    if _dtype(out) != chain.dtype.out:
        raise _Refused(f"output {out.name} is {_dtype(out)}, the chain computes {chain.dtype.out}")
    reason = _compact_global(out)
    if reason:
        raise _Refused(reason)
    parser = _EpilogueParser(source, vi, vj, chain, extents)
    ops = parser.parse(store.value)
    if not ops:
        raise _Refused(f"block {block.name_hint} only copies {source.name}")
    relu_nan = parser.relu_nan
    if relu_nan is not None and not chain.dtype.out.startswith(("float", "bfloat")):
        relu_nan = RELU_NAN_TO_ZERO  # integers have no NaN: every spelling agrees
    return _Epilogue(nest, ops, parser.bias, out, relu_nan)


def _check_covers(block, indices, dims, extents: _Extents) -> None:
    """The epilogue's iterators run over all of M x N, as the kernel writes all of it."""
    for var, dim, name in zip(indices, dims, ("M", "N")):
        iter_var = next(iv for iv in block.iter_vars if iv.var.same_as(var))
        if not extents.equal(iter_var.dom.extent, dim):
            raise _Refused(
                f"block {block.name_hint} covers {_expr_text(iter_var.dom.extent)} of "
                f"{name} = {_expr_text(dim)} (the kernel would write all of it)"
            )


_IF_THEN_ELSE = "prim.if_then_else"


class _EpilogueParser:
    """Turns an elementwise expression of ``source[i, j]`` into a tuple of family ops.

    It also records what the relu's spelling makes of NaN, which TVM's code keeps: ``max(a,
    b)`` and ``select(c, a, b)`` are ``a > b ? a : b`` and ``c ? a : b``, so a NaN reaching
    ``max(z, 0)`` or ``select(z > 0, z, 0)`` gives 0, and one reaching ``max(0, z)`` or
    ``select(z < 0, 0, z)`` stays NaN.
    """

    def __init__(self, source, vi, vj, chain: _Reduction, extents: _Extents):
        self.source, self.vi, self.vj = source, vi, vj
        self.chain, self.extents = chain, extents
        self.bias = None
        self.relu_nan = None

    def parse(self, expr) -> tuple[str, ...]:
        if isinstance(expr, ir.TensorLoad) and expr.source.same_as(self.source):
            if len(expr.indices) == 2 and _is_var(expr.indices[0], self.vi):
                if _is_var(expr.indices[1], self.vj):
                    return ()
            raise _Refused(
                f"reads {self.source.name}{_index_text(expr)}, not "
                f"{self.source.name}[{self.vi.name}, {self.vj.name}] (indices are mixed up)"
            )
        if isinstance(expr, tirx.Add):
            return self._bias_add(expr)
        if isinstance(expr, tirx.Max):
            return self._relu_max(expr)
        if isinstance(expr, tirx.Select):
            return self._relu_select(expr.condition, expr.true_value, expr.false_value)
        if isinstance(expr, tvm.ir.Call) and getattr(expr.op, "name", None) == _IF_THEN_ELSE:
            return self._relu_select(*expr.args, spelled="if_then_else()")
        if isinstance(expr, tirx.Min):
            raise _Refused("applies min(): a clipped relu is not part of the family", op="relu")
        if isinstance(expr, tirx.Cast):
            raise _Refused(f"casts the result to {_dtype(expr)}")
        if isinstance(expr, tirx.Sub):
            raise _Refused("combines with -, not a bias add (+)")
        if isinstance(expr, tirx.Mul):
            raise _Refused("multiplies the result (a scale or leaky relu is not in the family)")
        raise _Refused(f"computes {_operation_text(expr)}, which is not a bias add or a relu")

    def _contains_source(self, expr) -> bool:
        found = []

        def on_load(load):
            if load.source.same_as(self.source):
                found.append(load)

        tvm_ffi.structural_walk(expr, (ir.TensorLoad, on_load))
        return bool(found)

    def _bias_add(self, expr) -> tuple[str, ...]:
        inner, bias = (expr.a, expr.b) if self._contains_source(expr.a) else (expr.b, expr.a)
        if self._contains_source(bias):
            raise _Refused(f"adds {self.source.name} to itself", op="bias")
        ops = self.parse(inner)
        if not isinstance(bias, ir.TensorLoad):
            value = _const_value(bias)
            what = f"the constant {value}" if value is not None else str(bias)
            raise _Refused(f"adds {what}, not a bias vector b[j]", op="bias")
        try:
            self._check_bias(bias)
        except _Refused as refused:
            raise _Refused(refused.reason, op="bias") from None
        return (*ops, "bias")

    def _check_bias(self, load):
        chain = self.chain
        buf = _bias_vector(load, self.vi, self.vj, chain.n, chain.dtype.out, self.extents)
        if self.bias is not None or chain.bias is not None:
            raise _Refused("adds a second bias")
        self.bias = buf

    def _relu_max(self, expr) -> tuple[str, ...]:
        # max(a, b) is a > b ? a : b: NaN in a gives b, NaN in b stays.
        for value, bound, nan in (
            (expr.a, expr.b, RELU_NAN_TO_ZERO),
            (expr.b, expr.a, RELU_KEEPS_NAN),
        ):
            if self._contains_source(value) and not self._contains_source(bound):
                threshold = _const_value(bound)
                if threshold is None:
                    raise _Refused(
                        f"max() against {bound}, not against 0 (a relu needs 0)", op="relu"
                    )
                if threshold != 0:
                    raise _Refused(f"relu threshold is {threshold}, not 0", op="relu")
                return self._relu(value, nan)
        raise _Refused(
            "max() of two computed values (a leaky relu is not in the family)", op="relu"
        )

    def _relu_select(self, cond, then, other, spelled="select()") -> tuple[str, ...]:
        # Every comparison with NaN is false, so NaN takes the false branch.
        branches = (
            (then, other, "positive", RELU_NAN_TO_ZERO),
            (other, then, "negative", RELU_KEEPS_NAN),
        )
        for value, zero, keep_when, nan in branches:
            if not _is_zero(zero) or not self._contains_source(value):
                continue
            if _is_relu_condition(cond, value, keep_when):
                return self._relu(value, nan)
            raise _Refused(
                f"{spelled} condition {cond} does not compare the value with 0", op="relu"
            )
        raise _Refused(f"{spelled} does not choose between the value and 0", op="relu")

    def _relu(self, value, nan) -> tuple[str, ...]:
        ops = self.parse(value)
        self.relu_nan = nan
        return (*ops, "relu")


def _is_relu_condition(cond, value, keep_when) -> bool:
    """True if ``cond`` is ``value > 0`` (keep_when positive) or ``value < 0`` (negative)."""
    keep_value_if = {
        "positive": ((tirx.GT, tirx.GE), (tirx.LT, tirx.LE)),
        "negative": ((tirx.LT, tirx.LE), (tirx.GT, tirx.GE)),
    }[keep_when]
    value_left, value_right = keep_value_if
    if isinstance(cond, value_left) and _is_zero(cond.b):
        return tvm_ffi.structural_equal(cond.a, value)
    if isinstance(cond, value_right) and _is_zero(cond.a):
        return tvm_ffi.structural_equal(cond.b, value)
    return False


# --------------------------------------------------------------------------------------
# Chains
# --------------------------------------------------------------------------------------


def _extend_chain(positions, core: _Reduction, index: _FunctionIndex, extents, func_name):
    """Grow a chain from a reduction (and its init block, if separate) through epilogue blocks.

    Returns the Match, the Rejections of epilogue-like blocks that could not join it, and the
    positions of the nests it covers.
    """
    members = list(positions)
    ops: tuple[str, ...] = ("bias",) if core.bias is not None else ()
    bias, relu_nan = core.bias, None
    current = core.out
    intermediates = []
    rejections = []
    while True:
        consumers = [owner for owner in index.owners.get(current, {}) if owner not in members]
        if not consumers:
            break
        try:
            position, epilogue = _next_epilogue(
                consumers, members, current, core, ops, bias, intermediates, index, extents
            )
        except _Refused as refused:
            # The nearest pattern is the one the refused operation would have made, if any.
            attempted = pattern_for(core.layout, (*ops, refused.op)) if refused.op else None
            nearest = (attempted or pattern_for(core.layout, ops)).name
            for owner in consumers:
                if owner >= 0 and _is_spatial(index.nests[owner].block):
                    target = index.nests[owner]
                    reason = refused.reason
                    rejections.append(Rejection(func_name, (target.name,), nearest, reason))
            break
        members.append(position)
        if not epilogue.out.same_as(current):
            intermediates.append(current)
        ops, current = ops + epilogue.ops, epilogue.out
        bias = epilogue.bias if epilogue.bias is not None else bias
        relu_nan = epilogue.relu_nan or relu_nan
    nests = [index.nests[p] for p in members]
    match = Match(
        func=func_name,
        pattern=pattern_for(core.layout, ops).name,
        blocks=tuple(n.name for n in nests),
        dtype=core.dtype,
        m=core.m,
        n=core.n,
        k=core.k,
        x=core.x,
        w=core.w,
        bias=bias,
        out=current,
        intermediates=tuple(intermediates),
        stmts=tuple(n.stmt for n in nests),
        relu_nan=relu_nan,
    )
    return match, rejections, members


def _next_epilogue(consumers, members, current, core, ops, bias, intermediates, index, extents):
    """(position, epilogue) that extends the chain through ``current``, or _Refused why not.

    The epilogue is the next statement after the chain that uses ``current``.  It either reads
    it into a new buffer (then ``current`` must be a local buffer nobody else uses), or
    updates it in place (``Y[i, j] = Y[i, j] + b[j]``; later readers see the final value
    either way).
    """
    last = index.nests[members[-1]]
    # Step 1. The next user, past statements that leave the chain's buffers alone: the call
    # that replaces the chain runs at the place of its last block, after them.
    written = {*intermediates, current}
    read = {core.x, core.w, bias} - {None}
    position = _next_user(last, current, consumers, written, read, index)
    target = index.nests[position]
    in_place = target.block.body.buffer.same_as(current)
    if not in_place and (len(consumers) != 1 or consumers[0] < 0):
        users = index.other_users(current, *members)
        raise _Refused(
            f"{current.name} is read by {len(users)} places ({', '.join(users)}), so it "
            f"stays materialized and the chain ends at block {last.name}"
        )
    if not in_place and (current in index.params or current not in index.local):
        raise _Refused(
            f"{current.name} is a function parameter, so it stays materialized and the chain "
            f"ends at block {last.name}"
        )
    # Step 2. The consumer must be a family epilogue over ``current``.
    epilogue = _analyze_epilogue(target, core, current, extents, index)
    new_ops = ops + epilogue.ops
    if pattern_for(core.layout, new_ops) is None:
        raise _Refused(
            f"{' then '.join(new_ops)} after {core.layout} is not a pattern of the family "
            "(bias before relu, each at most once)"
        )
    # Step 3. Nothing the chain writes may be something it reads.
    outputs = {*intermediates, current, epilogue.out}
    inputs = {core.x, core.w, bias, epilogue.bias} - {None}
    if (epilogue.out.same_as(current) and not in_place) or outputs & inputs:
        raise _Refused(
            f"block {target.name} writes {epilogue.out.name}, which the chain also reads (aliasing)"
        )
    if epilogue.out in index.views or epilogue.bias in index.views:
        raise _Refused(f"block {target.name} uses a buffer view that may alias another buffer")
    return position, epilogue


def _next_user(last: _Nest, current, consumers, written, read, index: _FunctionIndex) -> int:
    """Position of the first of ``consumers`` after ``last`` in its statement list.

    Every statement in between must use none of the buffers the chain writes (``written``)
    and write none it reads (``read``): the chain's blocks move past it.
    """
    for position, stmt in index.siblings_after(last):
        if position in consumers:
            return position
        if position is None:  # not a leaf nest: anything it uses may be written
            touched = _buffers_used(stmt) & (written | read)
            what = _STATEMENT_WORDS.get(type(stmt), type(stmt).__name__)
        else:
            between = index.nests[position]
            touched = index.uses.get(position, set()) & written
            if between.block.body.buffer in read:
                touched.add(between.block.body.buffer)
            what = f"block {between.name}"
        if touched:
            names = ", ".join(sorted(v.name for v in touched))
            raise _Refused(
                f"{what} between block {last.name} and the next use of {current.name} "
                f"touches {names}, which the chain reads or writes, so the chain ends at "
                f"block {last.name}"
            )
    targets = [index.nests[c].name for c in consumers if c >= 0]
    named = f"block {targets[0]}" if targets else f"the next use of {current.name}"
    raise _Refused(
        f"{named} does not follow block {last.name} in the same statement list, so the chain "
        "ends before it"
    )


def _buffers_used(stmt) -> set:
    found = set()
    tvm_ffi.structural_walk(stmt, (ir.Var, lambda var: found.add(var) if _is_buffer(var) else None))
    return found


def _is_spatial(block) -> bool:
    return all(iv.iter_type == _DATA_PAR for iv in block.iter_vars)


def _stranded_epilogues(start: int, index: _FunctionIndex, func_name: str):
    """Elementwise blocks downstream of a refused reduction: (position, Rejection) pairs."""
    rejections, seen = [], {start}
    pending = [start]
    while pending:
        position = pending.pop(0)
        producer = index.nests[position]
        written = producer.block.body.buffer
        for owner in index.owners.get(written, {}):
            # Nests are indexed in program order: an earlier user (an init) is not downstream.
            if owner <= position or owner in seen or not _is_spatial(index.nests[owner].block):
                continue
            seen.add(owner)
            pending.append(owner)
            reason = (
                f"it reads {written.name}, the output of block {producer.name}, which is not "
                "offloaded"
            )
            target = index.nests[owner].name
            rejections.append((owner, Rejection(func_name, (target,), None, reason)))
    return rejections


_STATEMENT_WORDS = {
    tirx.IfThenElse: "an if statement",
    tirx.SeqStmt: "several statements",
    tirx.For: "a loop",
}


def _unreadable_candidates(index: _FunctionIndex, func_name: str) -> list[Rejection]:
    """Multiply-reduce blocks whose body is not one store (an if, several statements, ...)."""
    rejections = []
    for block in index.inner_blocks:
        nested = []
        tvm_ffi.structural_walk(block.body, (s_tir.SBlock, nested.append))
        if nested or not _looks_like_gemm(block):
            continue
        body = next(
            (w for kind, w in _STATEMENT_WORDS.items() if isinstance(block.body, kind)),
            type(block.body).__name__,
        )
        reason = (
            f"the body of block {block.name_hint} is {body}, not a single store "
            "Y[i, j] = Y[i, j] + X[i, k] * W[.., ..]"
        )
        rejections.append(Rejection(func_name, (block.name_hint,), "dense", reason))
    return rejections


def is_s_tir(func: tirx.PrimFunc) -> bool:
    """True if ``func`` is written with SBlocks (S-TIR); otherwise it is read as plain loops."""
    return isinstance(func.body, s_tir.SBlockRealize)


def _separate_init(nest: _Nest, index: _FunctionIndex, covered) -> tuple[int, ...]:
    """The position of the block that initialises a reduction with no init, if any (0 or 1)."""
    if nest.block.init is not None:
        return ()
    before = index.sibling_before(nest)
    if before is None or before in covered:
        return ()
    if not index.nests[before].block.body.buffer.same_as(nest.block.body.buffer):
        return ()
    return (before,)


def scan_function(name: str, func: tirx.PrimFunc) -> FunctionScan:
    """Find every chain in ``func`` and every refused candidate, with reasons.

    Parameters
    ----------
    name : str
        The function's name in its module (reported in each record).
    func : tvm.tirx.PrimFunc
        The function to scan; it is not modified.

    Returns
    -------
    FunctionScan
    """
    index = _FunctionIndex(func)
    extents = _Extents()
    matches, rejections, covered = [], [], set()
    stranded = []
    for position, nest in enumerate(index.nests):
        if position in covered or not _looks_like_gemm(nest.block):
            continue
        init = _separate_init(nest, index, covered)
        try:
            core = _analyze_reduction(nest, extents, index, *(index.nests[p] for p in init))
        except _Refused as refused:
            nearest = refused.nearest or "dense"
            rejections.append(Rejection(name, (nest.name,), nearest, refused.reason))
            stranded += _stranded_epilogues(position, index, name)
            continue
        positions = (*init, position)
        match, refused, members = _extend_chain(positions, core, index, extents, name)
        covered.update(members)
        matches.append(match)
        rejections.extend(refused)
    rejections += [r for position, r in stranded if position not in covered]
    rejections += _unreadable_candidates(index, name)
    return FunctionScan(name, tuple(matches), tuple(rejections))


__all__ = ["PATTERNS", "FunctionScan", "Match", "Rejection", "is_s_tir", "scan_function"]
