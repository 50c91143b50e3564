"""Programs of the pattern family as data, built into real S-TIR PrimFuncs.

Entry points: :class:`ChainSpec` and :class:`ProgramSpec` describe a function (one or more
dense / matmul chains with their spellings, dtypes and extents, plus unrelated blocks next to
them); :func:`build_program` builds it into a :class:`Program`, a ``tvm.tirx.PrimFunc`` with
what the matcher should report for each chain; :func:`mutate` turns a positive into a near
miss that changes one thing the meaning depends on (:data:`MUTATIONS`).

This module gathers the public names of the modules that do the work:

- :mod:`.specs`: the specs (:class:`ChainSpec`, its :class:`Knobs`, :class:`DistractorSpec`,
  :class:`ProgramSpec`);
- :mod:`.spellings`: the tables of IR spellings the knobs and spellings name;
- :mod:`.mutations`: the near misses, each a description, the knobs it turns, where it
  applies and which extents it makes equal;
- :mod:`.builder` (with :mod:`.blocks`): the one builder, which reads spec fields only, and
  what a build gives (:class:`Program`, :class:`ExpectedChain`).
"""

from .builder import ExpectedChain, Program, build_program
from .mutations import MUTATIONS, Mutation, applicable_mutations, mutate
from .specs import (
    CUTTING_KINDS,
    DISTRACTORS,
    INITS,
    INSIDE_KINDS,
    SIGNATURES,
    ChainSpec,
    DistractorSpec,
    Knobs,
    ProgramSpec,
)
from .spellings import RELU_SPELLINGS

__all__ = [
    "CUTTING_KINDS",
    "DISTRACTORS",
    "INITS",
    "INSIDE_KINDS",
    "MUTATIONS",
    "RELU_SPELLINGS",
    "SIGNATURES",
    "ChainSpec",
    "DistractorSpec",
    "ExpectedChain",
    "Knobs",
    "Mutation",
    "Program",
    "ProgramSpec",
    "applicable_mutations",
    "build_program",
    "mutate",
]
