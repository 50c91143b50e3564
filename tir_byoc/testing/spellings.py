"""The ways a chain's pieces can be spelled in TIR, as tables the builder looks up.

Each table maps a name a spec field holds to the IR it stands for: :data:`RELU_SPELLINGS`
(the relu a positive writes), and the variations only near misses use, :data:`RELU_FORMS`,
:data:`BIAS_FORMS`, :data:`PRODUCTS`, :data:`COMBINERS` and :data:`BIAS_COMBINERS`.  A spec
names an entry; :mod:`tir_byoc.testing.builder` looks it up and never branches on which
mutation, if any, asked for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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

__all__ = [
    "BIAS_COMBINERS",
    "BIAS_FORMS",
    "COMBINERS",
    "PRODUCTS",
    "RELU_FORMS",
    "RELU_SPELLINGS",
    "BiasForm",
    "Relu",
]
