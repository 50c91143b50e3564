"""Every epilogue op, one :class:`~.record.OpSpec` each: the table :data:`TABLE`.

An entry says the op's code and slot, its constants and tensor, its NumPy oracle and its
spellings.  A spelling's blocks are written with the IR constructors (``tirx.Mul``, ...), not
Python's operators, which fold (``z * 0.0`` becomes ``0.0``, turning a leaky relu of slope 0
into a relu with another NaN result), and name every constant: the op's own by the names of
its ``constants``, the others by the names of :data:`LITERALS`.  The first spelling is the one
Relax's ``LegalizeOps`` writes (after ``from_exported_program`` for an op torch decomposes),
its blocks named as Relax names them.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import tirx

from .record import OpSpec, Spelling

#: The named constants spellings write besides an op's own, the same value wherever they are
#: written; a name ending in 2 is a second occurrence of a value, which a near miss may change
#: alone.
LITERALS: dict[str, float] = {
    "half": 0.5,
    "half2": 0.5,
    "one": 1.0,
    "one2": 1.0,
    "three": 3.0,
    "shift": 3.0,
    "six": 6.0,
    "six2": 6.0,
    "inf": math.inf,
    "-inf": -math.inf,
}

_mul, _add, _div, _max, _min = tirx.Mul, tirx.Add, tirx.Div, tirx.Max, tirx.Min
_f32 = np.float32


def _one(name, build, block="compute", **fields) -> Spelling:
    """A spelling in one block: ``build(z, terms)``."""
    return Spelling(name, (lambda z, earlier, k: build(z, k),), (block,), **fields)


def _clip(outer, inner, value_first: bool, inner_first: bool, nan: str) -> Spelling:
    """``outer(inner(z, inner's bound), outer's bound)``, with the operands in the orders given;
    a NaN becomes ``nan``: min(NaN, c) and max(NaN, c) give c, min(c, NaN) and max(c, NaN) NaN."""
    bound, word = {_max: "lo", _min: "hi"}, {_max: "max", _min: "min"}
    low = f"z, {bound[inner]}" if value_first else f"{bound[inner]}, z"
    low = f"{word[inner]}({low})"
    text = f"{low}, {bound[outer]}" if inner_first else f"{bound[outer]}, {low}"

    def build(z, k):
        low = inner(z, k.c(bound[inner])) if value_first else inner(k.c(bound[inner]), z)
        return outer(low, k.c(bound[outer])) if inner_first else outer(k.c(bound[outer]), low)

    return _one(f"clip: {word[outer]}({text})", build, nan=nan)


def _sigmoid(x):
    return _f32(1) / (_f32(1) + np.exp(-x))


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(_f32)


def _leaky(name, build) -> Spelling:
    return _one(f"leaky_relu: {name}", build)


#: Every op.  Its position in :data:`tir_byoc.epilogues.OPS` is its slot, then its code.
TABLE = (
    OpSpec(
        "scale",
        1,
        "scale",
        lambda z, c, t: z * c[0],
        (
            _one("z * c", lambda z, k: _mul(z, k.c("factor")), "T_multiply"),
            _one("c * z", lambda z, k: _mul(k.c("factor"), z)),
            _one("z * s[0]", lambda z, k: _mul(z, k.operand), reads="scalar"),
            _one("s[0] * z", lambda z, k: _mul(k.operand, z), reads="scalar"),
        ),
        constants=("factor",),
        example=(0.125,),
    ),
    OpSpec(
        "div",
        2,
        "scale",
        lambda z, c, t: z / c[0],
        (_one("z / c", lambda z, k: _div(z, k.c("divisor")), "T_divide"),),
        constants=("divisor",),
        example=(8.0,),
    ),
    OpSpec(
        "bias",
        3,
        "bias",
        lambda z, c, t: z + t,
        (_one("z + b[j]", lambda z, k: _add(z, k.operand), "T_add", reads="vector"),),
        tensor="vector",
    ),
    OpSpec(
        "relu",
        4,
        "activation",
        lambda z, c, t: np.where(z > 0, z, _f32(0)),
        (_one("max(z, 0)", lambda z, k: _max(z, k.zero())),),
        keep_nan=(5, lambda z, c, t: np.where(z < 0, _f32(0), z)),
    ),
    OpSpec(
        "gelu",
        6,
        "activation",
        lambda z, c, t: z * (_f32(0.5) + _erf(z * c[0]) * _f32(0.5)),
        (
            Spelling(
                "gelu: relax",
                (
                    lambda z, e, k: _mul(z, k.c("sqrt_half")),
                    lambda z, e, k: k.erf(e[0]),
                    lambda z, e, k: _mul(e[1], k.c("half")),
                    lambda z, e, k: _add(k.c("half2"), e[2]),
                    lambda z, e, k: _mul(z, e[3]),
                ),
                ("T_multiply_1", "compute", "T_multiply_2", "T_add", "T_multiply"),
            ),
            _one(
                "gelu: halves",
                lambda z, k: _mul(
                    _mul(z, k.c("half")), _add(k.c("one"), k.erf(_mul(z, k.c("sqrt_half"))))
                ),
            ),
        ),
        constants=("sqrt_half",),
        example=(math.sqrt(0.5),),
        pinned=True,
        template=True,
    ),
    OpSpec(
        "gelu_tanh",
        7,
        "activation",
        lambda z, c, t: _f32(0.5) * z * (_f32(1) + np.tanh(c[0] * (z + c[1] * (z * z * z)))),
        (
            Spelling(
                "gelu_tanh: relax",
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
                tuple(
                    "T_multiply_1 T_multiply_2 T_multiply_3 T_multiply_4 T_add T_multiply_5 "
                    "compute T_add_1 T_multiply".split()
                ),
            ),
            # torch's GPT-2 NewGELU as written in Python: 0.5 x (1 + tanh(c0 (x + c1 x^3))).
            _one(
                "gelu_tanh: gpt2",
                lambda z, k: _mul(
                    _mul(k.c("half"), z),
                    _add(
                        k.c("one"),
                        k.tanh(
                            _mul(
                                k.c("sqrt_2_over_pi"),
                                _add(z, _mul(k.c("cubic"), k.pow(z, "three"))),
                            )
                        ),
                    ),
                ),
            ),
        ),
        constants=("sqrt_2_over_pi", "cubic"),
        example=(math.sqrt(2 / math.pi), 0.044715),
        pinned=True,
        template=True,
    ),
    OpSpec(
        "silu",
        8,
        "activation",
        lambda z, c, t: z * _sigmoid(z),
        (
            Spelling(
                "silu: relax",
                (lambda z, e, k: tirx.sigmoid(z), lambda z, e, k: _mul(z, e[0])),
                ("compute", "T_multiply"),
            ),
        ),
        template=True,
    ),
    OpSpec(
        "sigmoid",
        9,
        "activation",
        lambda z, c, t: _sigmoid(z),
        (_one("sigmoid", lambda z, k: tirx.sigmoid(z)),),
        template=True,
    ),
    OpSpec(
        "tanh",
        10,
        "activation",
        lambda z, c, t: np.tanh(z),
        (_one("tanh", lambda z, k: tirx.tanh(z)),),
        template=True,
    ),
    OpSpec(
        "clip",
        11,
        "activation",
        lambda z, c, t: np.where(
            np.isnan(z), c[2], np.where(z < c[0], c[0], np.where(z > c[1], c[1], z))
        ).astype(_f32),
        (
            _clip(_max, _min, True, True, "hi"),
            _clip(_max, _min, False, True, "lo"),
            _clip(_max, _min, True, False, "hi"),
            _clip(_max, _min, False, False, "nan"),
            _clip(_min, _max, True, True, "lo"),
            _clip(_min, _max, False, True, "hi"),
            _clip(_min, _max, True, False, "lo"),
            _clip(_min, _max, False, False, "nan"),
        ),
        constants=("lo", "hi", "nan"),
        example=(0.0, 6.0, 6.0),
    ),
    OpSpec(
        "leaky_relu",
        12,
        "activation",
        lambda z, c, t: np.where(z > 0, z, c[0] * z),
        (
            _leaky(
                "select(0 < z, z, z * a)",
                lambda z, k: tirx.Select(tirx.LT(k.zero(), z), z, _mul(z, k.c("slope"))),
            ),
            _leaky(
                "select(z > 0, z, a * z)",
                lambda z, k: tirx.Select(tirx.GT(z, k.zero()), z, _mul(k.c("slope"), z)),
            ),
            _leaky(
                "select(z < 0, z * a, z)",
                lambda z, k: tirx.Select(tirx.LT(z, k.zero()), _mul(z, k.c("slope")), z),
            ),
            _leaky("max(z, z * a)", lambda z, k: _max(z, _mul(z, k.c("slope")))),
            _leaky("max(a * z, z)", lambda z, k: _max(_mul(k.c("slope"), z), z)),
        ),
        constants=("slope",),
        example=(0.01,),
    ),
    # z * sigmoid(alpha * z): CLIP's quick_gelu (alpha 1.702); silu is alpha 1 unscaled.
    OpSpec(
        "swish",
        15,
        "activation",
        lambda z, c, t: z * _sigmoid(c[0] * z),
        (
            Spelling(
                "swish: torch",  # torch's x * torch.sigmoid(alpha * x), as Relax lowers it
                (
                    lambda z, e, k: _mul(z, k.c("alpha")),
                    lambda z, e, k: tirx.sigmoid(e[0]),
                    lambda z, e, k: _mul(z, e[1]),
                ),
                ("T_multiply_1", "compute", "T_multiply"),
            ),
        ),
        constants=("alpha",),
        example=(1.702,),
        template=True,
    ),
    # z * relu6(z + 3) / 6: MobileNetV3's hardswish (torch.nn.Hardswish).
    OpSpec(
        "hardswish",
        17,
        "activation",
        lambda z, c, t: z * np.minimum(np.maximum(z + _f32(3), _f32(0)), _f32(6)) / _f32(6),
        (
            Spelling(
                "hardswish: torch",  # as torch.export decomposes it: clamp_min, then clamp_max
                (
                    lambda z, e, k: _add(z, k.c("shift")),
                    lambda z, e, k: _max(_min(e[0], k.c("inf")), k.zero()),
                    lambda z, e, k: _max(_min(e[1], k.c("six")), k.c("-inf")),
                    lambda z, e, k: _mul(z, e[2]),
                    lambda z, e, k: _div(e[3], k.c("six2")),
                ),
                ("T_add", "compute", "compute_1", "T_multiply", "T_divide"),
            ),
            Spelling(
                "hardswish: relu6",  # x * F.relu6(x + 3) / 6, as hand-written MobileNetV3s have it
                (
                    lambda z, e, k: _add(z, k.c("shift")),
                    lambda z, e, k: _max(_min(e[0], k.c("six")), k.zero()),
                    lambda z, e, k: _mul(z, e[1]),
                    lambda z, e, k: _div(e[2], k.c("six2")),
                ),
            ),
        ),
        template=True,
    ),
    OpSpec(
        "add",
        13,
        "tail",
        lambda z, c, t: z + t,
        (
            _one("z + R", lambda z, k: _add(z, k.operand), "T_add", reads="tensor"),
            _one("R + z", lambda z, k: _add(k.operand, z), reads="tensor"),
        ),
        tensor="full",
    ),
    OpSpec(
        "mul",
        14,
        "tail",
        lambda z, c, t: z * t,
        (
            _one("z * G", lambda z, k: _mul(z, k.operand), "T_multiply", reads="tensor"),
            _one("G * z", lambda z, k: _mul(k.operand, z), reads="tensor"),
        ),
        tensor="full",
    ),
    OpSpec(
        "channel_scale",
        16,
        "tail",
        lambda z, c, t: z * t,
        (
            _one("z * g[j]", lambda z, k: _mul(z, k.operand), "T_multiply", reads="vector"),
            _one("g[j] * z", lambda z, k: _mul(k.operand, z), reads="vector"),
        ),
        tensor="vector",
    ),
)

__all__ = ["LITERALS", "TABLE"]
