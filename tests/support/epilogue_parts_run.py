"""Run by backends/test_epilogue_c.py in a process of its own, whose TVM pool has TVM_NUM_THREADS
threads: each named backend's gemm entry point with an epilogue that runs in C, over an output
large enough to be shared among the pool's threads and over a small one, with the outputs,
float64 references and parts (tir_byoc_<backend>_epilogue_parts) saved to the .npz file named
by argv[1]."""

from __future__ import annotations

import math
import sys

import numpy as np

import tir_byoc  # noqa: F401  (loads TVM's runtime, whose pool the epilogue shares)
from tir_byoc import toolchain

F32 = 1 | 1 << 8 | 1 << 16  # TIR_BYOC_SIG_F32
NK = 0
BIAS, RELU_KEEP_NAN, GELU, ADD = 3, 5, 6, 13  # TIR_BYOC_OP_*
# oneDNN fuses the bias; a relu that keeps NaN it never fuses, so everything after runs in C.
OPS = BIAS | RELU_KEEP_NAN << 8 | GELU << 16 | ADD << 24
GELU_C = math.sqrt(0.5)
#: name: (m, n, k).  301 rows split unevenly; 7 x 40 is below the size worth sharing.
SHAPES = {"large": (301, 523, 4), "small": (7, 40, 4)}


def run(backend, m, n, k, rng):
    gemm = toolchain.entry_point(backend, "gemm")
    parts = toolchain.entry_point(backend, "epilogue_parts")
    # Small integers: every product is exact in fp32 whatever order a library sums in, so the
    # outputs of one and two threads can be compared bit for bit.
    x = rng.integers(-3, 4, (m, k)).astype("float32")
    w = rng.integers(-3, 4, (n, k)).astype("float32")
    bias = (rng.integers(-8, 9, n) / 4).astype("float32")
    residual = rng.standard_normal((m, n)).astype("float32")
    y = np.full((m, n), np.nan, "float32")
    status = gemm(x.ctypes.data, w.ctypes.data, y.ctypes.data, m, n, k, F32, NK, 1, 1,
                  *[0] * 4, OPS, GELU_C, *[0.0] * 5, bias.ctypes.data, residual.ctypes.data,
                  None, None)  # fmt: skip
    assert status == 0, (backend, m, n, status)
    z = x.astype("float64") @ w.T.astype("float64") + bias
    z = np.maximum(z, 0.0)
    z = z * (0.5 + np.frompyfunc(math.erf, 1, 1)(z * GELU_C).astype("float64") * 0.5)
    return y, z + residual, parts(OPS >> 8 if backend == "onednn" else OPS, m, n)


def main(out, backends):
    import tvm

    rng = np.random.default_rng(0)
    saved = {"threads": np.array(tvm.get_global_func("runtime.NumThreads")())}
    for backend in backends:
        for name, (m, n, k) in SHAPES.items():
            y, expected, parts = run(backend, m, n, k, rng)
            saved[f"{backend}.{name}"] = y
            saved[f"{backend}.{name}.expected"] = expected
            saved[f"{backend}.{name}.parts"] = np.array(parts)
    np.savez(out, **saved)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))
