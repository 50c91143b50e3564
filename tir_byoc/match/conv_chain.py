"""A convolution's chain: the convolution (:mod:`.conv`) and the elementwise blocks after it.

Entry point: :func:`scan_convolution`, called by :mod:`.scan` for each reduction block that
:func:`~.conv.looks_like_conv`.  It reads the convolution exactly or declines it, then grows the
chain as :mod:`.chain` grows a GEMM's: each following elementwise block is composed into one
expression of the output (:func:`.chain.compose`) and read as epilogue ops by the GEMM's parser
(:class:`.epilogue.EpilogueParser`), with one difference: a per-channel vector (a bias, a
channel scale) is read along the output's channel axis (``b[0, o, 0, 0]`` of a (1, O, 1, 1)
bias in NCHW, ``b[0, 0, 0, o]`` in NHWC, or an (O,) vector), not along the last axis.  The chain
ends at the longest cut whose intermediates nothing else reads; the shorter cuts are kept for
a backend that takes only a prefix.  The result is a :class:`~.conv_records.ConvMatch`.
"""

from __future__ import annotations

import math

from tvm import tirx

from ..decline import GEMM_CHAIN, Decline, Declined
from ..epilogues import OPS, epilogue_error
from .chain import MAX_EPILOGUE_BLOCKS, Cut, compose, cut_refusal, next_user
from .conv import ConvCore, read_convolution
from .conv_records import ConvMatch, conv_pattern
from .epilogue import EpilogueParser, read_elementwise
from .explain import stranded_epilogues
from .exprs import as_int64, const_value, dtype_of, expr_text, index_text, is_var
from .records import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO, Step
from .stir import compact_global
from .traversal import elements


class ConvEpilogueParser(EpilogueParser):
    """The GEMM's epilogue parser, its per-channel vectors read along the channel axis."""

    def __init__(self, core: ConvCore, axes, extents, params):
        super().__init__(core.out, axes, core, extents, params)
        self.core = core
        self.channel = axes[core.channel_axis]

    def _vector(self, load, op: str, role: str) -> Step:
        buffer, indices = load.source, elements(load.indices)
        shape = self.extents.shape(buffer)
        channels = self.core.geometry.out_channels
        rank = len(self.core.out_shape)
        axis = self.core.channel_axis
        ok = False
        if len(indices) == 1 and len(shape) == 1:
            ok = is_var(indices[0], self.channel) and const_value(shape[0]) == channels
        elif len(indices) == rank and len(shape) == rank:
            ok = True
            for a, (index, dim) in enumerate(zip(indices, shape)):
                if a == axis:
                    ok = ok and is_var(index, self.channel) and const_value(dim) == channels
                    continue
                # Another axis: a dim of 1, read at 0 (or at an output axis of extent 1).
                single = const_value(self.core.out_shape[a]) == 1
                ok = ok and const_value(dim) == 1
                ok = ok and (const_value(index) == 0 or (single and is_var(index, self.axes[a])))
        if not ok:
            raise Declined(
                f"{role} {buffer.name}{index_text(load)} of shape {[expr_text(d) for d in shape]} "
                f"is not a per-channel vector of the output's {channels} channels",
                op=op,
            )
        if dtype_of(buffer) != "float32":
            raise Declined(f"{role} {buffer.name} is {dtype_of(buffer)}, expected float32", op=op)
        reason = compact_global(buffer)
        if reason:
            raise Declined(reason, op=op)
        return Step(op, OPS[op].code, (), buffer)


def _rows(geometry) -> tirx.PrimExpr:
    """The GEMM rows a convolution's output holds (batch x positions), int64: a constant, or
    an expression of a symbolic batch."""
    positions = math.prod(geometry.out_size)
    if geometry.static_batch:
        return tirx.IntImm("int64", geometry.batch * positions)
    return as_int64(geometry.batch) * tirx.IntImm("int64", positions)


def _match(core: ConvCore, cut: Cut, members, written, index, func_name, shorter=()):
    geometry = core.geometry
    inside = members[: cut.count]
    nests = [index.nests[p] for p in inside]
    ops = tuple(s.op for s in cut.steps)
    relu = [s for s in cut.steps if s.op == "relu"]
    relu_nan = None
    if relu:
        relu_nan = RELU_KEEPS_NAN if relu[0].code != OPS["relu"].code else RELU_NAN_TO_ZERO
    bias = cut.steps[0].tensor if ops[:1] == ("bias",) else None
    per_group = geometry.channels // geometry.groups
    return ConvMatch(
        func=func_name,
        pattern=conv_pattern(geometry.dims, ops),
        blocks=tuple(n.name for n in nests),
        dtype=core.dtype,
        m=_rows(geometry),
        n=tirx.IntImm("int64", geometry.out_channels),
        k=tirx.IntImm("int64", per_group * math.prod(geometry.kernel)),
        x=core.x,
        w=core.w,
        bias=bias,
        out=cut.out,
        intermediates=tuple(b for b, at in written if at < cut.count and not b.same_as(cut.out)),
        stmts=tuple(n.stmt for n in nests),
        relu_nan=relu_nan,
        epilogue=cut.steps,
        shorter=shorter,
        conv=geometry,
    )


def grow_chain(position: int, core: ConvCore, index, extents, func_name):
    """``(match, declines, members)``: the convolution at ``position`` with its epilogue."""
    pad_at = [index.nests.index(core.pad)] if core.pad is not None else []
    members = [*pad_at, position]
    start = len(members)
    cuts = [Cut(start, core.out, ())]
    written = [(core.padded, 0)] if core.pad is not None else []
    written.append((core.out, 0))
    handles = {b.__chandle__() for b, _ in written}
    owners = set(index.owners_of(core.out))
    read = {core.x, core.w}
    values, axes, parser = {}, None, None
    refusals, stopped = [], None
    # Step 1. Compose the elementwise blocks that follow, noting each cut.
    while len(members) - start < MAX_EPILOGUE_BLOCKS:
        users = owners.difference(members)
        if not users:
            break
        live = {b for b, _ in written}
        current = written[-1][0]
        try:
            at = next_user(index.nests[members[-1]], current, users, live, read, index)
            block = read_elementwise(index.nests[at], core, extents)
            axes = axes or block.axes
            value, loads = compose(block, axes, values, live)
            if block.out in read or block.out in loads:
                raise Declined(
                    f"block {block.nest.name} writes {block.out.name}, which the chain also "
                    "reads (aliasing)"
                )
        except Declined as refused:
            stopped = (refused, sorted(u for u in users if u >= 0))
            break
        members.append(at)
        read |= loads
        values[block.out.__chandle__()] = value
        if block.out.__chandle__() not in handles:
            written.append((block.out, len(members) - 1))
            handles.add(block.out.__chandle__())
            owners.update(index.owners_of(block.out))
        parser = parser or ConvEpilogueParser(core, axes, extents, index.params)
        try:
            steps = parser.parse(value)
            error = epilogue_error(tuple(s.op for s in steps))
            if error:
                raise Declined(error, op=steps[-1].op)
        except Declined as refused:
            refusals.append((at, refused))
            continue
        cuts.append(Cut(len(members), block.out, steps))
    # Step 2. The cuts whose intermediates nothing else reads, longest first.
    valid = [c for c in reversed(cuts) if cut_refusal(c, members, written, index) is None]
    if not valid:
        reason = cut_refusal(cuts[0], members, written, index)
        raise Declined(reason, nearest=conv_pattern(core.geometry.dims, ()))
    best = valid[0]
    shorter = tuple(_match(core, c, members, written, index, func_name) for c in valid[1:])
    match = _match(core, best, members, written, index, func_name, shorter)
    # Step 3. Why the blocks after the chain stay TVM code.
    declines = []
    left = members[best.count :]
    refused = next((r for p, r in reversed(refusals) if p in left), None)
    if left and refused is None:
        refused = Declined(cut_refusal(cuts[-1], members, written, index) or "it ends no cut")
    if not left and stopped is not None:
        refused, left = stopped
    names = tuple(index.nests[p].name for p in left)
    if refused is not None and names:
        declines.append(Decline(func_name, names, GEMM_CHAIN, refused.reason, match.pattern))
    return match, declines, members[: best.count]


def scan_convolution(position: int, index, extents, func_name):
    """``(match or None, declines, covered positions)`` for the reduction at ``position``."""
    nest = index.nests[position]
    try:
        core = read_convolution(position, index, extents)
        return grow_chain(position, core, index, extents, func_name)
    except Declined as refused:
        nearest = refused.nearest or "conv2d"
        declines = [Decline(func_name, (nest.name,), GEMM_CHAIN, refused.reason, nearest)]
        declines += [d for _, d in stranded_epilogues(position, index, func_name)]
        return None, declines, set()


__all__ = ["ConvEpilogueParser", "grow_chain", "scan_convolution"]
