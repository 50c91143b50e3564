"""What marks an offloaded call in a rewritten function, and the epilogue it passes.

Shared by the rewriter (:mod:`tir_byoc.rewrite`, which builds the calls) and what reads them
back: weight packing (:mod:`tir_byoc.packing`, which packs a weight for one call's epilogue),
the default schedules, the toolchain (which loads the libraries a module calls) and the model.
Here are the block annotations (:data:`INTRINSIC_ATTR`, :data:`BLOCKS_ATTR`), the readers
:func:`intrinsic_calls` and :func:`calls_in_parallel_loops`, and :func:`epilogue_arguments`,
the epilogue as the gemm entry point takes it.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx

from .epilogues import MAX_CONSTANTS, MAX_OPS
from .match import Match

#: Block annotation naming the intrinsic an offloaded block calls.
INTRINSIC_ATTR = "tir_byoc.intrinsic"
#: Block annotation listing the blocks it replaced.
BLOCKS_ATTR = "tir_byoc.blocks"


def intrinsic_calls(func: tirx.PrimFunc) -> dict[str, int]:
    """How many offloaded blocks of ``func`` call each intrinsic, by intrinsic name."""
    counts: dict[str, int] = {}

    def on_block(block):
        if block.annotations and INTRINSIC_ATTR in block.annotations:
            name = str(block.annotations[INTRINSIC_ATTR])
            counts[name] = counts.get(name, 0) + 1

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return counts


def calls_in_parallel_loops(func: tirx.PrimFunc) -> list[str]:
    """The offloaded blocks of ``func`` that sit inside a parallel loop, by block name.

    An intrinsic shares its own work among the threads of TVM's pool (the MKL backend does, as
    TVM's parallel loops do), so it must be called where TVM's code could start a parallel loop:
    a call from inside one would be a parallel launch within a launch, which TVM's pool refuses
    or, on the calling thread, corrupts.  The offload puts each call at the function's root and
    no schedule of tir_byoc moves it; this finds a schedule that did.
    """
    found = []
    parallel = [0]

    def on_loop(loop, visitor):
        inside = loop.kind == tirx.ForKind.PARALLEL
        parallel[0] += inside
        visitor.visit(loop.body)
        parallel[0] -= inside

    def on_block(block, visitor):
        if parallel[0] and block.annotations and INTRINSIC_ATTR in block.annotations:
            found.append(block.name_hint)
        visitor.visit(block.body)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_loop), (s_tir.SBlock, on_block)])
    return found


class RewriteError(RuntimeError):
    """A match no longer fits the function it came from (a broken invariant)."""


def epilogue_arguments(match: Match) -> tuple[int, list]:
    """The epilogue as the gemm entry point takes it: the op codes, and the constants (floats,
    or the read of a scalar parameter) padded to :data:`MAX_CONSTANTS`."""
    codes = 0
    constants = []
    for position, step in enumerate(match.epilogue):
        codes |= step.code << (8 * position)
        constants += step.constants
    if len(match.epilogue) > MAX_OPS or len(constants) > MAX_CONSTANTS:
        raise RewriteError(f"{match.func}: the epilogue of {match.pattern} does not fit one call")
    return codes, constants + [0.0] * (MAX_CONSTANTS - len(constants))


__all__ = [
    "BLOCKS_ATTR",
    "INTRINSIC_ATTR",
    "RewriteError",
    "calls_in_parallel_loops",
    "epilogue_arguments",
    "intrinsic_calls",
]
