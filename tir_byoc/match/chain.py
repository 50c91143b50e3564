"""The chain builder: grow a chain from a reduction through the epilogues that follow it.

Entry point: :func:`extend_chain`, which returns the :class:`~.records.Match` and the
refusals of epilogue-like blocks that could not join.  It decides which block comes next
(:func:`next_user`: past statements that leave the chain's buffers alone), whether it may
join (a private intermediate, or an update in place), and asks :mod:`.epilogue` what it
computes.  Called by :mod:`.scan`.
"""

from __future__ import annotations

from ..patterns import pattern_for
from .epilogue import analyze_epilogue
from .explain import STATEMENT_WORDS
from .records import Match, Refused, Rejection
from .reduction import Reduction
from .stir import FunctionIndex, Nest, buffers_used, is_spatial


def extend_chain(positions, core: Reduction, index: FunctionIndex, extents, func_name):
    """Grow a chain from a reduction (and its init block, if separate) through epilogue blocks.

    Returns the Match, the Rejections of epilogue-like blocks that could not join it, and the
    positions of the nests it covers.
    """
    members = list(positions)
    ops: tuple[str, ...] = ("bias",) if core.bias is not None else ()
    bias, relu_nan = core.bias, None
    current = core.out
    intermediates = []
    rejections = []
    while True:
        consumers = [owner for owner in index.owners.get(current, {}) if owner not in members]
        if not consumers:
            break
        try:
            position, epilogue = next_epilogue(
                consumers, members, current, core, ops, bias, intermediates, index, extents
            )
        except Refused as refused:
            # The nearest pattern is the one the refused operation would have made, if any.
            attempted = (
                pattern_for(core.layout, (*ops, refused.op), core.form) if refused.op else None
            )
            nearest = (attempted or pattern_for(core.layout, ops, core.form)).name
            for owner in consumers:
                if owner >= 0 and is_spatial(index.nests[owner].block):
                    target = index.nests[owner]
                    reason = refused.reason
                    rejections.append(Rejection(func_name, (target.name,), nearest, reason))
            break
        members.append(position)
        if not epilogue.out.same_as(current):
            intermediates.append(current)
        ops, current = ops + epilogue.ops, epilogue.out
        bias = epilogue.bias if epilogue.bias is not None else bias
        relu_nan = epilogue.relu_nan or relu_nan
    nests = [index.nests[p] for p in members]
    match = Match(
        func=func_name,
        pattern=pattern_for(core.layout, ops, core.form).name,
        blocks=tuple(n.name for n in nests),
        dtype=core.dtype,
        m=core.m,
        n=core.n,
        k=core.k,
        x=core.x,
        w=core.w,
        bias=bias,
        out=current,
        intermediates=tuple(intermediates),
        stmts=tuple(n.stmt for n in nests),
        relu_nan=relu_nan,
        batch=core.batch,
    )
    return match, rejections, members


def next_epilogue(consumers, members, current, core, ops, bias, intermediates, index, extents):
    """(position, epilogue) that extends the chain through ``current``, or Refused why not.

    The epilogue is the next statement after the chain that uses ``current``.  It either reads
    it into a new buffer (then ``current`` must be a local buffer nobody else uses), or
    updates it in place (``Y[i, j] = Y[i, j] + b[j]``; later readers see the final value
    either way).
    """
    last = index.nests[members[-1]]
    # Step 1. The next user, past statements that leave the chain's buffers alone: the call
    # that replaces the chain runs at the place of its last block, after them.
    written = {*intermediates, current}
    read = {core.x, core.w, bias} - {None}
    position = next_user(last, current, consumers, written, read, index)
    target = index.nests[position]
    in_place = target.block.body.buffer.same_as(current)
    if not in_place and (len(consumers) != 1 or consumers[0] < 0):
        users = index.other_users(current, *members)
        raise Refused(
            f"{current.name} is read by {len(users)} places ({', '.join(users)}), so it "
            f"stays materialized and the chain ends at block {last.name}"
        )
    if not in_place and (current in index.params or current not in index.local):
        raise Refused(
            f"{current.name} is a function parameter, so it stays materialized and the chain "
            f"ends at block {last.name}"
        )
    # Step 2. The consumer must be a family epilogue over ``current``.
    epilogue = analyze_epilogue(target, core, current, extents, index)
    new_ops = ops + epilogue.ops
    if pattern_for(core.layout, new_ops, core.form) is None:
        raise Refused(
            f"{' then '.join(new_ops)} after {core.layout} is not a pattern of the family "
            "(bias before relu, each at most once)"
        )
    # Step 3. Nothing the chain writes may be something it reads.
    outputs = {*intermediates, current, epilogue.out}
    inputs = {core.x, core.w, bias, epilogue.bias} - {None}
    if (epilogue.out.same_as(current) and not in_place) or outputs & inputs:
        raise Refused(
            f"block {target.name} writes {epilogue.out.name}, which the chain also reads (aliasing)"
        )
    if epilogue.out in index.views or epilogue.bias in index.views:
        raise Refused(f"block {target.name} uses a buffer view that may alias another buffer")
    return position, epilogue


def next_user(last: Nest, current, consumers, written, read, index: FunctionIndex) -> int:
    """Position of the first of ``consumers`` after ``last`` in its statement list.

    Every statement in between must use none of the buffers the chain writes (``written``)
    and write none it reads (``read``): the chain's blocks move past it.
    """
    for position, stmt in index.siblings_after(last):
        if position in consumers:
            return position
        if position is None:  # not a leaf nest: anything it uses may be written
            touched = buffers_used(stmt) & (written | read)
            what = STATEMENT_WORDS.get(type(stmt), type(stmt).__name__)
        else:
            between = index.nests[position]
            touched = index.uses.get(position, set()) & written
            if between.block.body.buffer in read:
                touched.add(between.block.body.buffer)
            what = f"block {between.name}"
        if touched:
            names = ", ".join(sorted(v.name for v in touched))
            raise Refused(
                f"{what} between block {last.name} and the next use of {current.name} "
                f"touches {names}, which the chain reads or writes, so the chain ends at "
                f"block {last.name}"
            )
    targets = [index.nests[c].name for c in consumers if c >= 0]
    named = f"block {targets[0]}" if targets else f"the next use of {current.name}"
    raise Refused(
        f"{named} does not follow block {last.name} in the same statement list, so the chain "
        "ends before it"
    )


def separate_init(nest: Nest, index: FunctionIndex, covered) -> tuple[int, ...]:
    """The position of the block that initialises a reduction with no init, if any (0 or 1)."""
    if nest.block.init is not None:
        return ()
    before = index.sibling_before(nest)
    if before is None or before in covered:
        return ()
    if not index.nests[before].block.body.buffer.same_as(nest.block.body.buffer):
        return ()
    return (before,)
