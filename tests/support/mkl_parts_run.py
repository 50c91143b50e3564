"""Run by backends/test_mkl.py in a process of its own, whose TVM pool has TVM_NUM_THREADS
threads: MKL gemm calls of every cut (tir_byoc_mkl_cut), epilogue included, with their
outputs, float64 references and cuts saved to the .npz file named by argv[1]."""

from __future__ import annotations

import ctypes
import math
import sys

import numpy as np

import tir_byoc  # noqa: F401  (loads TVM's runtime, whose pool the calls share)
from tir_byoc import toolchain

F32 = 1 | 1 << 8 | 1 << 16  # TIR_BYOC_SIG_F32
PACKED_WEIGHT = 1 << 25
NK, KN = 0, 1
BIAS, GELU, ADD = 3, 6, 13  # TIR_BYOC_OP_*
GELU_C = math.sqrt(0.5)

#: name: (m, n, k, batch counts, x strides, w strides, layout, packed); strides in matrices.
CASES = {
    "columns_nk": (64, 200, 300, (1, 1), None, None, NK, False),
    "columns_kn": (64, 200, 300, (1, 1), None, None, KN, False),
    "columns_packed": (64, 200, 300, (1, 1), None, None, NK, True),
    "rows": (3000, 20, 100, (1, 1), None, None, NK, False),
    "gemv": (1, 1000, 1500, (1, 1), None, None, NK, False),
    "batches_flat": (32, 48, 80, (2, 5), (5, 1), (5, 1), KN, False),
    "batches_per_row": (32, 48, 80, (2, 5), (5, 1), (0, 1), KN, False),
    "batches_broadcast": (32, 48, 80, (2, 5), (5, 1), (0, 0), NK, False),
    "small_packed": (8, 16, 24, (1, 1), None, None, NK, True),
    "rows_packed": (600, 64, 40, (1, 1), None, None, NK, True),
}


def block_of(pack, weight, m, n, k, layout):
    """The weight as a block of MKL's packed form (TIR_BYOC_PACK_LIBRARY), 64-byte aligned."""
    form, size = ctypes.c_int32(1), ctypes.c_int64(0)
    args = [weight.ctypes.data, m, n, k, F32, layout, 0, *[0.0] * 6, ctypes.byref(form)]
    assert pack(*args, None, ctypes.byref(size)) == 0
    block = np.zeros(size.value + 64, np.uint8)
    block = block[-block.ctypes.data % 64 :][: size.value]
    assert pack(*args, block.ctypes.data, ctypes.byref(size)) == 0
    return block


def run(name, gemm, pack, cut, rng):
    m, n, k, counts, x_strides, w_strides, layout, packed = CASES[name]
    count = counts[0] * counts[1]
    xs = [s * m * k for s in x_strides] if x_strides else [0, 0]
    ws = [s * n * k for s in w_strides] if w_strides else [0, 0]
    x_len = 1 + sum((c - 1) * s for c, s in zip(counts, x_strides or (0, 0), strict=True))
    w_len = 1 + sum((c - 1) * s for c, s in zip(counts, w_strides or (0, 0), strict=True))
    x = rng.standard_normal((x_len, m, k)).astype("float32")
    w_shape = (n, k) if layout == NK else (k, n)
    w = rng.standard_normal((w_len, *w_shape)).astype("float32")
    bias = rng.standard_normal(n).astype("float32")
    residual = rng.standard_normal((count, m, n)).astype("float32")
    y = np.full((count, m, n), np.nan, "float32")
    operand = block_of(pack, w[0], m, n, k, layout) if packed else w
    flags = PACKED_WEIGHT if packed else 0
    status = gemm(x.ctypes.data, operand.ctypes.data, y.ctypes.data, m, n, k, F32 | flags,
                  layout, *counts, *xs, *ws, BIAS | GELU << 8 | ADD << 16, GELU_C, *[0.0] * 5,
                  bias.ctypes.data, residual.ctypes.data, None, None)  # fmt: skip
    assert status == 0, (name, status)
    # float64 reference: each batch index's matrices, as the strides locate them.
    expected = np.empty(y.shape)
    erf = np.frompyfunc(math.erf, 1, 1)
    for i0 in range(counts[0]):
        for i1 in range(counts[1]):
            xi = x[(i0 * x_strides[0] + i1 * x_strides[1]) if x_strides else 0].astype("float64")
            wi = w[(i0 * w_strides[0] + i1 * w_strides[1]) if w_strides else 0].astype("float64")
            z = xi @ (wi.T if layout == NK else wi) + bias
            z = z * (0.5 + erf(z * GELU_C).astype("float64") * 0.5)
            expected[i0 * counts[1] + i1] = z + residual[i0 * counts[1] + i1]
    parts = ctypes.c_int32(0)
    how = cut(m, n, k, count, int(packed), ctypes.byref(parts))
    return y, expected, how, parts.value


def main(out):
    gemm, pack, cut = (toolchain.entry_point("mkl", name) for name in ("gemm", "pack", "cut"))
    rng = np.random.default_rng(0)
    saved = {}
    for name in CASES:
        y, expected, how, parts = run(name, gemm, pack, cut, rng)
        saved[name] = y
        saved[f"{name}.expected"] = expected
        saved[f"{name}.cut"] = np.array([how, parts])
    import tvm

    saved["threads"] = np.array(tvm.get_global_func("runtime.NumThreads")())
    np.savez(out, **saved)


if __name__ == "__main__":
    main(sys.argv[1])
