"""float32 exp in TIR arithmetic (tir_byoc.schedules.vector_exp): within one ulp of the exact
exp over float32's range, libm's special values, and where the default schedule uses it."""

import numpy as np
import pytest
import tvm
from support.byoc_testing import POINTS, lowered, pointwise_func, run_pointwise, vector_loads
from tvm import te, tirx, topi

from tir_byoc import schedules
from tir_byoc.model import host_target
from tir_byoc.schedules import vector_exp, vector_math


@pytest.fixture(scope="module", params=[1, 16], ids=["serial", "16 lanes"])
def built(request):
    func = pointwise_func(vector_exp.exp_float32, request.param)
    return tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target("llvm"))


def test_a_vectorised_loop_stays_vector():
    # The vectoriser turns a whole loop back into scalar code around any call it has no vector
    # form of (`isnan` was one): the 16-lane loop must still load 16 lanes at a time.
    func = pointwise_func(vector_exp.exp_float32, 16)
    assert [load.ty.dtype.lanes for load in vector_loads(func)] == [16]


def test_within_one_ulp_of_the_exact_exp_over_floats_range(built):
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.uniform(-104.5, 89.5, POINTS // 2),  # the whole range, overflow and underflow
            rng.uniform(-2.0, 2.0, POINTS // 4),  # where a softmax's inputs mostly are
            rng.standard_normal(POINTS // 4) * 1e-4,  # around 0, where exp(x) is 1 + x
        ]
    ).astype("float32")
    got = run_pointwise(built, x).astype(np.float64)
    exact = np.exp(x.astype(np.float64))
    with np.errstate(over="ignore"):
        rounded = exact.astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    normal = np.isfinite(rounded) & (rounded >= tiny)
    ulp = np.spacing(rounded[normal]).astype(np.float64)
    assert np.max(np.abs(got[normal] - exact[normal]) / ulp) <= 1.0
    subnormal = rounded < tiny
    smallest = float(np.finfo(np.float32).smallest_subnormal)
    assert np.max(np.abs(got[subnormal] - exact[subnormal])) <= smallest
    assert np.all(np.isinf(got[~np.isfinite(rounded)]))


def test_special_values_are_libms(built):
    x = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            vector_exp.OVERFLOW,
            np.nextafter(np.float32(vector_exp.OVERFLOW), np.float32(np.inf)),
            -87.33654,  # exp is float32's smallest normal here
            -103.972,  # ...and its smallest subnormal here
            -104.0,
            -1e30,
            1e30,
        ],
        "float32",
    )
    with np.errstate(over="ignore"):
        expected = np.exp(x)
    got = run_pointwise(built, x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
    finite = np.isfinite(expected)
    assert np.all(np.abs(got[finite] - expected[finite]) <= np.spacing(expected[finite]))
    assert got[2] == np.inf and got[3] == 0.0 and got[6] == np.inf and got[9] == 0.0


def test_every_float32_exp_is_replaced_and_other_dtypes_are_left():
    x = te.placeholder((64,), "float32", name="x")
    d = te.placeholder((64,), "float64", name="d")
    y = te.compute((64,), lambda i: tirx.exp(x[i]) + tirx.exp(x[i] * 2.0), name="y")
    z = te.compute((64,), lambda i: tirx.exp(d[i]), name="z")
    func = te.create_prim_func([x, d, y, z])
    expanded = vector_math.expand(func)
    text = expanded.script()
    assert text.count("T.exp(") == 1  # the float64 one
    # A function without float32 exp comes back as it was.
    w = te.compute((64,), lambda i: x[i] + 1.0, name="w")
    plain = te.create_prim_func([x, w])
    assert vector_math.expand(plain).same_as(plain)


def test_calls_whose_type_is_a_pointer_are_passed_over():
    """A sort's packed call and its array handles have no dtype; the exp beside them is still
    written out (``torch.median`` lowers to such a function)."""
    x = te.placeholder((8,), "float32", name="x")
    ordered = topi.sort(x)
    y = te.compute((8,), lambda i: tirx.exp(ordered[i]), name="y")
    expanded = vector_math.expand(te.create_prim_func([x, y]))
    text = expanded.script()
    assert "T.exp(" not in text and "tvm.contrib.sort.sort" in text


def test_the_default_schedule_writes_exp_out_only_where_the_target_rounds_in_vectors():
    from tvm.script import relax as R

    func = lowered(lambda x: R.nn.softmax(x, axis=-1), (32, 128))
    generic = tvm.target.Target("llvm")  # x86-64: SSE2, no vector rounding
    host = host_target()
    assert not vector_math.applies(generic)
    by_generic = schedules.default_schedule(tvm.IRModule({"main": func}), generic)
    assert "T.exp(" in by_generic.module["main"].script()
    if not vector_math.applies(host):
        pytest.skip(f"this machine's CPU ({host}) has no SSE4.1")
    by_host = schedules.default_schedule(tvm.IRModule({"main": func}), host)
    assert "T.exp(" not in by_host.module["main"].script()
    x = np.random.default_rng(1).standard_normal((32, 128)).astype("float32") * 10
    out = tvm.runtime.tensor(np.zeros_like(x))
    tvm.compile(by_host.module, target=host)["main"](tvm.runtime.tensor(x), out)
    expected = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), expected / expected.sum(-1, keepdims=True), rtol=3e-6)


def test_a_function_a_tuner_scheduled_keeps_its_loops_and_gets_the_same_exp():
    x = te.placeholder((64, 64), "float32", name="x")
    y = te.compute((64, 64), lambda i, j: tirx.exp(x[i, j]), name="y")
    tuned = te.create_prim_func([x, y]).with_attr("tirx.is_scheduled", True)
    mod = tvm.IRModule({"main": tuned})
    generic = schedules.default_schedule(mod, tvm.target.Target("llvm"), scheduled_by="tuner")
    assert dict(generic.rules) == {"main": "tuner"}
    tvm.ir.assert_structural_equal(generic.module["main"], tuned)
    host = host_target()
    if not vector_math.applies(host):
        pytest.skip(f"this machine's CPU ({host}) has no SSE4.1")
    by_host = schedules.default_schedule(mod, host, scheduled_by="tuner")
    tvm.ir.assert_structural_equal(by_host.module["main"], vector_math.expand(tuned))
    assert "T.exp(" not in by_host.module["main"].script()
