"""The records of a matched convolution: its geometry (:class:`ConvGeometry`) and the match
(:class:`ConvMatch`), with the names of the convolution patterns.

A convolution pattern is named after its dims and its epilogue, ``conv2d``,
``conv2d_bias_relu_add``, ``conv1d_bias_gelu``: :func:`conv_pattern` makes the name,
:func:`is_conv_pattern` and :func:`conv_ops` read it.  Every convolution is served by one entry
point per backend, :data:`CONV_ENTRY` (``tir_byoc_<backend>_conv`` in ``tir_byoc.h``), which
takes the epilogue as data.  Made by :mod:`.conv_chain`; read by :mod:`tir_byoc.registry`,
:mod:`tir_byoc.rewrite` and :mod:`tir_byoc.packing`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tvm import tirx

from .records import Match

#: The pattern of the intrinsics that serve convolutions: the conv entry point.
CONV_ENTRY = "conv"

#: Activations' layouts: channels first (NCW, NCHW, NCDHW) or last (NWC, NHWC, NDHWC).
CHANNELS_FIRST, CHANNELS_LAST = "channels_first", "channels_last"
#: Weight layouts: (O, I/G, k...) as TVM's OIHW, or (k..., I/G, O) as its HWIO.
WEIGHT_OIK, WEIGHT_KIO = "oik", "kio"

_NAME = re.compile(r"^conv([123])d((?:_[a-z_]+)?)$")


def conv_pattern(dims: int, ops: tuple[str, ...]) -> str:
    """The pattern name of a ``dims``-D convolution followed by ``ops``."""
    return "_".join((f"conv{dims}d", *ops))


def is_conv_pattern(name: str) -> bool:
    """True if ``name`` names a convolution pattern (``conv2d``, ``conv1d_bias_relu``, ...)."""
    return isinstance(name, str) and _NAME.match(name) is not None


def conv_ops(name: str, known) -> tuple[str, ...]:
    """The epilogue ops of the convolution pattern ``name``, read greedily against the op
    names ``known`` (longest first, so ``gelu_tanh`` is one op)."""
    found = _NAME.match(name)
    if found is None:
        raise ValueError(f"{name!r} is not a convolution pattern (expected conv<1|2|3>d[_ops])")
    rest, ops = found.group(2).lstrip("_"), []
    names = sorted(known, key=len, reverse=True)
    while rest:
        op = next((o for o in names if rest == o or rest.startswith(o + "_")), None)
        if op is None:
            raise ValueError(f"{name!r}: {rest!r} does not start with an epilogue op")
        ops.append(op)
        rest = rest[len(op) :].lstrip("_")
    return tuple(ops)


@dataclass(frozen=True)
class ConvGeometry:
    """What a convolution computes, as its call passes it: every dim static but the batch,
    which may be symbolic (an integer expression the call passes as it is).

    ``in_size``, ``out_size``, ``kernel``, ``stride``, ``dilation`` and ``pad`` (the low
    padding) have one entry per spatial dim, outermost first.  Output position q of dim a reads
    input position ``q * stride[a] + r * dilation[a] - pad[a]`` for kernel offset r; outside
    the input it reads 0.
    """

    layout: str
    weight_layout: str
    batch: int | tirx.PrimExpr
    channels: int
    out_channels: int
    groups: int
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pad: tuple[int, ...]

    @property
    def dims(self) -> int:
        return len(self.kernel)

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.channels

    @property
    def high_pad(self) -> tuple[int, ...]:
        """The high padding the sizes imply (negative where the input's end is never read)."""
        return tuple(
            (q - 1) * s + (k - 1) * d + 1 - i - p
            for q, s, k, d, i, p in zip(
                self.out_size, self.stride, self.kernel, self.dilation, self.in_size, self.pad
            )
        )

    @property
    def text(self) -> str:
        """One line for reports: ``NCHW 1x64x56x56 -> 256, 3x3/2 d1 p1 g1``."""
        letters = "DHW"[3 - self.dims :]
        layout = f"NC{letters}" if self.layout == CHANNELS_FIRST else f"N{letters}C"
        size = "x".join(str(v) for v in (self.batch, self.channels, *self.in_size))
        window = "x".join(map(str, self.kernel))
        stride = "x".join(map(str, self.stride))
        dilation = "x".join(map(str, self.dilation))
        pad = "x".join(map(str, self.pad))
        return (
            f"{layout} {size} -> {self.out_channels}, {window}/{stride} d{dilation} p{pad} "
            f"g{self.groups}"
        )

    def call_arguments(self) -> tuple[int, ...]:
        """The geometry as the conv entry point takes it (``tir_byoc.h``): layout and weight
        layout (int32), then n, c, o, groups and the six per-dim triples (int64), the dims a
        convolution lacks trivial (extent, kernel, stride, dilation 1, padding 0)."""
        fill = 3 - self.dims
        args = [
            0 if self.layout == CHANNELS_FIRST else 1,
            0 if self.weight_layout == WEIGHT_OIK else 1,
            self.batch,
            self.channels,
            self.out_channels,
            self.groups,
        ]
        for values in (self.in_size, self.out_size, self.kernel, self.stride, self.dilation):
            args += [*values, *([1] * fill)]
        return (*args, *self.pad, *([0] * fill))

    @property
    def static_batch(self) -> bool:
        return isinstance(self.batch, int)

    @property
    def flops(self) -> int | tirx.PrimExpr:
        """Multiply-adds times two (an expression of the batch where it is symbolic)."""
        per_output = (self.channels // self.groups) * math.prod(self.kernel)
        return 2 * self.batch * self.out_channels * math.prod(self.out_size) * per_output


@dataclass(frozen=True)
class ConvMatch(Match):
    """A chain of blocks that computes a convolution and its epilogue.

    A :class:`~tir_byoc.match.Match` whose ``m``, ``n`` and ``k`` are those of the GEMM the
    convolution is (output positions of the batch, output channels, input channels of a group
    times the window), for reports; ``x`` is the input as the function receives it (before its
    padding block), ``w`` the weight, ``out`` the output; ``conv`` the geometry the call passes.
    """

    conv: ConvGeometry | None = None

    @property
    def layout(self) -> str:
        return CONV_ENTRY

    @property
    def pattern_entry(self) -> str:
        return CONV_ENTRY

    @property
    def rows(self):
        return self.m


def prefer_tvm(match) -> str | None:
    """Why a convolution intrinsic leaves ``match`` to TVM's own code, or None: a depthwise
    convolution over channels-first activations, which TVM's schedule for it
    (:class:`tir_byoc.schedules.window.SlidingWindow`) ran faster than oneDNN's primitive with
    the reorders its blocked layout needs (MobileNetV2, one thread: 26 ms with TVM's, 30 ms
    with oneDNN's).  The ``check`` of the bundled conv intrinsics."""
    conv = getattr(match, "conv", None)
    if conv is not None and conv.depthwise and conv.layout == CHANNELS_FIRST:
        return (
            "a depthwise convolution over channels-first activations: TVM's sliding-window "
            "schedule ran it faster (MobileNetV2)"
        )
    return None


__all__ = [
    "CHANNELS_FIRST",
    "CHANNELS_LAST",
    "CONV_ENTRY",
    "WEIGHT_KIO",
    "WEIGHT_OIK",
    "ConvGeometry",
    "ConvMatch",
    "conv_ops",
    "conv_pattern",
    "is_conv_pattern",
    "prefer_tvm",
]
