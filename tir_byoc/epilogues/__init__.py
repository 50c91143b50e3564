"""Epilogue operations as data: what may follow a GEMM, one record per operation.

An epilogue is a sequence of operations on the product ``z``, applied in the order given: any
order, an op more than once, as long as one call carries it (:func:`epilogue_error`: at most
:data:`MAX_OPS` ops, :data:`MAX_TENSORS` tensors and :data:`MAX_CONSTANTS` constants).  Each op
belongs to a **slot**, the place real models most often put it::

    scale  (z * c, z / c)          attention's 1/sqrt(d), a scalar parameter
    bias   (z + b[j])              nn.Linear
    activation                     relu, gelu, gelu_tanh, silu, sigmoid, tanh, clip,
                                   leaky_relu, swish, hardswish
    tail   (z + R, z * G)          a residual add, the gate of a gated MLP (R, G of y's shape)
           (z * g[j])              a layer scale (ConvNeXt, DINOv2, BEiT), g an (n,) vector

and the epilogues with at most one op per slot, in slot order, are the **canonical** ones
(:func:`epilogues`): the members the tests describe and match one by one.  Other orders come
from real models too: a scale after the bias (OPT's query projection), a second residual add
(GPT-NeoX's parallel attention and MLP), a scale after the activation (Gemma 2's soft-capping).

Each operation is one :class:`OpSpec` in :data:`OPS` (the table is :mod:`.table`): its
op code in the calling convention (``TIR_BYOC_OP_*`` in ``intrinsics/include/tir_byoc.h``),
its slot, constants and tensor, its NumPy oracle, and its spellings: the blocks TVM writes for
it, first the ones Relax's ``LegalizeOps`` writes.  Everything else is read from the record:
:func:`reference` (the tests' oracle, fp32 as TVM's lowering computes the TIR), :func:`compose`
(the op as TE blocks, for :func:`tir_byoc.patterns.describe`), the matcher's templates
(:mod:`tir_byoc.match.templates`) and the spellings the test generators build
(:mod:`tir_byoc.testing.spellings`).  Adding an operation is one entry of the table, and its
case in ``tir_byoc_epilogue.h`` (and in a backend that fuses it).
"""

from __future__ import annotations

import itertools

import numpy as np
from tvm import te

from .record import MAX_CONSTANTS, MAX_OPS, MAX_TENSORS, SLOTS, OpSpec, Spelling, Terms
from .table import LITERALS, TABLE

#: Every operation, by name (in slot order, then code order).
OPS: dict[str, OpSpec] = {
    spec.name: spec
    for slot in SLOTS
    for spec in sorted((s for s in TABLE if s.slot == slot), key=lambda s: s.code)
}

#: The relu whose spelling keeps a NaN (``max(0, z)``) has a code of its own.
RELU_KEEP_NAN_CODE = OPS["relu"].keep_nan[0]


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


def _spec(name: str, what: str) -> OpSpec:
    if name not in OPS:
        raise ValueError(f"{what}: expected an op of {list(OPS)}, got {name!r}")
    return OPS[name]


def reference(name: str, z: np.ndarray, constants=(), tensor=None, keep_nan=False) -> np.ndarray:
    """``name`` applied to ``z`` in fp32 NumPy, the way TVM's lowering computes its TIR."""
    spec = _spec(name, "reference")
    function = spec.reference
    if keep_nan:
        if spec.keep_nan is None:
            raise ValueError(f"reference: {name} has no variant that keeps NaN")
        function = spec.keep_nan[1]
    with np.errstate(all="ignore"):
        z = np.asarray(z, dtype=np.float32)
        return function(z, [np.float32(v) for v in constants], tensor)


def compose(name: str, value: te.Tensor, tensor: te.Tensor | None = None, constants=None):
    """``name`` applied to ``value`` as TE blocks, spelled as Relax's ``LegalizeOps`` does.

    ``tensor`` is the bias or the layer scale (n,), or the residual / gate tensor (value's
    shape); ``constants`` default to the op's :attr:`OpSpec.example`.
    """
    spec = _spec(name, "compose")
    spelling = spec.spellings[0]
    values = {**LITERALS, **spec.values(constants)}

    def stage(block, done):
        def body(*i):
            operand = None
            if tensor is not None:
                operand = tensor[i[-1]] if spec.tensor == "vector" else tensor[i]
            terms = Terms(value.dtype, values, operand)
            return block(value[i], [earlier[i] for earlier in done], terms)

        return body

    stages: list[te.Tensor] = []
    for block, block_name in zip(spelling.blocks, spelling.block_names):
        stages.append(te.compute(value.shape, stage(block, tuple(stages)), name=block_name))
    return stages[-1]


__all__ = [
    "LITERALS",
    "MAX_CONSTANTS",
    "MAX_OPS",
    "MAX_TENSORS",
    "OPS",
    "RELU_KEEP_NAN_CODE",
    "SLOTS",
    "OpSpec",
    "Spelling",
    "Terms",
    "compose",
    "epilogue_error",
    "epilogues",
    "reference",
]
