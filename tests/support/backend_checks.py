"""Shared checks for the library backend tests: run an offloaded pattern, compare with NumPy.

Not a test file (no ``test_`` prefix); imported by ``test_backend_*.py``.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tvm

import tir_byoc
from tir_byoc.patterns import FIXED_EPILOGUES, PATTERNS
from tir_byoc.patterns import pattern as pattern_of
from tir_byoc.rewrite import intrinsic_calls
from tir_byoc.signature import DtypeSignature
from tir_byoc.testing.inputs import random_array

#: The members with entry points of their own; the gemm entry point's epilogues are checked op
#: by op in backends/test_epilogue_c.py and through TVM in match/test_epilogues.py.
FIXED = [n for n, p in PATTERNS.items() if p.ops in FIXED_EPILOGUES]

#: Dtype signature -> (x, w, out) NumPy dtypes.
NUMPY_DTYPES = {
    "float32": ("float32", "float32", "float32"),
    "bfloat16,bfloat16->float32": (ml_dtypes.bfloat16, ml_dtypes.bfloat16, "float32"),
    "float16,float16->float32": ("float16", "float16", "float32"),
    "uint8,int8->int32": ("uint8", "int8", "int32"),
    "int8,int8->int32": ("int8", "int8", "int32"),
}

#: Tolerances (rtol, atol) against a float64 / int64 reference computed from the same inputs:
#: products of bf16/fp16 values are exact in fp32, so only fp32 summation order differs;
#: integer results must be exact.
TOLERANCES = {
    "float32": (1e-5, 1e-5),
    "bfloat16,bfloat16->float32": (1e-5, 1e-4),
    "float16,float16->float32": (1e-5, 1e-4),
    "uint8,int8->int32": (0, 0),
    "int8,int8->int32": (0, 0),
}

#: (B, M, N, K) run through one compiled function with symbolic extents; K = 0 is an empty sum,
#: M = 1 a GEMV (which the OpenBLAS intrinsics serve with sgemv), B = 0 an empty batch.  B is
#: ignored by the 2-D patterns.
SHAPES = ((3, 3, 5, 7), (2, 17, 33, 65), (2, 2, 3, 0), (1, 1, 9, 11), (0, 1, 4, 0), (4, 1, 4, 8))


def describe(pattern: str, signature: str):
    """The TIR description of ``pattern`` with the dtypes of ``signature``."""
    dtypes = DtypeSignature.parse(signature)
    return tir_byoc.describe(pattern, x_dtype=dtypes.x, w_dtype=dtypes.w, out_dtype=dtypes.out)


def reference(pattern: str, x, w, bias):
    spec = pattern_of(pattern)
    wide = "int64" if np.dtype(x.dtype).kind in "iu" else "float64"
    x, w = x.astype(wide), w.astype(wide)
    y = x @ (np.swapaxes(w, -1, -2) if spec.layout == "dense" else w)
    if bias is not None:
        y = y + bias.astype(wide)
    if spec.has_relu:
        y = np.maximum(y, 0)
    return y


def intrinsics_fired(func) -> list[str]:
    """The intrinsics the offloaded blocks of ``func`` call, each as often as it is called,
    sorted by name (from :func:`tir_byoc.rewrite.intrinsic_calls`)."""
    return sorted(Counter(intrinsic_calls(func)).elements())


def check_pattern(pattern: str, signature: str, backend: str, seed: int = 0) -> None:
    """Offload ``pattern`` to ``backend``, check the intrinsic fired once, compare with NumPy."""
    func = describe(pattern, signature)
    offloaded = tir_byoc.offload(func, backends=[backend])
    spec = pattern_of(pattern)
    assert intrinsics_fired(offloaded) == [f"{backend}.{spec.call_pattern}"]
    built = tvm.compile(tvm.IRModule({"main": offloaded}), target="llvm")
    x_dt, w_dt, out_dt = NUMPY_DTYPES[signature]
    rng = np.random.default_rng(seed)
    rtol, atol = TOLERANCES[signature]
    for b, m, n, k in SHAPES:
        lead = () if spec.batch == "none" else (b,)
        w_lead = lead if spec.batch == "batched" else ()
        x = random_array((*lead, m, k), x_dt, rng)
        w = random_array((*w_lead, *((n, k) if spec.layout == "dense" else (k, n))), w_dt, rng)
        bias = random_array((n,), out_dt, rng) if spec.has_bias else None
        y = tvm.runtime.tensor(np.full((*lead, m, n), 7, out_dt))
        args = [x, w] + ([bias] if bias is not None else [])
        built["main"](*[tvm.runtime.tensor(a) for a in args], y)
        expected = reference(pattern, x, w, bias)
        np.testing.assert_allclose(
            y.numpy().astype(expected.dtype),
            expected,
            rtol=rtol,
            atol=atol * max(k, 1),
            err_msg=f"{backend}.{pattern} [{signature}] B={b} M={m} N={n} K={k}",
        )


def library(backend: str) -> ctypes.CDLL:
    """The loaded intrinsic library of ``backend`` (compiled on first use)."""
    return ctypes.CDLL(str(tir_byoc.toolchain.load_backend(backend)))


def call_intrinsic(lib, symbol, *operands, m, n, k, signature):
    """Call an intrinsic directly; returns its status code."""
    function = getattr(lib, symbol)
    function.restype = ctypes.c_int32
    pointers = [ctypes.c_void_p(a.ctypes.data if a is not None else None) for a in operands]
    extents = [ctypes.c_int64(v) for v in (m, n, k)]
    return function(*pointers, *extents, ctypes.c_int32(signature))


def run_exported_mlp_in_fresh_process(backend: str, tmp_path) -> str:
    """Export the offloaded demo MLP, run it in a new interpreter without tir_byoc.

    Returns the subprocess's report line; fails the test if it did not agree with NumPy.
    """
    from tir_byoc.demo import lowered_mlp, mlp_reference, mlp_weights

    offloaded = tir_byoc.offload(lowered_mlp(), backends=[backend])
    built = tvm.compile(offloaded, target="llvm")
    path = tir_byoc.export_library(built, tmp_path / f"mlp_{backend}.so")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 800)).astype("float32")
    params = mlp_weights(rng)
    np.savez(tmp_path / "inputs.npz", x, *params, expected=mlp_reference(x, *params))
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        import tvm
        from tvm import relax
        data = np.load({str(tmp_path / "inputs.npz")!r})
        args = [tvm.runtime.tensor(data[f"arr_{{i}}"]) for i in range(5)]
        vm = relax.VirtualMachine(tvm.runtime.load_module({str(path)!r}), tvm.cpu())
        result = vm["forward"](*args).numpy()
        assert "tir_byoc" not in sys.modules, "the fresh process imported tir_byoc"
        maps = open("/proc/self/maps").read()
        libraries = sorted({{line.split("/")[-1] for line in maps.splitlines()
                             if "dnnl" in line or "openblas" in line}})
        error = float(np.abs(result - data["expected"]).max())
        print("max-abs-error", error, "libraries", ",".join(libraries))
        sys.exit(0 if np.allclose(result, data["expected"], rtol=1e-4, atol=1e-4) else 1)
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"fresh process failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


def check_status_codes_of_a_32_bit_blas(backend: str) -> None:
    """The status codes at entry of ``tir_byoc_<backend>_dense_bias_relu`` for a BLAS that
    indexes with 32-bit ints: OK, a dtype it does not serve, an extent past 2^31 - 1 (refused
    before the output is touched), a missing bias."""
    lib = library(backend)
    f32 = DtypeSignature.parse("float32").code
    x = np.ones((2, 3), "float32")
    w = np.ones((4, 3), "float32")
    bias = np.arange(4, dtype="float32")
    y = np.zeros((2, 4), "float32")
    f64 = DtypeSignature.parse("float64").code
    symbol = f"tir_byoc_{backend}_dense_bias_relu"
    assert call_intrinsic(lib, symbol, x, w, bias, y, m=2, n=4, k=3, signature=f32) == 0
    np.testing.assert_array_equal(y, np.broadcast_to(3 + bias, (2, 4)))
    assert call_intrinsic(lib, symbol, x, w, bias, y, m=2, n=4, k=3, signature=f64) == 1
    y[:] = -1
    assert call_intrinsic(lib, symbol, x, w, bias, y, m=2**31, n=4, k=3, signature=f32) == 2
    assert (y == -1).all()
    assert call_intrinsic(lib, symbol, x, w, None, y, m=2, n=4, k=3, signature=f32) == 3


def require_available(backend: str) -> None:
    """Fail (not skip) the calling test module if ``backend`` cannot be used here: the test
    environment installs every bundled backend's library."""
    reason = tir_byoc.toolchain.unavailable(backend)
    if reason is not None:
        pytest.fail(f"the {backend} backend must be available in the test environment: {reason}")


def uninstall_every_wheel(monkeypatch) -> None:
    """Make ``importlib.metadata`` report every distribution missing, as a machine without the
    backends' wheels would."""

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)


def onednn_executed(run, capfd) -> list[list[str]]:
    """The fields of each line oneDNN's verbose log (on stdout, switched on for that run)
    writes for a primitive executed during ``run()``: [primitive kind, kernel, ...]."""
    found = re.search(r"(/\S*libdnnl\.so[.\d]*)", Path("/proc/self/maps").read_text())
    assert found, "oneDNN is not loaded"
    dnnl, libc = ctypes.CDLL(found.group(1)), ctypes.CDLL(None)
    libc.fflush(None)
    capfd.readouterr()
    dnnl.dnnl_set_verbose(1)
    try:
        run()
    finally:
        dnnl.dnnl_set_verbose(0)
        libc.fflush(None)
    lines = [line.split(",") for line in capfd.readouterr().out.splitlines()]
    return [fields[3:] for fields in lines if len(fields) > 7 and fields[1] == "exec"]
