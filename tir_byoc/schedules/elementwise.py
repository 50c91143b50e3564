"""Default CPU schedule of a PrimFunc whose blocks are all spatial: elementwise, broadcast,
transpose, reshape, gather (an embedding lookup), concatenation.

Entry point: :class:`Elementwise`, a dlight rule (``None`` when it does not apply).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target

from .loops import schedule_blocks


class Elementwise(CPUScheduleRule):
    """Inline every block that can be, then run each remaining block in parallel over its outer
    loops with its innermost loop vectorised.

    Applies when every block of the function has only spatial iterators (dlight's normal
    form).  :attr:`notes` holds, after :meth:`apply`, the blocks left on one thread and why.
    """

    def __init__(self):
        self.notes: dict[str, str] = {}

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks or not all(block.is_injective() for block in blocks):
            return None
        # Step 1. One loop nest per output where inlining allows: no intermediate buffers.
        blocks = try_inline(sch, blocks)
        # Step 2. Parallel outside, vector inside.
        self.notes = schedule_blocks(sch, blocks, target)
        return sch
