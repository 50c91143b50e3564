"""What the matcher should call a chain the generators built: its pattern, batch form included.

Entry points: :func:`expected_chain`, the :class:`ExpectedChain` of a chain the builder built
(with :func:`cut_chain` for one a block cuts after its reduction), from
:func:`expected_pattern`, the name of the pattern a chain computes (its batch
form from :func:`~.batches.batch_label`), :func:`expected_epilogue` and :func:`relu_nan`, its
ops with their constants and tensors and what its relu makes of a NaN, and
:func:`epilogue_stop`, where the matcher stops a near miss in its epilogue.  Labels come from
here, never from the matcher, so that the label property compares two independent readings.

The epilogue's constants are the ones the generator writes, as fp32, in the order of each
op's record (:data:`tir_byoc.epilogues.OPS`): a scale's factor (or the scalar parameter's
read, ``"s0[0]"``), gelu's sqrt(1/2) and tanh-gelu's sqrt(2/pi) and 0.044715 (pinned in their
records), the clip's bounds and what its spelling makes of a NaN (the spellings declare it:
TVM's ``max(a, b)`` is ``a > b ? a : b``, so a NaN in ``a`` gives ``b``), the leaky relu's
slope, the swish's alpha.  A near miss whose mutation stops the chain in its
epilogue is matched up to the op it breaks (:func:`epilogue_stop`, restating the matcher's
rules): the chain ends after the last block before the one computing that op, or before the
first op one call cannot carry; an op a spelling of several blocks computes can only end the
chain after its last block, since its first blocks' input is read again by a later one.  A
residual broadcast from a (1, N) tensor read ``R[0, j]`` is a bias add; one broadcast from
(M, 1), and a gate broadcast either way, are refused.  A positive's ops are expected in the
order the chain applies them (:attr:`~.specs.ChainSpec.applied_ops`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from tvm import ir

from ..epilogues import OPS, epilogue_error
from ..patterns import pattern_for
from ..signature import DtypeSignature
from .batches import BatchLabel, Product, batch_label
from .mutations import MUTATIONS
from .specs import ChainSpec, ProgramSpec
from .spellings import RELU_NAN


@dataclass(frozen=True)
class ExpectedChain:
    """What the generator built for one chain, for checking the matcher's report.

    ``pattern`` is the pattern the chain was built as (:func:`~.labels.expected_pattern`);
    when ``mutation`` is set the chain is a near miss of that pattern and must not be
    reported as it.  ``batch_dims`` is how many merged batch dims its match reports (0
    without batch dims).  ``epilogue`` is each op with its constants and tensor
    (:func:`~.labels.expected_epilogue`) and ``relu_nan`` what its relu makes of a NaN.
    ``stop``, for a near miss whose mutation stops the chain in its epilogue
    (:attr:`~.mutations.Mutation.stops`), is the (pattern, blocks) the matcher reports for
    the part before the op it refuses (:func:`~.labels.epilogue_stop`).
    """

    index: int
    pattern: str
    blocks: tuple[str, ...]
    x: str
    w: str
    bias: str | None
    out: str
    dtype: DtypeSignature
    mutation: str | None = None
    batch_dims: int = 0
    epilogue: tuple = ()
    relu_nan: str | None = None
    stop: tuple[str, tuple[str, ...]] | None = None


def expected_pattern(spec: ProgramSpec, c: int, ops: tuple[str, ...] | None = None) -> str:
    """The name of the pattern chain ``c`` of ``spec`` computes (with ``ops``, if given, in
    place of its own epilogue ops)."""
    chain = spec.chains[c]
    form = batch_label(spec, chain).form
    return pattern_for(chain.layout, chain.applied_ops if ops is None else ops, form).name


def _fp32(value: float) -> float | str:
    """``value`` as the fp32 constant the TIR holds (``"nan"`` for a NaN)."""
    value = float(np.float32(value))
    return "nan" if math.isnan(value) else value


def expected_epilogue(
    spec: ProgramSpec, c: int, tensors: Mapping[str, str], ops: tuple[str, ...] | None = None
) -> tuple[tuple[str, tuple, str | None], ...]:
    """``(op, constants, tensor)`` of each op of chain ``c`` (or of ``ops``), in the order the
    chain applies them.

    ``tensors`` gives the buffer each op reads (``"bias"``, ``"add"``, ``"mul"``, and
    ``"scale"`` for a scale by a scalar parameter), by name.  Constants are fp32 values (see
    :func:`_fp32`), the scalar parameter's read as ``"s0[0]"``.
    """
    chain = spec.chains[c]
    steps = []
    for op in chain.applied_ops if ops is None else ops:
        spelling = chain.spelling(op)
        if spelling is not None and spelling.reads == "scalar":
            constants: tuple = (f"{tensors[op]}[0]",)
        else:
            constants = tuple(_fp32(v) for v in _constants(chain, op, spelling))
        tensor = tensors.get(op) if OPS[op].tensor else None
        steps.append((op, constants, tensor))
    return tuple(steps)


def _constants(chain: ChainSpec, op: str, spelling) -> list[float]:
    """The constants of ``op`` in ``chain``, in the op's order: a pinned op's are its own
    (gelu's sqrt(1/2)), the others' come from the chain's fields
    (:attr:`~.specs.ChainSpec.constant_values`); a clip's NaN result is the one its spelling
    gives (``spelling.nan``)."""
    spec = OPS[op]
    values = {**(spec.values() if spec.pinned else {}), **chain.constant_values}
    if spelling is not None and spelling.nan is not None:
        values["nan"] = math.nan if spelling.nan == "nan" else values[spelling.nan]
    return [values[name] for name in spec.constants]


def epilogue_of(match) -> tuple[tuple[str, tuple, str | None], ...]:
    """A match's epilogue in the form of :func:`expected_epilogue`, to compare the two."""

    def constant(value):
        if isinstance(value, ir.TensorLoad):  # a scale's scalar parameter
            return f"{value.source.name}[{', '.join(str(int(i)) for i in value.indices)}]"
        return _fp32(value)

    return tuple(
        (step.op, tuple(constant(c) for c in step.constants), getattr(step.tensor, "name", None))
        for step in match.epilogue
    )


def relu_nan(chain: ChainSpec) -> str | None:
    """What the chain's relu makes of a NaN (``"zero"`` or ``"keep"``), None without one.

    Integers have no NaN: every spelling is ``"zero"`` there.
    """
    if chain.relu is None:
        return None
    return RELU_NAN[chain.relu] if chain.dtypes[2].startswith("float") else "zero"


def _read_as(chain: ChainSpec, op: str) -> str | None:
    """The op the matcher reads where chain's knobs have changed ``op``; None if it refuses."""
    knobs = chain.knobs
    spelling = chain.spelling(op)
    changed = knobs.fixed_constant
    if spelling is not None and (
        (knobs.functions_swapped and spelling.functions)
        or (changed and changed[0] in spelling.constants)
    ):
        return None
    if op == "clip" and knobs.clip_swapped:
        return None
    if op == "leaky_relu" and knobs.slope is not None and not 0 < knobs.slope <= 1:
        return None
    if op in ("add", "mul") and knobs.tail_form != "full":
        # R[0, j] of a (1, N) tensor is a bias, G[0, j] a layer scale; an (M, 1) is refused.
        return None if knobs.tail_form == "column" else {"add": "bias", "mul": "channel_scale"}[op]
    return op


def epilogue_stop(spec: ProgramSpec, c: int) -> tuple[tuple[str, ...], int] | None:
    """Where the matcher ends chain ``c``, a near miss whose mutation stops it in its epilogue
    (:attr:`~.mutations.Mutation.stops`): the ops it reports and how many of the chain's
    epilogue groups (:attr:`~.specs.ChainSpec.epilogue_groups`) it covers.  None for a
    positive and for the other mutations.
    """
    chain = spec.chains[c]
    if chain.mutation is None or not MUTATIONS[chain.mutation].stops:
        return None
    accepted = ("bias",) if chain.init == "bias" else ()
    for kept, group in enumerate(chain.epilogue_groups):
        ops = (*accepted, *(_read_as(chain, op) for op in group))
        if None in ops or epilogue_error(ops):
            return accepted, kept
        accepted = ops
    return accepted, len(chain.epilogue_groups)


def expected_chain(spec: ProgramSpec, c: int, built, reduction, groups) -> ExpectedChain:
    """What chain ``c`` of ``spec`` scans as: ``built`` is its :class:`~.builder.ChainBuilder`,
    ``reduction`` the names of its reduction blocks, ``groups`` those of its epilogue groups."""
    chain = spec.chains[c]
    tensors = {op: buffer.name for op, buffer in built.tensors.items()}
    if built.bias is not None:
        tensors["bias"] = built.bias.name
    stop = epilogue_stop(spec, c)
    if stop is not None:
        ops, kept = stop
        stop = (
            expected_pattern(spec, c, ops),
            (*reduction, *(name for group in groups[:kept] for name in group)),
        )
    blocks = (*reduction, *(name for group in groups for name in group))
    return ExpectedChain(
        index=c,
        pattern=expected_pattern(spec, c),
        blocks=blocks,
        x=built.x.name,
        w=built.w.name,
        bias=built.bias.name if built.bias is not None else None,
        out=built.out.name,
        dtype=DtypeSignature(*chain.dtypes),
        mutation=chain.mutation,
        batch_dims=batch_label(spec, chain).dims,
        epilogue=expected_epilogue(spec, c, tensors),
        relu_nan=relu_nan(chain),
        stop=stop,
    )


def cut_chain(spec: ProgramSpec, c: int, built, reduction) -> ExpectedChain:
    """What a chain cut by a block between its reduction and its epilogue scans as."""
    chain = spec.chains[c]
    bias = built.bias if chain.init == "bias" else None
    epilogue = ()
    if bias is not None:
        epilogue = expected_epilogue(spec, c, {"bias": bias.name}, ops=("bias",))
    return ExpectedChain(
        index=c,
        pattern=expected_pattern(spec, c, ("bias",) if bias is not None else ()),
        blocks=reduction,
        x=built.x.name,
        w=built.w.name,
        bias=bias.name if bias is not None else None,
        out=built.stages[0].name,
        dtype=DtypeSignature(*chain.dtypes),
        batch_dims=batch_label(spec, chain).dims,
        epilogue=epilogue,
    )


__all__ = [
    "BatchLabel",
    "ExpectedChain",
    "Product",
    "batch_label",
    "cut_chain",
    "epilogue_of",
    "epilogue_stop",
    "expected_chain",
    "expected_epilogue",
    "expected_pattern",
    "relu_nan",
]
