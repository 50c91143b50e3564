"""The ways a chain's pieces can be spelled in TIR, as tables the builder looks up.

Each table maps a name a spec field holds to the IR it stands for: :data:`RELU_SPELLINGS`
(the relu a positive writes, with what each makes of a NaN in :data:`RELU_NAN`), the other
epilogue ops as :class:`OpSpelling` entries (:data:`SCALE_SPELLINGS`,
:data:`ACTIVATION_SPELLINGS`, :data:`TAIL_SPELLINGS`: one block or several, the way Relax,
torch or a hand-written kernel writes them, read from the ops' records in
:mod:`tir_byoc.epilogues`), and the variations only near misses use,
:data:`RELU_FORMS`, :data:`BIAS_FORMS`, :data:`TAIL_FORMS`, :data:`PRODUCTS`,
:data:`COMBINERS` and :data:`BIAS_COMBINERS`.  A spec names an entry;
:mod:`tir_byoc.testing.builder` looks it up and never branches on which mutation, if any,
asked for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..epilogues import LITERALS, OPS, Spelling, Terms

#: Relu spellings, by name: each builds ``relu(z)`` from ``z`` and a zero of z's dtype (the
#: threshold, which only a near miss moves away from 0).
RELU_SPELLINGS: dict[str, Callable] = {
    "max(z, 0)": lambda z, c: tirx.Max(z, c),
    "max(0, z)": lambda z, c: tirx.Max(c, z),
    "select(z > 0, z, 0)": lambda z, c: tirx.Select(z > c, z, c),
    "select(0 < z, z, 0)": lambda z, c: tirx.Select(c < z, z, c),
    "select(z >= 0, z, 0)": lambda z, c: tirx.Select(z >= c, z, c),
    "select(z < 0, 0, z)": lambda z, c: tirx.Select(z < c, c, z),
    "select(z <= 0, 0, z)": lambda z, c: tirx.Select(z <= c, c, z),
    "select(0 > z, 0, z)": lambda z, c: tirx.Select(c > z, c, z),
    "if_then_else(z > 0, z, 0)": lambda z, c: tirx.if_then_else(z > c, z, c),
    "if_then_else(z < 0, 0, z)": lambda z, c: tirx.if_then_else(z < c, c, z),
}

#: What each relu spelling makes of a NaN, as TVM lowers it (``max(a, b)`` is ``a > b ? a :
#: b``, and every comparison with NaN is false): ``"zero"`` or ``"keep"``.
RELU_NAN: dict[str, str] = {
    "max(z, 0)": "zero",  # NaN > 0 is false: 0
    "max(0, z)": "keep",  # 0 > NaN is false: NaN
    "select(z > 0, z, 0)": "zero",
    "select(0 < z, z, 0)": "zero",
    "select(z >= 0, z, 0)": "zero",
    "select(z < 0, 0, z)": "keep",
    "select(z <= 0, 0, z)": "keep",
    "select(0 > z, 0, z)": "keep",
    "if_then_else(z > 0, z, 0)": "zero",
    "if_then_else(z < 0, 0, z)": "keep",
}


@dataclass(frozen=True)
class Relu:
    """What a relu form is built from: the value, the value before the block's bias add, the
    chain's relu spelling (a key of :data:`RELU_SPELLINGS`), its threshold and the dtype."""

    z: object
    pre_bias: object
    spelling: str
    threshold: int
    dtype: str

    def const(self, value):
        return tirx.const(value, self.dtype)

    def spelled(self):
        return RELU_SPELLINGS[self.spelling](self.z, self.const(self.threshold))


def _leaky(r: Relu):
    slope = r.z * r.const(0.01)
    if r.spelling.startswith("max"):
        return tirx.Max(r.z, slope)
    return tirx.Select(r.z > r.const(0), r.z, slope)


#: Relu forms, by name: ``"spelled"`` is the chain's own relu spelling; the others are near
#: misses of it.
RELU_FORMS: dict[str, Callable[[Relu], object]] = {
    "spelled": Relu.spelled,
    "select_shifted": lambda r: tirx.Select(r.z > r.const(1), r.z, r.const(0)),
    "leaky": _leaky,
    "clipped": lambda r: tirx.Min(r.spelled(), r.const(6)),
    "pre_bias_select": lambda r: tirx.Select(r.pre_bias > r.const(0), r.z, r.const(0)),
}


@dataclass(frozen=True)
class BiasForm:
    """A bias buffer's shape, from (M, N), and the indices it is read at, from (i, j) and a
    maker of index constants."""

    shape: Callable
    index: Callable


#: Bias forms, by name: ``"vector"`` and ``"row"`` are what a positive's ``bias`` says; the
#: others are near misses.
BIAS_FORMS: dict[str, BiasForm] = {
    "vector": BiasForm(lambda m, n: (n,), lambda i, j, const: [j]),
    "row": BiasForm(lambda m, n: (1, n), lambda i, j, const: [const(0), j]),
    "row_axis": BiasForm(lambda m, n: (m,), lambda i, j, const: [i]),
    "full": BiasForm(lambda m, n: (m, n), lambda i, j, const: [i, j]),
    "second_row": BiasForm(lambda m, n: (2, n), lambda i, j, const: [const(1), j]),
}

#: How a reduction step combines X and W, given ``commuted`` (write ``W * X``).
PRODUCTS: dict[str, Callable] = {
    "mul": lambda x, w, commuted: w * x if commuted else x * w,
    "add": lambda x, w, commuted: x + w,
}

#: How a reduction step folds its update into the accumulator, given ``accumulate_last``
#: (write ``update + acc``).
COMBINERS: dict[str, Callable] = {
    "add": lambda acc, update, last: update + acc if last else acc + update,
    "max": lambda acc, update, last: tirx.Max(acc, update),
    "sub": lambda acc, update, last: acc - update,
}

#: How a bias epilogue combines its two operands (in the order the chain spells them).
BIAS_COMBINERS: dict[str, Callable] = {
    "add": lambda left, right: left + right,
    "sub": lambda left, right: left - right,
    "mul": lambda left, right: left * right,
}

# --------------------------------------------------------------------------------------
# The other epilogue ops: their spellings, read from their records
# --------------------------------------------------------------------------------------

#: The constants a near miss may write with another value (:attr:`~.knobs.Knobs.fixed_constant`):
#: the literals of the spellings and the constants of the ops whose constants are pinned
#: (gelu's sqrt(1/2)), by the names the spellings read.
FIXED_CONSTANTS: dict[str, float] = {
    **LITERALS,
    **{name: value for op in OPS.values() if op.pinned for name, value in op.values().items()},
}


class SwappedTerms(Terms):
    """:class:`~tir_byoc.epilogues.Terms` whose erf and tanh trade places (a near miss:
    gelu's erf written as tanh, tanh-gelu's tanh as erf)."""

    def erf(self, x):
        return tirx.tanh(x)

    def tanh(self, x):
        return tirx.erf(x)


@dataclass(frozen=True)
class OpSpelling:
    """One way to write an epilogue op of :data:`tir_byoc.epilogues.OPS` in TIR, as a test
    builds it.

    Attributes
    ----------
    op : str
        The op it computes.
    blocks : tuple of callable
        One per block, in order: ``block(z, earlier, terms)`` builds the block's value from
        ``z`` (the op's input: a load of its buffer or, for a one-block spelling that shares
        its block with other ops, their expression), ``earlier`` (loads of the op's blocks
        before this one, at the same indices) and a :class:`~tir_byoc.epilogues.Terms`.
    constants : tuple of str
        The fixed constants (keys of :data:`FIXED_CONSTANTS`) it writes.
    functions : tuple of str
        The functions of the formula a near miss may swap (``"erf"``, ``"tanh"``).
    nan, reads
        As :class:`~tir_byoc.epilogues.Spelling` has them.
    """

    op: str
    blocks: tuple[Callable, ...]
    constants: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    nan: str | None = None
    reads: str | None = None


class _Reading(Terms):
    """Terms that note the names a spelling reads and the functions it calls."""

    def __init__(self):
        super().__init__("float32", {}, tirx.Var("t", "float32"))
        object.__setattr__(self, "read", [])

    def c(self, name):
        self.read.append(name)
        return tirx.const(1.0, "float32")

    def erf(self, x):
        self.read.append("erf()")
        return super().erf(x)

    def tanh(self, x):
        self.read.append("tanh()")
        return super().tanh(x)


def _op_spelling(op: str, spelling: Spelling, blocks=None) -> OpSpelling:
    reading = _Reading()
    spelling.inline(tirx.Var("z", "float32"), reading)
    read = tuple(dict.fromkeys(reading.read))
    return OpSpelling(
        op,
        spelling.blocks if blocks is None else blocks,
        tuple(name for name in read if name in FIXED_CONSTANTS),
        tuple(name[:-2] for name in read if name.endswith("()")),
        spelling.nan,
        spelling.reads,
    )


def _commuted(expr, z):
    """``expr`` with the operands of each ``+`` and ``*`` outside ``z`` in the other order."""
    if expr.same_as(z):
        return expr
    if isinstance(expr, (tirx.Add, tirx.Mul)):
        return type(expr)(_commuted(expr.b, z), _commuted(expr.a, z))
    if isinstance(expr, tvm.ir.Call):
        args = [_commuted(arg, z) for arg in expr.args]
        return tirx.call_intrin(str(expr.ty.dtype), expr.op.name, *args)
    if hasattr(expr, "a") and hasattr(expr, "b"):
        return type(expr)(_commuted(expr.a, z), _commuted(expr.b, z))
    return expr


def _spellings_of(spec) -> dict[str, OpSpelling]:
    """The test spellings of an op: its record's, and for an op of fixed form (a template of
    the matcher) its first spelling also in one block and with every ``+`` and ``*``
    commuted, since a hand-written kernel may write it either way."""
    first, *others = spec.spellings
    found = {first.name: _op_spelling(spec.name, first)}
    if spec.template:
        z = tirx.Var("z", "float32")
        one_block = (lambda z, earlier, k: first.inline(z, k),)
        commuted = (lambda z, earlier, k: _commuted(first.inline(z, k), z),)
        if len(first.blocks) > 1:
            found[f"{spec.name}: one block"] = _op_spelling(spec.name, first, one_block)
        expr = first.inline(z, _Reading())
        if not tvm_ffi.structural_equal(expr, _commuted(expr, z)):
            found[f"{spec.name}: commuted"] = _op_spelling(spec.name, first, commuted)
    found.update((other.name, _op_spelling(spec.name, other)) for other in others)
    return found


#: The ops a chain spells with fields of its own (``ChainSpec.bias``, ``ChainSpec.relu``).
_OWN_FIELDS = ("bias", "relu")


def _slot_spellings(slot: str) -> dict[str, OpSpelling]:
    return {
        name: spelling
        for spec in OPS.values()
        if spec.slot == slot and spec.name not in _OWN_FIELDS
        for name, spelling in _spellings_of(spec).items()
    }


#: Scale-slot spellings, by name: a constant ``factor`` or the scalar parameter ``s[0]``.
SCALE_SPELLINGS: dict[str, OpSpelling] = _slot_spellings("scale")

#: Activation spellings (relu has :data:`RELU_SPELLINGS`), by name: ``"op: form"``.
ACTIVATION_SPELLINGS: dict[str, OpSpelling] = _slot_spellings("activation")

#: Tail-slot spellings, by name: a residual ``R`` or a gate ``G`` of the output's shape, a
#: layer scale ``g`` of shape (N,).
TAIL_SPELLINGS: dict[str, OpSpelling] = _slot_spellings("tail")

#: Every op spelling, by name.
OP_SPELLINGS: dict[str, OpSpelling] = {
    **SCALE_SPELLINGS,
    **ACTIVATION_SPELLINGS,
    **TAIL_SPELLINGS,
}


@dataclass(frozen=True)
class TailForm:
    """A residual or gate tensor's shape, from the output's batch extents, M and N, and the
    indices it is read at, from the batch iterators, i, j and a maker of index constants."""

    shape: Callable
    index: Callable


#: Tail tensor forms, by name: ``"full"`` is a positive's; the broadcast ones are near misses.
TAIL_FORMS: dict[str, TailForm] = {
    "full": TailForm(lambda batch, m, n: (*batch, m, n), lambda b, i, j, const: [*b, i, j]),
    "row": TailForm(lambda batch, m, n: (1, n), lambda b, i, j, const: [const(0), j]),
    "column": TailForm(lambda batch, m, n: (m, 1), lambda b, i, j, const: [i, const(0)]),
}

__all__ = [
    "ACTIVATION_SPELLINGS",
    "BIAS_COMBINERS",
    "BIAS_FORMS",
    "COMBINERS",
    "FIXED_CONSTANTS",
    "OP_SPELLINGS",
    "PRODUCTS",
    "RELU_FORMS",
    "RELU_NAN",
    "RELU_SPELLINGS",
    "SCALE_SPELLINGS",
    "TAIL_FORMS",
    "TAIL_SPELLINGS",
    "BiasForm",
    "OpSpelling",
    "Relu",
    "SwappedTerms",
    "TailForm",
]
