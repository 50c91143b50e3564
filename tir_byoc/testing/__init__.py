"""Testing helpers for tir_byoc and for people who register their own intrinsics.

Modules
-------
programs
    Programs of the pattern family described as data (:class:`ChainSpec`,
    :class:`ProgramSpec`) and built into real S-TIR PrimFuncs by :func:`build_program`,
    together with what the matcher should report for them; near-miss mutants
    (:data:`MUTATIONS`).  It re-exports the public names of the modules that do the work,
    which import one another in this order: ``spellings`` (the IR each spec field and knob
    value names; the epilogue ops' spellings read from their records in
    :mod:`tir_byoc.epilogues`), ``knobs`` (the :class:`Knobs` a near miss turns),
    ``conditions`` and ``mutations`` (where each near miss applies, and its knob values),
    ``batches`` and ``distractors`` (a chain's batch dims, the blocks around it), ``specs``,
    ``labels`` (what the matcher should report for a chain, read from its spec), and
    ``blocks`` and ``builder`` (the one builder).  Needs nothing beyond tir_byoc's own
    dependencies.
strategies
    hypothesis strategies over those programs (``programs()``, ``mutants()``; scheduled and
    lowered ones with the steps of ``schedule_steps``).  Needs the ``hypothesis`` package
    (``pip install tir-byoc[dev]``).
equivalence
    Run two versions of a function on the same random inputs and compare every buffer, with
    tolerances per dtype (:func:`assert_equivalent`); :func:`run` one function.  The one
    implementation of compiling, running and comparing that the tests use.
inputs
    Random inputs: :func:`random_array` (shape, dtype, rng) and :func:`random_arguments`
    (one array per parameter of a PrimFunc, symbolic extents from ``sizes``).
script
    :func:`to_tvmscript`: a PrimFunc as TVMScript that parses back, also with symbolic shapes.
loop_dtypes
    :func:`retype_loops`: a function of plain loops with some loops over another integer
    dtype (``uint32``, ``int8``, ...), as TVMScript allows.
models
    The models the tests and the benchmarks build (transformers configs and torch.nn layers,
    random weights, nothing downloaded) with their inputs: the real-model tests' small
    transformers, ResNet-50, MobileNetV2 and a VGG-like network.  Needs torch and
    transformers when a model is built, not when imported.
"""
