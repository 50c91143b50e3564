"""The ways a chain's pieces can be spelled in TIR, as tables the builder looks up.

Each table maps a name a spec field holds to the IR it stands for: :data:`RELU_SPELLINGS`
(the relu a positive writes, with what each makes of a NaN in :data:`RELU_NAN`), the other
epilogue ops as :class:`OpSpelling` entries (:data:`SCALE_SPELLINGS`,
:data:`ACTIVATION_SPELLINGS`, :data:`TAIL_SPELLINGS`: one block or several, the way Relax,
torch or a hand-written kernel writes them), and the variations only near misses use,
:data:`RELU_FORMS`, :data:`BIAS_FORMS`, :data:`TAIL_FORMS`, :data:`PRODUCTS`,
:data:`COMBINERS` and :data:`BIAS_COMBINERS`.  A spec names an entry;
:mod:`tir_byoc.testing.builder` looks it up and never branches on which mutation, if any,
asked for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tvm import tirx

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
# The other epilogue ops: scale, activation and tail spellings
# --------------------------------------------------------------------------------------

#: The constants the gelus are written with, by the names their spellings use (a name
#: ending in 2 is a second occurrence of the same value, which a near miss may change alone).
FIXED_CONSTANTS: dict[str, float] = {
    "half": 0.5,
    "half2": 0.5,
    "one": 1.0,
    "one2": 1.0,
    "three": 3.0,
    "sqrt_half": math.sqrt(0.5),
    "sqrt_2_over_pi": math.sqrt(2 / math.pi),
    "cubic": 0.044715,
}


@dataclass(frozen=True)
class Terms:
    """What an op spelling is built from besides its input: the epilogue's ``dtype``, the
    named constants (``values``: the fixed ones of :data:`FIXED_CONSTANTS` and the op's own,
    ``factor``, ``lo``, ``hi``, ``slope``, ``alpha``), the tensor or scalar it reads
    (``operand``, a load at the block's indices) and whether gelu's erf and tanh-gelu's tanh
    trade places (a near miss)."""

    dtype: str
    values: Mapping[str, float] = field(default_factory=dict)
    operand: object = None
    swap_functions: bool = False

    def c(self, name: str):
        return tirx.const(self.values[name], self.dtype)

    def zero(self):
        return tirx.const(0, self.dtype)

    def erf(self, x):
        return tirx.tanh(x) if self.swap_functions else tirx.erf(x)

    def tanh(self, x):
        return tirx.erf(x) if self.swap_functions else tirx.tanh(x)


@dataclass(frozen=True)
class OpSpelling:
    """One way to write an epilogue op of :data:`tir_byoc.epilogues.OPS` in TIR.

    Attributes
    ----------
    op : str
        The op it computes.
    blocks : tuple of callable
        One per block, in order: ``block(z, earlier, terms)`` builds the block's value from
        ``z`` (the op's input: a load of its buffer or, for a one-block spelling that shares
        its block with other ops, their expression), ``earlier`` (loads of the op's blocks
        before this one, at the same indices) and a :class:`Terms`.
    constants : tuple of str
        The fixed constants (keys of :data:`FIXED_CONSTANTS`) it writes.
    nan : str or None
        A clip: what a NaN becomes, ``"lo"``, ``"hi"`` or ``"nan"``, as TVM lowers the
        spelling (``max(a, b)`` is ``a > b ? a : b``, ``min(a, b)`` is ``a < b ? a : b``).
    reads : str or None
        ``"scalar"`` (a scale by ``s[0]``, a parameter of shape (1,)), ``"vector"`` (a layer
        scale ``g[j]`` of shape (N,)) or ``"tensor"`` (a residual or gate of the output's
        shape).
    """

    op: str
    blocks: tuple[Callable, ...]
    constants: tuple[str, ...] = ()
    nan: str | None = None
    reads: str | None = None

    def __post_init__(self):
        unknown = set(self.constants) - set(FIXED_CONSTANTS)
        if unknown:
            raise ValueError(f"OpSpelling: expected constants of FIXED_CONSTANTS, got {unknown}")


def _one(build, op, **fields) -> OpSpelling:
    """A one-block spelling: ``build(z, terms)``."""
    return OpSpelling(op, (lambda z, earlier, k: build(z, k),), **fields)


# The IR constructors, not Python's operators: those fold (``z * 0.0`` becomes ``0.0``, which
# would turn a leaky relu of slope 0 into a relu with another NaN result).
_mul, _add, _div = tirx.Mul, tirx.Add, tirx.Div

#: Scale-slot spellings, by name: a constant ``factor`` or the scalar parameter ``s[0]``.
SCALE_SPELLINGS: dict[str, OpSpelling] = {
    "z * c": _one(lambda z, k: _mul(z, k.c("factor")), "scale"),
    "c * z": _one(lambda z, k: _mul(k.c("factor"), z), "scale"),
    "z / c": _one(lambda z, k: _div(z, k.c("factor")), "div"),
    "z * s[0]": _one(lambda z, k: _mul(z, k.operand), "scale", reads="scalar"),
    "s[0] * z": _one(lambda z, k: _mul(k.operand, z), "scale", reads="scalar"),
}

_GELU = ("half", "half2", "sqrt_half")
_GELU_TANH = ("half", "one", "one2", "sqrt_2_over_pi", "cubic")


def _clip(outer, inner, value_first, inner_first, nan) -> OpSpelling:
    """``outer(inner(z, inner bound), outer bound)`` with the operands in the orders given."""
    bound = {tirx.Max: "lo", tirx.Min: "hi"}

    def build(z, k):
        low = inner(z, k.c(bound[inner])) if value_first else inner(k.c(bound[inner]), z)
        return outer(low, k.c(bound[outer])) if inner_first else outer(k.c(bound[outer]), low)

    return _one(build, "clip", nan=nan)


def _gelu_tanh_inner(z, k):
    """``(sqrt(2/pi) z) (1 + (0.044715 z) z)``, as Relax writes tanh's argument."""
    cubic = _mul(_mul(k.c("cubic"), z), z)
    return _mul(_mul(k.c("sqrt_2_over_pi"), z), _add(k.c("one2"), cubic))


def _pow(z, k):
    """``pow(z, 3)``, built as the call itself (``tirx.pow`` warns about a power of 3)."""
    return tirx.call_intrin(k.dtype, "tirx.pow", z, k.c("three"))


#: Activation spellings (relu has :data:`RELU_SPELLINGS`), by name: ``"op: form"``.
ACTIVATION_SPELLINGS: dict[str, OpSpelling] = {
    # Relax's LegalizeOps: five blocks, the last reading the input again.
    "gelu: relax": OpSpelling(
        "gelu",
        (
            lambda z, e, k: _mul(z, k.c("sqrt_half")),
            lambda z, e, k: k.erf(e[0]),
            lambda z, e, k: _mul(e[1], k.c("half")),
            lambda z, e, k: _add(k.c("half2"), e[2]),
            lambda z, e, k: _mul(z, e[3]),
        ),
        _GELU,
    ),
    "gelu: one block": _one(
        lambda z, k: _mul(
            z, _add(k.c("half"), _mul(k.erf(_mul(z, k.c("sqrt_half"))), k.c("half2")))
        ),
        "gelu",
        constants=_GELU,
    ),
    "gelu: commuted": _one(
        lambda z, k: _mul(
            _add(_mul(k.c("half2"), k.erf(_mul(k.c("sqrt_half"), z))), k.c("half")), z
        ),
        "gelu",
        constants=_GELU,
    ),
    "gelu: halves": _one(
        lambda z, k: _mul(_mul(z, k.c("half")), _add(k.c("one"), k.erf(_mul(z, k.c("sqrt_half"))))),
        "gelu",
        constants=("half", "one", "sqrt_half"),
    ),
    # Relax's LegalizeOps of gelu(approximate="tanh"): nine blocks.
    "gelu_tanh: relax": OpSpelling(
        "gelu_tanh",
        (
            lambda z, e, k: _mul(k.c("half"), z),
            lambda z, e, k: _mul(k.c("sqrt_2_over_pi"), z),
            lambda z, e, k: _mul(k.c("cubic"), z),
            lambda z, e, k: _mul(e[2], z),
            lambda z, e, k: _add(k.c("one"), e[3]),
            lambda z, e, k: _mul(e[1], e[4]),
            lambda z, e, k: k.tanh(e[5]),
            lambda z, e, k: _add(k.c("one2"), e[6]),
            lambda z, e, k: _mul(e[0], e[7]),
        ),
        _GELU_TANH,
    ),
    "gelu_tanh: one block": _one(
        lambda z, k: _mul(_mul(k.c("half"), z), _add(k.c("one"), k.tanh(_gelu_tanh_inner(z, k)))),
        "gelu_tanh",
        constants=_GELU_TANH,
    ),
    # torch's GPT-2 NewGELU as written in Python: 0.5 x (1 + tanh(c0 (x + c1 x^3))).
    "gelu_tanh: gpt2": _one(
        lambda z, k: _mul(
            _mul(k.c("half"), z),
            _add(
                k.c("one"),
                k.tanh(_mul(k.c("sqrt_2_over_pi"), _add(z, _mul(k.c("cubic"), _pow(z, k))))),
            ),
        ),
        "gelu_tanh",
        constants=("half", "one", "three", "sqrt_2_over_pi", "cubic"),
    ),
    "silu: one block": _one(lambda z, k: _mul(z, tirx.sigmoid(z)), "silu"),
    "silu: commuted": _one(lambda z, k: _mul(tirx.sigmoid(z), z), "silu"),
    "silu: two blocks": OpSpelling(
        "silu", (lambda z, e, k: tirx.sigmoid(z), lambda z, e, k: _mul(z, e[0]))
    ),
    # CLIP's quick_gelu as torch writes it, x * sigmoid(1.702 * x): three blocks in Relax.
    "swish: three blocks": OpSpelling(
        "swish",
        (
            lambda z, e, k: _mul(z, k.c("alpha")),
            lambda z, e, k: tirx.sigmoid(e[0]),
            lambda z, e, k: _mul(z, e[1]),
        ),
    ),
    "swish: one block": _one(lambda z, k: _mul(z, tirx.sigmoid(_mul(k.c("alpha"), z))), "swish"),
    "swish: commuted": _one(lambda z, k: _mul(tirx.sigmoid(_mul(z, k.c("alpha"))), z), "swish"),
    "sigmoid": _one(lambda z, k: tirx.sigmoid(z), "sigmoid"),
    "tanh": _one(lambda z, k: tirx.tanh(z), "tanh"),
    # A NaN: min(NaN, c) and max(NaN, c) give c, min(c, NaN) and max(c, NaN) give NaN.
    "clip: max(min(z, hi), lo)": _clip(tirx.Max, tirx.Min, True, True, "hi"),
    "clip: max(min(hi, z), lo)": _clip(tirx.Max, tirx.Min, False, True, "lo"),
    "clip: max(lo, min(z, hi))": _clip(tirx.Max, tirx.Min, True, False, "hi"),
    "clip: max(lo, min(hi, z))": _clip(tirx.Max, tirx.Min, False, False, "nan"),
    "clip: min(max(z, lo), hi)": _clip(tirx.Min, tirx.Max, True, True, "lo"),
    "clip: min(max(lo, z), hi)": _clip(tirx.Min, tirx.Max, False, True, "hi"),
    "clip: min(hi, max(z, lo))": _clip(tirx.Min, tirx.Max, True, False, "lo"),
    "clip: min(hi, max(lo, z))": _clip(tirx.Min, tirx.Max, False, False, "nan"),
    "leaky_relu: select(0 < z, z, z * a)": _one(
        lambda z, k: tirx.Select(tirx.LT(k.zero(), z), z, _mul(z, k.c("slope"))), "leaky_relu"
    ),
    "leaky_relu: select(z > 0, z, a * z)": _one(
        lambda z, k: tirx.Select(tirx.GT(z, k.zero()), z, _mul(k.c("slope"), z)), "leaky_relu"
    ),
    "leaky_relu: select(z < 0, z * a, z)": _one(
        lambda z, k: tirx.Select(tirx.LT(z, k.zero()), _mul(z, k.c("slope")), z), "leaky_relu"
    ),
    "leaky_relu: max(z, z * a)": _one(
        lambda z, k: tirx.Max(z, _mul(z, k.c("slope"))), "leaky_relu"
    ),
    "leaky_relu: max(a * z, z)": _one(
        lambda z, k: tirx.Max(_mul(k.c("slope"), z), z), "leaky_relu"
    ),
}

#: Tail-slot spellings, by name: a residual ``R`` or a gate ``G`` of the output's shape, a
#: layer scale ``g`` of shape (N,).
TAIL_SPELLINGS: dict[str, OpSpelling] = {
    "z + R": _one(lambda z, k: _add(z, k.operand), "add", reads="tensor"),
    "R + z": _one(lambda z, k: _add(k.operand, z), "add", reads="tensor"),
    "z * G": _one(lambda z, k: _mul(z, k.operand), "mul", reads="tensor"),
    "G * z": _one(lambda z, k: _mul(k.operand, z), "mul", reads="tensor"),
    "z * g[j]": _one(lambda z, k: _mul(z, k.operand), "channel_scale", reads="vector"),
    "g[j] * z": _one(lambda z, k: _mul(k.operand, z), "channel_scale", reads="vector"),
}

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
    "TailForm",
    "Terms",
]
