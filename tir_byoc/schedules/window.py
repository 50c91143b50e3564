"""Default CPU schedule of a PrimFunc around one reduction that reads along its output's rows: a
depthwise convolution (ConvNeXt's 7 x 7), a pooling window, a sum over a leading axis.

Entry point: :class:`SlidingWindow`, a dlight rule (``None`` when it does not apply).

Each output element of such a block sums a few products, one per tap of its window, and the
taps of neighbouring outputs are neighbouring inputs: ``out[c, y, x] += in[c, y + r, x + s] *
w[c, r, s]``.  The row rules reduce each element's taps in vector lanes, a strided gather of
49 values for a 7 x 7 window, far below the vector units' rate on a depthwise convolution
(docs/model-flow.md has the measurement).  Here the window's loops go outside the
output's last axis, which is vectorised: each step multiplies one tap by a vector of
consecutive inputs and adds it to a vector of outputs, and a row of the output stays in cache
for the whole window.  Every output element still adds its products in the order TVM wrote
them: the result is the unscheduled function's (up to a multiply and an add that LLVM may
contract into one fused multiply-add).

A product left to TVM whose right operand is read along its rows, ``C[i, j] += A[i, k] *
B[k, j]`` (a batched matmul no library takes), has that form too, its window being k: it runs
in the i-k-j order, each row of C built from rows of B.
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, s_tir, sym, tirx
from tvm.target import Target

from ..match.exprs import const_value
from .base import NotingRule
from .loops import (
    leading_spatial,
    parallel_rows,
    reads_var,
    schedule_blocks,
    static_extent,
    vector_lanes,
)

#: The innermost loop over the window's taps is unrolled up to this extent.
MAX_UNROLLED = 16
#: The largest stride along the rows a window may read with (a pooling or a convolution of
#: stride 2 reads every other input of a row: the vector's lanes gather them).
MAX_STEP = 2


class SlidingWindow(NotingRule):
    """The window's loops outside the output's last axis, that axis vectorised, the rows in
    parallel; the function's other (spatial) blocks as
    :class:`~tir_byoc.schedules.elementwise.Elementwise` schedules them, each on its own.

    Applies when the function has exactly one reduction block, its iterators are spatial ones
    then reduction ones, the last spatial one and the reduction ones of static extent (those
    before may be symbolic: a dynamic batch runs in parallel with the rows), it stores along
    its last spatial iterator, and every buffer it reads is read either along that iterator
    (with a step of 1 or 2, in the buffer's last axis: a stride-2 pooling or depthwise
    convolution in NCHW, each lane reading every other input) or not at all by it (a weight,
    read once per tap).  Every other block is spatial.
    """

    def schedule(self, sch: s_tir.Schedule, blocks, target: Target) -> s_tir.Schedule | None:
        reductions = [block for block in blocks if not block.is_injective()]
        if len(reductions) != 1:
            return None
        window = reductions[0]
        kind = window.dom_kind()
        rows = leading_spatial(kind)
        if rows < 2 or kind != "S" * rows + "R" * (len(kind) - rows):
            return None
        loops = sch.get_loops(window.block_rv)
        # The rows outside may be symbolic (a dynamic batch); the row in vectors and the taps
        # are not.
        if len(loops) != len(kind) or any(
            static_extent(sch, loop) is None for loop in loops[rows - 1 :]
        ):
            return None
        if not _reads_along_rows(sch, window.block_rv, rows):
            return None
        # Step 1. The window's loops outside the last spatial one, which runs in vectors.
        *outer, along = loops[:rows]
        taps = loops[rows:]
        sch.reorder(*taps, along)
        bits = sch.get(window.block_rv).writes[0].source.dtype.bits
        serial = _vectorize(sch, along, vector_lanes(target, bits))
        # Step 2. The rows in parallel, then the output zeroed before the window's loops (TVM
        # parallelises and vectorises a reduction block only before its init is split off).
        note = parallel_rows(sch, window.block_rv, len(outer))
        sch.decompose_reduction(window.block_rv, taps[0])
        if static_extent(sch, taps[-1]) <= MAX_UNROLLED:
            sch.unroll(taps[-1])  # a row of a 7 x 7 window's taps: 0.94 -> 0.74 ms (ConvNeXt-T)
        # Step 3. The other blocks (a pad before, a bias after) each in parallel, vectorised.
        others = [block for block in blocks if block is not window]
        self.notes = schedule_blocks(sch, others, target)
        note = "; ".join(n for n in (note, serial) if n)
        if note:
            self.notes[window.name] = note
        return sch


def _vectorize(sch: s_tir.Schedule, loop, lanes: int) -> str | None:
    """Vectorise ``loop`` in ``lanes``, or in half or a quarter of them (at least 4) when that
    divides it and ``lanes`` does not: a 56-wide row in 8 lanes is seven vectors, in 16 it is
    three and eight scalar elements.  Returns why it stays serial, or None."""
    extent = static_extent(sch, loop)
    if extent <= lanes:
        sch.vectorize(loop)
        return None
    for width in (lanes, lanes // 2, lanes // 4):
        if width >= 4 and extent % width == 0:
            sch.vectorize(sch.split(loop, factors=[None, width])[1])
            return None
    return f"its rows of {extent} are no multiple of 4: not vectorised"


def _reads_along_rows(sch: s_tir.Schedule, block_rv, rows: int) -> bool:
    """Whether the block stores along its last spatial iterator x (its last index, x itself)
    and reads every buffer either at ``x + (something without x)`` in the buffer's last axis
    only, or without x."""
    block = sch.get(block_rv)
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not store.indices:
        return False
    x = block.iter_vars[rows - 1].var
    if not (isinstance(store.indices[-1], tirx.Var) and store.indices[-1].same_as(x)):
        return False
    if any(reads_var(index, x) for index in list(store.indices)[:-1]):
        return False
    loads = []
    tvm_ffi.structural_walk(store.value, [(ir.TensorLoad, loads.append)])
    for load in loads:
        *leading, last = list(load.indices) or [None]
        if any(reads_var(index, x) for index in leading):
            return False
        if last is not None and reads_var(last, x) and not _small_step(last, x):
            return False
    return True


def _small_step(index, var) -> bool:
    """Whether ``index`` is ``var`` times a step of 1 to :data:`MAX_STEP` plus an expression
    without ``var``."""
    coefficients = sym.detect_linear_equation(index, [var])
    if len(coefficients) != 2:
        return False
    step = const_value(coefficients[0])
    return step is not None and 1 <= step <= MAX_STEP and not reads_var(coefficients[1], var)
