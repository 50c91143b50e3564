"""The oneMKL backend: every pattern against NumPy (fp32), selection, its static link, packed
weights made at run time, and an exported model in a fresh process.

The gemm entry point's epilogues are checked op by op, with special values, in
test_epilogue_c.py, and through TVM in match/test_epilogues.py and match/test_batch.py (all
parametrised over the backends, MKL among them).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.backend_checks import (
    FIXED,
    check_pattern,
    check_status_codes_of_a_32_bit_blas,
    describe,
    require_available,
    run_exported_mlp_in_fresh_process,
    uninstall_every_wheel,
)
from tvm import relax
from tvm.script import relax as R

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.backends import mkl
from tir_byoc.packing import PACK_CHOOSE, PACK_CHOOSE_ANY_M
from tir_byoc.registry import BackendUnavailable
from tir_byoc.relax import pipeline
from tir_byoc.signature import PACKED_WEIGHT_FLAG, DtypeSignature

F32 = DtypeSignature.parse("float32").code
LIBRARY, PLAIN = 1, 0  # TIR_BYOC_PACK_LIBRARY, TIR_BYOC_PACK_PLAIN
EPACKED = 6
NK, KN = 0, 1
HEADER = 64  # bytes before a block's weight (pack_header in mkl/gemm.c)


@pytest.fixture(scope="module", autouse=True)
def _mkl_installed():
    require_available("mkl")


@pytest.mark.parametrize("pattern", FIXED)
def test_every_pattern_matches_numpy(pattern):
    check_pattern(pattern, "float32", "mkl")


def test_fp32_goes_to_mkl_on_intel_cpus_and_every_other_dtype_to_onednn():
    first = "mkl" if mkl.PRIORITY == mkl.INTEL_PRIORITY else "onednn"
    assert [m.intrinsic for m in tir_byoc.scan(describe("dense_bias", "float32"))] == [
        f"{first}.dense_bias"
    ]
    assert [
        m.intrinsic for m in tir_byoc.scan(describe("dense_bias", "float32"), backends="mkl")
    ] == ["mkl.dense_bias"]
    bf16 = describe("dense", "bfloat16,bfloat16->float32")
    (refused,) = tir_byoc.scan(bf16, backends=["mkl"])
    assert refused.intrinsic is None
    assert refused.reason == (
        "mkl.dense: dtype bfloat16,bfloat16->float32 not supported (supports float32)"
    )


def test_locate_says_what_to_install_when_the_wheel_is_missing(monkeypatch):
    uninstall_every_wheel(monkeypatch)
    with pytest.raises(BackendUnavailable, match=r"mkl-include is not installed .*pip install"):
        mkl.locate()


def test_a_missing_objcopy_is_reported_before_anything_is_compiled(monkeypatch):
    import shutil

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "objcopy" else which(name))
    assert toolchain.unavailable("mkl") == (
        "backend mkl links static libraries and needs objcopy, which is not on PATH "
        "(install binutils)"
    )
    (match,) = tir_byoc.scan(describe("dense", "float32"), backends=["mkl", "ref"])
    assert match.intrinsic == "ref.dense"


def test_mkl_is_linked_in_and_only_the_intrinsics_are_exported():
    """MKL's symbols stay local to the backend's code: PyTorch, loaded in the same process by
    the real-model tests, exports an MKL of its own (cblas_sgemm, vsErf, ...)."""
    path = toolchain.load_backend("mkl")
    needed = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
    assert "mkl" not in needed.lower()  # no shared MKL library to find at run time
    assert "gomp" not in needed.lower()  # sequential MKL: its threads are TVM's
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[-1] for line in symbols.splitlines() if line.split()}
    assert "tir_byoc_mkl_gemm" in names and "tir_byoc_mkl_pack" in names
    assert {n for n in names if not n.startswith("tir_byoc_")} == set()


def test_status_codes_at_entry():
    # MKL's LP64 interface indexes with 32-bit ints: larger extents are refused untouched.
    check_status_codes_of_a_32_bit_blas("mkl")


def test_exported_library_runs_in_a_fresh_process(tmp_path):
    report = run_exported_mlp_in_fresh_process("mkl", tmp_path)
    assert report.startswith("max-abs-error")


# ----------------------------------------------------------------------------------------------
# Packed weights: a block of the plain weight, packed by MKL at the first call that meets it.
# ----------------------------------------------------------------------------------------------


def _pack(weight, m, layout, form):
    """``weight`` packed for a call of ``m`` rows: (form, block or None)."""
    pack = toolchain.entry_point("mkl", "pack")
    n, k = weight.shape if layout == NK else weight.shape[::-1]
    chosen, size = ctypes.c_int32(form), ctypes.c_int64(0)
    args = [weight.ctypes.data, m, n, k, F32, layout, 0, *[0.0] * 6, ctypes.byref(chosen)]
    assert pack(*args, None, ctypes.byref(size)) == 0
    if size.value == 0:
        return chosen.value, None
    block = np.zeros(size.value + 64, np.uint8)
    start = -block.ctypes.data % 64  # 64-byte aligned, as TVM allocates
    block = block[start : start + size.value]
    assert pack(*args, block.ctypes.data, ctypes.byref(size)) == 0
    return chosen.value, block


def _gemm(x, w, y, n, layout, flags=0, bias=None):
    """One gemm call, bias as its one epilogue op if given; returns its status."""
    gemm = toolchain.entry_point("mkl", "gemm")
    m, k = x.shape
    ops = 3 if bias is not None else 0  # TIR_BYOC_OP_BIAS
    tensors = [bias.ctypes.data if bias is not None else None, None, None, None]
    return gemm(x.ctypes.data, w.ctypes.data, y.ctypes.data, m, n, k, F32 | flags, layout,
                1, 1, 0, 0, 0, 0, ops, *[0.0] * 6, *tensors)  # fmt: skip


@pytest.mark.parametrize("layout", [NK, KN], ids=["nk", "kn"])
def test_a_packed_weight_gives_the_plain_result_wherever_its_block_is(monkeypatch, layout):
    monkeypatch.setenv("TIR_BYOC_MKL_PACK", "library")
    rng = np.random.default_rng(0)
    m, n, k = 37, 70, 129
    weight = rng.standard_normal((n, k) if layout == NK else (k, n)).astype("float32")
    x = rng.standard_normal((m, k)).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    plain = np.zeros((m, n), "float32")
    assert _gemm(x, weight, plain, n, layout, bias=bias) == 0
    form, block = _pack(weight, m, layout, PACK_CHOOSE)
    assert form == LIBRARY and block is not None and block.nbytes == HEADER + weight.nbytes
    # The block holds the plain weight: MKL's packing is made by the call, in this process.
    np.testing.assert_array_equal(block[HEADER:].view("float32"), weight.ravel())
    packed = np.full((m, n), np.nan, "float32")
    assert _gemm(x, block, packed, n, layout, PACKED_WEIGHT_FLAG, bias) == 0
    np.testing.assert_allclose(packed, plain, rtol=1e-5, atol=1e-5)
    # A copy of the block at another address (as a model exported and loaded again holds it)
    # computes the same: nothing in it depends on where it was made.
    moved = np.zeros(block.nbytes + 128, np.uint8)[64 + 32 :][: block.nbytes]
    moved[:] = block
    again = np.full((m, n), np.nan, "float32")
    assert _gemm(x, moved, again, n, layout, PACKED_WEIGHT_FLAG, bias) == 0
    np.testing.assert_array_equal(again, packed)


def test_a_block_meets_only_the_call_it_was_made_for(monkeypatch):
    monkeypatch.setenv("TIR_BYOC_MKL_PACK", "library")
    rng = np.random.default_rng(1)
    m, n, k = 8, 16, 24
    weight = rng.standard_normal((n, k)).astype("float32")
    _, block = _pack(weight, m, NK, PACK_CHOOSE)
    x = rng.standard_normal((m, k)).astype("float32")
    y = np.full((m, n), -7.0, "float32")
    # Another M, another layout, a plain weight passed as a block: refused, y untouched.
    x_other = rng.standard_normal((m + 1, k)).astype("float32")
    y_other = np.full((m + 1, n), -7.0, "float32")
    assert _gemm(x_other, block, y_other, n, NK, PACKED_WEIGHT_FLAG) == EPACKED
    assert _gemm(x, block, y, n, KN, PACKED_WEIGHT_FLAG) == EPACKED
    assert _gemm(x, weight, y, n, NK, PACKED_WEIGHT_FLAG) == EPACKED
    assert (y == -7).all() and (y_other == -7).all()
    # The call it was made for packs it; another weight of the same shape has another hash,
    # so it gets a packing of its own, never the first one's.
    assert _gemm(x, block, y, n, NK, PACKED_WEIGHT_FLAG) == 0
    np.testing.assert_allclose(y, x @ weight.T, rtol=1e-5, atol=1e-4)
    _, rebuilt = _pack(2 * weight, m, NK, PACK_CHOOSE)
    assert not np.array_equal(rebuilt[:HEADER], block[:HEADER])  # the hash differs
    assert _gemm(x, rebuilt, y, n, NK, PACKED_WEIGHT_FLAG) == 0
    np.testing.assert_allclose(y, 2 * x @ weight.T, rtol=1e-5, atol=1e-4)


def test_a_call_whose_m_is_known_only_at_run_time_keeps_the_plain_weight():
    """MKL packs for one M: a symbolic M keeps the plain weight, whatever the timing says."""
    weight = np.ones((16, 24), "float32")
    assert _pack(weight, 1, NK, PACK_CHOOSE_ANY_M) == (PLAIN, None)


def test_the_forced_plain_form_makes_no_block(monkeypatch):
    monkeypatch.setenv("TIR_BYOC_MKL_PACK", "plain")
    assert _pack(np.ones((16, 24), "float32"), 8, NK, PACK_CHOOSE) == (PLAIN, None)


def test_a_relax_model_packs_its_constant_weight_and_computes_the_same(monkeypatch):
    monkeypatch.setenv("TIR_BYOC_MKL_PACK", "library")
    rng = np.random.default_rng(2)
    m, k, n = 32, 48, 40
    weight = rng.standard_normal((k, n)).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    x = relax.Var("x", R.Tensor((m, k), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            z = R.add(R.matmul(x, relax.const(weight)), relax.const(bias))
            out = builder.emit_output(builder.emit(R.nn.gelu(z)))
        builder.emit_func_output(out)
    import tvm

    lowered = pipeline.lower(builder.get())
    packed = tir_byoc.offload(lowered, backends="mkl")
    script = packed.script(show_meta=False)
    assert "tir_byoc_mkl_gemm" in script and "_packed" in script
    data = rng.standard_normal((m, k)).astype("float32")

    def run(mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(data)).numpy()

    np.testing.assert_allclose(run(packed), run(lowered), rtol=1e-5, atol=1e-5)


def test_threads_meeting_a_new_block_at_once_all_get_the_right_result(monkeypatch):
    """The first call of a block packs its weight under a lock; calls racing to it (a model run
    from several threads) all wait for that one packing and compute the same product."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("TIR_BYOC_MKL_PACK", "library")
    rng = np.random.default_rng(3)
    m, n, k = 64, 96, 160
    weight = rng.standard_normal((n, k)).astype("float32")
    _, block = _pack(weight, m, NK, PACK_CHOOSE)
    inputs = [rng.standard_normal((m, k)).astype("float32") for _ in range(8)]
    outputs = [np.full((m, n), np.nan, "float32") for _ in inputs]

    def run(i):  # ctypes releases the GIL for the call: the eight run at once
        return _gemm(inputs[i], block, outputs[i], n, NK, PACKED_WEIGHT_FLAG)

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(run, range(len(inputs)))) == [0] * len(inputs)
    for x, y in zip(inputs, outputs, strict=True):
        np.testing.assert_allclose(y, x @ weight.T, rtol=1e-5, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# The work of a call shared among TVM's threads: by columns, rows or batch indices.
# ----------------------------------------------------------------------------------------------

COLUMNS, ROWS, BATCHES = 0, 1, 2  # the cuts of tir_byoc_mkl_cut

#: How mkl_parts_run.py's calls are cut with two threads in TVM's pool.
CUTS_AT_TWO = {
    "columns_nk": (COLUMNS, 2),  # 200 columns: 112 + 88
    "columns_kn": (COLUMNS, 2),
    "columns_packed": (COLUMNS, 2),  # one packing per part
    "rows": (ROWS, 2),  # 20 columns are too few for two parts of 16
    "gemv": (COLUMNS, 2),
    "batches_flat": (BATCHES, 2),  # 10 batch indices: 5 + 5, across dim 0
    "batches_per_row": (BATCHES, 2),  # the weight broadcasts along dim 0: a run per row
    "batches_broadcast": (BATCHES, 2),  # stride 0: a loop of products
    "small_packed": (COLUMNS, 1),  # 3072 multiply-adds: one thread
    "rows_packed": (ROWS, 2),  # 300 rows per thread: one packing, which both threads read
}


def _parts_run(tmp_path, threads):
    out = tmp_path / f"parts-{threads}.npz"
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    script = Path(__file__).parents[1] / "support" / "mkl_parts_run.py"
    done = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return np.load(out)


def test_calls_shared_among_tvm_threads_compute_what_one_thread_computes(tmp_path):
    """Two threads in TVM's pool (parts of uneven size), then one: every cut with a bias,
    gelu and residual epilogue run per part, against float64 NumPy and each other."""
    shared, alone = _parts_run(tmp_path, 2), _parts_run(tmp_path, 1)
    if int(shared["threads"]) < 2:
        pytest.skip("TVM's pool has one thread on this machine: nothing is shared")
    for name, (how, parts) in CUTS_AT_TWO.items():
        assert tuple(shared[f"{name}.cut"]) == (how, parts), name
        assert tuple(alone[f"{name}.cut"]) == (BATCHES if how == BATCHES else COLUMNS, 1), name
        k = 1500 if name == "gemv" else 300
        for result in (shared, alone):
            np.testing.assert_allclose(
                result[name], result[f"{name}.expected"], rtol=1e-5, atol=1e-5 * np.sqrt(k),
                err_msg=name,
            )  # fmt: skip
        np.testing.assert_allclose(shared[name], alone[name], rtol=1e-5, atol=1e-4, err_msg=name)
