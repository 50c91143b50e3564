"""A convolution's padding block: ``pad_temp`` as x zero-padded, read exactly.

Entry point: :func:`read_padding`, called by :mod:`.conv` for the block that writes the buffer
a convolution reads.  TVM's legalised convolution pads with

    pad_temp[n, c, h, w] = if_then_else(p0 <= h < p0 + H and p1 <= w < p1 + W,
                                        x[n, c, h - p0, w - p1], 0)

(without padding, a plain copy).  The block must write its buffer whole, at its iterators in
order, read x at each iterator minus a constant, and its condition, a conjunction of bounds of
single iterators, must make each axis copy exactly x's extent from that offset, zeros around
it; anything else is declined with what differs.
"""

from __future__ import annotations

import math

from tvm import ir, sym, tirx

from ..decline import Declined
from .exprs import const_value, dtype_of, expr_text, shape_of
from .extents import Extents
from .stir import DATA_PAR, Nest, check_binding, compact_global
from .traversal import elements

_IF_THEN_ELSE = ir.Op.get("prim.if_then_else")


def static_extent(value, what: str) -> int:
    """``value`` as an int, or Declined: convolutions are matched with static shapes."""
    found = const_value(value)
    if found is None:
        raise Declined(
            f"{what} is {expr_text(value)}, not a constant; convolutions are matched "
            "with static shapes only",
            nearest="conv2d",
        )
    return int(found)


def batch_extent(value, what: str):
    """``value`` as an int, or the symbolic batch itself (an integer expression): a
    convolution's batch (its first dim) may be symbolic, its other dims are matched static."""
    found = const_value(value)
    if found is not None:
        return int(found)
    if not ir.is_prim_expr(value) or not dtype_of(value).startswith("int"):
        raise Declined(f"{what} is {expr_text(value)}, not an integer", nearest="conv2d")
    return value


def dim_extent(value, axis: int, what: str):
    """A convolution's dim ``axis``: :func:`batch_extent` for the batch, else
    :func:`static_extent`."""
    return batch_extent(value, what) if axis == 0 else static_extent(value, what)


def same_extent(a, b) -> bool:
    """Whether two extents (ints, or a symbolic batch) are provably equal."""
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return bool(sym.Analyzer().can_prove_equal(a, b))


def _bounds(cond, handles: dict[int, int], fail) -> dict[int, list]:
    """Per axis, [lo, hi) from a conjunction of comparisons of an iterator with a constant."""
    bounds: dict[int, list] = {}
    pending = [cond]
    while pending:
        term = pending.pop()
        if isinstance(term, tirx.And):
            pending += [term.a, term.b]
            continue
        kinds = (tirx.LT, tirx.LE, tirx.GT, tirx.GE)
        if not isinstance(term, kinds):
            fail(f"its condition holds {expr_text(term)}, not a bound of an iterator")
        a, b = term.a, term.b
        flip = isinstance(a, tirx.Var) is False
        var, constant = (b, a) if flip else (a, b)
        value = const_value(constant)
        if not isinstance(var, tirx.Var) or value is None or var.__chandle__() not in handles:
            fail(f"its condition holds {expr_text(term)}, not a bound of an iterator")
        # Normalise to var OP value with OP one of <, <=, >, >=.
        op = type(term)
        if flip:
            op = {tirx.LT: tirx.GT, tirx.LE: tirx.GE, tirx.GT: tirx.LT, tirx.GE: tirx.LE}[op]
        lo_hi = bounds.setdefault(handles[var.__chandle__()], [None, None])
        if op in (tirx.LT, tirx.LE):
            hi = int(value) + (op is tirx.LE)
            lo_hi[1] = hi if lo_hi[1] is None else min(lo_hi[1], hi)
        else:
            lo = int(value) + (op is tirx.GT)
            lo_hi[0] = lo if lo_hi[0] is None else max(lo_hi[0], lo)
    return bounds


def read_padding(pad: Nest, padded, extents: Extents, near: str):
    """``(x, low pads per axis)`` of the block that writes ``padded`` as x zero-padded."""
    name = pad.block.name_hint

    def fail(reason):
        raise Declined(f"padding block {name}: {reason}", nearest=near)

    check_binding(pad, extents)
    store = pad.block.body
    iterators = pad.iterators
    if any(it.iter_type != DATA_PAR for it in iterators) or pad.block.init is not None:
        fail("is not elementwise")
    indices = elements(store.indices)
    rank = len(shape_of(padded))
    if (
        len(indices) != rank
        or len(iterators) != rank
        or not all(
            isinstance(i, tirx.Var) and i.same_as(it.var) for i, it in zip(indices, iterators)
        )
    ):
        fail(f"does not write {padded.name} at its iterators in order")
    sizes = [dim_extent(d, a, f"a dim of {padded.name}") for a, d in enumerate(shape_of(padded))]
    extents = [dim_extent(it.extent, a, "an iterator's extent") for a, it in enumerate(iterators)]
    if not all(same_extent(e, size) for e, size in zip(extents, sizes)):
        fail(f"does not cover {padded.name} whole")
    value, cond = store.value, None
    if isinstance(value, ir.Call) and value.op.same_as(_IF_THEN_ELSE):
        cond, then, other = elements(value.args)
    elif isinstance(value, tirx.Select):
        cond, then, other = value.condition, value.true_value, value.false_value
    else:
        then, other = value, None
    if other is not None and (
        const_value(other) != 0
        or math.copysign(1.0, const_value(other)) < 0
        or dtype_of(other) != "float32"
    ):
        fail(f"pads with {expr_text(other)}, not 0")
    if not isinstance(then, ir.TensorLoad) or len(then.indices) != rank:
        fail(f"copies {expr_text(then)}, not an element of a tensor of rank {rank}")
    x = then.source
    handles = {it.handle: axis for axis, it in enumerate(iterators)}
    bounds = _bounds(cond, handles, fail) if cond is not None else {}
    x_sizes = [dim_extent(d, a, f"a dim of {x.name}") for a, d in enumerate(shape_of(x))]
    pads = []
    for axis, (index, it) in enumerate(zip(elements(then.indices), iterators)):
        coefficients = sym.detect_linear_equation(index, [it.var])
        values = [const_value(c) for c in coefficients]
        if len(values) != 2 or None in values or values[0] != 1 or values[1] > 0:
            fail(f"reads {x.name} at {expr_text(index)}, not {it.var.name} - padding")
        low = -int(values[1])
        if not isinstance(sizes[axis], int):  # the symbolic batch: copied whole, never padded
            if low != 0 or axis in bounds or not same_extent(sizes[axis], x_sizes[axis]):
                fail(f"does not copy {x.name}'s batch {expr_text(sizes[axis])} as it is")
            pads.append(0)
            continue
        lo, hi = bounds.get(axis, [None, None])
        lo = 0 if lo is None else max(lo, 0)
        hi = sizes[axis] if hi is None else min(hi, sizes[axis])
        if lo != low or hi != min(sizes[axis], low + x_sizes[axis]):
            fail(
                f"copies {x.name} on axis {axis} over [{lo}, {hi}) with offset {low}, not over "
                f"[{low}, {low + x_sizes[axis]}) with zeros around it"
            )
        pads.append(low)
    reason = compact_global(x)
    if reason:
        fail(reason)
    return x, pads


__all__ = ["batch_extent", "dim_extent", "read_padding", "same_extent", "static_extent"]
