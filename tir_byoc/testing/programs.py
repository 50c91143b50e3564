"""Programs of the pattern family as data, built into real S-TIR PrimFuncs.

Entry points: :class:`ChainSpec` and :class:`ProgramSpec` describe a function (one or more
dense / matmul chains with their spellings, dtypes and extents, plus unrelated blocks next to
them); :func:`build_program` builds it into a :class:`Program`, a ``tvm.tirx.PrimFunc`` with
what the matcher should report for each chain; :func:`mutate` turns a positive into a near
miss that changes one thing the meaning depends on (:data:`MUTATIONS`).

This module gathers the public names of the modules that do the work:

- :mod:`.specs`: the specs (:class:`ChainSpec`, its :class:`Knobs`, :class:`DistractorSpec`,
  :class:`ProgramSpec`);
- :mod:`.labels`: what the matcher should call a chain (:func:`expected_pattern`,
  :func:`batch_label`, the batch form a chain's batch dims give it, the epilogue's ops with
  their constants, and where a near miss stops), read from spec fields;
- :mod:`.spellings`: the tables of IR spellings the knobs and spellings name (each relu, each
  other epilogue op in one block or several);
- :mod:`.mutations`: the near misses, each a description, the knobs it turns, where it
  applies, which extents it makes equal and, for some, the words of the refusal;
- :mod:`.builder` (with :mod:`.blocks`): the one builder, which reads spec fields only, and
  what a build gives (:class:`Program`, :class:`ExpectedChain`).
"""

from .builder import ExpectedChain, Program, build_program
from .labels import BatchLabel, batch_label, expected_pattern
from .mutations import MUTATIONS, Mutation, applicable_mutations, mutate
from .specs import (
    BATCH_AXES,
    BATCH_MODES,
    CUTTING_KINDS,
    DISTRACTORS,
    INITS,
    INSIDE_KINDS,
    MAX_BATCH_DIMS,
    SIGNATURES,
    ChainSpec,
    DistractorSpec,
    Knobs,
    ProgramSpec,
)
from .spellings import RELU_SPELLINGS

__all__ = [
    "BATCH_AXES",
    "BATCH_MODES",
    "CUTTING_KINDS",
    "DISTRACTORS",
    "INITS",
    "INSIDE_KINDS",
    "MAX_BATCH_DIMS",
    "MUTATIONS",
    "RELU_SPELLINGS",
    "SIGNATURES",
    "BatchLabel",
    "ChainSpec",
    "DistractorSpec",
    "ExpectedChain",
    "Knobs",
    "Mutation",
    "Program",
    "ProgramSpec",
    "applicable_mutations",
    "batch_label",
    "build_program",
    "expected_pattern",
    "mutate",
]
