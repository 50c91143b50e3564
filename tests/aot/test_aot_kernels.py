"""PrimFuncs as plain C: parallel loops, allocations in the workspace, asserts that return,
and what is refused."""

import re

import numpy as np
import pytest
from support import aot_harness as harness
from tvm.script import tirx as T

import tir_byoc.aot as aot
from tir_byoc.aot.c_kernel import ASSERT_STATUS, PARALLEL_FOR


# fmt: off
@T.prim_func
def two_passes(a: T.Buffer((64, 64), "float32"), b: T.Buffer((64, 64), "float32")):
    tmp = T.alloc_buffer((64, 64), "float32")  # 16 KB: in the workspace, not on the stack
    row = T.alloc_buffer((8,), "float32")  # 32 bytes: on the stack
    for i in T.parallel(64):
        for j in range(64):
            tmp[i, j] = a[i, j] * T.float32(2)
    for i in T.parallel(64):
        for j in range(64):
            row[j % 8] = tmp[j, i]
            b[i, j] = row[j % 8] + T.float32(1)


@T.prim_func
def per_row(a: T.Buffer((4, 512), "float32"), b: T.Buffer((4, 512), "float32")):
    for i in T.parallel(4):
        tmp = T.alloc_buffer((512,), "float32")  # 2 KB in the loop: the rows would share it
        for j in range(512):
            tmp[j] = a[i, j] * T.float32(2)
        for j in range(512):
            b[i, j] = tmp[511 - j]


@T.prim_func
def checked(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
    for i in range(4):
        assert a[i] >= T.float32(0), "negative input"
        b[i] = T.sqrt(a[i])


@T.prim_func
def math_ops(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in range(64):
        b[i] = (
            T.erf(a[i]) + T.tanh(a[i]) * T.exp(T.float32(0) - a[i] * a[i])
            + T.floor(a[i]) + T.sqrt(T.fabs(a[i])) + T.max(a[i], T.float32(0))
            + T.Cast("float32", T.floordiv(T.Cast("int32", a[i] * T.float32(8)), 3))
        )


@T.prim_func
def masks(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    for i in range(8):
        b[i] = T.Select(T.bitwise_not(a[i] > 2), T.bitwise_not(a[i]), a[i])


@T.prim_func
def vectors(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
    b[T.Ramp(0, 1, 4)] = a[T.Ramp(0, 1, 4)] + T.Broadcast(T.float32(1), 4)


@T.prim_func
def half(a: T.Buffer((4,), "float16"), b: T.Buffer((4,), "float16")):
    for i in range(4):
        b[i] = a[i] + a[i]
# fmt: on


@pytest.fixture(scope="module")
def passes(tmp_path_factory):
    return aot.build(two_passes, out_dir=tmp_path_factory.mktemp("passes"), name="passes")


def test_large_allocations_take_workspace_and_small_ones_the_stack(passes):
    kernels = passes.path("passes_kernels.c").read_text()
    assert "float *restrict tmp = (float *)(scratch + 0);" in kernels
    assert re.search(r"float row\[8\];", kernels)
    assert passes.workspace_bytes == 64 * 64 * 4
    entry = passes.path("passes.c").read_text()
    assert "status = passes_two_passes(a, b, ws + 0);" in entry


def test_parallel_loops_are_marked(passes):
    kernels = passes.path("passes_kernels.c").read_text()
    # The second loop's stack row is declared in its body: private to each iteration.
    assert kernels.count(f"  {PARALLEL_FOR}\n  for (") == 2
    assert '#define TIR_BYOC_PARALLEL_FOR _Pragma("omp parallel for")' in kernels


def test_a_parallel_loop_that_takes_scratch_stays_serial(tmp_path):
    artifact = aot.build(per_row, out_dir=tmp_path / "rows", name="rows")
    kernels = artifact.path("rows_kernels.c").read_text()
    assert "(scratch + 0)" in kernels and f"  {PARALLEL_FOR}\n" not in kernels
    a = np.arange(4 * 512, dtype="float32").reshape(4, 512)
    (b,), _ = harness.run(artifact, harness.make(artifact), [a])
    np.testing.assert_array_equal(b, (a * 2)[:, ::-1])


@pytest.mark.parametrize("openmp", [False, True], ids=["serial", "openmp"])
def test_the_kernel_runs_serially_and_on_openmp_threads(passes, openmp, tmp_path):
    variables = ("CFLAGS=-O2 -fopenmp", "LDFLAGS=-fopenmp") if openmp else ()
    runner = harness.make(passes, *variables, build_dir=tmp_path / "build")
    symbols = harness.undefined_symbols(runner)
    assert any(s.startswith("GOMP_parallel") for s in symbols) == openmp
    assert harness.tvm_symbols(runner) == set()
    a = np.random.default_rng(0).standard_normal((64, 64)).astype("float32")
    (b,), _ = harness.run(passes, runner, [a], env={"OMP_NUM_THREADS": "2"})
    np.testing.assert_allclose(b, (a * 2).T + 1, rtol=1e-6)


def test_a_failed_assert_is_a_status_not_an_abort(tmp_path):
    artifact = aot.build(checked, out_dir=tmp_path / "checked", name="checked")
    kernels = artifact.path("checked_kernels.c").read_text()
    assert f"if (!(0.0f <= a[i])) return {ASSERT_STATUS}; /* negative input */" in kernels
    runner = harness.make(artifact)
    (b,), _ = harness.run(artifact, runner, [np.array([0, 1, 4, 9], "float32")])
    np.testing.assert_array_equal(b, [0, 1, 2, 3])
    with pytest.raises(AssertionError, match=f"checked_run returned {ASSERT_STATUS}"):
        harness.run(artifact, runner, [np.array([1, -1, 4, 9], "float32")])
    assert f"#define CHECKED_EASSERT {ASSERT_STATUS}" in artifact.path("checked.h").read_text()


def test_math_is_libm_and_agrees_with_the_vm(tmp_path):
    artifact = aot.build(math_ops, out_dir=tmp_path / "math", name="math")
    kernels = artifact.path("math_kernels.c").read_text()
    assert "erff(" in kernels and "tanhf(" in kernels
    assert "erff" not in artifact.path("math_kernels.h").read_text()  # declared by math.h
    a = np.linspace(-3, 3, 64, dtype="float32")
    (b,), _ = harness.run(artifact, harness.make(artifact), [a])
    np.testing.assert_allclose(b, artifact.model(a), rtol=1e-6, atol=1e-6)


def test_bitwise_not_is_logical_on_bool_and_bitwise_on_ints(tmp_path):
    artifact = aot.build(masks, out_dir=tmp_path / "masks", name="masks")
    a = np.arange(-3, 5, dtype="int32")
    (b,), _ = harness.run(artifact, harness.make(artifact), [a])
    np.testing.assert_array_equal(b, np.where(a > 2, a, ~a))
    np.testing.assert_array_equal(b, artifact.model(a))


@pytest.mark.parametrize(
    ("func", "construct"),
    [
        (vectors, "a vector of 4 lanes (int32x4)"),
        (half, "dtype float16"),
    ],
)
def test_vector_lanes_and_fp16_are_refused_before_any_file(func, construct, tmp_path):
    with pytest.raises(aot.Unsupported, match=re.escape(construct)):
        aot.build(func, out_dir=tmp_path / "never", name="refused")
    assert not (tmp_path / "never").exists()
