"""Default CPU schedule of a PrimFunc with reductions that dlight's CPU ``Reduction`` rule
declines: a lone reduction (a mean, a row sum), reductions over other than trailing axes,
blocks that do not share their leading spatial axes (a layer norm over a transposed input).

Entry point: :class:`RowReduction`, a dlight rule (``None`` when it does not apply).
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.dlight.base import try_inline
from tvm.target import Target

from .base import NotingRule
from .loops import schedule_blocks
from .symbolic import simplify_indices


class RowReduction(NotingRule):
    """Inline what can be, then give each remaining block its own parallel loop nest: a
    reduction block runs its leading spatial loops (its rows) in parallel and reduces each row
    in vector lanes where it is longer than the vector width (:func:`~.loops.split_row`),
    else serially in the order TVM wrote it; a spatial block is scheduled as
    :class:`~tir_byoc.schedules.elementwise.Elementwise` schedules one.

    Applies when the function has at least one reduction block and every block is in
    dlight's normal form.
    """

    def schedule(self, sch: s_tir.Schedule, blocks, target: Target) -> s_tir.Schedule | None:
        if all(block.is_injective() for block in blocks):
            return None
        if any("O" in block.dom_kind() for block in blocks):
            return None
        # Step 1. Fold the elementwise blocks into their neighbours.
        blocks = try_inline(sch, blocks)
        simplify_indices(sch, blocks)  # what inlining composed, on symbolic shapes
        # Step 2. Each block in parallel over its rows.
        self.notes = schedule_blocks(sch, blocks, target)
        return sch
