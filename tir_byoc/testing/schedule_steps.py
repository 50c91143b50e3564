"""Schedule primitives that leave what a function computes as it is, and TVM's lowering.

Entry points: :func:`apply_step` (one of :data:`SCHEDULE_STEPS` on one block, skipped where it
does not apply), :func:`leaf_blocks` and :func:`lower_to_plain_loops`, which
:mod:`.strategies` applies to built programs (``scheduled_programs``, ``lowered_programs``).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import ScheduleError

#: Schedule primitives ``strategies.scheduled_programs`` applies; none changes what a function
#: computes.
SCHEDULE_STEPS = (
    "split",
    "reorder",
    "fuse",
    "unroll",
    "parallel",
    "compute_inline",
    "reverse_compute_inline",
    "decompose_reduction",
)
# Not fuse_reduction_epilogue: TVM 0.27 applies it to any consumer, not only a bias add (an
# exp consumer became ``init exp(0); E = exp(X * W + E)``, and a transpose consumer left the
# reduction's own output unwritten), and with iterators out of (i, j, k) order it writes the
# init out of bounds (``Z[vj, vi] = b[vi]``).  Each makes the "original" itself wrong.


def sole_consumer(schedule, block) -> bool:
    """Whether ``block`` is the only consumer of each of its producers.

    TVM 0.27's reverse_compute_inline checks this only when the producer is a reduction: into
    a spatial producer whose output another block also reads, it inlines anyway and drops the
    producer's store, leaving the other reader with a buffer nobody allocates or writes.
    """
    producers = schedule.get_producers(block)
    return bool(producers) and all(
        len(schedule.get_consumers(producer)) == 1 for producer in producers
    )


def apply_step(schedule, step: str, block_name: str, factor: int) -> None:
    """Apply ``step`` to the block; a primitive that does not apply there is skipped."""
    try:
        block = schedule.get_sblock(block_name)
        loops = schedule.get_loops(block)
        if step == "split":
            schedule.split(loops[-1], factors=[None, factor])
        elif step == "reorder" and len(loops) >= 2:
            schedule.reorder(*reversed(loops))
        elif step == "fuse" and len(loops) >= 2:
            schedule.fuse(loops[0], loops[1])
        elif step == "unroll" and isinstance(schedule.get(loops[-1]).extent, tirx.IntImm):
            schedule.unroll(loops[-1])  # TVM cannot unroll a loop of symbolic extent
        elif step == "parallel":
            schedule.parallel(loops[0])
        elif step == "compute_inline":
            schedule.compute_inline(block)
        elif step == "reverse_compute_inline" and sole_consumer(schedule, block):
            schedule.reverse_compute_inline(block)
        elif step == "decompose_reduction":
            schedule.decompose_reduction(block, loops[0])
    except (ScheduleError, ValueError, IndexError, RuntimeError):
        pass


def leaf_blocks(func) -> list:
    """The blocks of ``func`` but its root, in the order a walk meets them."""
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append))
    return [block for block in found if block.name_hint != "root"]


def lower_to_plain_loops(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` through TVM's own S-TIR lowering, which leaves plain loops without SBlocks."""
    passes = tvm.transform.Sequential(
        [
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.CompactBufferAllocation(),
            s_tir.transform.LowerMatchBuffer(),
            s_tir.transform.LowerOpaqueBlock(),
            tirx.transform.StmtSimplify(),
        ]
    )
    return passes(tvm.IRModule({"main": func}))["main"]


__all__ = ["SCHEDULE_STEPS", "apply_step", "leaf_blocks", "lower_to_plain_loops", "sole_consumer"]
