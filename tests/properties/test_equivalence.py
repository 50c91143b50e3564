"""Property 1, equivalence: an offloaded function computes what the original did.

Every generated function (positives and near misses, 2-D or with batch dims) is offloaded with
the property registry (the bundled fp32 intrinsics plus test-only widening ones, so every
generated dtype has a kernel, ``bmm_`` entry points included), both versions are compiled
and run on the same random contents of every parameter,
and every parameter is compared afterwards: outputs nobody matched included.  The float
inputs of some examples are 100 or 10^4 times larger, or have NaN and infinities among them:
NaN must then come out exactly where the original puts it, infinities with their sign.
"""

import numpy as np
import pytest
import tvm
from hypothesis import event, given, note
from hypothesis import strategies as st
from properties.harness import PROPERTY_REGISTRY, TARGET, normwise, offload, profile, reported

import tir_byoc
from tir_byoc.patterns import pattern as pattern_of
from tir_byoc.rewrite import intrinsic_calls
from tir_byoc.testing import strategies
from tir_byoc.testing.equivalence import assert_equivalent, run
from tir_byoc.testing.programs import RELU_SPELLINGS, ChainSpec, ProgramSpec, build_program
from tir_byoc.testing.script import to_tvmscript
from tir_byoc.testing.spellings import ACTIVATION_SPELLINGS

#: How an example's float inputs are drawn: (magnitude, share of NaN and infinities).
INPUTS = {"normal": (1.0, 0.0), "x100": (100.0, 0.0), "x1e4": (1e4, 0.0), "special": (1.0, 0.1)}


def _calls(func) -> int:
    return sum(intrinsic_calls(func).values())


# In CI 105 examples, not 150: the epilogue ops made an example's build take longer, and the
# CI profile's time stays what it was (tests/properties/README.md).
@profile(0.5, ci_share=0.35)
@given(
    program=strategies.all_programs(),
    seed=st.integers(0, 2**16),
    inputs=st.sampled_from(("normal", "normal", "x100", "x1e4", "special")),
)
def test_offloaded_function_computes_the_same_results(program, seed, inputs):
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
        for form in {pattern_of(m.pattern).batch for m in planned}:
            event(f"offloaded a chain of batch form {form}")
        magnitude, special = INPUTS[inputs]
        compared_normwise = normwise(program, magnitude)
        event(f"inputs {inputs}{', compared normwise' if compared_normwise else ''}")
        try:
            assert_equivalent(
                program.func,
                rewritten,
                bindings=program.bindings,
                seed=seed,
                magnitude=magnitude,
                special=special,
                normwise=compared_normwise,
                target=TARGET,
            )
        except AssertionError:
            note(f"the offloaded function:\n{to_tvmscript(rewritten)}")
            raise


@pytest.mark.parametrize("backend", ["ref", "openblas", "mkl", "onednn"])
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


#: Values an activation meets at its edges: NaN, infinities, zeros of both signs, values where
#: exp, erf and tanh saturate or overflow (exp overflows past 88.7), the largest floats.
SPECIAL_VALUES = (
    *(np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 3.0, -3.0),
    *(10.0, -10.0, 88.0, -88.0, 89.0, -89.0, 1e4, -1e4, 1e13, -1e13, 3e38, -3e38),
)


@pytest.mark.parametrize("backend", ["ref", "openblas", "mkl", "onednn"])
def test_every_activation_spelling_meets_special_values_as_tvm_does(backend):
    # One chain per spelling, each z = x: NaN and infinities come out where the spelling's TIR
    # puts them (a clip's NaN result depends on its spelling), values where they are.
    chains = tuple(
        ChainSpec(activation=name, n=1, k=1, bounds=(-1.0, 2.0), slope=0.25)
        for name in ACTIVATION_SPELLINGS
    )
    program = build_program(ProgramSpec(chains=chains, m=len(SPECIAL_VALUES)))
    rewritten = tir_byoc.offload(program.func, registry=PROPERTY_REGISTRY, backends=[backend])
    assert _calls(rewritten) == len(chains)
    x = np.array(SPECIAL_VALUES, "float32").reshape(-1, 1)
    contents = {"X": x, "W": np.ones((1, 1), "float32"), "Z": np.zeros_like(x)}
    arrays = [contents[param.name[0]] for param in program.func.params]
    want, got = (run(func, arrays) for func in (program.func, rewritten))
    for param, spelling, expected, result in zip(
        program.func.params[2::3], ACTIVATION_SPELLINGS, want[2::3], got[2::3]
    ):
        np.testing.assert_allclose(
            result,
            expected,
            rtol=1e-5,
            atol=1e-6,
            equal_nan=True,
            err_msg=f"{spelling} ({param.name})",
        )
