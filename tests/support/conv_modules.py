"""Convolutions for the conv tests: a spec, its Relax module lowered to fused PrimFuncs as TVM
lowers it (no tir_byoc rewrite before), and its result from the definition in float64.

:class:`ConvSpec` is the variant as data (dims, layout, groups, stride, dilation, padding and
the epilogue ops that follow); :func:`lowered` builds it, :func:`inputs` draws its arguments and
:func:`expected` computes it with NumPy, window by window.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

_LAYOUTS = {
    (1, "first"): ("NCW", "OIW"),
    (2, "first"): ("NCHW", "OIHW"),
    (3, "first"): ("NCDHW", "OIDHW"),
    (1, "last"): ("NWC", "WIO"),
    (2, "last"): ("NHWC", "HWIO"),
    (3, "last"): ("NDHWC", "DHWIO"),
}


def _erf(z):
    return np.vectorize(math.erf)(z)


#: The epilogue ops a spec may hold: the Relax op (given y and the op's tensor) and its float64
#: definition (given z and the tensor).  "bias" and "channel_scale" read a per-channel tensor,
#: "add" a residual of the output's shape.
OPS = {
    "bias": (lambda y, t: R.add(y, t), lambda z, t: z + t),
    "relu": (lambda y, t: R.nn.relu(y), lambda z, t: np.maximum(z, 0)),
    "clip": (lambda y, t: R.clip(y, 0.0, 6.0), lambda z, t: np.clip(z, 0, 6)),
    "gelu": (lambda y, t: R.nn.gelu(y), lambda z, t: 0.5 * z * (1 + _erf(z / math.sqrt(2)))),
    "silu": (lambda y, t: R.nn.silu(y), lambda z, t: z / (1 + np.exp(-z))),
    "sigmoid": (lambda y, t: R.sigmoid(y), lambda z, t: 1 / (1 + np.exp(-z))),
    "tanh": (lambda y, t: R.tanh(y), lambda z, t: np.tanh(z)),
    "add": (lambda y, t: R.add(y, t), lambda z, t: z + t),
    "channel_scale": (lambda y, t: R.multiply(y, t), lambda z, t: z * t),
    "mul": (lambda y, t: R.multiply(y, t), lambda z, t: z * t),
    "scale": (lambda y, t: R.multiply(y, relax.const(0.5, "float32")), lambda z, t: z * 0.5),
    "leaky_relu": (lambda y, t: R.nn.leakyrelu(y, 0.1), lambda z, t: np.where(z > 0, z, 0.1 * z)),
    "gelu_tanh": (
        lambda y, t: R.nn.gelu_tanh(y),
        lambda z, t: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))),
    ),
}
TENSOR_OPS = ("bias", "add", "channel_scale", "mul")


@dataclass(frozen=True)
class ConvSpec:
    """One convolution and the ops after it; per-dim tuples are outermost first."""

    layout: str = "first"  # channels "first" (NCHW) or "last" (NHWC)
    batch: int = 1
    channels: int = 4
    out_channels: int = 4
    groups: int = 1
    sizes: tuple[int, ...] = (7, 7)
    kernel: tuple[int, ...] = (3, 3)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    pad_lo: tuple[int, ...] = (1, 1)
    pad_hi: tuple[int, ...] = (1, 1)
    ops: tuple[str, ...] = field(default=())

    @property
    def dims(self) -> int:
        return len(self.sizes)

    @property
    def out_sizes(self) -> tuple[int, ...]:
        return tuple(
            (n + lo + hi - (k - 1) * d - 1) // s + 1
            for n, k, s, d, lo, hi in zip(
                self.sizes, self.kernel, self.stride, self.dilation, self.pad_lo, self.pad_hi
            )
        )

    def _shape(self, channels, spatial):
        if self.layout == "first":
            return (self.batch, channels, *spatial)
        return (self.batch, *spatial, channels)

    @property
    def x_shape(self):
        return self._shape(self.channels, self.sizes)

    @property
    def y_shape(self):
        return self._shape(self.out_channels, self.out_sizes)

    @property
    def w_shape(self):
        per_group = self.channels // self.groups
        if self.layout == "first":
            return (self.out_channels, per_group, *self.kernel)
        return (*self.kernel, per_group, self.out_channels)

    @property
    def channel_shape(self):
        """A per-channel tensor as torch's bias is: (1, O, 1..) or (1, 1.., O)."""
        spatial = (1,) * self.dims
        return (1, *self._shape(self.out_channels, spatial)[1:])

    def tensor_shape(self, op: str):
        return self.y_shape if op in ("add", "mul") else self.channel_shape


def lowered(spec: ConvSpec) -> tvm.IRModule:
    """The Relax module of ``spec`` (parameters x, w, then one tensor per tensor op) after
    LegalizeOps, AnnotateTIROpPattern, FuseOps and FuseTIR."""
    data_layout, kernel_layout = _LAYOUTS[(spec.dims, spec.layout)]
    x = relax.Var("x", R.Tensor(spec.x_shape, "float32"))
    w = relax.Var("w", R.Tensor(spec.w_shape, "float32"))
    tensors = [
        relax.Var(f"t{i}", R.Tensor(spec.tensor_shape(op), "float32"))
        for i, op in enumerate(o for o in spec.ops if o in TENSOR_OPS)
    ]
    op = (R.nn.conv1d, R.nn.conv2d, R.nn.conv3d)[spec.dims - 1]
    builder = relax.BlockBuilder()
    with builder.function("main", [x, w, *tensors]):
        with builder.dataflow():
            y = builder.emit(
                op(
                    x,
                    w,
                    strides=list(spec.stride),
                    padding=[*spec.pad_lo, *spec.pad_hi],
                    dilation=list(spec.dilation),
                    groups=spec.groups,
                    data_layout=data_layout,
                    kernel_layout=kernel_layout,
                )
            )
            remaining = iter(tensors)
            for name in spec.ops:
                tensor = next(remaining) if name in TENSOR_OPS else None
                y = builder.emit(OPS[name][0](y, tensor))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    return tvm.transform.Sequential(passes)(builder.get())


def inputs(spec: ConvSpec, seed: int) -> list[np.ndarray]:
    """x, w and the ops' tensors, float32 normals."""
    rng = np.random.default_rng(seed)
    shapes = [
        spec.x_shape,
        spec.w_shape,
        *(spec.tensor_shape(o) for o in spec.ops if o in TENSOR_OPS),
    ]
    return [rng.standard_normal(s).astype("float32") for s in shapes]


def expected(spec: ConvSpec, arrays) -> np.ndarray:
    """The convolution and its ops from their definitions, in float64."""
    x, w, *tensors = (a.astype(np.float64) for a in arrays)
    if spec.layout == "last":  # compute channels first
        x = np.moveaxis(x, -1, 1)
        w = np.moveaxis(np.moveaxis(w, -1, 0), -1, 1)  # (k.., I, O) -> (O, I, k..)
    padded = np.pad(x, [(0, 0), (0, 0), *zip(spec.pad_lo, spec.pad_hi)])
    outs = spec.out_sizes
    total = np.zeros((spec.batch, spec.out_channels, *outs))
    per_in = spec.channels // spec.groups
    per_out = spec.out_channels // spec.groups
    for g, offset in itertools.product(range(spec.groups), np.ndindex(*spec.kernel)):
        window = tuple(
            slice(r * d, r * d + (n - 1) * s + 1, s)
            for r, n, s, d in zip(offset, outs, spec.stride, spec.dilation)
        )
        ins, outs_g = slice(g * per_in, (g + 1) * per_in), slice(g * per_out, (g + 1) * per_out)
        taps = w[(outs_g, slice(None), *offset)]
        total[:, outs_g] += np.einsum("bc...,oc->bo...", padded[(slice(None), ins, *window)], taps)
    if spec.layout == "last":
        total = np.moveaxis(total, 1, -1)
    remaining = iter(tensors)
    for name in spec.ops:
        tensor = next(remaining) if name in TENSOR_OPS else None
        total = OPS[name][1](total, tensor)
    return total
