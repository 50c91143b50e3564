"""oneDNN's conv entry point (intrinsics/onednn/conv.cpp) against the reference convolution
(intrinsics/ref/conv.c), called through ctypes: every weight form, layouts, groups and
epilogues, NaN through relu, and a packed weight met by a call it was not made for."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.epilogues import OPS

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="oneDNN is not installed"
)

F32 = 0x10101
PACKED = 1 << 25
PLAIN, LIBRARY, BLOCKED = 0, 1, 3
NULL = ctypes.c_void_p(0)


def _pointer(array):
    return ctypes.c_void_p(array.ctypes.data)


def _geometry(layout, weight_layout, n, c, o, groups, size, kernel, stride, dilation, pad):
    out = [
        (i + 2 * p - (k - 1) * d - 1) // s + 1
        for i, k, s, d, p in zip(size, kernel, stride, dilation, pad)
    ]
    fill = 3 - len(size)
    return [
        layout,
        weight_layout,
        n,
        c,
        o,
        groups,
        *size,
        *[1] * fill,
        *out,
        *[1] * fill,
        *kernel,
        *[1] * fill,
        *stride,
        *[1] * fill,
        *dilation,
        *[1] * fill,
        *pad,
        *[0] * fill,
    ], out


def _codes(ops):
    codes = 0
    for position, op in enumerate(ops):
        codes |= OPS[op].code << (8 * position)
    return codes


def _aligned(size):
    raw = np.zeros(size + 64, "uint8")
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + size]


def _call(backend, geometry, x, w, y, ops, tensors, form=PLAIN):
    conv = toolchain.entry_point(backend, "conv")
    codes = _codes(ops)
    constants = [c for op in ops for c in OPS[op].example][:6]
    constants += [0.0] * (6 - len(constants))
    weight, dtypes = _pointer(w), F32
    if form != PLAIN:
        pack = toolchain.entry_point(backend, "conv_pack")
        chosen, size = ctypes.c_int32(form), ctypes.c_int64(0)
        args = [_pointer(w), F32, *geometry, codes, *constants]
        assert pack(*args, ctypes.byref(chosen), None, ctypes.byref(size)) == 0
        block = _aligned(size.value)
        assert pack(*args, ctypes.byref(chosen), _pointer(block), ctypes.byref(size)) == 0
        weight, dtypes = _pointer(block), F32 | PACKED
    pointers = [_pointer(t) for t in tensors] + [NULL] * (4 - len(tensors))
    return conv(_pointer(x), weight, _pointer(y), dtypes, *geometry, codes, *constants, *pointers)


CASES = [
    # layout, weight layout, n, c, o, groups, size, kernel, stride, dilation, pad
    (0, 0, 1, 8, 16, 1, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1)),
    (0, 0, 2, 8, 8, 8, (10, 7), (3, 3), (2, 1), (1, 2), (1, 0)),
    (1, 1, 1, 6, 12, 3, (8, 8), (1, 1), (1, 1), (1, 1), (0, 0)),
    (0, 0, 1, 4, 6, 1, (12,), (5,), (2,), (1,), (2,)),
    (1, 1, 1, 4, 4, 2, (5, 5, 5), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),
]
EPILOGUES = [
    (),
    ("bias", "relu"),
    ("channel_scale", "bias", "clip"),
    ("bias", "add", "relu"),
    ("gelu", "channel_scale"),
]


@pytest.mark.parametrize("form", [PLAIN, LIBRARY, BLOCKED])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ops", EPILOGUES)
def test_onednn_computes_what_the_reference_convolution_computes(case, ops, form):
    n, c, o, groups, size, kernel = case[2:8]
    geometry, out = _geometry(*case)
    rng = np.random.default_rng(len(ops) * 7 + form)
    x = rng.standard_normal(n * c * int(np.prod(size))).astype("float32")
    w = rng.standard_normal(o * (c // groups) * int(np.prod(kernel))).astype("float32")
    y_count = n * o * int(np.prod(out))
    tensors = [
        rng.standard_normal(y_count if op == "add" else o).astype("float32")
        for op in ops
        if OPS[op].tensor is not None
    ]
    want, got = np.zeros(y_count, "float32"), np.full(y_count, np.nan, "float32")
    assert _call("ref", geometry, x, w, want, ops, tensors) == 0
    assert _call("onednn", geometry, x, w, got, ops, tensors, form) == 0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", [PLAIN, LIBRARY, BLOCKED])
@pytest.mark.parametrize("relu", ["relu"])
def test_nan_and_infinities_through_relu_are_what_the_reference_gives(form, relu):
    geometry, _ = _geometry(0, 0, 1, 1, 16, 1, (4, 4), (1, 1), (1, 1), (1, 1), (0, 0))
    x = np.ones(16, "float32")
    w = np.zeros(16, "float32")  # z = bias exactly
    bias = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1, 1, 3e38, -3e38] + [2.0] * 7, "float32")
    want, got = np.zeros(16 * 16, "float32"), np.zeros(16 * 16, "float32")
    assert _call("ref", geometry, x, w, want, ("bias", relu), [bias]) == 0
    assert _call("onednn", geometry, x, w, got, ("bias", relu), [bias], form) == 0
    np.testing.assert_array_equal(got, want)


def test_a_packed_weight_met_by_another_call_is_refused_not_computed():
    geometry, _ = _geometry(0, 0, 1, 8, 8, 1, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    # Another kernel size: the block holds a weight of another shape.
    other, _ = _geometry(0, 0, 1, 8, 8, 1, (6, 6), (1, 1), (1, 1), (1, 1), (0, 0))
    w = np.ones(8 * 8 * 9, "float32")
    pack = toolchain.entry_point("onednn", "conv_pack")
    chosen, size = ctypes.c_int32(LIBRARY), ctypes.c_int64(0)
    args = [_pointer(w), F32, *geometry, 0, *[0.0] * 6]
    assert pack(*args, ctypes.byref(chosen), None, ctypes.byref(size)) == 0
    block = _aligned(size.value)
    assert pack(*args, ctypes.byref(chosen), _pointer(block), ctypes.byref(size)) == 0
    x, y = np.ones(8 * 36, "float32"), np.zeros(8 * 36, "float32")
    conv = toolchain.entry_point("onednn", "conv")
    status = conv(
        _pointer(x),
        _pointer(block),
        _pointer(y),
        F32 | PACKED,
        *other,
        0,
        *[0.0] * 6,
        NULL,
        NULL,
        NULL,
        NULL,
    )
    assert status == 6  # TIR_BYOC_EPACKED


def test_bad_calls_get_their_status_codes():
    geometry, _ = _geometry(0, 0, 1, 6, 4, 4, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1))
    conv = toolchain.entry_point("onednn", "conv")
    x = np.ones(200, "float32")
    # 6 input channels do not split into 4 groups.
    assert (
        conv(
            _pointer(x),
            _pointer(x),
            _pointer(x),
            F32,
            *geometry,
            0,
            *[0.0] * 6,
            NULL,
            NULL,
            NULL,
            NULL,
        )
        == 2
    )
    good, _ = _geometry(0, 0, 1, 4, 4, 1, (5, 5), (3, 3), (1, 1), (1, 1), (1, 1))
    assert (
        conv(
            _pointer(x),
            _pointer(x),
            _pointer(x),
            0x20202,
            *good,
            0,
            *[0.0] * 6,
            NULL,
            NULL,
            NULL,
            NULL,
        )
        == 1
    )  # fp16: not implemented
    assert tir_byoc.REGISTRY["onednn.conv"].backend == "onednn"
