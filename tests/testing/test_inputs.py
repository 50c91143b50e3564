"""tir_byoc.testing.inputs: one maker of random inputs, for tests, properties and benchmarks."""

import ml_dtypes
import numpy as np
import pytest
from tvm import tirx

from tir_byoc.testing.inputs import (
    WIDE_INTEGER_BOUND,
    concrete_extent,
    parameter_shapes,
    random_arguments,
    random_array,
    resolved_sizes,
)
from tir_byoc.testing.programs import ChainSpec, ProgramSpec, build_program


@pytest.mark.parametrize(
    ("dtype", "low", "high"),
    [
        ("int8", -128, 127),
        ("uint8", 0, 255),
        ("int32", -WIDE_INTEGER_BOUND, WIDE_INTEGER_BOUND),
        ("uint32", 0, WIDE_INTEGER_BOUND),
    ],
)
def test_integers_cover_their_range_or_stay_within_the_bound(dtype, low, high):
    values = random_array((4096,), dtype, np.random.default_rng(0))
    assert values.dtype == np.dtype(dtype)
    assert values.min() >= low and values.max() <= high
    assert values.min() < low + (high - low) // 8 and values.max() > high - (high - low) // 8


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", ml_dtypes.bfloat16])
def test_floats_are_standard_normal_in_their_dtype(dtype):
    values = random_array((64, 64), dtype, np.random.default_rng(0))
    assert values.dtype == np.dtype(ml_dtypes.bfloat16 if "bfloat16" in str(dtype) else dtype)
    assert abs(float(values.astype("float64").std()) - 1) < 0.05


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_floats_may_be_larger_or_have_nan_and_infinities_among_them(dtype):
    rng = np.random.default_rng(0)
    large = random_array((64, 64), dtype, rng, magnitude=1e4).astype("float64")
    assert np.isfinite(large).all() and 0.9e4 < large.std() < 1.1e4  # fp16 clipped to 65504
    special = random_array((64, 64), dtype, rng, special=0.1).astype("float64")
    for is_kind in (np.isnan, np.isposinf, np.isneginf):
        assert 0.02 < is_kind(special).mean() < 0.05
    assert np.isfinite(random_array((64, 64), "int8", rng, special=0.5)).all()


def test_a_dtype_that_is_neither_float_nor_integer_is_refused():
    with pytest.raises(ValueError, match="expected a float or integer dtype, got bool"):
        random_array((2,), "bool", np.random.default_rng(0))


def test_one_seed_gives_the_same_arguments():
    program = build_program(ProgramSpec(chains=(ChainSpec(bias="vector"),), m=3))
    first, again = (random_arguments(program.func, seed=7) for _ in range(2))
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    other = random_arguments(program.func, seed=8)
    assert not np.array_equal(first[0], other[0])


def test_symbolic_extents_come_from_sizes_by_var_or_name_or_a_default():
    program = build_program(ProgramSpec(chains=(ChainSpec(n=4, k=3),), symbolic_m=True, m=6))
    (m,) = program.bindings
    by_var = parameter_shapes(program.func, {m: 6})
    assert by_var == parameter_shapes(program.func, {"m": 6})
    assert by_var == [((6, 3), "float32"), ((4, 3), "float32"), ((6, 4), "float32")]
    assert parameter_shapes(program.func, default_extent=2)[0] == ((2, 3), "float32")
    assert resolved_sizes(program.func, default_extent=5) == {"m": 5}
    with pytest.raises(ValueError, match="neither a constant nor a variable given in sizes"):
        random_arguments(program.func)


def test_an_extent_may_be_an_expression_of_the_given_variables():
    m = tirx.Var("m", "int64")
    stride = m * tirx.IntImm("int64", 4) + tirx.IntImm("int64", 1)
    assert concrete_extent(stride, {"m": 5}) == 21
    assert concrete_extent(stride, {m: 2}) == 9
    with pytest.raises(ValueError, match="neither a constant nor a variable given in sizes"):
        concrete_extent(stride, {})
