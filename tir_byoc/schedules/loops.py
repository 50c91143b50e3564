"""Loop transformations the default CPU rules share: a parallel outer loop, a vector inner one.

Entry points: :func:`schedule_blocks` (each block by its kind, the reasons it leaves blocks on
one thread), built on :func:`parallel_vectorize` (a block of spatial loops only) and
:func:`parallel_rows` (a reduction block: its leading spatial loops in parallel), and
:func:`vector_lanes`.
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


def _leading_spatial(dom_kind: str) -> int:
    return len(dom_kind) - len(dom_kind.lstrip("S"))


def schedule_blocks(sch: s_tir.Schedule, blocks, target: Target) -> dict[str, str]:
    """Schedule each of ``blocks`` (dlight ``SBlockInfo``): a spatial block with
    :func:`parallel_vectorize`, a reduction block with :func:`parallel_rows`.

    Returns
    -------
    dict
        The blocks left on one thread, by name, with the reason.
    """
    notes = {}
    for block in blocks:
        if block.is_injective():
            note = parallel_vectorize(sch, block.block_rv, target)
        else:
            note = parallel_rows(sch, block.block_rv, _leading_spatial(block.dom_kind()))
        if note is not None:
            notes[block.name] = note
    return notes
