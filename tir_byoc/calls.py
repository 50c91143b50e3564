"""What marks an offloaded call in a rewritten function, and the epilogue it passes.

Shared by the rewriter (:mod:`tir_byoc.rewrite`, which builds the calls) and weight packing
(:mod:`tir_byoc.packing`, which finds them again and packs a weight for one call's epilogue):
the block annotations (:data:`INTRINSIC_ATTR`, :data:`BLOCKS_ATTR`) and
:func:`epilogue_arguments`, the epilogue as the gemm entry point takes it.
"""

from __future__ import annotations

from .epilogues import MAX_CONSTANTS, MAX_OPS
from .match import Match

#: Block annotation naming the intrinsic an offloaded block calls.
INTRINSIC_ATTR = "tir_byoc.intrinsic"
#: Block annotation listing the blocks it replaced.
BLOCKS_ATTR = "tir_byoc.blocks"


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


__all__ = ["BLOCKS_ATTR", "INTRINSIC_ATTR", "RewriteError", "epilogue_arguments"]
