"""The convolution analysis: a reduction block that is a convolution, and its padding block.

Entry points: :func:`looks_like_conv` (a reduction whose input is read at a position computed
from an output and a reduction iterator: a convolution candidate, never a GEMM) and
:func:`read_convolution`, which reads such a block exactly or declines with the first thing
that differs.  TVM's legalised ``relax.nn.conv1d/2d/3d`` (topi) is

    pad_temp[n, c, h, w] = if_then_else(p0 <= h < p0 + H and p1 <= w < p1 + W,
                                        x[n, c, h - p0, w - p1], 0)
    conv[n, o, y, x] += pad_temp[n, o // (O/G) * (C/G) + rc, y*s0 + ry*d0, x*s1 + rx*d1]
                        * w[o, rc, ry, rx]        (init 0)

in any spatial rank, channels first (NCHW, weight OIHW) or last (NHWC, weight HWIO), the
channel index simplified by TVM for one group (``rc``) or depthwise (``o + rc``); without
padding the reduction reads x itself.  Every index is checked by proving it equal to the
form above (the arithmetic analyzer), never by its spelling; the padding block's condition
must bound each axis to exactly the input's extent.  Called by :mod:`.conv_chain`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import ir, sym, tirx

from ..decline import Declined
from ..signature import DtypeSignature
from .conv_padding import dim_extent, read_padding, same_extent, static_extent
from .conv_records import CHANNELS_FIRST, CHANNELS_LAST, WEIGHT_KIO, WEIGHT_OIK, ConvGeometry
from .exprs import const_value, dtype_of, expr_text, shape_of
from .extents import Extents
from .stir import COMM_REDUCE, DATA_PAR, FunctionIndex, Nest, check_binding, compact_global
from .traversal import elements, walk


@dataclass(frozen=True)
class ConvCore:
    """A convolution read from its blocks; what the epilogue reading needs of it too
    (``out``, ``out_shape``, ``dtype``, ``n``: the output channels)."""

    nest: Nest
    pad: Nest | None
    x: ir.Var
    padded: ir.Var
    w: ir.Var
    out: ir.Var
    geometry: ConvGeometry
    out_shape: tuple
    dtype: DtypeSignature
    channel_axis: int

    @property
    def n(self):
        return self.out_shape[self.channel_axis]

    @property
    def bias(self):
        return None


def _loads(expr) -> list:
    found = []
    walk(expr, ir.TensorLoad, found.append)
    return found


def _handles(expr) -> set[int]:
    found = set()
    walk(expr, tirx.Var, lambda v: found.add(v.__chandle__()))
    return found


def looks_like_conv(block) -> bool:
    """A reduction multiplying two buffer elements, one read at an index that combines an
    output iterator with a reduction iterator (``y * 2 + ry``, ``o + rc``): a convolution
    candidate.  A GEMM indexes every operand by bare iterators."""
    kinds = {iv.var.__chandle__(): iv.iter_type for iv in elements(block.iter_vars)}
    if COMM_REDUCE not in kinds.values() or not isinstance(block.body, tirx.BufferStore):
        return False
    products = []
    walk(block.body.value, tirx.Mul, products.append)
    for product in products:
        if not all(isinstance(e, ir.TensorLoad) for e in (product.a, product.b)):
            continue
        for load in (product.a, product.b):
            for index in elements(load.indices):
                if isinstance(index, tirx.Var):
                    continue
                roles = {kinds.get(h) for h in _handles(index)}
                if DATA_PAR in roles and COMM_REDUCE in roles:
                    return True
    return False


_static = static_extent


def _sizes(buffer) -> list:
    """A buffer's dims: ints, the first (the batch) possibly symbolic."""
    return [dim_extent(d, a, f"a dim of {buffer.name}") for a, d in enumerate(shape_of(buffer))]


def _nearest(dims: int) -> str:
    return f"conv{dims}d"


class _Reader:
    """Reads one reduction block; every check raises Declined naming the pattern it is near."""

    def __init__(self, nest: Nest, index: FunctionIndex, extents: Extents):
        self.nest, self.index, self.extents = nest, index, extents
        self.block = nest.block
        self.name = self.block.name_hint
        self.near = "conv2d"
        self.analyzer = sym.Analyzer()
        for it in nest.iterators:
            self.analyzer.bind(it.var, ir.Range.from_min_extent(it.min, it.extent))

    def fail(self, reason: str):
        raise Declined(f"block {self.name}: {reason}", nearest=self.near)

    def equal(self, a, b) -> bool:
        if dtype_of(a) != dtype_of(b):
            a, b = tirx.Cast("int64", a), tirx.Cast("int64", b)
        return bool(self.analyzer.can_prove_equal(a, b))

    # Step 1. The reduction: out[...] = out[...] + data[...] * weight[...], init 0.
    def product(self):
        store = self.block.body
        out, indices = store.buffer, elements(store.indices)
        value = store.value
        if not isinstance(value, tirx.Add):
            self.fail(f"computes {expr_text(value)}, not out + data * weight")
        for acc, product in ((value.a, value.b), (value.b, value.a)):
            if (
                isinstance(acc, ir.TensorLoad)
                and acc.source.same_as(out)
                and len(elements(acc.indices)) == len(indices)
                and all(a.same_as(b) for a, b in zip(elements(acc.indices), indices))
                and isinstance(product, tirx.Mul)
            ):
                break
        else:
            self.fail("its update is not out[...] + a * b of the same element")
        operands = (product.a, product.b)
        if not all(isinstance(o, ir.TensorLoad) for o in operands):
            self.fail("multiplies values other than two buffer elements (a cast or a computation)")
        init = self.block.init
        if (
            not isinstance(init, tirx.BufferStore)
            or not init.buffer.same_as(out)
            or const_value(init.value) != 0
            or math.copysign(1.0, const_value(init.value)) < 0
        ):
            self.fail("the reduction is not initialised to 0 in its own init")
        for var in (out, *(o.source for o in operands)):
            if dtype_of(var) != "float32":
                self.fail(f"{var.name} is {dtype_of(var)}; convolutions are matched in float32")
        return out, indices, operands

    # Step 2. The roles of the iterators, from the weight's and the output's indices.
    def roles(self, out, out_indices, operands):
        spatial = {it.handle: it for it in self.nest.iterators if it.iter_type == DATA_PAR}
        reduce = {it.handle: it for it in self.nest.iterators if it.iter_type == COMM_REDUCE}
        if len(spatial) + len(reduce) != len(self.nest.iterators):
            self.fail("has an iterator that is neither spatial nor a reduction")
        bare = [o for o in operands if all(isinstance(i, tirx.Var) for i in elements(o.indices))]
        if len(bare) != 1:
            self.fail("does not read exactly one operand (the weight) at bare iterators")
        weight = bare[0]
        data = operands[1] if weight is operands[0] else operands[0]
        rank = len(out_indices)
        dims = rank - 2
        self.near = _nearest(max(1, min(dims, 3)))
        if not 1 <= dims <= 3:
            self.fail(f"its output has {rank} dims; a convolution's has 3 to 5")
        if len({i.__chandle__() for i in out_indices}) != rank or set(
            i.__chandle__() for i in out_indices
        ) != set(spatial):
            self.fail("its output is not indexed by its spatial iterators, one per axis")
        w_indices = [i.__chandle__() for i in elements(weight.indices)]
        if len(w_indices) != rank or len(data.indices) != rank:
            self.fail(f"its weight or input does not have {rank} dims like its output")
        if len(set(w_indices)) != rank or set(w_indices) - set(spatial) - set(reduce):
            self.fail("its weight is not indexed by distinct iterators")
        if set(reduce) != set(w_indices) - set(spatial) or len(reduce) != dims + 1:
            self.fail("its reduction iterators are not the weight's input channel and window")
        o_in_w = [p for p, h in enumerate(w_indices) if h in spatial]
        if o_in_w == [0]:
            weight_layout, rc_at, window_at = WEIGHT_OIK, 1, list(range(2, rank))
        elif o_in_w == [rank - 1]:
            weight_layout, rc_at, window_at = WEIGHT_KIO, rank - 2, list(range(dims))
        else:
            self.fail("the weight's output channel is neither its first nor its last axis")
        out_handles = [i.__chandle__() for i in out_indices]
        o_handle = w_indices[o_in_w[0]]
        o_at = out_handles.index(o_handle)
        if o_at == 1:
            layout, spatial_at = CHANNELS_FIRST, list(range(2, rank))
        elif o_at == rank - 1 and rank > 2:
            layout, spatial_at = CHANNELS_LAST, list(range(1, rank - 1))
        else:
            self.fail("the output channel is neither axis 1 nor the last axis of the output")
        iterator = {**spatial, **reduce}
        return {
            "weight": weight,
            "data": data,
            "weight_layout": weight_layout,
            "layout": layout,
            "batch": iterator[out_handles[0]],
            "o": iterator[o_handle],
            "o_at": o_at,
            "rc": iterator[w_indices[rc_at]],
            "window": [iterator[w_indices[p]] for p in window_at],
            "positions": [iterator[out_handles[p]] for p in spatial_at],
            "spatial_at": spatial_at,
        }

    # Step 3. The input's indices: batch, the channel of the group, q * s + r * d.
    def data_indices(self, roles, channels):
        data = roles["data"]
        indices = elements(data.indices)
        o, rc = roles["o"], roles["rc"]
        out_channels = _static(o.extent, "the output channels")
        per_group = _static(rc.extent, "the input channels of a group")
        if per_group < 1 or channels % per_group:
            self.fail(f"its group reads {per_group} of {channels} input channels, not a divisor")
        groups = channels // per_group
        if out_channels % groups:
            self.fail(f"{out_channels} output channels do not split into {groups} groups")
        if not isinstance(indices[0], tirx.Var) or not indices[0].same_as(roles["batch"].var):
            self.fail(
                f"reads {data.source.name} at batch {expr_text(indices[0])}, not the output's"
            )
        channel = indices[roles["o_at"]]
        expected = (
            rc.var
            if groups == 1
            else tirx.FloorDiv(o.var, tirx.IntImm(dtype_of(o.var), out_channels // groups))
            * tirx.IntImm(dtype_of(o.var), per_group)
            + rc.var
        )
        if not self.equal(channel, expected):
            self.fail(
                f"reads input channel {expr_text(channel)}, not {expr_text(expected)} "
                f"({groups} groups)"
            )
        strides, dilations = [], []
        for axis, q, r in zip(roles["spatial_at"], roles["positions"], roles["window"]):
            index = indices[axis]
            coefficients = sym.detect_linear_equation(index, [q.var, r.var])
            if len(coefficients) != 3 or any(const_value(c) is None for c in coefficients):
                self.fail(f"reads {data.source.name} at {expr_text(index)}, not q * s + r * d")
            stride, dilation, base = (int(const_value(c)) for c in coefficients)
            if stride < 1 or dilation < 1 or base != 0:
                self.fail(f"reads {data.source.name} at {expr_text(index)}, not q * s + r * d")
            if not self.equal(index, q.var * stride + r.var * dilation):
                self.fail(f"reads {data.source.name} at {expr_text(index)}, not q * s + r * d")
            strides.append(stride)
            dilations.append(dilation)
        return groups, strides, dilations


def read_convolution(position: int, index: FunctionIndex, extents: Extents) -> ConvCore:
    """The convolution of the reduction nest at ``position`` (with its padding block, if the
    nest reads one); Declined with the first thing that differs."""
    nest = index.nests[position]
    reader = _Reader(nest, index, extents)
    check_binding(nest, extents)
    out, out_indices, operands = reader.product()
    roles = reader.roles(out, out_indices, operands)
    data, weight = roles["data"], roles["weight"]
    padded, w = data.source, weight.source
    layout = roles["layout"]
    rank = len(out_indices)
    padded_sizes = _sizes(padded)
    if len(padded_sizes) != rank:
        reader.fail(f"{padded.name} has {len(padded_sizes)} dims, expected {rank}")
    channel_at = 1 if layout == CHANNELS_FIRST else rank - 1
    channels = padded_sizes[channel_at]
    groups, strides, dilations = reader.data_indices(roles, channels)
    # Step 4. Shapes: the iterators cover the output and the weight; reads stay in the input.
    out_sizes = _sizes(out)
    by_handle = {it.handle: it for it in nest.iterators}
    covered = [
        dim_extent(by_handle[i.__chandle__()].extent, axis, "an extent")
        for axis, i in enumerate(out_indices)
    ]
    if not all(same_extent(e, size) for e, size in zip(covered, out_sizes)):
        reader.fail(f"its iterators do not cover {out.name} whole")
    w_sizes = [_static(d, f"a dim of {w.name}") for d in shape_of(w)]
    w_extents = [_static(by_handle[i.__chandle__()].extent, "an extent") for i in weight.indices]
    if w_sizes != w_extents:
        reader.fail(f"its iterators do not cover the weight {w.name} whole")
    kernel = [_static(r.extent, "a window extent") for r in roles["window"]]
    positions = [_static(q.extent, "an output extent") for q in roles["positions"]]
    padded_spatial = [padded_sizes[a] for a in roles["spatial_at"]]
    for q, k, s, d, size in zip(positions, kernel, strides, dilations, padded_spatial):
        if (q - 1) * s + (k - 1) * d >= size:
            reader.fail(f"reads past the end of {padded.name} ({size} positions)")
    if not same_extent(padded_sizes[0], out_sizes[0]):
        reader.fail(f"{padded.name} has batch {padded_sizes[0]}, the output {out_sizes[0]}")
    # Step 5. The padding block, when the reduction reads one.
    pad_nest, x, pads = None, padded, [0] * (rank - 2)
    if padded not in index.params:
        writers = [p for p in index.owners_of(padded) if p != position]
        before = index.sibling_before(nest)
        if padded not in index.local or writers != [before] or before is None:
            reader.fail(
                f"{padded.name} is neither a parameter nor written only by the block right "
                "before it"
            )
        pad_nest = index.nests[before]
        if not pad_nest.block.body.buffer.same_as(padded):
            reader.fail(f"the block before it does not write {padded.name}")
        x, low = read_padding(pad_nest, padded, extents, reader.near)
        pads = [low[a] for a in roles["spatial_at"]]
        if low[0] or low[channel_at]:
            reader.fail("its padding block pads the batch or the channels")
    x_sizes = _sizes(x)
    if not same_extent(x_sizes[0], out_sizes[0]) or x_sizes[channel_at] != channels:
        reader.fail(f"{x.name} has shape {x_sizes}, not the batch and channels the block reads")
    for var in (x, w, out):
        reason = compact_global(var)
        if reason:
            reader.fail(reason)
    if len({v.__chandle__() for v in (x, w, out)}) != 3:
        reader.fail("its output is also an input")
    geometry = ConvGeometry(
        layout=layout,
        weight_layout=roles["weight_layout"],
        batch=out_sizes[0],
        channels=channels,
        out_channels=out_sizes[channel_at],
        groups=groups,
        in_size=tuple(x_sizes[a] for a in roles["spatial_at"]),
        out_size=tuple(positions),
        kernel=tuple(kernel),
        stride=tuple(strides),
        dilation=tuple(dilations),
        pad=tuple(pads),
    )
    return ConvCore(
        nest,
        pad_nest,
        x,
        padded,
        w,
        out,
        geometry,
        tuple(shape_of(out)),
        DtypeSignature.parse("float32"),
        channel_at,
    )


__all__ = ["ConvCore", "looks_like_conv", "read_convolution"]
