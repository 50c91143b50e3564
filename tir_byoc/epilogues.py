"""Epilogue operations as data: what may follow a GEMM, and how each is computed.

An epilogue is a sequence of operations on the product ``z``, applied in the order given: any
order, an op more than once, as long as one call carries it (:func:`epilogue_error`: at most
:data:`MAX_OPS` ops, :data:`MAX_TENSORS` tensors and :data:`MAX_CONSTANTS` constants).  Each op
belongs to a **slot**, the place real models most often put it::

    scale  (z * c, z / c)          attention's 1/sqrt(d), a scalar parameter
    bias   (z + b[j])              nn.Linear
    activation                     relu, gelu, gelu_tanh, silu, swish, sigmoid, tanh, clip,
                                   leaky_relu
    tail   (z + R, z * G)          a residual add, the gate of a gated MLP (R, G of y's shape)
           (z * g[j])              a layer scale (ConvNeXt, DINOv2, BEiT), g an (n,) vector

and the epilogues with at most one op per slot, in slot order, are the **canonical** ones
(:func:`epilogues`): the members the tests describe and match one by one.  Other orders come
from real models too: a scale after the bias (OPT's query projection), a second residual add
(GPT-NeoX's parallel attention and MLP), a scale after the activation (Gemma 2's soft-capping).

Each operation is one :class:`OpSpec` in :data:`OPS`: its name, its op code in the calling
convention (``TIR_BYOC_OP_*`` in ``intrinsics/include/tir_byoc.h``), its slot, the constants
it takes and the tensor it reads.  Adding an operation is one entry here, one recogniser in
:mod:`tir_byoc.match.epilogue`, and one case in ``tir_byoc_epilogue.h`` (and in a backend
that fuses it).  :func:`reference` computes any op in NumPy the way TVM's lowering of its TIR
does (fp32, the same comparisons), the tests' oracle; :func:`compose` builds an op as TE
blocks spelled the way Relax's ``LegalizeOps`` spells it, for :func:`tir_byoc.patterns.describe`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

#: The slots of an epilogue, in the order of the canonical epilogues.
SLOTS = ("scale", "bias", "activation", "tail")

#: The largest epilogue one call carries (``TIR_BYOC_MAX_OPS``), and its constants and tensors.
MAX_OPS, MAX_CONSTANTS, MAX_TENSORS = 8, 6, 4


@dataclass(frozen=True)
class OpSpec:
    """One epilogue operation.

    Attributes
    ----------
    name : str
        The name patterns use (``dense_bias_gelu``).
    code : int
        ``TIR_BYOC_OP_<NAME>`` of ``tir_byoc.h``.
    slot : str
        One of :data:`SLOTS`.
    constants : tuple of str
        The constants the C op takes, in order (clip: ``lo``, ``hi`` and what a NaN becomes).
    tensor : str or None
        ``"vector"`` for an (n,) vector indexed by the column, ``"full"`` for a tensor of the
        output's shape, None for no tensor.
    example : tuple of float
        The constants :func:`tir_byoc.patterns.describe` builds the op with.
    """

    name: str
    code: int
    slot: str
    constants: tuple[str, ...] = ()
    tensor: str | None = None
    example: tuple[float, ...] = ()


#: Every operation, by name (in slot order, then code order).
OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        OpSpec("scale", 1, "scale", ("factor",), example=(0.125,)),
        OpSpec("div", 2, "scale", ("divisor",), example=(8.0,)),
        OpSpec("bias", 3, "bias", tensor="vector"),
        OpSpec("relu", 4, "activation"),
        OpSpec("gelu", 6, "activation", ("sqrt_half",), example=(math.sqrt(0.5),)),
        OpSpec(
            "gelu_tanh",
            7,
            "activation",
            ("sqrt_2_over_pi", "cubic"),
            example=(math.sqrt(2 / math.pi), 0.044715),
        ),
        OpSpec("silu", 8, "activation"),
        OpSpec("sigmoid", 9, "activation"),
        OpSpec("tanh", 10, "activation"),
        OpSpec("clip", 11, "activation", ("lo", "hi", "nan"), example=(0.0, 6.0, 6.0)),
        OpSpec("leaky_relu", 12, "activation", ("slope",), example=(0.01,)),
        # z * sigmoid(alpha * z): CLIP's quick_gelu (alpha 1.702); silu is alpha 1 unscaled.
        OpSpec("swish", 15, "activation", ("alpha",), example=(1.702,)),
        OpSpec("add", 13, "tail", tensor="full"),
        OpSpec("mul", 14, "tail", tensor="full"),
        OpSpec("channel_scale", 16, "tail", tensor="vector"),
    )
}

#: The relu whose spelling keeps a NaN (``max(0, z)``) has a code of its own.
RELU_KEEP_NAN_CODE = 5

#: The fixed constants of the gelus, as fp32 (what the TIR holds): a spelling with another
#: value is not that gelu.
GELU_CONSTANTS = {
    "gelu": (np.float32(math.sqrt(0.5)),),
    "gelu_tanh": (np.float32(math.sqrt(2 / math.pi)), np.float32(0.044715)),
}


def epilogue_error(names) -> str | None:
    """Why ``names`` is not an epilogue one call carries (an unknown op, or more ops, tensors or
    constants than the calling convention has room for), or None."""
    names = tuple(names)
    unknown = [name for name in names if name not in OPS]
    if unknown:
        return f"{unknown[0]!r} is not an epilogue op (expected one of {list(OPS)})"
    for first, second in itertools.pairwise(names):
        if f"{first}_{second}" in OPS:  # a pattern's name could not tell them apart
            return f"{first} then {second} would be named as the one op {first}_{second}"
    tensors = sum(OPS[name].tensor is not None for name in names)
    constants = sum(len(OPS[name].constants) for name in names)
    if len(names) > MAX_OPS or tensors > MAX_TENSORS or constants > MAX_CONSTANTS:
        return (
            f"{' then '.join(names)} is more than one call carries ({len(names)} ops, "
            f"{tensors} tensors, {constants} constants; at most {MAX_OPS}, {MAX_TENSORS} and "
            f"{MAX_CONSTANTS})"
        )
    return None


def epilogues() -> list[tuple[str, ...]]:
    """The canonical epilogues (at most one op per slot, in slot order), shortest first."""
    by_slot = [[None] + [n for n, s in OPS.items() if s.slot == slot] for slot in SLOTS]
    result = [()]
    for options in by_slot:
        result = [(*e, o) if o else e for e in result for o in options]
    return sorted(set(result), key=lambda e: (len(e), [list(OPS).index(n) for n in e]))


def reference(name: str, z: np.ndarray, constants=(), tensor=None, keep_nan=False) -> np.ndarray:
    """``name`` applied to ``z`` in fp32 NumPy, the way TVM's lowering computes its TIR."""
    f32 = np.float32
    z = np.asarray(z, dtype=f32)
    c = [f32(v) for v in constants]
    with np.errstate(all="ignore"):
        if name == "scale":
            return z * c[0]
        if name == "div":
            return z / c[0]
        if name in ("bias", "add"):
            return z + tensor
        if name in ("mul", "channel_scale"):
            return z * tensor
        if name == "relu":
            return np.where(z < 0, f32(0), z) if keep_nan else np.where(z > 0, z, f32(0))
        if name == "gelu":
            return z * (f32(0.5) + _erf(z * c[0]) * f32(0.5))
        if name == "gelu_tanh":
            return f32(0.5) * z * (f32(1) + np.tanh(c[0] * (z + c[1] * (z * z * z))))
        if name == "silu":
            return z * (f32(1) / (f32(1) + np.exp(-z)))
        if name == "swish":
            return z * (f32(1) / (f32(1) + np.exp(-(c[0] * z))))
        if name == "sigmoid":
            return f32(1) / (f32(1) + np.exp(-z))
        if name == "tanh":
            return np.tanh(z)
        if name == "clip":
            inside = np.where(z < c[0], c[0], np.where(z > c[1], c[1], z))
            return np.where(np.isnan(z), c[2], inside).astype(f32)
        if name == "leaky_relu":
            return np.where(z > 0, z, c[0] * z)
    raise ValueError(f"reference: expected an op of {list(OPS)}, got {name!r}")


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(np.float32)


def compose(name: str, value: te.Tensor, tensor: te.Tensor | None = None, constants=None):
    """``name`` applied to ``value`` as TE blocks, spelled as Relax's ``LegalizeOps`` does.

    ``tensor`` is the bias or the layer scale (n,), or the residual / gate tensor (value's
    shape); ``constants`` default to the op's :attr:`OpSpec.example`.
    """
    spec = OPS[name]
    dtype = value.dtype
    c = [tirx.const(v, dtype) for v in (spec.example if constants is None else constants)]

    def each(fn, block):
        return te.compute(value.shape, lambda *i: fn(*i), name=block)

    if name == "scale":
        return each(lambda *i: value[i] * c[0], "T_multiply")
    if name == "div":
        return each(lambda *i: value[i] / c[0], "T_divide")
    if name == "bias":
        return each(lambda *i: value[i] + tensor[i[-1]], "T_add")
    if name == "add":
        return each(lambda *i: value[i] + tensor[i], "T_add")
    if name == "mul":
        return each(lambda *i: value[i] * tensor[i], "T_multiply")
    if name == "channel_scale":
        return each(lambda *i: value[i] * tensor[i[-1]], "T_multiply")
    if name == "relu":
        return each(lambda *i: te.max(value[i], tirx.const(0, dtype)), "compute")
    if name == "sigmoid":
        return each(lambda *i: te.sigmoid(value[i]), "compute")
    if name == "tanh":
        return each(lambda *i: te.tanh(value[i]), "compute")
    if name == "clip":
        return each(lambda *i: te.max(te.min(value[i], c[1]), c[0]), "compute")
    if name == "leaky_relu":
        zero = tirx.const(0, dtype)
        return each(lambda *i: tirx.Select(zero < value[i], value[i], value[i] * c[0]), "compute")
    half, one = tirx.const(0.5, dtype), tirx.const(1.0, dtype)
    if name == "silu":
        sigmoid = each(lambda *i: te.sigmoid(value[i]), "compute")
        return each(lambda *i: value[i] * sigmoid[i], "T_multiply")
    if name == "swish":  # torch's x * torch.sigmoid(alpha * x), as Relax lowers it
        scaled = each(lambda *i: value[i] * c[0], "T_multiply_1")
        sigmoid = each(lambda *i: te.sigmoid(scaled[i]), "compute")
        return each(lambda *i: value[i] * sigmoid[i], "T_multiply")
    if name == "gelu":
        scaled = each(lambda *i: value[i] * c[0], "T_multiply_1")
        erf = each(lambda *i: te.erf(scaled[i]), "compute")
        halved = each(lambda *i: erf[i] * half, "T_multiply_2")
        shifted = each(lambda *i: half + halved[i], "T_add")
        return each(lambda *i: value[i] * shifted[i], "T_multiply")
    if name == "gelu_tanh":
        outer = each(lambda *i: half * value[i], "T_multiply_1")
        inner = each(lambda *i: c[0] * value[i], "T_multiply_2")
        cubic = each(lambda *i: c[1] * value[i], "T_multiply_3")
        square = each(lambda *i: cubic[i] * value[i], "T_multiply_4")
        poly = each(lambda *i: one + square[i], "T_add")
        arg = each(lambda *i: inner[i] * poly[i], "T_multiply_5")
        tanh = each(lambda *i: te.tanh(arg[i]), "compute")
        shifted = each(lambda *i: one + tanh[i], "T_add_1")
        return each(lambda *i: outer[i] * shifted[i], "T_multiply")
    raise ValueError(f"compose: expected an op of {list(OPS)}, got {name!r}")
