"""Plain loop nests (TIR without SBlocks) read as the SBlocks they were lowered from.

Entry point: :func:`lift_nest`.  TVM's own lowering (``LowerInitBlock``,
``ConvertBlocksToOpaque``, ``LowerOpaqueBlock``) and hand-written ``@T.prim_func`` code give
loop nests with no SBlock around the store::

    for i, j, k in T.grid(M, N, K):
        if k == 0:
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[j, k]

:func:`lift_nest` returns the SBlock such a nest denotes, so that the matcher reads it with
the same analysis as S-TIR: one iterator per loop, bound to the loop's variable, spatial when
the loop variable indexes the store and a reduction otherwise, and the ``if k == 0`` store as
the block's init.  The lifted block is only read, never inserted: the matcher keeps the
original loop nest as the statement a rewrite replaces.

Only loops over int32 or int64 (:data:`LOOP_DTYPES`) are lifted; a nest of the same form
with a loop over another integer type (TVMScript takes ``range(T.uint32(128))``) is an
:class:`Unread` nest, which says why.
"""

from __future__ import annotations

from typing import NamedTuple

from tvm import ir, s_tir, tirx

_DATA_PAR = 0
_COMM_REDUCE = 2

#: The dtypes of the loop variables (and block iterators) the matcher reads: TE and TVM's
#: lowering give int32, Relax int64.  TVM's IterVar takes no unsigned type, and nothing
#: proves that a narrow or unsigned loop's arithmetic (its wrap-around) is the kernel's: when
#: unsure, a nest is not rewritten.
LOOP_DTYPES = ("int32", "int64")


def loop_dtype_refusal(var, what: str = "loop") -> str | None:
    """Why a loop (or an iterator: ``what``) over ``var`` is not read, or None."""
    dtype = str(var.ty.dtype)
    if dtype in LOOP_DTYPES:
        return None
    return f"{what} {var.name} runs over {dtype}; the matcher reads int32 and int64 {what}s only"


class Unread(NamedTuple):
    """A loop nest of the form :func:`lift_nest` reads, but with a loop it does not read."""

    name: str  # the name its block would have had
    loops: tuple
    update: tirx.BufferStore
    reduces: bool  # some loop variable does not index the store: a reduction
    reason: str


def perfect_loops(stmt):
    """(loops, innermost body) of the perfectly nested loops at ``stmt``."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
        if isinstance(stmt, tirx.SeqStmt) and len(stmt.seq) == 1:
            stmt = stmt.seq[0]
    return tuple(loops), stmt


def _is_zero_test(cond, var) -> bool:
    """True if ``cond`` is ``var == 0`` (either side)."""
    if not isinstance(cond, tirx.EQ):
        return False
    for a, b in ((cond.a, cond.b), (cond.b, cond.a)):
        if isinstance(a, tirx.Var) and a.same_as(var) and isinstance(b, tirx.IntImm):
            return b.value == 0
    return False


def _split_init(body, loops):
    """(loops, init store or None, update store) of a nest body, or None if it is no such form.

    The forms: a store; ``if k == 0: init`` then the update; the init then the loops over
    k around the update (``decompose_reduction`` inside the spatial loops, then lowered).
    """
    if isinstance(body, tirx.BufferStore):
        return loops, None, body
    if (
        isinstance(body, tirx.SeqStmt)
        and len(body.seq) == 2
        and isinstance(body.seq[0], tirx.BufferStore)
        and isinstance(body.seq[1], tirx.For)
    ):
        inner, update = perfect_loops(body.seq[1])
        if isinstance(update, tirx.BufferStore) and not any(
            _indexes(update, loop.loop_var) for loop in inner
        ):
            return loops + inner, body.seq[0], update
        return None
    if not (isinstance(body, tirx.SeqStmt) and len(body.seq) == 2):
        return None
    guard, update = body.seq
    if not (
        isinstance(guard, tirx.IfThenElse)
        and guard.else_case is None
        and isinstance(guard.then_case, tirx.BufferStore)
        and isinstance(update, tirx.BufferStore)
    ):
        return None
    reduce_vars = [loop.loop_var for loop in loops if not _indexes(update, loop.loop_var)]
    if len(reduce_vars) != 1 or not _is_zero_test(guard.condition, reduce_vars[0]):
        return None
    return loops, guard.then_case, update


def _indexes(store, var) -> bool:
    return any(isinstance(e, tirx.Var) and e.same_as(var) for e in store.indices)


def lift_nest(stmt, taken: set[str]):
    """The SBlock a plain loop nest denotes: ``(loops, SBlockRealize)``, an Unread, or None.

    Parameters
    ----------
    stmt : tvm.tirx.Stmt
        A statement of a PrimFunc without SBlocks.
    taken : set of str
        Names already given; the lifted block is named after the buffer it writes (``Y``,
        then ``Y_1``, ...), which is what reports call it, and its name is added.

    Returns
    -------
    tuple, Unread or None
        The loops and a realize of the lifted block, whose iterator variables are the loop
        variables themselves; an :class:`Unread` (named as the block would be) when a loop
        runs over another dtype than int32 or int64; None when ``stmt`` is not a loop nest
        around one store, optionally with an init (``if k == 0: init`` before the store, or
        the init before the loops over k).
    """
    loops, body = perfect_loops(stmt)
    if not loops:
        return None
    split = _split_init(body, loops)
    if split is None:
        return None
    loops, init, update = split
    name, suffix = update.buffer.name, 0
    while name in taken:
        suffix += 1
        name = f"{update.buffer.name}_{suffix}"
    taken.add(name)
    reasons = (loop_dtype_refusal(loop.loop_var) for loop in loops)
    reason = next((r for r in reasons if r is not None), None)
    if reason is not None:
        reduces = not all(_indexes(update, loop.loop_var) for loop in loops)
        return Unread(name, loops, update, reduces, reason)
    iter_vars = [
        tirx.IterVar(
            ir.Range.from_min_extent(loop.min, loop.extent),
            loop.loop_var,
            _DATA_PAR if _indexes(update, loop.loop_var) else _COMM_REDUCE,
        )
        for loop in loops
    ]
    block = s_tir.SBlock(iter_vars, [], [], name, update, init)
    realize = s_tir.SBlockRealize([loop.loop_var for loop in loops], True, block)
    return loops, realize


__all__ = ["LOOP_DTYPES", "Unread", "lift_nest", "loop_dtype_refusal", "perfect_loops"]
