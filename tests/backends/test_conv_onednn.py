"""oneDNN's conv entry point (intrinsics/onednn/conv.cpp) against the reference convolution
(intrinsics/ref/conv.c), called through ctypes: every weight form, layouts, groups and
epilogues, NaN through relu and clip, and a packed weight met by a call it was not made for;
ReLU6 after a convolution against TVM's own build, and which oneDNN post-ops serve a clip
(oneDNN's verbose log)."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
import tvm
from support.conv_modules import ConvSpec, lowered

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


def _call(backend, geometry, x, w, y, ops, tensors, form=PLAIN, constants=None):
    conv = toolchain.entry_point(backend, "conv")
    codes = _codes(ops)
    if constants is None:
        constants = [c for op in ops for c in OPS[op].example][:6]
    constants = list(constants)
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


# -- clip (ReLU6): fused where oneDNN computes what TVM computes, NaN included ---------------

#: A clip's NaN result, as each spelling of it gives: TVM's clip (ReLU6) max(min(z, hi), lo)
#: gives hi, min(max(z, lo), hi) gives lo, a bound-first spelling NaN.
CLIP_NAN = {"hi": 6.0, "lo": 0.0, "nan": float("nan")}
SPECIALS = [np.nan, np.inf, -np.inf, 3e38, -3e38, 1e30, -1e30, 7.0, -7.0, 6.0, 0.0]


def _special_bias(o):
    """A bias whose channels cycle through NaN, the infinities, huge and plain values."""
    return np.array([SPECIALS[i % len(SPECIALS)] for i in range(o)], "float32")


@pytest.mark.parametrize("form", [PLAIN, LIBRARY, BLOCKED])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("nan", sorted(CLIP_NAN))
def test_a_clip_after_the_bias_gives_what_the_c_clip_gives_on_nan_and_infinities(form, layout, nan):
    # z = bias exactly (zero weight): every output channel meets one of SPECIALS.
    geometry, _ = _geometry(layout, layout, 1, 16, 48, 1, (5, 5), (1, 1), (1, 1), (1, 1), (0, 0))
    x = np.ones(16 * 25, "float32")
    w = np.zeros(16 * 48, "float32")
    bias = _special_bias(48)
    constants = [0.0, 6.0, CLIP_NAN[nan]]
    want, got = np.zeros(48 * 25, "float32"), np.zeros(48 * 25, "float32")
    assert _call("ref", geometry, x, w, want, ("bias", "clip"), [bias], constants=constants) == 0
    assert _call("onednn", geometry, x, w, got, ("bias", "clip"), [bias], form, constants) == 0
    assert np.isnan(want).any() == (nan == "nan")
    np.testing.assert_array_equal(got, want)


def _conv_post_ops(run, capfd):
    """(kernel, post-ops) of each convolution oneDNN executed during ``run()``, from its
    verbose log on stdout (switched on for that run): [("brgconv_1x1:avx512_core",
    "binary_min+binary_max"), ...], "" for no post-op."""
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
    post_ops = []
    for line in capfd.readouterr().out.splitlines():
        fields = line.split(",")
        if len(fields) > 7 and fields[1] == "exec" and fields[3] == "convolution":
            attributes = fields[7].partition("attr-post-ops:")[2].split()
            names = attributes[0].split("+") if attributes else []
            post_ops.append((fields[4], "+".join(name.split(":")[0] for name in names)))
    return post_ops


@pytest.mark.parametrize(
    ("nan", "post_ops"),
    [
        ("hi", "binary_min+binary_max"),  # TVM's clip, ReLU6
        ("lo", "eltwise_clip_v2"),
        ("nan", ""),  # no oneDNN post-op gives NaN for NaN: the clip runs in C
    ],
)
def test_a_clip_is_fused_as_the_post_ops_that_give_its_nan_result(nan, post_ops, capfd):
    # MobileNetV2's 1x1 expansion, channels last, its weight in the primitive's layout: a
    # brgemm kernel here, which takes post-ops.
    geometry, _ = _geometry(1, 1, 1, 16, 96, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(16 * 196).astype("float32")
    w = rng.standard_normal(16 * 96).astype("float32")
    bias = _special_bias(96)
    constants = [0.0, 6.0, CLIP_NAN[nan]]
    want, got = np.zeros(96 * 196, "float32"), np.zeros(96 * 196, "float32")
    assert _call("ref", geometry, x, w, want, ("bias", "clip"), [bias], constants=constants) == 0

    def run():
        status = _call("onednn", geometry, x, w, got, ("bias", "clip"), [bias], LIBRARY, constants)
        assert status == 0

    run()  # the probes run on the first call; the log is of the second
    ((kernel, fused),) = _conv_post_ops(run, capfd)
    if kernel.startswith("ref") or "gemm" in kernel:
        pytest.skip(f"this CPU runs the shape on {kernel}, which gets no post-ops")
    assert fused == post_ops, kernel
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _integral_inputs(spec, seed):
    """x, w and a bias of small integers (every sum exact in fp32, in any order), with one of
    SPECIALS in x at every third position of each spatial dim (one channel each: no window
    of three taps meets two) and NaN and the infinities in three channels of the bias."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, spec.x_shape).astype("float32")
    w = rng.integers(-2, 3, spec.w_shape).astype("float32")
    bias = rng.integers(-4, 5, spec.channel_shape).astype("float32")
    flat_bias = bias.reshape(-1)
    flat_bias[:3] = [np.nan, np.inf, -np.inf]
    channels_first = spec.layout == "first"
    for i, position in enumerate(np.ndindex(*(len(range(0, n, 3)) for n in spec.sizes))):
        spatial = tuple(3 * p for p in position)
        channel = i % spec.channels
        index = (0, channel, *spatial) if channels_first else (0, *spatial, channel)
        x[index] = SPECIALS[i % len(SPECIALS)]
    return [x, w, bias]


@pytest.mark.parametrize("layout", ["first", "last"])
@pytest.mark.parametrize("kernel", [1, 3])
def test_relu6_after_a_convolution_gives_tvms_bits_on_nan_infinities_and_huge_values(
    layout, kernel
):
    def spec(ops):
        pad = (kernel // 2,) * 2
        return ConvSpec(
            layout=layout,
            channels=8,
            out_channels=24,
            sizes=(9, 9),
            kernel=(kernel,) * 2,
            pad_lo=pad,
            pad_hi=pad,
            ops=ops,
        )

    def run(mod, arrays):
        executable = tvm.compile(mod, target="llvm")
        vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()

    relu6 = lowered(spec(("bias", "clip")))
    arrays = _integral_inputs(spec(()), kernel)
    # The values the clip meets hold NaN, both infinities, and values below, inside and above
    # [0, 6].
    z = run(lowered(spec(("bias",))), arrays)
    assert np.isnan(z).any() and np.isposinf(z).any() and np.isneginf(z).any()
    assert (z[np.isfinite(z)] > 6).any() and (z < 0).any() and ((z > 0) & (z < 6)).any()
    (choice,) = tir_byoc.scan(relu6, backends=["onednn"])
    assert choice.intrinsic == "onednn.conv", choice.reason
    want = run(relu6, arrays)
    got = run(tir_byoc.offload(relu6, backends=["onednn"]), arrays)
    np.testing.assert_array_equal(got.view("uint32"), want.view("uint32"))
