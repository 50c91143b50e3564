"""Unrelated blocks next to a chain, as data: :class:`DistractorSpec` and the kinds it names.

The blocks themselves are built by :func:`tir_byoc.testing.blocks.distractor`;
:func:`distractor_problem` is what a :class:`~.specs.ProgramSpec` checks of each.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Unrelated blocks placed next to a chain, touching its buffers.
DISTRACTORS = (
    "abs_x",  # E[i, k] = |X[i, k]| (X % 7 for integers): reads the chain's input
    "transpose_w_in",  # the weight is a local buffer, transposed from a parameter first
    "bias_in",  # the bias is a local buffer, computed elementwise from a parameter first
    "row_sum_out",  # R[i] = sum_j Z[i, j]: a row reduction of the chain's output
    "transpose_out",  # Zt[j, i] = Z[i, j]
    "inplace_out",  # Z[i, j] = |Z[i, j]| after the chain (Z % 7 for integers)
    "unrelated",  # a block on buffers of its own
    "overwrite_x",  # X[i, k] = |X[i, k]| in place (X % 7 for integers)
)

#: Distractors that must come before their chain (they produce one of its inputs).
_PRODUCERS = ("transpose_w_in", "bias_in")
#: Distractors that must come after their chain (they read its output).
_CONSUMERS = ("row_sum_out", "transpose_out", "inplace_out")
#: Distractors that may sit between a reduction and its epilogue.  The call that replaces a
#: chain runs where its last block was, so a block between that leaves the chain's buffers
#: alone stays there (TOPI's dense copies its bias right there); one that writes a buffer
#: the chain reads cuts it after the reduction.
INSIDE_KINDS = ("abs_x", "bias_in", "unrelated", "overwrite_x")
#: Inside kinds that cut the chain.
CUTTING_KINDS = ("overwrite_x",)


@dataclass(frozen=True)
class DistractorSpec:
    """An unrelated block: ``kind`` from :data:`DISTRACTORS`, next to chain ``chain``.

    It goes before the chain (``before``; producers always do), after it, or ``inside`` it:
    between the reduction and the first epilogue block, which cuts the chain there (the
    matcher only joins blocks that follow one another).
    """

    kind: str
    chain: int = 0
    before: bool = False
    inside: bool = False

    @property
    def placement(self) -> str:
        if self.inside:
            return "inside"
        if self.kind in _PRODUCERS or (self.before and self.kind not in _CONSUMERS):
            return "before"
        return "after"


def distractor_problem(spec, d: DistractorSpec) -> str | None:
    """What is wrong with distractor ``d`` of the :class:`~.specs.ProgramSpec` ``spec``, or
    None."""
    if d.kind not in DISTRACTORS or not 0 <= d.chain < len(spec.chains):
        return f"distractor {d} names an unknown kind or chain"
    chain = spec.chains[d.chain]
    if d.kind == "bias_in" and chain.bias is None:
        return f"distractor {d}: chain {d.chain} has no bias"
    if d.inside and (d.kind not in INSIDE_KINDS or not chain.epilogue_blocks):
        return (
            f"distractor {d}: expected a kind in {INSIDE_KINDS} and a chain with an "
            "epilogue block to sit inside"
        )
    if d.inside and d.kind == "bias_in" and chain.init == "bias":
        return f"distractor {d}: the init of chain {d.chain} reads the bias before it is made"
    return None


__all__ = [
    "CUTTING_KINDS",
    "DISTRACTORS",
    "INSIDE_KINDS",
    "DistractorSpec",
    "distractor_problem",
]
