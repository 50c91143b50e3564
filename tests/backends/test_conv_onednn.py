"""oneDNN's conv entry point (intrinsics/onednn/conv.cpp) against the reference convolution
(intrinsics/ref/conv.c), called through ctypes: every weight form, layouts, groups and
epilogues, NaN through relu and clip, and a packed weight met by a call it was not made for;
ReLU6 after a convolution against TVM's own build, and which oneDNN post-ops serve a clip
(oneDNN's verbose log)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import tvm
from support.backend_checks import onednn_executed
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


def _constants(ops, constants=None):
    if constants is None:
        constants = [c for op in ops for c in OPS[op].example][:6]
    return [*constants, *[0.0] * (6 - len(constants))]


def _pack(geometry, w, ops, form, constants=None):
    """The block oneDNN's pack function makes of ``w`` in ``form`` for a call of ``geometry``."""
    pack = toolchain.entry_point("onednn", "conv_pack")
    chosen, size = ctypes.c_int32(form), ctypes.c_int64(0)
    args = [_pointer(w), F32, *geometry, _codes(ops), *_constants(ops, constants)]
    assert pack(*args, ctypes.byref(chosen), None, ctypes.byref(size)) == 0
    block = _aligned(size.value)
    assert pack(*args, ctypes.byref(chosen), _pointer(block), ctypes.byref(size)) == 0
    return block


def _call_packed(geometry, x, block, y, ops, tensors, constants=None):
    """oneDNN's conv entry point on a block made by :func:`_pack` (for this call or not)."""
    conv = toolchain.entry_point("onednn", "conv")
    pointers = [_pointer(t) for t in tensors] + [NULL] * (4 - len(tensors))
    return conv(
        _pointer(x),
        _pointer(block),
        _pointer(y),
        F32 | PACKED,
        *geometry,
        _codes(ops),
        *_constants(ops, constants),
        *pointers,
    )


def _call(backend, geometry, x, w, y, ops, tensors, form=PLAIN, constants=None):
    if form != PLAIN:
        block = _pack(geometry, w, ops, form, constants)
        return _call_packed(geometry, x, block, y, ops, tensors, constants)
    conv = toolchain.entry_point(backend, "conv")
    pointers = [_pointer(t) for t in tensors] + [NULL] * (4 - len(tensors))
    return conv(
        _pointer(x),
        _pointer(w),
        _pointer(y),
        F32,
        *geometry,
        _codes(ops),
        *_constants(ops, constants),
        *pointers,
    )


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


@pytest.mark.parametrize("pack_batch", [1, 3])
def test_a_packed_weight_met_by_another_call_is_refused_not_computed(pack_batch):
    geometry, _ = _geometry(0, 0, pack_batch, 8, 8, 1, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    # Another kernel size, at the block's batch and another: the block holds a weight of
    # another shape.
    w = np.ones(8 * 8 * 9, "float32")
    block = _pack(geometry, w, (), LIBRARY)
    for n in (pack_batch, 2):
        other, _ = _geometry(0, 0, n, 8, 8, 1, (6, 6), (1, 1), (1, 1), (1, 1), (0, 0))
        x, y = np.ones(n * 8 * 36, "float32"), np.zeros(n * 8 * 36, "float32")
        assert _call_packed(other, x, block, y, (), []) == 6  # TIR_BYOC_EPACKED
    # The block's own call runs.
    x, y = np.ones(pack_batch * 8 * 36, "float32"), np.zeros(pack_batch * 8 * 36, "float32")
    assert _call_packed(geometry, x, block, y, (), []) == 0


#: The offset of the weight descriptor's strides in a conv block's header (PackHeader in
#: intrinsics/onednn/conv.cpp).
STRIDES = 232


@pytest.mark.parametrize("magic", [b"tirbyocC", b"tirbyCv2"])
def test_a_block_of_an_earlier_format_is_refused(magic):
    """Versions 1 and 2 of the block named their layout by a hash, without its descriptor."""
    geometry, _ = _geometry(1, 1, 1, 8, 8, 1, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    w = np.ones(8 * 8 * 9, "float32")
    block = _pack(geometry, w, (), LIBRARY)
    x, y = np.ones(8 * 36, "float32"), np.zeros(8 * 36, "float32")
    assert _call_packed(geometry, x, block, y, (), []) == 0
    block[:8] = np.frombuffer(magic, "uint8")
    assert _call_packed(geometry, x, block, y, (), []) == 6  # TIR_BYOC_EPACKED


@pytest.mark.parametrize("reorder", ["0", "1"])
def test_a_block_whose_descriptor_no_layout_has_is_refused(reorder, monkeypatch):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", reorder)
    case = (1, 1, 8, 16, 1, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1))
    geometry, x, bias, y_count = _batch_inputs(case, 2, 0)
    block = _packed_for(case, 2, LIBRARY, _weight(case))
    y = np.zeros(y_count, "float32")
    assert _call_packed(geometry, x, block, y, BATCH_OPS, [bias]) == 0
    block[STRIDES : STRIDES + 8] = np.frombuffer(np.int64(7).tobytes(), "uint8")
    assert _call_packed(geometry, x, block, y, BATCH_OPS, [bias]) == 6  # TIR_BYOC_EPACKED


def test_no_block_is_made_for_a_call_without_a_batch():
    geometry, _ = _geometry(1, 1, 0, 8, 8, 1, (6, 6), (3, 3), (1, 1), (1, 1), (1, 1))
    w = np.ones(8 * 8 * 9, "float32")
    pack = toolchain.entry_point("onednn", "conv_pack")
    chosen, size = ctypes.c_int32(LIBRARY), ctypes.c_int64(-1)
    args = [_pointer(w), F32, *geometry, 0, *[0.0] * 6]
    assert pack(*args, ctypes.byref(chosen), None, ctypes.byref(size)) == 0
    assert (chosen.value, size.value) == (PLAIN, 0)
    block = _aligned(4096)
    size = ctypes.c_int64(4096)
    chosen = ctypes.c_int32(LIBRARY)
    assert pack(*args, ctypes.byref(chosen), _pointer(block), ctypes.byref(size)) == 2  # ESHAPE


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
    """(kernel, post-ops) of each convolution oneDNN executed during ``run()``:
    [("brgconv_1x1:avx512_core", "binary_min+binary_max"), ...], "" for no post-op."""
    post_ops = []
    for fields in onednn_executed(run, capfd):
        if fields[0] == "convolution":
            attributes = fields[4].partition("attr-post-ops:")[2].split()
            names = attributes[0].split("+") if attributes else []
            post_ops.append((fields[1], "+".join(name.split(":")[0] for name in names)))
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


# -- a weight packed for one batch, met by calls at every batch (a symbolic batch) -----------

#: The batches the calls run at, the block made at one of the first and at 8.
CALL_BATCHES = (1, 2, 3, 8, 17)
BATCH_CASES = [
    # layout, weight layout, c, o, groups, size, kernel, stride, dilation, pad
    (0, 0, 8, 16, 1, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 1, 8, 16, 1, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 1, 16, 40, 1, (7, 7), (1, 1), (1, 1), (1, 1), (0, 0)),
    (1, 1, 16, 16, 16, (8, 8), (3, 3), (2, 2), (1, 1), (1, 1)),  # depthwise
]
BATCH_OPS = ("bias", "relu")


def _batch_inputs(case, n, seed):
    """The geometry of ``case`` at batch ``n``, its x, its bias and the output's size."""
    layout, weight_layout, c, o, groups, size = case[:6]
    geometry, out = _geometry(layout, weight_layout, n, c, o, groups, size, *case[6:])
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n * c * int(np.prod(size))).astype("float32")
    bias = rng.standard_normal(o).astype("float32")
    return geometry, x, bias, n * o * int(np.prod(out))


def _packed_for(case, pack_batch, form, w):
    geometry, *_ = _batch_inputs(case, pack_batch, 0)
    return _pack(geometry, w, BATCH_OPS, form)


def _weight(case):
    c, o, groups, kernel = case[2], case[3], case[4], case[6]
    rng = np.random.default_rng(o)
    return rng.standard_normal(o * (c // groups) * int(np.prod(kernel))).astype("float32")


@pytest.mark.parametrize("form", [LIBRARY, BLOCKED])
@pytest.mark.parametrize("pack_batch", [1, 8])
@pytest.mark.parametrize("case", BATCH_CASES)
def test_a_weight_packed_for_one_batch_serves_calls_at_every_batch(case, pack_batch, form):
    w = _weight(case)
    block = _packed_for(case, pack_batch, form, w)
    for n in CALL_BATCHES:
        geometry, x, bias, y_count = _batch_inputs(case, n, n)
        want, got = np.zeros(y_count, "float32"), np.full(y_count, np.nan, "float32")
        assert _call("ref", geometry, x, w, want, BATCH_OPS, [bias]) == 0
        assert _call_packed(geometry, x, block, got, BATCH_OPS, [bias]) == 0, n
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"n = {n}")


@pytest.mark.parametrize("form", [LIBRARY, BLOCKED])
@pytest.mark.parametrize("pack_batch", [1, 8])
@pytest.mark.parametrize("case", BATCH_CASES[1:])
def test_a_block_reordered_for_its_call_gives_the_bits_the_block_gives_unreordered(
    case, pack_batch, form, monkeypatch, capfd
):
    """TIR_BYOC_ONEDNN_TEST_REORDER=1 sends every block down the path of a block made for
    another layout: the weight reordered, in the call, into the layout the call's primitive
    asks for (here that same layout): the weight's reorders run, and the result is the same."""
    w = _weight(case)
    block = _packed_for(case, pack_batch, form, w)
    for n in CALL_BATCHES:
        geometry, x, bias, y_count = _batch_inputs(case, n, n)
        as_packed, reordered = np.zeros(y_count, "float32"), np.zeros(y_count, "float32")

        def reorders(y):
            def run():
                assert _call_packed(geometry, x, block, y, BATCH_OPS, [bias]) == 0

            run()  # primitives and probes made; the log is of the second call
            return sum(fields[0] == "reorder" for fields in onednn_executed(run, capfd))

        monkeypatch.delenv("TIR_BYOC_ONEDNN_TEST_REORDER", raising=False)
        plain_reorders = reorders(as_packed)
        monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", "1")
        assert reorders(reordered) > plain_reorders, n  # the weight's
        np.testing.assert_array_equal(reordered.view("uint32"), as_packed.view("uint32"))


@pytest.mark.parametrize("pack_batch", [1, 2])
def test_resnet50s_1x1_1024_to_512_packed_at_one_batch_computes_at_others(pack_batch):
    """ResNet-50's first 1x1 of its last stage, channels last: with two threads on AVX-512,
    oneDNN 3.2 asks for its weight in 64-channel blocks at n = 1 and in 48-channel blocks
    (512 channels padded to 528) at n >= 2, so a block made at one batch is reordered for the
    other, through the plain layout (elsewhere the layouts may agree; the result is checked
    either way)."""
    case = (1, 1, 1024, 512, 1, (14, 14), (1, 1), (1, 1), (1, 1), (0, 0))
    w = _weight(case)
    block = _packed_for(case, pack_batch, LIBRARY, w)
    for n in (1, 2, 3):
        geometry, x, bias, y_count = _batch_inputs(case, n, n)
        want, got = np.zeros(y_count, "float32"), np.full(y_count, np.nan, "float32")
        assert _call("ref", geometry, x, w, want, BATCH_OPS, [bias]) == 0
        assert _call_packed(geometry, x, block, got, BATCH_OPS, [bias]) == 0, n
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"n = {n}")
