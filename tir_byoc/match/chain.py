"""The chain builder: grow a chain from a reduction through the epilogue blocks that follow it.

Entry point: :func:`extend_chain`, which returns the :class:`~.records.Match` and the
refusals of epilogue-like blocks that could not join.  It takes the elementwise blocks after
the reduction one at a time (:func:`next_user`: past statements that leave the chain's
buffers alone) and composes each into one expression of the product ``Y[..., i, j]``, the
reads of earlier blocks' buffers replaced by what those blocks computed: an op that Relax
spells over several blocks (gelu: five, reading its input twice) is one expression, and
:mod:`.epilogue` reads it: one parser reads every prefix, and since each prefix's expression
holds the previous one's node, from where the previous one ended.  Every block whose
expression is a whole epilogue is a place the chain may end (a **cut**); the chain ends at
the last cut whose other buffers nothing outside it reads, and the shorter cuts are kept for
a backend that takes only a prefix.  Called by :mod:`.scan`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import ir, tirx

from ..decline import GEMM_CHAIN, Decline, Declined
from ..epilogues import OPS, epilogue_error
from ..patterns import pattern_for
from .epilogue import EpilogueParser, read_elementwise
from .explain import STATEMENT_WORDS
from .records import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO, Match, Step
from .reduction import Reduction
from .stir import FunctionIndex, Nest, buffers_used, is_spatial
from .traversal import elements, mutate

#: The most elementwise blocks one chain composes (gelu_tanh alone is nine).
MAX_EPILOGUE_BLOCKS = 24


@dataclass(frozen=True)
class Cut:
    """A place the chain may end: after ``count`` members, the output and the ops so far."""

    count: int
    out: ir.Var
    steps: tuple[Step, ...]


def extend_chain(positions, core: Reduction, index: FunctionIndex, extents, func_name):
    """Grow a chain from a reduction (and its init block, if separate) through epilogue blocks.

    Returns the Match, the Declines of epilogue-like blocks that could not join it, and the
    positions of the nests it covers.
    """
    members = list(positions)
    base = (Step("bias", OPS["bias"].code, (), core.bias),) if core.bias is not None else ()
    cuts = [Cut(len(members), core.out, base)]
    written = [core.out]  # the buffers the chain writes, in order
    written_handles = {core.out.__chandle__()}
    written_at = [0]  # for each, how many members come before the first that writes it
    owners = set(index.owners_of(core.out))  # the nests (and -1, other code) using them
    read = {core.x, core.w} | ({core.bias} if core.bias is not None else set())
    values: dict = {}  # buffer's handle -> its value, an expression of the product core.out[axes]
    axes, parser = None, None
    parse_refusals = []  # (position, Declined) of each block whose value is no epilogue
    compose_refusal = None
    # Step 1. Compose the elementwise blocks that follow, noting each cut.
    while len(members) - len(positions) < MAX_EPILOGUE_BLOCKS:
        live = set(written)
        users = owners.difference(members)
        if not users:
            break
        try:
            position = next_user(index.nests[members[-1]], written[-1], users, live, read, index)
            block = read_elementwise(index.nests[position], core, extents)
            axes = axes or block.axes
            value, loads = compose(block, axes, values, live)
            if block.out in read or block.out in loads:
                raise Declined(
                    f"block {block.nest.name} writes {block.out.name}, which the chain also "
                    "reads (aliasing)"
                )
        except Declined as refused:
            spatial = [u for u in users if u >= 0 and is_spatial(index.nests[u].block)]
            compose_refusal = (refused, sorted(spatial))
            break
        members.append(position)
        read |= loads
        values[block.out.__chandle__()] = value
        if block.out.__chandle__() not in written_handles:
            written.append(block.out)
            written_handles.add(block.out.__chandle__())
            written_at.append(len(members) - 1)
            owners.update(index.owners_of(block.out))
        if parser is None:  # one parser reads every prefix: it keeps what it has read
            parser = EpilogueParser(core.out, axes, core, extents, index.params)
        try:
            steps = base + parser.parse(value)
            ops = tuple(s.op for s in steps)
            if pattern_for(core.layout, ops, core.form) is None:
                raise Declined(epilogue_error(ops), op=ops[-1])
        except Declined as refused:
            parse_refusals.append((position, refused))
            continue
        cuts.append(Cut(len(members), block.out, steps))
    # Step 2. The cuts whose inner buffers nothing else reads, longest first.
    valid, cut_refused = [], None  # cut_refused: (the cut, why), for the longest refused cut
    chain_written = list(zip(written, written_at))
    for cut in reversed(cuts):
        reason = cut_refusal(cut, members, chain_written, index)
        if reason is None:
            valid.append(cut)
        elif not valid and cut_refused is None:
            cut_refused = (cut, Declined(reason))
    best = valid[0]
    shorter = tuple(
        make_match(cut, members, chain_written, core, index, func_name) for cut in valid[1:]
    )
    match = make_match(best, members, chain_written, core, index, func_name, shorter)
    # Step 3. Why the blocks after the chain stay TVM code: the blocks composed past its end
    # (a longer cut could not end the chain, or what they compute is not an epilogue), or the
    # next user, which could not be composed.
    left_out = members[best.count :]
    refused, blocks = None, ()
    if left_out:
        refused = _telling(parse_refusals, cut_refused, members, best.count)
        blocks = left_out
    elif compose_refusal is not None:
        refused, blocks = compose_refusal
    rejections = []
    names = tuple(index.nests[p].name for p in blocks)
    if refused is not None and names:
        ops = tuple(s.op for s in best.steps)
        attempted = pattern_for(core.layout, (*ops, refused.op), core.form) if refused.op else None
        nearest = (attempted or pattern_for(core.layout, ops, core.form)).name
        rejections.append(Decline(func_name, names, GEMM_CHAIN, refused.reason, nearest))
    return match, rejections, members[: best.count]


def _telling(parse_refusals, cut_refused, members, end) -> Declined | None:
    """The refusal that says best why the members after ``end`` are no part of the chain.

    The furthest of the near misses (a refusal naming the op it came close to: a gelu spread
    over five blocks is only judged at the fifth) and the longest cut that parsed but could not
    end the chain: whichever reaches further, since the chain went that far before it failed.
    A near miss at a cut's own end is impossible (a cut is a parsed block). Without either, the
    first refusal: what a later block adds around it is refused first.
    """
    after = {position: i for i, position in enumerate(members) if i >= end}
    mine = [(after[p], r) for p, r in parse_refusals if p in after]
    near = [(i, r) for i, r in mine if r.op is not None]
    if near and (cut_refused is None or near[-1][0] >= cut_refused[0].count):
        return near[-1][1]
    if cut_refused is not None:
        return cut_refused[1]
    return mine[0][1] if mine else None


def compose(block, axes, values, live):
    """``block``'s value over ``axes``, reads of the chain's buffers replaced by their values.

    Returns the expression and the buffers it reads that are not the chain's own.
    """
    # Variables by handle: the same variable read twice comes back as two Python objects.
    rename = {var.__chandle__(): axis for var, axis in zip(block.axes, axes)}
    chain = {buffer.__chandle__() for buffer in live}
    others = set()
    # A Declined raised inside the FFI mutator would come back as a RuntimeError: the first
    # misplaced read is noted, and refused after it.
    misread = []

    def on_var(var, _mutator):
        return rename.get(var.__chandle__(), var)

    def on_load(load, mutator):
        handle = load.source.__chandle__()
        if handle in values:
            # A read of a buffer the chain computed, at the block's own axes, is replaced
            # whole: renaming its indices first would make a node only to drop it.
            indices = elements(load.indices)
            if len(indices) == len(axes) and all(
                isinstance(i, tirx.Var) and rename.get(i.__chandle__(), i).same_as(a)
                for i, a in zip(indices, axes)
            ):
                return values[handle]
        load = mutator.default_mutate(load)
        buffer = load.source
        handle = buffer.__chandle__()
        if handle not in chain:
            others.add(buffer)
            return load
        indices = elements(load.indices)
        if len(indices) != len(axes) or not all(
            isinstance(i, tirx.Var) and i.same_as(a) for i, a in zip(indices, axes)
        ):
            misread.append(buffer)
            return load
        return values.get(handle, load)

    value = mutate(block.value, [(ir.TensorLoad, on_load), (tirx.Var, on_var)])
    if misread:
        raise Declined(
            f"block {block.nest.name} reads {misread[0].name} at other indices than its own "
            "axes, so it is not elementwise over the chain"
        )
    return value, others


def cut_refusal(cut: Cut, members, written, index: FunctionIndex) -> str | None:
    """Why the chain cannot end at ``cut`` (an inner buffer read elsewhere), or None.

    ``written`` holds each buffer the chain writes with the number of members before the
    first that writes it.
    """
    inside = members[: cut.count]
    last = index.nests[inside[-1]]
    for buffer in _written_inside(cut, written):
        if buffer in index.params or buffer not in index.local:
            return (
                f"{buffer.name} is a function parameter, so it stays materialized and the chain "
                f"cannot end at block {last.name}"
            )
        users = index.other_users(buffer, *inside)
        if users:
            return (
                f"{buffer.name} is also read by {', '.join(users)}, so it stays materialized "
                f"and the chain cannot end at block {last.name}"
            )
    if cut.out in index.views or any(s.tensor in index.views for s in cut.steps):
        return f"block {last.name} uses a buffer view that may alias another buffer"
    return None


def _written_inside(cut: Cut, written):
    """The buffers the members before ``cut`` write, but for its output."""
    return [b for b, at in written if at < cut.count and not b.same_as(cut.out)]


def make_match(cut: Cut, members, written, core: Reduction, index, func_name, shorter=()) -> Match:
    inside = members[: cut.count]
    nests = [index.nests[p] for p in inside]
    intermediates = tuple(_written_inside(cut, written))
    relu = [s for s in cut.steps if s.op == "relu"]
    relu_nan = None
    if relu:
        relu_nan = RELU_KEEPS_NAN if relu[0].code != OPS["relu"].code else RELU_NAN_TO_ZERO
        if not core.dtype.out.startswith(("float", "bfloat")):
            relu_nan = RELU_NAN_TO_ZERO  # integers have no NaN: every spelling agrees
    bias = next((s.tensor for s in cut.steps if s.op == "bias"), None)
    return Match(
        func=func_name,
        pattern=pattern_for(core.layout, tuple(s.op for s in cut.steps), core.form).name,
        blocks=tuple(n.name for n in nests),
        dtype=core.dtype,
        m=core.m,
        n=core.n,
        k=core.k,
        x=core.x,
        w=core.w,
        bias=bias,
        out=cut.out,
        intermediates=intermediates,
        stmts=tuple(n.stmt for n in nests),
        relu_nan=relu_nan,
        batch=core.batch,
        epilogue=cut.steps,
        shorter=shorter,
    )


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
            raise Declined(
                f"{what} between block {last.name} and the next use of {current.name} "
                f"touches {names}, which the chain reads or writes, so the chain ends at "
                f"block {last.name}"
            )
    targets = [index.nests[c].name for c in consumers if c >= 0]
    named = f"block {targets[0]}" if targets else f"the next use of {current.name}"
    raise Declined(
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
