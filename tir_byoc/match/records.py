"""The matcher's records: what a scan found (:class:`Match`), and per function
(:class:`FunctionScan`) its matches with what it declined and why
(:class:`~tir_byoc.decline.Decline`).  The analyses
signal a block that is not what a pattern needs with :class:`~tir_byoc.decline.Declined`.

Made by :mod:`.scan`; read by :mod:`tir_byoc.planning`, :mod:`tir_byoc.rewrite` and the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import ir, tirx

from ..decline import Decline
from ..patterns import pattern
from ..signature import DtypeSignature
from .exprs import expr_text

#: What a relu makes of NaN (:attr:`Match.relu_nan`): TVM's ``max(z, 0)`` gives 0,
#: ``max(0, z)`` and ``select(z < 0, 0, z)`` keep NaN.  Intrinsics are told which.
RELU_NAN_TO_ZERO = "zero"


RELU_KEEPS_NAN = "keep"


@dataclass(frozen=True)
class Step:
    """One operation of a match's epilogue, as its call passes it.

    Attributes
    ----------
    op : str
        A key of :data:`tir_byoc.epilogues.OPS`.
    code : int
        Its ``TIR_BYOC_OP_*`` code (a relu that keeps NaN has its own).
    constants : tuple of float or tvm.ir.PrimExpr
        Its constants, in the order of :attr:`~tir_byoc.epilogues.OpSpec.constants`; a scale
        by a scalar parameter holds the parameter's read.
    tensor : tvm.ir.Var or None
        The bias vector, residual or gate tensor it reads.
    """

    op: str
    code: int
    constants: tuple = ()
    tensor: ir.Var | None = None


@dataclass(frozen=True)
class Batch:
    """The batch dims of a match, as its call passes them.

    Attributes
    ----------
    form : str
        ``"leading"``: X and Y carry the batch dims, compact and in order, and the weight is
        shared; the call folds them into M.  ``"batched"``: a batched matmul, one matrix
        product per batch index, each operand's matrix found by its strides.
    counts : tuple of tvm.ir.PrimExpr
        The batch dims after merging the ones that index every operand alike (one or two,
        outermost first); their product is the number of matrix products.
    x_strides, w_strides : tuple of tvm.ir.PrimExpr
        Per dim of ``counts``, the element offset between consecutive X (W) matrices; 0 where
        the operand is broadcast.  Y is compact: its matrices follow each other.
    dims : tuple of tvm.ir.PrimExpr
        Y's batch dims as written in the function (for reports).
    """

    form: str
    counts: tuple[tvm.ir.PrimExpr, ...]
    x_strides: tuple[tvm.ir.PrimExpr, ...]
    w_strides: tuple[tvm.ir.PrimExpr, ...]
    dims: tuple[tvm.ir.PrimExpr, ...]

    @property
    def text(self) -> str:
        """Y's batch dims, as ``2x16``."""
        return "x".join(expr_text(d) for d in self.dims)


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
        Extents of one matrix product (static ``IntImm`` or symbolic).
    x, w, bias, out : tvm.ir.Var
        The buffers: input (..., M, K), weight, bias (None without one), output (..., M, N).
    intermediates : tuple of tvm.ir.Var
        Buffers written and read only inside the chain; dead once it is offloaded.
    stmts : tuple of tvm.tirx.Stmt
        The loop nests of ``blocks``, siblings in one ``SeqStmt``; the rewrite replaces them.
    relu_nan : str or None
        For a pattern with relu: what its TIR spelling makes of a NaN,
        :data:`RELU_NAN_TO_ZERO` (``max(z, 0)``) or :data:`RELU_KEEPS_NAN` (``max(0, z)``).
    batch : Batch or None
        The batch dims, for the ``batch_`` and ``bmm_`` members.
    epilogue : tuple of Step
        The epilogue's operations with their constants and tensors, in order.
    shorter : tuple of Match
        The chain cut after an earlier block, longest first: each a prefix of the epilogue
        that could be offloaded alone (the rest staying TVM code), for a backend that cannot
        take the whole epilogue.
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
    batch: Batch | None = None
    epilogue: tuple[Step, ...] = ()
    shorter: tuple[Match, ...] = field(default=(), repr=False, compare=False)

    @property
    def layout(self) -> str:
        """The weight layout, ``dense`` or ``matmul``."""
        return pattern(self.pattern).layout

    @property
    def pattern_entry(self) -> str:
        """The entry point its calls use (:attr:`tir_byoc.patterns.Pattern.call_pattern`)."""
        return pattern(self.pattern).call_pattern

    @property
    def tensors(self) -> tuple[ir.Var, ...]:
        """The tensors the epilogue reads (bias, residual, gate), in op order."""
        return tuple(s.tensor for s in self.epilogue if s.tensor is not None)

    @property
    def shape(self) -> tuple[str, str, str]:
        """M, N, K as text (symbolic extents by name)."""
        return tuple(expr_text(e) for e in (self.m, self.n, self.k))

    @property
    def rows(self) -> tvm.ir.PrimExpr:
        """M as the call passes it: times the batch when leading batch dims fold into it."""
        if self.batch is None or self.batch.form != "leading":
            return self.m
        rows = self.m
        for count in self.batch.counts:
            rows = rows * count
        return rows

    @property
    def buffers(self) -> dict[str, str]:
        """Role -> buffer name."""
        roles = {"x": self.x, "w": self.w, "bias": self.bias, "out": self.out}
        return {role: var.name for role, var in roles.items() if var is not None}


@dataclass(frozen=True)
class FunctionScan:
    """Everything the matcher found in one PrimFunc: its matches, and the candidates it
    declined (:class:`~tir_byoc.decline.Decline` of kind
    :data:`~tir_byoc.decline.GEMM_CHAIN`), each with the first condition that failed."""

    func: str
    matches: tuple[Match, ...] = ()
    rejections: tuple[Decline, ...] = ()
