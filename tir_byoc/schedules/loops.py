"""Loop transformations the default CPU rules share: a parallel outer loop, a vector inner one.

Entry points: :func:`schedule_blocks` (each block by its kind, the reasons it leaves blocks on
one thread), built on :func:`parallel_vectorize` (a block of spatial loops only) and
:func:`parallel_rows` (a reduction block: its leading spatial loops in parallel), and
:func:`vector_lanes`; :func:`split_row` and :func:`vectorize_partials` (a row's reduction in
vector registers), shared with :class:`~tir_byoc.schedules.rows.VectorRows`.

A row's reduction split into ``lanes`` partial results adds a sum in another order than the
serial loop (a maximum or minimum is the same in any order): see :mod:`.rows`.
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.dlight.base import get_extent
from tvm.target import Target
from tvm.target.codegen import llvm_get_vector_width

#: Fewer loop iterations than this (over all of a block's loops) run on one thread: starting
#: TVM's thread pool costs a few microseconds, about what this much elementwise work takes.
MIN_PARALLEL_WORK = 1 << 14


def vector_lanes(target: Target, dtype_bits: int) -> int:
    """Elements of ``dtype_bits`` in one vector register of ``target`` (128-bit if unknown)."""
    width = llvm_get_vector_width(target)
    return max((width if width > 0 else 128) // dtype_bits, 2)


def _static(sch: s_tir.Schedule, loop) -> int | None:
    extent = get_extent(sch, loop)
    return extent if isinstance(extent, int) else None


def _work(sch: s_tir.Schedule, loops) -> int | None:
    """Iterations of ``loops`` together, ``None`` if one is symbolic."""
    total = 1
    for loop in loops:
        extent = _static(sch, loop)
        if extent is None:
            return None
        total *= extent
    return total


def _parallel(sch: s_tir.Schedule, loops, work: int | None) -> str | None:
    """Fuse ``loops`` and run them in parallel if the block's work is worth a thread pool."""
    if not loops:
        return "no spatial loop outside the vector loop: runs on one thread"
    if work is not None and work < MIN_PARALLEL_WORK:
        return f"{work} iterations, below {MIN_PARALLEL_WORK}: runs on one thread"
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if _static(sch, fused) == 1:
        return "its spatial loops have extent 1: runs on one thread"
    sch.parallel(fused)
    return None


def _dtype_bits(sch: s_tir.Schedule, block) -> int:
    writes = sch.get(block).writes
    return writes[0].source.dtype.bits if writes else 32


def parallel_vectorize(sch: s_tir.Schedule, block, target: Target) -> str | None:
    """Schedule a block whose loops are all spatial: outer loops in parallel, inner vectorised.

    The innermost loop is split by the vector width when the width divides it (a remainder
    would put a predicate in the vector loop, which TVM's vectoriser turns back into scalar
    code); the loops outside it are fused into one parallel loop.

    Returns
    -------
    str or None
        Why the block runs on one thread, or ``None`` when it runs in parallel.
    """
    loops = sch.get_loops(block)
    if not loops:
        return "a scalar block with no loop"
    work = _work(sch, loops)
    lanes = vector_lanes(target, _dtype_bits(sch, block))
    inner = loops[-1]
    extent = _static(sch, inner)
    outer = list(loops[:-1])
    if extent is not None and extent % lanes == 0 and extent >= lanes:
        if extent > lanes:
            rest, vector = sch.split(inner, factors=[None, lanes])
            outer.append(rest)
        else:
            vector = inner
        sch.vectorize(vector)
    elif not outer:
        # One loop that the vector width does not divide: parallel over it as it is.
        outer = [inner]
    return _parallel(sch, outer, work)


def parallel_rows(sch: s_tir.Schedule, block, leading: int) -> str | None:
    """Run a reduction block's ``leading`` spatial loops in parallel; the reduction stays serial.

    Returns
    -------
    str or None
        Why the block runs on one thread, or ``None`` when it runs in parallel.
    """
    loops = sch.get_loops(block)
    if leading == 0:
        return "reduces over its outermost loop: runs on one thread"
    return _parallel(sch, list(loops[:leading]), _work(sch, loops))


def leading_spatial(dom_kind: str) -> int:
    """How many of a block's iterators (dlight's ``dom_kind``, ``"SSR"``) lead as spatial."""
    return len(dom_kind) - len(dom_kind.lstrip("S"))


def split_row(sch: s_tir.Schedule, info, rows: int, lanes: int) -> tuple:
    """Split the reduction of block ``info`` (dlight ``SBlockInfo``: ``rows`` spatial iterators,
    then one reduction iterator, its loop innermost) into ``lanes`` partial results per row
    with ``rfactor``.

    Returns
    -------
    (partial block or None, str or None)
        The new block of partial results (the original block then combines them), or None and
        why the reduction stays serial.
    """
    kind = info.dom_kind()
    if kind != "S" * rows + "R":
        return None, f"its iterators are {kind!r}, not the rows and one reduction axis"
    extent = _static(sch, sch.get_loops(info.block_rv)[-1])
    if extent is None:
        return None, "its reduction extent is symbolic"
    if extent <= lanes:
        return None, f"its reduction extent {extent} is not above the {lanes} vector lanes"
    if extent % lanes:
        return None, f"its reduction extent {extent} is not a multiple of the {lanes} vector lanes"
    _, lane = sch.split(sch.get_loops(info.block_rv)[-1], factors=[None, lanes])
    try:
        return sch.rfactor(lane, factor_axis=rows), None
    except s_tir.ScheduleError as error:
        return None, f"rfactor declined ({str(error).splitlines()[0]})"


def vectorize_partials(sch: s_tir.Schedule, partial, lanes: int) -> str | None:
    """The partial-result block of :func:`split_row`: its lane loop innermost and vectorised,
    its initialisation moved out of its reduction loop.

    rfactor makes the lane iterator the block's first and leaves the reduction its last; each
    must be bound to a loop of its own.  Returns why the lanes stay serial when they are not
    (nothing is changed then), else None.
    """
    loops = {sch.get(loop).loop_var: loop for loop in sch.get_loops(partial)}
    realize = sch.get(sch.get_loops(partial)[-1]).body
    values = realize.iter_values if isinstance(realize, s_tir.SBlockRealize) else ()
    lane = next((rv for var, rv in loops.items() if values and values[0].same_as(var)), None)
    reduction = next((rv for var, rv in loops.items() if values and values[-1].same_as(var)), None)
    if lane is None or reduction is None or _static(sch, lane) != lanes:
        return "its partial results are not in the loops rfactor makes"
    order = list(loops.values())
    if order.index(lane) < order.index(reduction):
        sch.reorder(reduction, lane)
    sch.vectorize(lane)
    sch.decompose_reduction(partial, reduction)
    return None


def schedule_blocks(sch: s_tir.Schedule, blocks, target: Target) -> dict[str, str]:
    """Schedule each of ``blocks`` (dlight ``SBlockInfo``): a spatial block with
    :func:`parallel_vectorize`; a reduction block with :func:`parallel_rows`, its row's
    reduction first split into vector lanes where :func:`split_row` can.

    Returns
    -------
    dict
        The blocks left on one thread, or reduced serially, by name, with the reason.
    """
    notes = {}
    for block in blocks:
        if block.is_injective():
            note = parallel_vectorize(sch, block.block_rv, target)
        else:
            note = _reduce_rows(sch, block, target)
        if note is not None:
            notes[block.name] = note
    return notes


def _reduce_rows(sch: s_tir.Schedule, info, target: Target) -> str | None:
    """A reduction block: its rows in parallel, each row's reduction in vector lanes where
    :func:`split_row` can.  Returns why it runs on one thread or reduces a row serially."""
    rows = leading_spatial(info.dom_kind())
    lanes = vector_lanes(target, _dtype_bits(sch, info.block_rv))
    partial, serial = split_row(sch, info, rows, lanes) if rows else (None, None)
    note = parallel_rows(sch, info.block_rv, rows)
    if partial is not None:
        # The partial results hold the work; the block left combines `lanes` of them per row.
        note = parallel_rows(sch, partial, rows)
        serial = vectorize_partials(sch, partial, lanes)
    if note is None and serial is not None:
        return f"reduces each row serially: {serial}"
    return note
