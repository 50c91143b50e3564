"""Property 1, equivalence: an offloaded function computes what the original did.

Every generated function (positives and near misses, 2-D or with batch dims) is offloaded with
the property registry (the bundled fp32 intrinsics plus test-only widening ones, so every
generated dtype has a kernel, ``bmm_`` entry points included), both versions are compiled
and run on the same random contents of every parameter,
and every parameter is compared afterwards: outputs nobody matched included.
"""

import numpy as np
import pytest
import tvm
from harness import PROPERTY_REGISTRY, offload, profile, reported
from hypothesis import event, given, note
from hypothesis import strategies as st

import tir_byoc
from tir_byoc.patterns import PATTERNS
from tir_byoc.rewrite import intrinsic_calls
from tir_byoc.testing import strategies
from tir_byoc.testing.equivalence import assert_equivalent, run
from tir_byoc.testing.programs import RELU_SPELLINGS, ChainSpec, ProgramSpec, build_program
from tir_byoc.testing.script import to_tvmscript


def _calls(func) -> int:
    return sum(intrinsic_calls(func).values())


@profile(0.5)
@given(program=strategies.all_programs(), seed=st.integers(0, 2**16))
def test_offloaded_function_computes_the_same_results(program, seed):
    with reported(program):
        found = tir_byoc.scan(program.func, registry=PROPERTY_REGISTRY)
        planned = [m for m in found if m.intrinsic]
        rewritten = offload(program.func)
        assert _calls(rewritten) == len(planned), "one extern call per offloaded match"
        if not planned:
            event("nothing offloaded")
            tvm.ir.assert_structural_equal(rewritten, program.func)
            return
        event(f"offloaded {len(planned)} chain(s)")
        for form in {PATTERNS[m.pattern].batch for m in planned}:
            event(f"offloaded a chain of batch form {form}")
        try:
            assert_equivalent(program.func, rewritten, bindings=program.bindings, seed=seed)
        except AssertionError:
            note(f"the offloaded function:\n{to_tvmscript(rewritten)}")
            raise


@pytest.mark.parametrize("backend", ["ref", "openblas", "onednn"])
@pytest.mark.parametrize("relu", list(RELU_SPELLINGS))
def test_relu_of_nan_is_unchanged_by_offloading(relu, backend):
    # TVM's max(z, 0) gives 0 for a NaN, max(0, z) keeps it: the kernel is told which.
    program = build_program(ProgramSpec(chains=(ChainSpec(relu=relu, n=1, k=1),), m=1))
    rewritten = tir_byoc.offload(program.func, registry=PROPERTY_REGISTRY, backends=[backend])
    assert _calls(rewritten) == 1
    x, w = np.full((1, 1), np.nan, "float32"), np.ones((1, 1), "float32")
    arrays = [x, w, np.zeros((1, 1), "float32")]
    results = [run(func, arrays)[-1] for func in (program.func, rewritten)]
    np.testing.assert_array_equal(results[1], results[0])
