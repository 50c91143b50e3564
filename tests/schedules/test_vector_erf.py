"""float32 erf in TIR arithmetic (tir_byoc.schedules.vector_erf): within two ulps of the exact
erf, erf's special values, and where the default schedule uses it."""

import math

import numpy as np
import pytest
import tvm
from support.byoc_testing import POINTS, lowered, pointwise_func, run_pointwise, vector_loads
from tvm import te, tirx

from tir_byoc import schedules
from tir_byoc.model import host_target
from tir_byoc.schedules import vector_erf, vector_math

_erf = np.vectorize(math.erf, otypes=[np.float64])


@pytest.fixture(scope="module", params=[1, 16], ids=["serial", "16 lanes"])
def built(request):
    func = pointwise_func(vector_erf.erf_float32, request.param)
    return tvm.compile(tvm.IRModule({"main": func}), target=tvm.target.Target("llvm"))


def test_a_vectorised_loop_stays_vector():
    func = pointwise_func(vector_erf.erf_float32, 16)
    assert [load.ty.dtype.lanes for load in vector_loads(func)] == [16]


def test_within_two_ulps_of_the_exact_erf(built):
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.uniform(-4.5, 4.5, POINTS // 2),  # every value erf does not round to +-1
            rng.standard_normal(POINTS // 4) * 2,  # where a GELU's inputs mostly are
            rng.standard_normal(POINTS // 8) * 1e-3,  # around 0, where erf(x) is 2x / sqrt(pi)
            # around 0.875, where the two forms meet
            rng.uniform(0.87, 0.88, POINTS // 8) * rng.choice([-1, 1], POINTS // 8),
        ]
    ).astype("float32")
    exact = _erf(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    error = np.abs(run_pointwise(built, x).astype(np.float64) - exact) / ulp
    assert error.max() <= 2.0, f"{error.max():.2f} ulps at x = {x[error.argmax()]!r}"


def test_special_values_are_erfs(built):
    tiny = np.finfo(np.float32).smallest_subnormal
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.92, 4.0, -10.0, 1e30, tiny, -tiny, 0.875])
    got = run_pointwise(built, x.astype("float32"))
    assert np.isnan(got[4]) and not np.isnan(np.delete(got, 4)).any()
    np.testing.assert_array_equal(np.signbit(got[:2]), [False, True])
    np.testing.assert_array_equal(got[2:4], [1.0, -1.0])
    np.testing.assert_array_equal(got[5:9], [1.0, 1.0, -1.0, 1.0])
    expected = _erf(x[9:].astype(np.float64))
    assert np.all(np.abs(got[9:] - expected) <= np.spacing(np.abs(expected).astype("float32")))


def test_every_float32_erf_is_replaced_and_other_dtypes_are_left():
    x = te.placeholder((64,), "float32", name="x")
    d = te.placeholder((64,), "float64", name="d")
    y = te.compute((64,), lambda i: tirx.erf(x[i]) * tirx.exp(x[i]), name="y")
    z = te.compute((64,), lambda i: tirx.erf(d[i]), name="z")
    expanded = vector_math.expand(te.create_prim_func([x, d, y, z])).script()
    assert expanded.count("T.erf(") == 1 and "T.exp(" not in expanded  # the float64 erf stays


def test_the_default_schedule_writes_a_group_norms_gelu_out():
    from tvm.script import relax as R

    def group_norm_gelu(x):
        gamma, beta = R.const(np.ones(8, "float32")), R.const(np.zeros(8, "float32"))
        return R.nn.gelu(R.nn.group_norm(x, gamma, beta, num_groups=8, channel_axis=1, axes=[2]))

    func = lowered(group_norm_gelu, (1, 8, 1000))
    host = host_target()
    if not vector_math.applies(host):
        pytest.skip(f"this machine's CPU ({host}) has no SSE4.1")
    by_host = schedules.default_schedule(tvm.IRModule({"main": func}), host)
    assert "T.erf(" in func.script() and "T.erf(" not in by_host.module["main"].script()
    x = np.random.default_rng(1).standard_normal((1, 8, 1000)).astype("float32") * 3 + 1
    out = tvm.runtime.tensor(np.zeros_like(x))
    gamma, beta = (tvm.runtime.tensor(np.full(8, value, "float32")) for value in (1, 0))
    tvm.compile(by_host.module, target=host)["main"](tvm.runtime.tensor(x), gamma, beta, out)
    normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    expected = 0.5 * normed * (1 + _erf(normed / math.sqrt(2)))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)
