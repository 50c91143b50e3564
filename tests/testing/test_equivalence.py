"""tir_byoc.testing.equivalence: it passes a correct rewrite and catches a wrong one."""

import numpy as np
import pytest

import tir_byoc
from tir_byoc.registry import REGISTRY, Intrinsic, Registry
from tir_byoc.testing.equivalence import (
    _difference,
    assert_equivalent,
    compile_functions,
    differences,
    longest_reduction,
    random_arguments,
    run,
    tolerance,
)
from tir_byoc.testing.programs import (
    ChainSpec,
    DistractorSpec,
    Knobs,
    ProgramSpec,
    build_program,
    mutate,
)

pytestmark = pytest.mark.usefixtures("reference_backend")


def _program(**chain):
    return build_program(ProgramSpec(chains=(ChainSpec(**chain),), m=5))


def test_a_correct_offload_is_equivalent():
    program = _program(bias="vector", relu="max(z, 0)")
    assert_equivalent(program.func, tir_byoc.offload(program.func), seed=3)


def test_a_kernel_for_the_wrong_pattern_is_caught():
    # dense_bias_relu served by the dense_bias kernel: negative outputs are not clamped.
    registry = Registry()
    registry.register_backend(REGISTRY.backend("ref"))
    wrong = REGISTRY["ref.dense_bias"]
    registry.register(
        Intrinsic(
            "ref.dense_bias_relu", "dense_bias_relu", wrong.extern_symbol, "float32", wrong.source
        )
    )
    program = _program(bias="vector", relu="max(z, 0)", n=8, k=8)
    rewritten = tir_byoc.offload(program.func, registry=registry)
    problems = differences(program.func, rewritten, seed=3)
    assert len(problems) == 1 and problems[0].startswith("Z0 (float32")
    with pytest.raises(AssertionError, match="results differ after the rewrite"):
        assert_equivalent(program.func, rewritten, seed=3)


def test_random_arguments_cover_every_parameter_with_its_dtype():
    program = build_program(
        ProgramSpec(
            chains=(ChainSpec(dtypes=("uint8", "int8", "int32"), bias="vector"),),
            symbolic_m=True,
            m=6,
        )
    )
    arrays = random_arguments(program.func, program.bindings, seed=0)
    assert [(a.shape, str(a.dtype)) for a in arrays] == [
        ((6, 3), "uint8"),
        ((4, 3), "int8"),
        ((4,), "int32"),
        ((6, 4), "int32"),
    ]
    with pytest.raises(ValueError, match="neither a constant nor a variable"):
        random_arguments(program.func, {}, seed=0)


def test_large_inputs_are_compared_normwise_and_nan_must_stay_where_it_was():
    program = _program(n=8, k=8)
    arrays = random_arguments(program.func, seed=1, magnitude=1e4)
    assert np.abs(arrays[0]).max() > 1e4
    assert differences(program.func, program.func, seed=1, magnitude=1e4, normwise=True) == []
    # Off by less than the normwise tolerance passes; a NaN or an infinity moved does not.
    param = program.func.params[-1]
    want = np.array([[np.nan, np.inf, 1e8, 1.0]])
    off = want + np.array([[0, 0, 0, 1e3]])  # within 1e-4 * sqrt(8) * 1e8
    assert _difference(param, want, off, 8, normwise=True) is None
    assert _difference(param, want, off, 8) is not None
    for wrong in (
        [1.0, np.inf, 1e8, 1.0],
        [np.nan, -np.inf, 1e8, 1.0],
        [np.nan, np.inf, 1e8, np.nan],
    ):
        assert _difference(param, want, np.array([wrong]), 8, normwise=True) is not None


def test_tolerances_are_exact_for_integers_and_grow_with_k():
    assert tolerance("int32", 100) == (0.0, 0.0)
    assert tolerance("float32", 100)[1] > tolerance("float32", 1)[1]
    assert tolerance("bfloat16", 1)[0] > tolerance("float16", 1)[0] > tolerance("float32", 1)[0]
    assert np.isfinite(tolerance("float16", 0)[1])


def test_a_parameter_with_an_offset_is_run_as_a_view(monkeypatch):
    # Passing X.data for a buffer bound at an offset reads the padding in front of the view.
    from tvm import tirx

    from tir_byoc import rewrite

    program = _program(x_view=True, n=3, k=4)
    assert_equivalent(program.func, tir_byoc.offload(program.func), seed=1)
    monkeypatch.setattr(rewrite, "_pointer", tirx.buffer_data)
    problems = differences(program.func, tir_byoc.offload(program.func), seed=1)
    assert len(problems) == 1 and problems[0].startswith("Z0 (float32")


@pytest.mark.parametrize("symbolic", [False, True])
def test_a_parameter_with_explicit_strides_is_run_with_them_and_read_back(symbolic):
    # X's rows are K + 1 elements apart, and a block overwrites X with tanh(X) after the product.
    chain = ChainSpec(n=3, k=4, batch=(2,), x_batch=("carry",), w_batch=("lack",))
    spec = ProgramSpec(
        chains=(chain,),
        distractors=(DistractorSpec("overwrite_x", 0),),
        m=5,
        symbolic_m=symbolic,
        symbolic_batch=symbolic,
    )
    program = build_program(mutate(spec, 0, "x_non_compact"))
    arrays = random_arguments(program.func, program.bindings, seed=4)
    x, w, z = run(program.func, arrays, bindings=program.bindings)
    np.testing.assert_allclose(z, arrays[0] @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x, np.abs(arrays[0]), rtol=1e-5, atol=1e-6)


def test_explicit_strides_on_a_bfloat16_parameter_are_refused_by_name():
    dtypes = ("bfloat16", "bfloat16", "float32")
    chain = ChainSpec(dtypes=dtypes, knobs=Knobs(x_row_padding=1), mutation="x_non_compact")
    program = build_program(ProgramSpec(chains=(chain,)))
    with pytest.raises(ValueError, match="parameter X0: explicit strides on a bfloat16 buffer"):
        run(program.func, random_arguments(program.func, seed=0))


def test_run_returns_every_buffer_and_leaves_its_arguments_alone():
    program = _program(bias="vector", n=3, k=4)
    arrays = random_arguments(program.func, seed=2)
    before = [a.copy() for a in arrays]
    x, w, b, z = run(program.func, arrays)
    np.testing.assert_allclose(z, x @ w.T + b, rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(a, a0) for a, a0 in zip(arrays, before))


def test_a_function_compiled_again_is_taken_from_the_cache():
    program = _program(n=3, k=4)
    rebuilt = _program(n=3, k=4)  # structurally equal, other objects
    first = compile_functions({"main": program.func})
    assert compile_functions({"main": rebuilt.func}) is first
    assert compile_functions({"main": _program(n=3, k=5).func}) is not first


def test_the_tolerance_widens_with_the_longest_reduction():
    program = build_program(
        ProgramSpec(chains=(ChainSpec(k=3), ChainSpec(k=17)), symbolic_m=True, m=2)
    )
    assert longest_reduction(program.func, program.bindings) == 17
