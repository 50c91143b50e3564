"""Which oneDNN implementation a packed conv weight runs on (intrinsics/onednn/conv.cpp): the
pack step times every implementation oneDNN offers for the call and records the one it keeps
in the block's header; a call runs the one its block names (oneDNN's first when the name is
empty or not offered), and computes what the reference convolution computes on each."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from support.backend_checks import onednn_executed

from tir_byoc import toolchain
from tir_byoc.epilogues import OPS

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="oneDNN is not installed"
)

F32 = 0x10101
PACKED = 1 << 25
CHOOSE, PLAIN, LIBRARY = -1, 0, 1
NULL = ctypes.c_void_p(0)
#: Where a block's header holds the implementation's name, and its room (PackHeader).
IMPLEMENTATION, IMPLEMENTATION_BYTES = 520, 48


def _pointer(array):
    return ctypes.c_void_p(array.ctypes.data)


def _shape(n, channels, size):
    """The conv entry point's geometry of a channels-last depthwise 3x3 (HWIO weight), pad 1:
    MobileNetV2's, for which oneDNN offers several kernels."""
    return [
        *(1, 1, n, channels, channels, channels),
        *(size, size, 1),
        *(size, size, 1),
        *(3, 3, 1),
        *(1, 1, 1),
        *(1, 1, 1),
        *(1, 1, 0),
    ]


OPS_CALLED = ("bias", "relu")
CODES = OPS["bias"].code | (OPS["relu"].code << 8)


def _aligned(size):
    raw = np.zeros(size + 64, "uint8")
    offset = (-raw.ctypes.data) % 64
    return raw[offset : offset + size]


def _pack(shape, w, form):
    """(form, block) of oneDNN's pack function for ``w`` (the block None for the plain form)."""
    pack = toolchain.entry_point("onednn", "conv_pack")
    chosen, size = ctypes.c_int32(form), ctypes.c_int64(0)
    args = [_pointer(w), F32, *shape, CODES, *[0.0] * 6]
    assert pack(*args, ctypes.byref(chosen), None, ctypes.byref(size)) == 0
    if size.value == 0:
        return chosen.value, None
    block = _aligned(size.value)
    assert pack(*args, ctypes.byref(chosen), _pointer(block), ctypes.byref(size)) == 0
    return chosen.value, block


def _run(shape, x, weight, y, bias, backend="onednn", packed=True):
    """The conv entry point of ``backend`` with the bias and relu; ``weight`` a block if
    ``packed``."""
    conv = toolchain.entry_point(backend, "conv")
    flags = F32 | (PACKED if packed else 0)
    return conv(
        _pointer(x),
        _pointer(weight),
        _pointer(y),
        flags,
        *shape,
        CODES,
        *[0.0] * 6,
        _pointer(bias),
        NULL,
        NULL,
        NULL,
    )


def _inputs(n, channels, size, seed=0):
    """x, w and bias of small integers: every sum exact in fp32, in any order, so that every
    kernel gives the reference's bits."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, n * size * size * channels).astype("float32")
    w = rng.integers(-2, 3, 9 * channels).astype("float32")
    bias = rng.integers(-4, 5, channels).astype("float32")
    return x, w, bias


def _reference(shape, x, w, bias, count):
    want = np.zeros(count, "float32")
    assert _run(shape, x, w, want, bias, "ref", False) == 0
    return want


def _name(block) -> str:
    return (
        bytes(block[IMPLEMENTATION : IMPLEMENTATION + IMPLEMENTATION_BYTES])
        .split(b"\0")[0]
        .decode()
    )


def _kernels(run, capfd):
    """The kernel of each convolution oneDNN executed during ``run()`` (its verbose log)."""
    return [f[1] for f in onednn_executed(run, capfd) if f[0] == "convolution"]


def _has_avx2() -> bool:
    return " avx2" in Path("/proc/cpuinfo").read_text()


@pytest.mark.skipif(not _has_avx2(), reason="the CPU has no AVX2 (oneDNN offers no jit_dw:avx2)")
@pytest.mark.parametrize(
    ("named", "runs_named"), [("jit_dw:avx2", True), ("no_such_kernel", False)]
)
def test_a_block_runs_the_implementation_its_header_names(named, runs_named, capfd):
    n, channels, size = 1, 32, 12
    shape = _shape(n, channels, size)
    x, w, bias = _inputs(n, channels, size)
    count = n * channels * size * size
    want = _reference(shape, x, w, bias, count)
    _, block = _pack(shape, w, LIBRARY)  # oneDNN's first implementation: no name
    assert _name(block) == ""
    got = np.full(count, np.nan, "float32")
    assert _run(shape, x, block, got, bias) == 0
    (first,) = _kernels(lambda: _run(shape, x, block, got, bias), capfd)
    # The same block naming another implementation: it runs that one (its weight reordered
    # into that kernel's layout when it asks for another), or oneDNN's first for a name it
    # does not offer.
    encoded = named.encode()
    block[IMPLEMENTATION : IMPLEMENTATION + len(encoded)] = np.frombuffer(encoded, "uint8")
    renamed = np.full(count, np.nan, "float32")
    assert _run(shape, x, block, renamed, bias) == 0
    (kernel,) = _kernels(lambda: _run(shape, x, block, renamed, bias), capfd)
    assert kernel == (named if runs_named else first)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(renamed, want)


@pytest.mark.parametrize("setting", [None, "first"])
def test_a_chosen_block_runs_the_implementation_it_names(setting, monkeypatch, capfd):
    # A shape of its own per case: the choice is made once per shape in a process.
    n, channels, size = 2, 48, 20 if setting is None else 18
    if setting is not None:
        monkeypatch.setenv("TIR_BYOC_ONEDNN_CONV_KERNEL", setting)
    shape = _shape(n, channels, size)
    x, w, bias = _inputs(n, channels, size, seed=1)
    count = n * channels * size * size
    want = _reference(shape, x, w, bias, count)
    form, block = _pack(shape, w, CHOOSE)
    got = np.full(count, np.nan, "float32")
    if block is None:
        assert form == PLAIN
        assert _run(shape, x, w, got, bias, packed=False) == 0
    else:
        assert _run(shape, x, block, got, bias) == 0
        name = _name(block)
        if setting == "first" or form != LIBRARY:
            assert name == ""
        if name:
            (kernel,) = _kernels(lambda: _run(shape, x, block, got, bias), capfd)
            assert kernel == name
    np.testing.assert_array_equal(got, want)
