"""oneDNN's weight packed by M (issue 50): for a GEMM whose M is known only at run time, a
block holding the weight in each layout oneDNN asks for over a sample of M
(``TIR_BYOC_PACK_LIBRARY_BY_M``), the call picking its M's copy; or a block holding the weight
and its transpose (``TIR_BYOC_PACK_LAYOUT_BY_M``), the call reading the one its range of M names.

A call computes what the plain weight gives at every M, whether its M's layout is in the
block or (``TIR_BYOC_ONEDNN_TEST_REORDER=1``, as for an M or a thread count whose layout the
block does not hold) a copy is reordered for that call; a block meets no call of another
weight shape; and a dynamic model packed this way equals torch at several sizes.
"""

import ctypes
import logging

import numpy as np
import pytest
from support.backend_checks import library

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.packing import PACK_FORMS
from tir_byoc.signature import PACKED_WEIGHT_FLAG
from tir_byoc.testing import models

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="the oneDNN backend is not available"
)

BY_M = next(code for code, name in PACK_FORMS.items() if name == "library_by_m")
LAYOUT_BY_M = next(code for code, name in PACK_FORMS.items() if name == "layout_by_m")
LIBRARY, TRANSPOSED = 1, 2
EPACKED = 6
F32 = 0x010101
KN = 1  # the weight's layout: a matmul's K x N
K, N = 96, 80
RNG = np.random.default_rng(50)
WEIGHT = RNG.standard_normal((K, N)).astype("float32")
BIAS = RNG.standard_normal(N).astype("float32")
ROWS = [1, 7, 32, 100, 257, 1000]


def _epilogue():
    """bias then gelu: op codes, one per byte, and the gelu's constant."""
    ops = tir_byoc.epilogues.OPS
    return ops["bias"].code | ops["gelu"].code << 8, np.sqrt(0.5)


def _pack(weight, form, m=1, n=N, k=K):
    """``weight`` packed in ``form`` for a call of m rows: a 64-byte aligned uint8 block."""
    pack = library("onednn").tir_byoc_onednn_pack
    pack.restype = ctypes.c_int32
    codes, constant = _epilogue()
    args = [ctypes.c_void_p(weight.ctypes.data), *map(ctypes.c_int64, (m, n, k))]
    args += [ctypes.c_int32(F32), ctypes.c_int32(KN), ctypes.c_int64(codes)]
    args += [ctypes.c_double(constant), *(ctypes.c_double(0) for _ in range(5))]
    chosen, size = ctypes.c_int32(form), ctypes.c_int64(0)
    assert pack(*args, ctypes.byref(chosen), None, ctypes.byref(size)) == 0
    storage = np.zeros(size.value + 64, np.uint8)
    start = (-storage.ctypes.data) % 64
    block = storage[start : start + size.value]
    out = ctypes.c_void_p(block.ctypes.data)
    assert pack(*args, ctypes.byref(chosen), out, ctypes.byref(size)) == 0
    return block


def _gemm(x, w, flags, n=N, k=K):
    """The gemm entry point's status and output for ``x`` (m x k) and the weight ``w``."""
    gemm = library("onednn").tir_byoc_onednn_gemm
    gemm.restype = ctypes.c_int32
    codes, constant = _epilogue()
    m = x.shape[0]
    y = np.full((m, n), np.nan, np.float32)
    bias = BIAS[:n] if n <= N else np.zeros(n, np.float32)
    args = [ctypes.c_void_p(a.ctypes.data) for a in (x, w, y)]
    args += [*map(ctypes.c_int64, (m, n, k)), ctypes.c_int32(F32 | flags), ctypes.c_int32(KN)]
    args += [*map(ctypes.c_int64, (1, 1, 0, 0, 0, 0)), ctypes.c_int64(codes)]
    args += [ctypes.c_double(constant), *(ctypes.c_double(0) for _ in range(5))]
    args += [ctypes.c_void_p(bias.ctypes.data), *(ctypes.c_void_p(None) for _ in range(3))]
    return gemm(*args), y


@pytest.mark.parametrize("reorder", ["0", "1"])
def test_every_m_computes_what_the_library_form_for_that_m_computes(monkeypatch, reorder):
    """Each M runs on the copy in its layout (or, reordering, on one made for the call): the
    bits of a block packed for that very M, and the plain weight's result within rounding."""
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", reorder)
    block = _pack(WEIGHT, BY_M)
    for m in ROWS:
        x = RNG.standard_normal((m, K)).astype("float32")
        status, y = _gemm(x, block, PACKED_WEIGHT_FLAG)
        assert status == 0, m
        status, for_m = _gemm(x, _pack(WEIGHT, LIBRARY, m=m), PACKED_WEIGHT_FLAG)
        assert status == 0, m
        np.testing.assert_array_equal(y, for_m, err_msg=f"m = {m}")
        status, plain = _gemm(x, WEIGHT, 0)
        assert status == 0, m
        np.testing.assert_allclose(y, plain, rtol=1e-5, atol=1e-5, err_msg=f"m = {m}")


def test_the_block_names_its_form_version_and_copies():
    block = _pack(WEIGHT, BY_M)
    header = block[:64].view(np.uint64)
    assert bytes(block[:8]) == b"tirbyocP"
    assert header[3] == BY_M  # the form
    assert header[4] == 1  # the format's version
    assert 1 <= header[5] <= 4  # the copies the table lists
    assert block.size >= 64 + 128 + header[5] * K * N * 4


def test_a_block_by_m_meets_no_call_of_another_weight_shape(monkeypatch):
    block = _pack(WEIGHT, BY_M)
    x = RNG.standard_normal((7, K)).astype("float32")
    for reorder in ("0", "1"):  # neither a copy nor a reorder serves another shape
        monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", reorder)
        status, _ = _gemm(x, block, PACKED_WEIGHT_FLAG, n=N - 16)
        assert status == EPACKED
        status, _ = _gemm(x[:, : K - 16].copy(), block, PACKED_WEIGHT_FLAG, k=K - 16)
        assert status == EPACKED
    # Another version of the format, a table past the block's end, or none: refused too.
    for field, value in ((4, 2), (5, 0), (5, 5)):
        stale = block.copy()
        stale[field * 8 : field * 8 + 8] = np.frombuffer(np.uint64(value).tobytes(), np.uint8)
        assert _gemm(x, stale, PACKED_WEIGHT_FLAG)[0] == EPACKED, (field, value)
    # A table naming a layout no primitive asks for and no format tag gives: refused.
    unknown = block.copy()
    unknown[64:72] ^= 0xFF
    assert _gemm(x, unknown, PACKED_WEIGHT_FLAG)[0] == EPACKED
    outside = block.copy()
    outside[64 + 8 : 64 + 16] = np.frombuffer(np.uint64(block.size).tobytes(), np.uint8)
    assert _gemm(x, outside, PACKED_WEIGHT_FLAG)[0] == EPACKED
    # A block of another form with the version set is not one this file makes.
    library_block = _pack(WEIGHT, LIBRARY, m=7)
    library_block[32:40] = np.frombuffer(np.uint64(1).tobytes(), np.uint8)
    assert _gemm(x, library_block, PACKED_WEIGHT_FLAG)[0] == EPACKED


def test_a_symbolic_m_chooses_plain_transposed_or_by_m_and_sizes_its_block():
    pack = library("onednn").tir_byoc_onednn_pack
    pack.restype = ctypes.c_int32
    codes, constant = _epilogue()
    args = [ctypes.c_void_p(WEIGHT.ctypes.data), *map(ctypes.c_int64, (1, N, K))]
    args += [ctypes.c_int32(F32), ctypes.c_int32(KN), ctypes.c_int64(codes)]
    args += [ctypes.c_double(constant), *(ctypes.c_double(0) for _ in range(5))]
    form, size = ctypes.c_int32(-2), ctypes.c_int64(-1)
    assert pack(*args, ctypes.byref(form), None, ctypes.byref(size)) == 0
    assert form.value in (0, TRANSPOSED, BY_M, LAYOUT_BY_M)  # never the library's for one M
    assert (size.value == 0) == (form.value == 0)


def test_a_block_by_layout_reads_the_copy_its_range_of_m_names(monkeypatch):
    """Each M reads the copy its range (a power of two to the next) names: the bits of the
    transposed block made for that M, or of the plain weight; the plain result within
    rounding either way."""
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "layout_by_m")  # the transpose every other range
    block = _pack(WEIGHT, LAYOUT_BY_M)
    header = block[:64].view(np.uint64)
    assert header[3] == LAYOUT_BY_M and header[4] == 1  # the form, the format's version
    assert list(block[64 + 48 : 64 + 64]) == [1, 0] * 8  # the copy of each range of M
    assert block.size >= 64 + 64 + 2 * K * N * 4
    read = set()
    for m in ROWS:
        x = RNG.standard_normal((m, K)).astype("float32")
        status, y = _gemm(x, block, PACKED_WEIGHT_FLAG)
        assert status == 0, m
        transposed = (m.bit_length() - 1) % 2 == 0
        read.add(transposed)
        if transposed:
            status, expected = _gemm(x, _pack(WEIGHT, TRANSPOSED, m=m), PACKED_WEIGHT_FLAG)
        else:
            status, expected = _gemm(x, WEIGHT, 0)
        assert status == 0, m
        np.testing.assert_array_equal(y, expected, err_msg=f"m = {m}")
        status, plain = _gemm(x, WEIGHT, 0)
        np.testing.assert_allclose(y, plain, rtol=1e-5, atol=1e-5, err_msg=f"m = {m}")
    assert read == {False, True}  # both copies served a call


def test_a_block_by_layout_meets_no_call_of_another_weight_shape_or_a_bad_table(monkeypatch):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "layout_by_m")
    block = _pack(WEIGHT, LAYOUT_BY_M)
    x = RNG.standard_normal((7, K)).astype("float32")
    assert _gemm(x, block, PACKED_WEIGHT_FLAG)[0] == 0
    assert _gemm(x, block, PACKED_WEIGHT_FLAG, n=N - 16)[0] == EPACKED
    assert _gemm(x[:, : K - 16].copy(), block, PACKED_WEIGHT_FLAG, k=K - 16)[0] == EPACKED

    def changed(at, value, dtype=np.uint64):
        stale = block.copy()
        raw = np.frombuffer(np.array(value, dtype).tobytes(), np.uint8)
        stale[at : at + raw.size] = raw
        return stale

    # Another version; a copy's layout that is not the one its primitive reads (m = 7 reads
    # the transposed copy, m = 32 the plain one); an offset or size outside the block; a range
    # that names neither copy.
    rows_32 = RNG.standard_normal((32, K)).astype("float32")
    for stale, rows in (
        (changed(32, 2), x),
        (changed(64 + 8, 12345), x),
        (changed(64, 12345), rows_32),
        (changed(64 + 16, 1), x),
        (changed(64 + 24, block.size), x),
        (changed(64 + 40, block.size), x),
        (changed(64 + 48 + 2, 2, np.uint8), x),
    ):
        assert _gemm(rows, stale, PACKED_WEIGHT_FLAG)[0] == EPACKED


# -- a dynamic model ------------------------------------------------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["library_by_m", "layout_by_m"])
def bert(request):
    """A dynamic BERT with every weight in the form by M ``request.param`` names."""
    pytest.importorskip("transformers")
    real = models.bert()
    with pytest.MonkeyPatch.context() as patch:
        # "library" names the library's layouts by M for a symbolic M.
        named = "library" if request.param == "library_by_m" else request.param
        patch.setenv("TIR_BYOC_ONEDNN_PACK", named)
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("tir_byoc")
        logger.addHandler(handler)
        previous = logger.level
        logger.setLevel(logging.INFO)
        try:
            built = tir_byoc.build_model(
                real.module,
                real.inputs,
                dynamic={0: {0: ("batch", 1, 8), 1: ("seq", 1, 32)}},
                backends="onednn",
            )
        finally:
            logger.removeHandler(handler)
            logger.setLevel(previous)
    packed = [r.getMessage() for r in records if r.getMessage().startswith("packed: ")]
    return real, built, packed, request.param


@pytest.mark.parametrize("reorder", ["0", "1"])
def test_a_dynamic_bert_packed_by_m_equals_torch_at_several_sizes(bert, monkeypatch, reorder):
    real, built, packed, form = bert
    assert packed and all(line.endswith(f"({form})") for line in packed), packed
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", reorder)
    generator = torch.Generator().manual_seed(50)
    for batch, sequence in ((1, 1), (1, 7), (3, 16), (2, 32)):
        ids = torch.randint(0, models.VOCAB, (batch, sequence), generator=generator)
        with torch.no_grad():
            expected = real.module(ids)
        np.testing.assert_allclose(
            built(ids).numpy(), expected.numpy(), rtol=1e-4, atol=1e-4, err_msg=str(ids.shape)
        )
