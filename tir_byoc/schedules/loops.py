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

import tvm_ffi
from tvm import ir, s_tir, tirx
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


def static_extent(sch: s_tir.Schedule, loop) -> int | None:
    extent = get_extent(sch, loop)
    return extent if isinstance(extent, int) else None


def _work(sch: s_tir.Schedule, loops) -> int | None:
    """Iterations of ``loops`` together, ``None`` if one is symbolic."""
    total = 1
    for loop in loops:
        extent = static_extent(sch, loop)
        if extent is None:
            return None
        total *= extent
    return total


def _parallel(sch: s_tir.Schedule, loops, work: int | None) -> str | None:
    """Fuse ``loops`` and run them in parallel if the block's work is worth a thread pool.

    Where a loop other than the outermost has a symbolic extent, only the loops up to the last
    such one are fused: each iteration of a fused loop recovers its indices by dividing by the
    extents inside it, and a division by a symbolic extent is a real one (tens of cycles), not
    the multiply and shift a constant gives; fusing the static loops after it too would pay
    for it on every vector (a dynamic GPT-2's q/k/v split at 4 x 128 ran 1.9x the static
    build's).  The static loops stay serial inside each parallel iteration."""
    if not loops:
        return "no spatial loop outside the vector loop: runs on one thread"
    if work is not None and work < MIN_PARALLEL_WORK:
        return f"{work} iterations, below {MIN_PARALLEL_WORK}: runs on one thread"
    symbolic = [i for i, loop in enumerate(loops) if static_extent(sch, loop) is None]
    if symbolic and symbolic[-1] > 0:
        loops = loops[: symbolic[-1] + 1]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if static_extent(sch, fused) == 1:
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
    code); the loops outside it are fused into one parallel loop.  Where a branch of the block
    (a concatenation on that axis) changes at multiples of the width, the vectors' loop is
    partitioned there instead (:func:`_vectorize_between`), so that each vector takes one
    branch.

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
    extent = static_extent(sch, inner)
    outer = list(loops[:-1])
    across = _transposed_read(sch, loops)
    if across is not None and _tile(sch, across, inner, lanes):
        return _parallel(sch, list(sch.get_loops(block)[:-2]), work)
    if extent is not None and extent % lanes == 0 and extent >= lanes:
        bounds = _branch_bounds(sch, inner, extent) if extent > lanes and outer else None
        if extent == lanes:
            sch.vectorize(inner)
        elif bounds and all(b % lanes == 0 for b in bounds):
            _vectorize_between(sch, inner, [b // lanes for b in bounds], lanes)
        else:
            rest, vector = sch.split(inner, factors=[None, lanes])
            outer.append(rest)
            sch.vectorize(vector)
    elif (extent is None or extent > lanes) and outer:
        why = _parallel(sch, outer, work)
        vectorize_split(sch, inner, lanes)
        return why
    elif not outer:
        # One loop that the vector width does not divide: parallel over it as it is.
        outer = [inner]
    return _parallel(sch, outer, work)


def vectorize_split(sch: s_tir.Schedule, loop, lanes: int) -> None:
    """Split ``loop`` into vectors of ``lanes`` and vectorise them.  When ``lanes`` does not
    divide its static extent, the vectors' loop is first partitioned before the last, partial
    vector: the whole vectors then have no bound check, and the partial one stays scalar (a
    bound check in a vector loop would make TVM's vectoriser turn all of it into scalar
    code)."""
    extent = get_extent(sch, loop)
    rest, vector = sch.split(loop, factors=[None, lanes])
    if isinstance(extent, int) and extent % lanes == 0:
        sch.vectorize(vector)
        return
    if not isinstance(extent, int):
        # loop_partition refuses a symbolic extent: the bound check is marked likely instead,
        # and TVM's LoopPartition pass splits the whole vectors from the last one at build time.
        _likely(sch, vector)
        sch.vectorize(vector)
        return
    whole, _ = sch.loop_partition(rest, factors=[extent // lanes, None])
    for block in sch.get_child_blocks(whole):
        sch.vectorize(sch.get_loops(block)[-1])


def _transposed_read(sch: s_tir.Schedule, loops):
    """The loop of a transpose's other axis, or None: the block stores along the innermost
    loop, and reads a buffer whose last (contiguous) axis follows an outer loop while the
    innermost loop's iterator indexes another of its axes.  Along the innermost loop such a
    read takes one element per cache line."""
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return None
    block = realize.block
    loop_of = {}  # iterator handle -> the loop it is bound to
    by_var = {sch.get(loop).loop_var.__chandle__(): loop for loop in loops}
    for iv, value in zip(block.iter_vars, realize.iter_values, strict=True):
        if isinstance(value, tirx.Var) and value.__chandle__() in by_var:
            loop_of[iv.var.__chandle__()] = by_var[value.__chandle__()]
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not store.indices:
        return None

    def handle(index):
        return index.__chandle__() if isinstance(index, tirx.Var) else None

    inner = handle(store.indices[-1])
    if inner is None or loop_of.get(inner) is None or not loop_of[inner].same_as(loops[-1]):
        return None
    reads = []
    tvm_ffi.structural_walk(store.value, [(ir.TensorLoad, reads.append)])
    for load in reads:
        indices = [handle(i) for i in load.indices]
        last = indices[-1] if indices else None
        if last is not None and last != inner and inner in indices[:-1] and last in loop_of:
            return loop_of[last]
    return None


def _tile(sch: s_tir.Schedule, across, inner, lanes: int) -> bool:
    """Tile a transpose: ``across`` (the loop of the read's contiguous axis) and ``inner`` (the
    write's) split by ``lanes``, the two tile loops innermost, so that each tile reads
    ``lanes`` short rows whose cache lines serve all of it.  The write's tile loop is
    vectorised, or the read's when the write's extent leaves a remainder (its tile loop then
    carries the bound check, outside the vector).  False, and nothing changed, unless both
    extents are static, at least ``lanes``, one a multiple of it, and the block has no branch
    to keep whole per vector (a concatenation's)."""
    extents = [static_extent(sch, loop) for loop in (across, inner)]
    if any(e is None or e < lanes for e in extents) or all(e % lanes for e in extents):
        return False
    if _branch_bounds(sch, inner, extents[1]) != []:
        return False
    _, across_tile = sch.split(across, factors=[None, lanes])
    inner_rest, inner_tile = sch.split(inner, factors=[None, lanes])
    if extents[1] % lanes == 0:  # write a vector, read lanes of them
        sch.reorder(inner_rest, across_tile)
        sch.vectorize(inner_tile)
    else:  # the write's tile has a remainder: read a vector, write lanes of them
        sch.reorder(inner_rest, inner_tile, across_tile)
        sch.vectorize(across_tile)
    return True


def _branch_bounds(sch: s_tir.Schedule, loop, extent: int) -> list[int] | None:
    """Where the block under ``loop`` changes branch along it: the points in (0, extent) at
    which a condition of its ``if_then_else`` or ``select`` (a concatenation, a pad) changes
    value, sorted; ``None`` when a condition reads the loop's iterator other than by comparing
    it with a constant, or the loop holds more than one block."""
    realize = sch.get(loop).body
    if not isinstance(realize, s_tir.SBlockRealize):
        return None
    loop_var = sch.get(loop).loop_var
    bound = [
        iv.var
        for iv, value in zip(realize.block.iter_vars, realize.iter_values, strict=True)
        if value.same_as(loop_var)
    ]
    if len(bound) != 1:
        return None
    (var,) = bound
    conditions = []

    def on_call(call):
        if isinstance(call.op, ir.Op) and call.op.name == "prim.if_then_else":
            conditions.append(call.args[0])

    tvm_ffi.structural_walk(
        realize.block.body,
        [(ir.Call, on_call), (tirx.Select, lambda select: conditions.append(select.condition))],
    )
    points = set()
    for condition in conditions:
        found = _compared(condition, var)
        if found is None:
            return None
        points |= found
    return sorted(p for p in points if 0 < p < extent)


#: A comparison of the iterator with a constant c, as the point where its value changes:
#: ``v < c`` changes at c, ``v <= c`` at c + 1 (and the mirrored forms likewise).
_CHANGES_AT = {tirx.LT: 0, tirx.GE: 0, tirx.LE: 1, tirx.GT: 1}
_MIRRORED = {tirx.LT: tirx.GT, tirx.GT: tirx.LT, tirx.LE: tirx.GE, tirx.GE: tirx.LE}


def _compared(condition, var) -> set[int] | None:
    """The points where ``condition`` can change value along ``var``: None if it reads ``var``
    other than in comparisons with a constant (combined by and, or, not)."""
    if isinstance(condition, tirx.And | tirx.Or):
        a, b = _compared(condition.a, var), _compared(condition.b, var)
        return None if a is None or b is None else a | b
    if isinstance(condition, tirx.Not):
        return _compared(condition.a, var)
    kind = type(condition)
    if kind in _CHANGES_AT:
        a, b = condition.a, condition.b
        if isinstance(a, tirx.IntImm) and b.same_as(var):
            a, b, kind = b, a, _MIRRORED[kind]
        if a.same_as(var) and isinstance(b, tirx.IntImm):
            return {int(b.value) + _CHANGES_AT[kind]}
    if isinstance(condition, tirx.EQ | tirx.NE):
        a, b = condition.a, condition.b
        if isinstance(a, tirx.IntImm) and b.same_as(var):
            a, b = b, a
        if a.same_as(var) and isinstance(b, tirx.IntImm):
            return {int(b.value), int(b.value) + 1}
    return None if reads_var(condition, var) else set()


def reads_var(expr, var) -> bool:
    """Whether ``expr`` reads ``var``."""
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Var, lambda v: found.append(v) if v.same_as(var) else None))
    return bool(found)


def _vectorize_between(sch: s_tir.Schedule, loop, points: list[int], lanes: int) -> None:
    """Split ``loop`` into vectors of ``lanes`` and partition the vectors' loop at ``points``
    (in vectors), each part's lanes vectorised: in each part every branch condition has one
    value for all its lanes, which TVM's simplifier then folds.  A condition whose value
    differs between the lanes of one vector makes TVM's vectoriser turn the whole loop back
    into scalar code (a concatenation on the last axis: LLaMA's rotary embedding)."""
    rest, _ = sch.split(loop, factors=[None, lanes])
    sizes = [b - a for a, b in zip([0, *points[:-1]], points, strict=True)]
    for part in sch.loop_partition(rest, factors=sizes):
        for block in sch.get_child_blocks(part):
            sch.vectorize(sch.get_loops(block)[-1])


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
    extent = get_extent(sch, sch.get_loops(info.block_rv)[-1])
    if isinstance(extent, int) and extent <= lanes:
        return None, f"its reduction extent {extent} is not above the {lanes} vector lanes"
    _, lane = sch.split(sch.get_loops(info.block_rv)[-1], factors=[None, lanes])
    try:
        return sch.rfactor(lane, factor_axis=rows), None
    except s_tir.ScheduleError as error:
        return None, f"rfactor declined ({str(error).splitlines()[0]})"


def _bound(sch: s_tir.Schedule, partial, extent: int) -> None:
    """Give :func:`split_row`'s block of partial results, over a row of ``extent`` elements
    that its lanes do not divide, its bound check (``vector * lanes + lane < extent``) if it
    has none: TVM 0.27's ``compute_at`` drops it, and makes the block's loops cover every lane
    of the last vector, which would then read past the row."""
    loop = sch.get_loops(partial)[-1]
    stmt = sch.get(loop)
    realize = stmt.body
    if not (isinstance(realize.predicate, tirx.IntImm) and realize.predicate.value):
        return  # rfactor's check is still there
    lanes = realize.block.iter_vars[0].dom.extent
    lane, vector = realize.iter_values[0], realize.iter_values[-1]
    limit = tirx.const(extent, lane.ty.dtype) if isinstance(extent, int) else extent
    bound = vector * lanes + lane < limit
    bounded = s_tir.SBlockRealize(realize.iter_values, bound, realize.block)
    replaced = tirx.For(
        stmt.loop_var,
        stmt.min,
        stmt.extent,
        stmt.kind,
        bounded,
        stmt.thread_binding,
        stmt.annotations,
    )
    sch.state.replace(sch.get_sref(loop), replaced, {realize.block: realize.block})


def vectorize_partials(sch: s_tir.Schedule, partial, lanes: int, extent: int) -> str | None:
    """The partial-result block of :func:`split_row` (over rows of ``extent`` elements): its
    lane loop innermost and vectorised, its initialisation moved out of its reduction loop.

    rfactor makes the lane iterator the block's first and leaves the reduction its last; each
    must be bound to a loop of its own.  When ``lanes`` does not divide ``extent``, the last
    vector of a row has a bound check, which would turn the whole vector loop back into scalar
    code: the reduction loop is partitioned before it, and only it is scalar.  Returns why the
    lanes stay serial when they are not (nothing is changed then), else None.
    """
    loops = {sch.get(loop).loop_var: loop for loop in sch.get_loops(partial)}
    realize = sch.get(sch.get_loops(partial)[-1]).body
    values = realize.iter_values if isinstance(realize, s_tir.SBlockRealize) else ()
    lane = next((rv for var, rv in loops.items() if values and values[0].same_as(var)), None)
    reduction = next((rv for var, rv in loops.items() if values and values[-1].same_as(var)), None)
    if lane is None or reduction is None or static_extent(sch, lane) != lanes:
        return "its partial results are not in the loops rfactor makes"
    order = list(loops.values())
    if order.index(lane) < order.index(reduction):
        sch.reorder(reduction, lane)  # before the bound check: reorder declines a block with one
    vectors = get_extent(sch, reduction)
    # A symbolic row may end in a partial vector at any length: bounded and partitioned.
    remainder = not isinstance(extent, int) or extent % lanes
    if remainder:
        _bound(sch, partial, extent)
    sch.vectorize(lane)
    sch.decompose_reduction(partial, reduction)
    if not isinstance(vectors, int):
        _likely(sch, sch.get_loops(sch.get_sblock(sch.get(partial).name_hint))[-1])
    elif remainder and vectors > 1:
        sch.loop_partition(reduction, factors=[vectors - 1, None])
    return None


def _likely(sch: s_tir.Schedule, loop) -> None:
    """Mark the bound check of the block directly under ``loop`` as likely: TVM's
    ``LoopPartition`` pass then runs the iterations where it holds for every lane without it,
    which a symbolic extent keeps :meth:`~tvm.s_tir.Schedule.loop_partition` from doing."""
    stmt = sch.get(loop)
    realize = stmt.body
    if not isinstance(realize, s_tir.SBlockRealize) or isinstance(realize.predicate, tirx.IntImm):
        return
    bounded = s_tir.SBlockRealize(
        realize.iter_values, tirx.likely(realize.predicate), realize.block
    )
    replaced = tirx.For(
        stmt.loop_var,
        stmt.min,
        stmt.extent,
        stmt.kind,
        bounded,
        stmt.thread_binding,
        stmt.annotations,
    )
    sch.state.replace(sch.get_sref(loop), replaced, {realize.block: realize.block})


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
    extent = get_extent(sch, sch.get_loops(info.block_rv)[-1])
    partial, serial = split_row(sch, info, rows, lanes) if rows else (None, None)
    note = parallel_rows(sch, info.block_rv, rows)
    if partial is not None:
        # The partial results hold the work; the block left combines `lanes` of them per row.
        note = parallel_rows(sch, partial, rows)
        serial = vectorize_partials(sch, partial, lanes, extent)
    if note is None and serial is not None:
        return f"reduces each row serially: {serial}"
    return note
