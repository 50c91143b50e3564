"""The oneDNN backend: every pattern and dtype it claims against NumPy, selection, fallbacks."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
import tvm
from support.backend_checks import (
    FIXED,
    call_intrinsic,
    check_pattern,
    describe,
    intrinsics_fired,
    library,
    require_available,
    run_exported_mlp_in_fresh_process,
    uninstall_every_wheel,
)
from tvm import te

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.backends import mkl, onednn
from tir_byoc.backends.cpu import cpuinfo_field
from tir_byoc.registry import BackendUnavailable, Registry
from tir_byoc.signature import DtypeSignature

F32 = DtypeSignature.parse("float32").code


@pytest.fixture(scope="module", autouse=True)
def _onednn_installed():
    require_available("onednn")


@pytest.mark.parametrize("signature", list(onednn.DTYPE_CPU_FLAGS))
@pytest.mark.parametrize("pattern", FIXED)
def test_every_pattern_and_dtype_matches_numpy(pattern, signature):
    if onednn.cpu_supports(DtypeSignature.parse(signature)) is not None:
        pytest.skip(onednn.cpu_supports(DtypeSignature.parse(signature)))
    check_pattern(pattern, signature, "onednn")


def test_integer_sums_beyond_fp32_precision_are_exact_or_refused():
    # 255 * 127 * 4096 + bias needs 28 bits: a fused fp32 epilogue would round it, and
    # without VNNI oneDNN sums pairs in saturating int16; there the intrinsic must refuse.
    lib = library("onednn")
    m, n, k = 2, 3, 4096
    x = np.full((m, k), 255, np.uint8)
    w = np.full((n, k), 127, np.int8)
    bias = np.array([1, 2, 3], np.int32)
    y = np.zeros((m, n), np.int32)
    signature = DtypeSignature.parse("uint8,int8->int32").code
    status = call_intrinsic(
        lib, "tir_byoc_onednn_dense_bias_relu", x, w, bias, y, m=m, n=n, k=k, signature=signature
    )
    if onednn.cpu_supports(DtypeSignature.parse("uint8,int8->int32")) is not None:
        assert status == 1  # TIR_BYOC_EDTYPE: not computed, so never wrong
        return
    assert status == 0
    expected = x.astype(np.int64) @ w.astype(np.int64).T + bias
    np.testing.assert_array_equal(y, expected)


def test_priority_prefers_mkl_or_onednn_by_cpu_then_openblas_then_ref(monkeypatch):
    func = describe("dense_bias_relu", "float32")
    # fp32 goes to MKL first on an Intel CPU and to oneDNN first elsewhere (the other is next);
    # oneDNN is first for every other dtype.
    intel = cpuinfo_field("vendor_id") in ("GenuineIntel", "")
    assert mkl.PRIORITY == (mkl.INTEL_PRIORITY if intel else mkl.OTHER_PRIORITY)
    assert mkl.OTHER_PRIORITY < onednn.PRIORITY < mkl.INTEL_PRIORITY
    first = "mkl" if intel else "onednn"
    assert [m.intrinsic for m in tir_byoc.scan(func)] == [f"{first}.dense_bias_relu"]
    assert {i.priority for i in tir_byoc.REGISTRY.of_backend("mkl")} == {mkl.PRIORITY}
    assert [m.intrinsic for m in tir_byoc.scan(func, backends=["onednn", "openblas"])] == [
        "onednn.dense_bias_relu"
    ]
    assert [m.intrinsic for m in tir_byoc.scan(func, backends=["openblas", "onednn"])] == [
        "openblas.dense_bias_relu"
    ]
    monkeypatch.setenv("TIR_BYOC_BACKENDS", "ref")
    assert intrinsics_fired(tir_byoc.offload(func)) == ["ref.dense_bias_relu"]
    # The per-call argument wins over the environment variable.
    assert intrinsics_fired(tir_byoc.offload(func, backends="onednn")) == ["onednn.dense_bias_relu"]


def test_dtype_the_cpu_cannot_run_exactly_is_refused_with_reason(monkeypatch):
    func = describe("matmul_relu", "bfloat16,bfloat16->float32")
    if onednn.cpu_supports(DtypeSignature.parse("bfloat16,bfloat16->float32")) is None:
        assert [m.intrinsic for m in tir_byoc.scan(func)] == ["onednn.matmul_relu"]
    monkeypatch.setattr(onednn, "cpu_flags", lambda: frozenset({"avx2"}))
    (match,) = tir_byoc.scan(func)
    assert match.intrinsic is None
    assert "onednn.matmul_relu: dtype bfloat16,bfloat16->float32 needs a CPU with one of" in (
        match.reason
    )
    assert "ref.matmul_relu: dtype bfloat16,bfloat16->float32 not supported" in match.reason


def test_dtype_outside_the_family_is_refused():
    (match,) = tir_byoc.scan(describe("dense", "float64"), backends=["onednn"])
    assert match.intrinsic is None
    assert "dtype float64 not supported" in match.reason
    assert onednn.cpu_supports(DtypeSignature.parse("float64")) == (
        "dtype float64 is not implemented by the oneDNN intrinsics"
    )


def test_locate_says_what_to_install_when_the_wheel_is_missing(monkeypatch):
    uninstall_every_wheel(monkeypatch)
    with pytest.raises(BackendUnavailable, match=r"onednn-cpu-gomp is not installed .*pip install"):
        onednn.locate()


def _fake_registry() -> Registry:
    """The ref intrinsics plus a preferred backend whose library is missing."""
    registry = Registry()
    for intrinsic in tir_byoc.REGISTRY.of_backend("ref"):
        registry.register(intrinsic)

    def locate():
        raise BackendUnavailable("libfakednn is not installed (`pip install fakednn`)")

    registry.register_backend(tir_byoc.Backend("fakednn", locate, "a library that is absent"))
    registry.register(
        tir_byoc.Intrinsic(
            "fakednn.dense_bias",
            "dense_bias",
            "tir_byoc_fakednn_dense_bias",
            ("float32",),
            tir_byoc.REGISTRY["onednn.dense_bias"].source,
            priority=1000,
        )
    )
    return registry


def test_missing_library_is_skipped_with_reason_and_ref_serves():
    registry = _fake_registry()
    func = describe("dense_bias", "float32")
    (alone,) = tir_byoc.scan(func, backends=["fakednn"], registry=registry)
    assert alone.intrinsic is None
    assert alone.reason == (
        "fakednn.dense_bias: backend fakednn unavailable: libfakednn is not installed "
        "(`pip install fakednn`)"
    )
    offloaded = tir_byoc.offload(func, registry=registry)
    assert intrinsics_fired(offloaded) == ["ref.dense_bias"]
    built = tvm.compile(tvm.IRModule({"main": offloaded}), target="llvm")
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((4, 6), (5, 6), (5,)))
    y = tvm.runtime.tensor(np.zeros((4, 5), "float32"))
    built["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)], y)
    np.testing.assert_allclose(y.numpy(), x @ w.T + b, rtol=1e-5, atol=1e-5)


def _cache_info(lib) -> tuple[int, int, int, int]:
    info = (ctypes.c_int64 * 4)()
    lib.tir_byoc_onednn_cache_info(info)
    return tuple(info)


def test_primitive_cache_is_a_bounded_lru():
    lib = library("onednn")
    lib.tir_byoc_onednn_set_cache_capacity.argtypes = [ctypes.c_int64]
    rng = np.random.default_rng(0)

    def run(n):
        x = rng.standard_normal((3, 4)).astype("float32")
        w = rng.standard_normal((n, 4)).astype("float32")
        y = np.zeros((3, n), "float32")
        assert (
            call_intrinsic(lib, "tir_byoc_onednn_dense", x, w, y, m=3, n=n, k=4, signature=F32) == 0
        )
        np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)

    assert lib.tir_byoc_onednn_set_cache_capacity(2) == 0
    try:
        assert lib.tir_byoc_onednn_set_cache_capacity(-1) != 0
        _, capacity, hits, misses = _cache_info(lib)
        assert capacity == 2
        for n in (101, 102, 103):  # three new shapes: the first is evicted
            run(n)
        size, _, hits_after, misses_after = _cache_info(lib)
        assert (size, hits_after - hits, misses_after - misses) == (2, 0, 3)
        run(103)  # most recent: a hit
        run(101)  # evicted: created again
        size, _, hits_end, misses_end = _cache_info(lib)
        assert (size, hits_end - hits_after, misses_end - misses_after) == (2, 1, 1)
    finally:
        lib.tir_byoc_onednn_set_cache_capacity(256)


def test_an_op_is_fused_only_where_onednn_computes_it_as_the_tir_does():
    # The table's conditions (constants oneDNN builds in, an exact reciprocal, clip's NaN
    # value), then the check on this machine; tensor ops are binary post-ops, not asked here.
    assert not onednn.fuses("div", (3.0,))  # z * (1/3) is not z / 3
    assert not onednn.fuses("gelu", (0.6,))  # not the constant oneDNN's gelu uses
    assert not onednn.fuses("clip", (0.0, 6.0, float("nan")))  # no post-op gives NaN for NaN
    assert not onednn.fuses("clip", (6.0, 0.0, 6.0))  # bounds out of order
    assert not onednn.fuses("add")
    with pytest.raises(ValueError, match=r"'softmax' is not an epilogue op \(expected one of"):
        onednn.fuses("softmax")


def test_tanh_and_gelu_tanh_run_in_c_where_onednn_has_no_avx512_and_c_has_vector_tanh():
    # Speed, not exactness: on AVX2 oneDNN's tanh-based eltwises took 3-4x as long as the C
    # epilogue's libmvec tanhf (matmul.cpp, FasterInC).  oneDNN's avx512_core needs these four.
    avx512_core = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= onednn.cpu_flags()
    if avx512_core or "tanhf" not in toolchain.vector_math("onednn"):
        pytest.skip("oneDNN has AVX-512 here, or the C epilogue has no vector tanhf")
    assert not onednn.fuses("gelu_tanh")
    assert not onednn.fuses("tanh")
    assert onednn.fuses("gelu") and onednn.fuses("silu")  # no tanh in them: fused as before
    assert onednn.fuses("swish", (1.702,))  # CLIP's quick_gelu, checked for its alpha


def test_status_codes_at_entry():
    lib = library("onednn")
    x = np.zeros((2, 3), "float32")
    w = np.zeros((4, 3), "float32")
    y = np.zeros((2, 4), "float32")
    f64 = DtypeSignature.parse("float64").code
    assert call_intrinsic(lib, "tir_byoc_onednn_dense", x, w, y, m=2, n=4, k=3, signature=F32) == 0
    assert call_intrinsic(lib, "tir_byoc_onednn_dense", x, w, y, m=2, n=4, k=3, signature=f64) == 1
    assert call_intrinsic(lib, "tir_byoc_onednn_dense", x, w, y, m=-2, n=4, k=3, signature=F32) == 2
    assert (
        call_intrinsic(lib, "tir_byoc_onednn_dense", None, w, y, m=2, n=4, k=3, signature=F32) == 3
    )
    assert (
        call_intrinsic(
            lib, "tir_byoc_onednn_dense_bias", x, w, None, y, m=2, n=4, k=3, signature=F32
        )
        == 3
    )


def test_exported_library_runs_in_a_fresh_process(tmp_path):
    report = run_exported_mlp_in_fresh_process("onednn", tmp_path)
    assert "libdnnl.so" in report


def test_concurrent_calls_share_the_cache_safely():
    lib = library("onednn")
    rng = np.random.default_rng(0)
    cases = []
    for n in (31, 32, 33):
        x = rng.standard_normal((5, 9)).astype("float32")
        w = rng.standard_normal((n, 9)).astype("float32")
        b = rng.standard_normal(n).astype("float32")
        cases.append((x, w, b, np.maximum(x @ w.T + b, 0)))
    failures = []

    def worker(seed):
        for i in range(30):
            x, w, b, expected = cases[(seed + i) % len(cases)]
            y = np.zeros_like(expected)
            status = call_intrinsic(
                lib,
                "tir_byoc_onednn_dense_bias_relu",
                x,
                w,
                b,
                y,
                m=5,
                n=w.shape[0],
                k=9,
                signature=F32,
            )
            if status != 0 or not np.allclose(y, expected, rtol=1e-5, atol=1e-5):
                failures.append((seed, i, status))

    workers = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert failures == []


@pytest.mark.parametrize("batched", [False, True], ids=["dense", "bmm"])
def test_half_inputs_with_infinities_give_what_tir_gives(batched):
    # oneDNN's bf16 kernels multiply an infinite input by the zeros that pad an odd k to
    # pairs (AVX-512, AMD Zen 4): -inf became NaN.  Such inputs now take TIR's own loop.
    signature = "bfloat16,bfloat16->float32"
    if onednn.cpu_supports(DtypeSignature.parse(signature)) is not None:
        pytest.skip(onednn.cpu_supports(DtypeSignature.parse(signature)))
    import ml_dtypes
    from tvm import te

    m, n, k, batch = 4, 13, 17, (2 if batched else 1)
    x = te.placeholder((1, m, k), "bfloat16", name="X")
    w = te.placeholder((batch, n, k), "bfloat16", name="W")
    b = te.placeholder((n,), "float32", name="b")
    r = te.reduce_axis((0, k), name="r")
    product = te.compute(
        (batch, m, n),
        lambda s, i, j: te.sum(x[0, i, r].astype("float32") * w[s, j, r].astype("float32"), r),
        name="dense",
    )
    y = te.compute((batch, m, n), lambda s, i, j: product[s, i, j] + b[j], name="Z")
    mod = tvm.IRModule({"main": te.create_prim_func([x, w, b, y])})
    offloaded = tir_byoc.offload(mod, backends="onednn")
    assert intrinsics_fired(offloaded["main"]) == [
        "onednn.bmm_dense_bias" if batched else "onednn.dense_bias"
    ]
    toolchain.load_called(offloaded)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((1, m, k)).astype(ml_dtypes.bfloat16)
    ws = rng.standard_normal((batch, n, k)).astype(ml_dtypes.bfloat16)
    xs[0, 0, k - 1], xs[0, 1, 3], ws[0, 2, k - 1] = -np.inf, np.inf, -np.inf
    bias = rng.standard_normal(n).astype("float32")
    results = []
    for module in (mod, offloaded):
        args = [tvm.runtime.tensor(a) for a in (xs, ws, bias, np.zeros((batch, m, n), "float32"))]
        tvm.compile(module, target="llvm")["main"](*args)
        results.append(args[-1].numpy())
    original, rewritten = results
    assert np.isinf(original).any()
    np.testing.assert_allclose(rewritten, original, rtol=1e-5, atol=1e-5)


#: The spellings of a clip to [0, 6] and the value each gives for NaN (the op's c2): TVM's
#: clip (ReLU6) max(min(z, hi), lo) gives hi, min(max(z, lo), hi) gives lo.
CLIP_SPELLINGS = {
    "hi": (lambda z: te.max(te.min(z, 6.0), 0.0), 6.0),
    "lo": (lambda z: te.min(te.max(z, 0.0), 6.0), 0.0),
}


@pytest.mark.parametrize("shape", [(5, 16, 8), (64, 96, 32)])
@pytest.mark.parametrize("spelling", sorted(CLIP_SPELLINGS))
def test_a_clip_after_a_gemm_gives_tvms_bits_on_nan_and_infinities(spelling, shape):
    """A clip is fused as the first of eltwise_clip_v2, eltwise_clip and binary_min/max that
    the probe finds giving the C clip's values, NaN included (matmul.cpp, Checked): ReLU6's
    spelling, whose NaN gives hi, as min and max where oneDNN's min gives hi, its other
    spelling as eltwise_clip_v2; either way the bits are TVM's."""
    m, n, k = shape
    clip, nan_result = CLIP_SPELLINGS[spelling]
    x = te.placeholder((m, k), "float32", name="X")
    w = te.placeholder((n, k), "float32", name="W")
    b = te.placeholder((n,), "float32", name="b")
    r = te.reduce_axis((0, k), name="r")
    product = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[j, r], r), name="dense")
    z = te.compute((m, n), lambda i, j: product[i, j] + b[j], name="Z")
    y = te.compute((m, n), lambda i, j: clip(z[i, j]), name="clip")
    mod = tvm.IRModule({"main": te.create_prim_func([x, w, b, y])})
    offloaded = tir_byoc.offload(mod, backends="onednn")
    assert intrinsics_fired(offloaded["main"]) == ["onednn.gemm"]
    toolchain.load_called(offloaded)
    # Small integers (every sum exact in any order), the bias cycling through NaN, the
    # infinities and huge values, and an infinity in x (inf * 0 is NaN in both).
    rng = np.random.default_rng(m)
    xs = rng.integers(-3, 4, (m, k)).astype("float32")
    ws = rng.integers(-2, 3, (n, k)).astype("float32")
    specials = [np.nan, np.inf, -np.inf, 3e38, -3e38, 7.0, -7.0, 6.0, 0.0, 2.5]
    bias = np.array([specials[j % len(specials)] for j in range(n)], "float32")
    xs[0, 0] = np.inf
    results = []
    for module in (mod, offloaded):
        args = [tvm.runtime.tensor(a) for a in (xs, ws, bias, np.zeros((m, n), "float32"))]
        tvm.compile(module, target="llvm")["main"](*args)
        results.append(args[-1].numpy())
    original, rewritten = results
    assert (original[:, np.isnan(bias)] == nan_result).all()  # NaN met the clip
    assert np.isin([0.0, 6.0], original).all() and ((original > 0) & (original < 6)).any()
    np.testing.assert_array_equal(rewritten.view("uint32"), original.view("uint32"))


def test_relu6s_clip_is_fused_on_avx512():
    # The probe found oneDNN's binary_min giving hi for NaN on AVX-512 (brgemm), as ReLU6's
    # clip does, and eltwise_clip_v2 lo, as the other spelling does.
    if not {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= onednn.cpu_flags():
        pytest.skip("no AVX-512 here: which forms agree is this CPU's kernels' to say")
    assert onednn.fuses("clip", (0.0, 6.0, 6.0))
    assert onednn.fuses("clip", (0.0, 6.0, 0.0))
