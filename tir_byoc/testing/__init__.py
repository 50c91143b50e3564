"""Testing helpers for tir_byoc and for people who register their own intrinsics.

Modules
-------
programs
    Programs of the pattern family described as data (:class:`ChainSpec`,
    :class:`ProgramSpec`) and built into real S-TIR PrimFuncs by :func:`build_program`,
    together with what the matcher should report for them; near-miss mutants
    (:data:`MUTATIONS`).  It re-exports the public names of ``specs`` (the specs and the
    :class:`Knobs` a near miss turns), ``labels`` (the pattern the matcher should report for
    a chain, batch form included, read from its spec), ``mutations`` (each near miss as a set
    of knob values), ``builder`` and ``blocks`` (the one builder) and ``spellings`` (the IR
    each knob value names).  Needs nothing beyond tir_byoc's own dependencies.
strategies
    hypothesis strategies over those programs (``programs()``, ``mutants()``).  Needs the
    ``hypothesis`` package (``pip install tir-byoc[dev]``).
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
"""
