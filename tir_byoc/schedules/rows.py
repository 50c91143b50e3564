"""Default CPU schedule of softmax, layer norm and RMS norm: every block in one parallel loop
over the rows, each row's sums and maxima in vector registers.

Entry point: :class:`VectorRows`, a dlight rule (``None`` when it does not apply).

It applies where dlight's CPU ``Reduction`` rule does (every block starts with the same
spatial axes, the rows; at least one block reduces; the last block is spatial) and schedules
the same way: the rows fused into one parallel loop, every block computed inside it, the
spatial blocks vectorised.  dlight then reduces each row serially: one chain of dependent
``maxss`` or ``addss`` per row, 128 to 768 long in a transformer, which took most of a
softmax's time (docs/model-flow.md has the measurement).  Here a reduction
over one trailing axis is first split into ``lanes`` partial results (``rfactor``), kept in one
vector register and combined at the end of the row.  When ``lanes`` does not divide the row
(Wav2Vec2's GroupNorm over 8,207 positions), the last, partial vector of each row is added lane
by lane after the whole ones; so is a spatial block's last vector.  A row of symbolic length
(a sequence) is split the same way, its bound check marked likely for TVM's ``LoopPartition``
(:func:`~tir_byoc.schedules.loops.vectorize_partials`).

A maximum or minimum is the same in any order.  A sum is not: the partial sums add each row's
elements in another order than TVM's serial loop, and the result can differ in the last bits,
as any vectorised or library sum does (torch's and MKL's among them).  A reduction this rule
cannot split (several reduction axes, a short extent, a reducer ``rfactor`` does not
recognise) stays serial, with the reason in :attr:`VectorRows.notes`.
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.dlight.base import get_extent
from tvm.target import Target

from .base import NotingRule
from .loops import (
    leading_spatial,
    split_row,
    vector_lanes,
    vectorize_partials,
    vectorize_split,
)
from .symbolic import simplify_row_body


class VectorRows(NotingRule):
    """dlight's CPU ``Reduction`` schedule with each row's reduction vectorised."""

    def schedule(self, sch: s_tir.Schedule, infos, target: Target) -> s_tir.Schedule | None:
        if len(infos) < 2 or not infos[-1].is_injective():
            return None
        if all(info.is_injective() for info in infos):
            return None
        kinds = [info.dom_kind() for info in infos]
        if any(not kind.startswith("S") for kind in kinds):
            return None
        infos = _inline_symbolic_producers(sch, infos)
        kinds = [info.dom_kind() for info in infos]
        rows = min(leading_spatial(kind) for kind in kinds)
        writes = sch.get(infos[-1].block_rv).writes
        lanes = vector_lanes(target, writes[0].source.dtype.bits if writes else 32)

        # Step 1. Split each reduction it can into `lanes` partial results (before compute_at:
        # rfactor needs the block alone under its loops).
        plan = []  # (block, role, row length): roles "spatial", "partial", "combine", "serial"
        for info in infos:
            if info.is_injective():
                plan.append((info.block_rv, "spatial", None))
                continue
            extent = get_extent(sch, sch.get_loops(info.block_rv)[-1])
            partial, why = split_row(sch, info, rows, lanes)
            if partial is not None:
                plan += [(partial, "partial", extent), (info.block_rv, "combine", extent)]
            else:
                self.notes[info.name] = f"reduces each row serially: {why}"
                plan.append((info.block_rv, "serial", extent))

        # Step 2. The rows of the last block in parallel, every other block inside them.
        last = plan[-1][0]
        loops = sch.get_loops(last)
        row_loop = sch.fuse(*loops[:rows]) if rows > 1 else loops[0]
        sch.parallel(row_loop)
        for block, _, _ in reversed(plan[:-1]):
            sch.compute_at(block, row_loop, preserve_unit_loops=True)
        simplify_row_body(sch, row_loop)  # what compute_at wrote for symbolic extents

        # Step 3. Vector loops inside each row (after compute_at: a loop partitioned at a
        # remainder hides the last block's loops from it).
        for block, role, extent in plan:
            if role == "spatial":
                _vectorize_inner(sch, block, lanes)
            elif role == "partial":
                why = vectorize_partials(sch, block, lanes, extent)
                if why is not None:
                    self.notes[sch.get(block).name_hint] = f"reduces each row serially: {why}"
        return sch


def _inline_symbolic_producers(sch: s_tir.Schedule, infos) -> list:
    """``infos`` less the spatial blocks before the first reduction, inlined into their readers,
    when that reduction's row has a symbolic length (else ``infos`` as given).

    Each block computed inside the row loop keeps a row of its own, and a row of symbolic
    length is allocated on the heap for each row (``TVMBackendAllocWorkspace``): a softmax
    merged with its scale and mask (:mod:`tir_byoc.relax.fuse_rows`) kept three such rows more
    and took ten times the static build's time.  Inlined, the scale and mask are computed
    again in the maximum's pass and the exponentials' (a multiply and an add each), and no
    row is kept for them; the values are the same expressions."""
    first = next(i for i, info in enumerate(infos) if not info.is_injective())
    if first == 0 or isinstance(get_extent(sch, sch.get_loops(infos[first].block_rv)[-1]), int):
        return infos
    kept = []
    for info in infos[:first]:
        try:
            sch.compute_inline(info.block_rv)
        except s_tir.ScheduleError:
            kept.append(info)
    return kept + list(infos[first:])


def _vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorise a spatial block's innermost loop, split by ``lanes`` when longer."""
    loops = sch.get_loops(block)
    if len(loops) <= 1:
        return
    inner = loops[-1]
    extent = get_extent(sch, inner)
    if isinstance(extent, int) and extent <= lanes:
        if extent >= 2:
            sch.vectorize(inner)
        return
    vectorize_split(sch, inner, lanes)
