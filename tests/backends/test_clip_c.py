"""The C epilogue's clip (intrinsics/include/tir_byoc_epilogue.h, its SSE span and the scalar
loop after it) against its definition, bit for bit: NaN to c2, below lo to lo, above hi to
hi, and every other value, signed zeros included, kept; for bounds in order, equal, NaN and
swapped, on every backend whose library runs the C epilogue."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tir_byoc import toolchain
from tir_byoc.epilogues import OPS

NAN = float("nan")
BOUNDS = [
    (0.0, 6.0, 6.0),  # ReLU6 as topi.clip spells it: NaN to hi
    (0.0, 6.0, 0.0),
    (0.0, 6.0, NAN),
    (-0.0, 0.0, 1.0),
    (0.0, -0.0, 2.0),
    (6.0, 6.0, 6.0),
    (NAN, 6.0, 6.0),
    (0.0, NAN, 3.0),
    (5.0, 3.0, 4.0),  # swapped: lo wins below lo, hi above hi
    (-np.inf, np.inf, 0.0),
]


def _values():
    """fp32 specials, signed zeros, denormals, the bounds' neighbours and random bit patterns,
    1003 of them: the vector span and a scalar tail."""
    specials = [NAN, -NAN, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38]
    near = np.nextafter(np.float32([0, 6, 3, 5]), np.float32(np.inf)).tolist()
    near += np.nextafter(np.float32([0, 6, 3, 5]), np.float32(-np.inf)).tolist()
    bits = np.random.default_rng(0).integers(0, 2**32, 1003, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32).copy()
    fixed = np.float32(specials + near + [0.0, 6.0, 3.0, 5.0, -1.0, 7.0])
    values[: len(fixed)] = fixed
    values[-len(fixed) :] = fixed
    return values


def _definition(v, lo, hi, nan):
    lo, hi, nan = np.float32(lo), np.float32(hi), np.float32(nan)
    return np.where(np.isnan(v), nan, np.where(v < lo, lo, np.where(v > hi, hi, v))).astype(
        np.float32
    )


@pytest.mark.parametrize("backend", ["ref", "onednn", "openblas"])
@pytest.mark.parametrize("bounds", BOUNDS, ids=str)
def test_the_c_clip_gives_its_definition_bit_for_bit(backend, bounds):
    if toolchain.unavailable(backend) is not None:
        pytest.skip(f"{backend} is not installed")
    epilogue = toolchain.entry_point(backend, "epilogue")
    values = _values()
    got = values.copy()
    null = ctypes.c_void_p(0)
    status = epilogue(
        ctypes.c_void_p(got.ctypes.data),
        1,
        got.size,
        OPS["clip"].code,
        *bounds,
        0.0,
        0.0,
        0.0,
        null,
        null,
        null,
        null,
    )
    assert status == 0
    want = _definition(values, *bounds)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
