"""The batch dims of a product: which matrix of X and of W each batch index of the output reads.

Entry point: :func:`batch_of`, which reads each operand's element stride along each batch
iterator of the output (:func:`operand_strides`) and merges the dims into the
:class:`~.records.Batch` the call takes, or raises :class:`~tir_byoc.decline.Declined`.  Called by
:mod:`.reduction`; reads :mod:`.exprs` and :mod:`.extents`.
"""

from __future__ import annotations

from tvm import tirx

from ..decline import Declined
from .exprs import as_int64, const_value, expr_text, is_var, is_zero
from .extents import Extents
from .records import Batch
from .traversal import elements


def _times(a, b):
    a_value, b_value = const_value(a), const_value(b)
    if a_value is not None and b_value is not None:
        return tirx.IntImm("int64", a_value * b_value)
    if a_value == 1:
        return as_int64(b)
    if b_value == 1:
        return as_int64(a)
    return as_int64(a) * as_int64(b)


def operand_strides(load, batch_vars, dims, extents: Extents, what: str) -> list:
    """Per output batch iterator, the element stride of ``load``'s operand along it (0 if none).

    Each leading index of the operand must be one of the output's batch iterators (each at
    most once, over the whole dim), or 0 on a dim of extent 1 (a broadcast).
    """
    buf = load.source
    shape = extents.shape(buf)
    leading = elements(load.indices)[:-2]
    strides = []  # by axis, read only with leading indices
    if leading:
        strides = [tirx.IntImm("int64", 1)] * len(shape)
        for axis in reversed(range(len(shape) - 1)):
            strides[axis] = _times(strides[axis + 1], shape[axis + 1])
    found = {}
    for axis, index in enumerate(leading):
        if is_zero(index):
            if not extents.equal(shape[axis], 1):
                raise Declined(
                    f"{what} {buf.name} is read only at 0 on axis {axis} of extent "
                    f"{expr_text(shape[axis])}: a partial batch range, not a broadcast"
                )
            continue
        position = next((p for p, v in enumerate(batch_vars) if is_var(index, v)), None)
        if position is None:
            raise Declined(
                f"{what} {buf.name} is indexed by {expr_text(index)} on axis {axis}, which is "
                "not a batch iterator of the output"
            )
        if position in found:
            raise Declined(f"{what} {buf.name} is indexed twice by batch iterator {index.name}")
        if not extents.equal(shape[axis], dims[position]):
            raise Declined(
                f"batch iterator {index.name} runs over {expr_text(dims[position])} of "
                f"{expr_text(shape[axis])} (axis {axis} of {what} {buf.name}): a partial batch "
                "range"
            )
        found[position] = strides[axis]
    return [found[p] if p in found else tirx.IntImm("int64", 0) for p in range(len(batch_vars))]


def batch_of(batch_iters, x, w, mk, extents: Extents) -> Batch:
    """The batch dims of a product: each operand's strides, merged into at most two dims.

    Output batch dims of extent 1 are dropped, and neighbours are merged where every operand
    steps over them as one dim (outer stride = inner stride x inner extent).  The form is
    ``leading`` when one merged dim remains, the weight does not vary along it and X's
    matrices follow each other (stride M x K): then X and Y are (B x M, K) and (B x M, N)
    matrices and the product is one 2-D call.  Otherwise it is ``batched``.
    """
    m, k = mk
    batch_vars = [it.var for it in batch_iters]
    dims = tuple(it.extent for it in batch_iters)
    x_strides = operand_strides(x, batch_vars, dims, extents, "input")
    w_strides = operand_strides(w, batch_vars, dims, extents, "weight")
    merged = []
    for count, x_stride, w_stride, var in zip(dims, x_strides, w_strides, batch_vars):
        if extents.equal(count, 1):
            continue
        if is_zero(x_stride) and is_zero(w_stride):
            raise Declined(
                f"batch iterator {var.name} of the output indexes neither operand: every batch "
                "would hold the same product"
            )
        if merged:
            outer_count, outer_x, outer_w = merged[-1]
            if extents.equal(outer_x, _times(x_stride, count)) and extents.equal(
                outer_w, _times(w_stride, count)
            ):
                merged[-1] = (_times(outer_count, count), x_stride, w_stride)
                continue
        merged.append((as_int64(count), x_stride, w_stride))
    if not merged:  # every batch dim has extent 1
        merged = [(tirx.IntImm("int64", 1), _times(m, k), tirx.IntImm("int64", 0))]
    counts, xs, ws = (tuple(column) for column in zip(*merged))
    if len(counts) == 1 and is_zero(ws[0]) and extents.equal(xs[0], _times(m, k)):
        return Batch("leading", counts, xs, ws, dims)
    if len(counts) > 2:
        raise Declined(
            f"the batch dims {'x'.join(expr_text(d) for d in dims)} index the operands in "
            f"{len(counts)} different ways; the batched call takes at most two"
        )
    return Batch("batched", counts, xs, ws, dims)


__all__ = ["batch_of", "operand_strides"]
