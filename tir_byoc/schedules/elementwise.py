"""Default CPU schedule of a PrimFunc whose blocks are all spatial: elementwise, broadcast,
transpose, reshape, gather (an embedding lookup), concatenation.

Entry point: :class:`Elementwise`, a dlight rule (``None`` when it does not apply).
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.dlight.base import try_inline
from tvm.target import Target

from .base import NotingRule
from .loops import schedule_blocks
from .symbolic import simplify_indices


class Elementwise(NotingRule):
    """Inline every block that can be, then run each remaining block in parallel over its outer
    loops with its innermost loop vectorised.

    Applies when every block of the function has only spatial iterators (dlight's normal
    form).
    """

    def schedule(self, sch: s_tir.Schedule, blocks, target: Target) -> s_tir.Schedule | None:
        if not all(block.is_injective() for block in blocks):
            return None
        # Step 1. One loop nest per output where inlining allows: no intermediate buffers.
        blocks = try_inline(sch, blocks)
        simplify_indices(sch, blocks)  # what inlining composed, on symbolic shapes
        # Step 2. Parallel outside, vector inside.
        self.notes = schedule_blocks(sch, blocks, target)
        return sch
