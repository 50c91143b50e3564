"""Programs of the pattern family as data, built into real S-TIR PrimFuncs.

Entry points: :class:`ChainSpec` and :class:`ProgramSpec` describe a function (one or more
dense / matmul chains with their spellings, dtypes and extents, plus unrelated blocks next to
them); :func:`build_program` builds it into a :class:`Program`, a ``tvm.tirx.PrimFunc`` with
what the matcher should report for each chain; :func:`mutate` turns a positive into a near
miss that changes one thing the meaning depends on (:data:`MUTATIONS`).

This module gathers the public names of the modules that do the work:

- :mod:`.specs`: the specs (:class:`ChainSpec`, :class:`ProgramSpec`), with :mod:`.knobs`
  (the :class:`Knobs` a near miss turns), :mod:`.distractors` (:class:`DistractorSpec`) and
  :mod:`.batches` (the batch dims, and :func:`batch_label`, the batch form they give a chain);
- :mod:`.labels`: what the matcher should call a chain (:func:`expected_pattern`, the
  epilogue's ops with their constants, and where a near miss stops), read from spec fields;
- :mod:`.spellings`: the tables of IR spellings the knobs and spellings name (each relu, each
  other epilogue op in one block or several);
- :mod:`.mutations`: the near misses, each a description, the knobs it turns, where it
  applies, which extents it makes equal and, for some, the words of the refusal;
- :mod:`.builder` (with :mod:`.blocks`): the one builder, which reads spec fields only, and
  what a build gives (:class:`Program`, :class:`ExpectedChain`).
"""

from .batches import BATCH_AXES, BATCH_MODES, MAX_BATCH_DIMS, BatchLabel, batch_label
from .builder import Program, build_program
from .distractors import CUTTING_KINDS, DISTRACTORS, INSIDE_KINDS, DistractorSpec
from .knobs import Knobs
from .labels import ExpectedChain, expected_pattern
from .mutations import MUTATIONS, Mutation, applicable_mutations, mutate
from .specs import INITS, SIGNATURES, ChainSpec, ProgramSpec
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
