"""oneDNN's fused 1 x 1 + depthwise pair (tir_byoc_onednn_conv_pair, intrinsics/onednn/conv.cpp)
against a float64 NumPy definition of the two convolutions and their epilogues, NaN and
infinities included: the fused primitive, and the two convolutions it falls back to where the
block's layouts are not the ones the call's primitive asks for."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tir_byoc import toolchain
from tir_byoc.conv_pairs import NOT_FUSED
from tir_byoc.epilogues import OPS

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="oneDNN is not installed"
)

F32 = 0x10101
PACKED = 1 << 25
FUSED = 1
#: The pack's choice for a symbolic batch (TIR_BYOC_PACK_CHOOSE_ANY_M), and its two fused
#: answers: fused at every batch, fused from the block's batch up.
ANY_BATCH, FUSED_ANY_BATCH, FUSED_FROM_BATCH = -2, 7, 8

#: An epilogue of one half: ops, constants (a clip's lo, hi and NaN result).
EPILOGUES = {
    "bias": (("bias",), ()),
    "relu": (("bias", "relu"), ()),
    "relu_keep_nan": (("bias", "relu_keep_nan"), ()),
    "relu6": (("bias", "clip"), (0.0, 6.0, 6.0)),  # topi.clip's spelling: NaN gives hi
    "clip_nan_lo": (("bias", "clip"), (-1.0, 2.5, -1.0)),
}


#: TIR_BYOC_OP_RELU_KEEP_NAN (tir_byoc.h): the relu whose NaN stays, which OPS spells as relu
#: with a flag.
RELU_KEEP_NAN = 5


def _codes(ops):
    codes = [RELU_KEEP_NAN if op == "relu_keep_nan" else OPS[op].code for op in ops]
    return sum(code << (8 * i) for i, code in enumerate(codes))


def _library():
    library = ctypes.CDLL(str(toolchain.load_backend("onednn")))
    pair = library.tir_byoc_onednn_conv_pair
    half = [ctypes.c_int32] * 2 + [ctypes.c_int64] * 23 + [ctypes.c_double] * 6
    pair.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32] + (half + [ctypes.c_void_p] * 4) * 2
    pair.restype = ctypes.c_int32
    return pair, toolchain.entry_point("onednn", "conv_pair_pack")


class Pair:
    """A 1 x 1 (c -> o) then a depthwise 3 x 3 of stride ``stride``, NHWC, HWIO weights."""

    def __init__(self, n, size, c, o, stride, pad, first, second, seed=0):
        self.n, self.size, self.c, self.o, self.stride, self.pad = n, size, c, o, stride, pad
        self.out = (size + 2 * pad - 3) // stride + 1 if pad == 1 else -(-size // stride)
        self.epilogues = (EPILOGUES[first], EPILOGUES[second])
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((n, size, size, c)).astype("float32")
        self.wa = (rng.standard_normal((1, 1, c, o)) / np.sqrt(c)).astype("float32")
        self.wb = (rng.standard_normal((3, 3, 1, o)) / 3).astype("float32")
        self.ba = rng.standard_normal(o).astype("float32")
        self.bb = rng.standard_normal(o).astype("float32")

    def halves(self):
        n, s, c, o, st_, out = self.n, self.size, self.c, self.o, self.stride, self.out
        a = [1, 1, n, c, o, 1, s, s, 1, s, s, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
        b = [1, 1, n, o, o, o, s, s, 1, out, out, 1, 3, 3, 1, st_, st_, 1, 1, 1, 1]
        b += [self.pad, self.pad, 0]
        result = []
        for ints, (ops, constants) in zip((a, b), self.epilogues):
            result.append(([*ints, _codes(ops)], [*constants, *[0.0] * (6 - len(constants))]))
        return result

    def pack(self, pack, choice=-1):
        (ia, ca), (ib, cb) = self.halves()
        arrays = [(ctypes.c_int64 * 25)(*ia), (ctypes.c_double * 6)(*ca)]
        arrays += [(ctypes.c_int64 * 25)(*ib), (ctypes.c_double * 6)(*cb)]
        chosen, size = ctypes.c_int32(choice), ctypes.c_int64(0)
        args = [self.wa.ctypes.data, self.wb.ctypes.data, F32, *arrays, ctypes.byref(chosen)]
        assert pack(*args, None, ctypes.byref(size)) == 0
        if chosen.value not in (FUSED, FUSED_ANY_BATCH, FUSED_FROM_BATCH):
            return chosen.value, None
        raw = np.zeros(size.value + 64, "uint8")
        block = raw[(-raw.ctypes.data) % 64 :][: size.value]
        assert pack(*args, ctypes.c_void_p(block.ctypes.data), ctypes.byref(size)) == 0
        return chosen.value, block

    def at_batch(self, n, seed):
        """The same pair and weights on a new input of batch ``n``."""
        other = Pair(n, self.size, self.c, self.o, self.stride, self.pad, "bias", "bias", seed)
        other.epilogues = self.epilogues
        other.wa, other.wb, other.ba, other.bb = self.wa, self.wb, self.ba, self.bb
        return other

    def run(self, pair, block):
        y = np.full((self.n, self.out, self.out, self.o), 7.0, "float32")
        args = [self.x.ctypes.data, block.ctypes.data, y.ctypes.data, F32 | PACKED]
        for (ints, constants), bias in zip(self.halves(), (self.ba, self.bb)):
            args += [*ints, *constants, bias.ctypes.data, None, None, None]
        return pair(*args), y

    def expected(self):
        """The two convolutions and their epilogues in float64, as TVM defines them."""

        def epilogue(z, bias, which):
            ops, constants = self.epilogues[which]
            z = z + bias
            if "relu" in ops:
                return np.where(z > 0, z, 0.0)  # a NaN becomes 0
            if "relu_keep_nan" in ops:
                return np.where(z < 0, 0.0, z)
            if "clip" in ops:
                lo, hi, nan = constants
                return np.where(np.isnan(z), nan, np.minimum(np.maximum(z, lo), hi))
            return z

        with np.errstate(invalid="ignore", over="ignore"):
            x = self.x.astype("float64")
            middle = epilogue(x @ self.wa[0, 0].astype("float64"), self.ba, 0)
            before, s, out = self.pad, self.stride, self.out
            after = (out - 1) * s + 3 - self.size - before
            padded = np.pad(middle, ((0, 0), (before, after), (before, after), (0, 0)))
            z = np.zeros((self.n, out, out, self.o))
            for i in range(3):
                for j in range(3):
                    window = padded[:, i : i + s * (out - 1) + 1 : s, j : j + s * (out - 1) + 1 : s]
                    z = z + window * self.wb[i, j, 0].astype("float64")
            return epilogue(z, self.bb, 1)


def _assert_matches(got, want):
    """NaN where the definition has NaN, the same infinities, the rest to fp32 rounding."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


def _poison(pair: Pair, seed: int):
    rng = np.random.default_rng(seed)
    flat = pair.x.reshape(-1)
    for value in (np.nan, np.inf, -np.inf):
        flat[rng.integers(0, flat.size, 20)] = value


#: A pair whose intermediate (4 x 56 x 56 x 144 floats, 7 MiB) is larger than twice the L2
#: cache of two threads on every machine these tests run on: oneDNN has a fused kernel for it.
LARGE = dict(n=4, size=56, c=24, o=144)


@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 1), (2, 0)])
@pytest.mark.parametrize("first, second", [("relu6", "relu6"), ("relu", "bias")])
def test_the_fused_pair_computes_the_two_convolutions(monkeypatch, stride, pad, first, second):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    pair_call, pack = _library()
    pair = Pair(**LARGE, stride=stride, pad=pad, first=first, second=second)
    _poison(pair, stride + pad)
    choice, block = pair.pack(pack)
    assert choice == FUSED, NOT_FUSED.get(choice)
    status, got = pair.run(pair_call, block)
    assert status == 0
    _assert_matches(got, pair.expected())


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(1, 2),
    size=st.integers(9, 30),
    c=st.sampled_from([3, 8, 16]),
    o=st.sampled_from([8, 24, 40]),
    stride=st.sampled_from([1, 2]),
    pad=st.sampled_from([0, 1]),
    first=st.sampled_from(sorted(EPILOGUES)),
    second=st.sampled_from(sorted(EPILOGUES)),
    poisoned=st.booleans(),
)
def test_a_block_met_where_its_layouts_do_not_serve_runs_the_two_convolutions(
    monkeypatch, n, size, c, o, stride, pad, first, second, poisoned
):
    # Small pairs have no fused kernel; their block is made for the large pair's layouts,
    # so the call runs the two convolutions on the weights reordered from the block.
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", "1")
    pair_call, pack = _library()
    pair = Pair(n, size, c, o, stride, pad if stride == 2 else 1, first, second, seed=size)
    if poisoned:
        _poison(pair, size)
    large = Pair(n=4, size=56, c=c, o=o, stride=stride, pad=pair.pad, first=first, second=second)
    choice, block = large.pack(pack)
    # 3: no fused kernel even for the large pair of these channels; 4: no fused form of the
    # epilogue that the probes find exact (oneDNN's relu on NaN, for the relu that keeps NaN)
    assert choice in (FUSED, 3, 4), NOT_FUSED.get(choice)
    if block is None:
        return
    pair.wa, pair.wb = large.wa, large.wb  # what the block holds
    status, got = pair.run(pair_call, block)
    assert status == 0
    _assert_matches(got, pair.expected())


@pytest.mark.parametrize("first, second", [("relu6", "relu6"), ("relu", "clip_nan_lo")])
def test_the_fallback_of_a_large_pair_gives_what_the_fused_primitive_gives(
    monkeypatch, first, second
):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    pair_call, pack = _library()
    pair = Pair(**LARGE, stride=2, pad=0, first=first, second=second)
    _poison(pair, 3)
    choice, block = pair.pack(pack)
    assert choice == FUSED, NOT_FUSED.get(choice)
    fused_status, fused = pair.run(pair_call, block)
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", "1")
    separate_status, separate = pair.run(pair_call, block)
    assert fused_status == separate_status == 0
    _assert_matches(fused, pair.expected())
    _assert_matches(separate, pair.expected())


def test_what_is_not_a_pair_is_refused_with_its_reason(monkeypatch):
    _, pack = _library()
    # A 3 x 3 first convolution: no append_dw.
    pair = Pair(**LARGE, stride=1, pad=1, first="relu6", second="relu6")
    (ia, ca), (ib, cb) = pair.halves()
    ia[12:14] = [3, 3]
    ia[21:23] = [1, 1]
    pair.wa = np.ones((3, 3, pair.c, pair.o), "float32")
    pair.halves = lambda: [(ia, ca), (ib, cb)]
    assert pair.pack(pack) == (2, None)
    # An infinity in a weight.
    pair = Pair(**LARGE, stride=1, pad=1, first="relu6", second="relu6")
    pair.wb[1, 1, 0, 3] = np.inf
    assert pair.pack(pack) == (5, None)
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "separate")
    pair = Pair(**LARGE, stride=1, pad=1, first="relu6", second="relu6")
    assert pair.pack(pack) == (6, None)


def test_a_block_of_another_kind_is_refused():
    pair_call, _ = _library()
    pair = Pair(**LARGE, stride=1, pad=1, first="relu", second="relu")
    block = np.zeros(4096, "uint8")
    status, _ = pair.run(pair_call, block)
    assert status == 6  # TIR_BYOC_EPACKED


def _pair_header(block):
    """A pair block's PairHeader (conv.cpp): the fused weights' offsets, each convolution's own
    block's offset (0: none) and the least batch fused (0: every batch)."""
    fields = np.frombuffer(block[8:48].tobytes(), "uint64")
    return dict(offset=tuple(fields[0:2]), alone=tuple(fields[2:4]), fuse_from=int(fields[4]))


@pytest.mark.parametrize("stride, pad", [(1, 1), (2, 0)])
@pytest.mark.parametrize("first, second", [("relu6", "relu6"), ("relu", "clip_nan_lo")])
def test_a_block_for_a_symbolic_batch_serves_every_batch(monkeypatch, stride, pad, first, second):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    pair_call, pack = _library()
    pair = Pair(**LARGE, stride=stride, pad=pad, first=first, second=second)
    choice, block = pair.pack(pack, ANY_BATCH)
    assert choice in (FUSED_ANY_BATCH, FUSED_FROM_BATCH), NOT_FUSED.get(choice)
    header = _pair_header(block)
    assert all(header["alone"]) and header["alone"][0] > max(header["offset"])
    assert header["fuse_from"] == (pair.n if choice == FUSED_FROM_BATCH else 0)
    # Each batch on the fused primitive where it serves, else on the convolutions' own blocks;
    # then every call on the own blocks (TIR_BYOC_ONEDNN_TEST_REORDER: no layout serves, so
    # the own blocks are reordered too); then the own blocks below a raised fuse_from.
    raised = block.copy()
    raised[40:48] = np.frombuffer(np.uint64(pair.n + 1).tobytes(), "uint8")
    for reorder, which in ((False, block), (True, block), (False, raised)):
        if reorder:
            monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", "1")
        else:
            monkeypatch.delenv("TIR_BYOC_ONEDNN_TEST_REORDER", raising=False)
        for n in (1, 3, pair.n, 6):
            at_n = pair.at_batch(n, seed=n)
            _poison(at_n, n)
            status, got = at_n.run(pair_call, which)
            assert status == 0, (reorder, n)
            _assert_matches(got, at_n.expected())


def test_a_symbolic_batch_pair_is_refused_for_the_reasons_of_a_static_one(monkeypatch):
    _, pack = _library()
    pair = Pair(**LARGE, stride=1, pad=1, first="relu6", second="relu6")
    pair.wb[1, 1, 0, 3] = np.nan
    assert pair.pack(pack, ANY_BATCH) == (5, None)
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "separate")
    pair = Pair(**LARGE, stride=1, pad=1, first="relu6", second="relu6")
    assert pair.pack(pack, ANY_BATCH) == (6, None)
