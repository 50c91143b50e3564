"""Which convolutions stay convolutions: the choice between a backend's convolution and
im2col + GEMM (:mod:`.convolutions`), made before ``LegalizeOps``.

A backend with a convolution intrinsic of its own (``onednn.conv``: oneDNN's convolution
primitive) serves a convolution that reaches TIR whole, matched there like a GEMM
(:mod:`tir_byoc.match.conv`); every other backend gets the convolution as im2col and a GEMM.
Where both apply, :func:`choose` decides per convolution, by measurement on this machine: it
times the convolution intrinsic on the convolution's shape (its weight in the form its pack
function chooses, as a constant weight is packed) and the GEMM that im2col would
call (``m`` output positions, ``n`` output channels, ``k`` input channels of a group times the
window; once per group) through the gemm entry point of the backend that serves GEMMs, and
keeps the convolution if it takes at most 5 % longer than that GEMM alone when its window is
wider than one position (im2col gathers each input value that many times before the GEMM), and
only if it is 5 % faster for a 1x1 one (MobileNetV2's 1x1 convolutions, as fast either way,
ran slower in the model as convolutions).  A depthwise convolution, which
im2col leaves to TVM's loop, goes to the convolution
intrinsic without timing.

``TIR_BYOC_CONVOLUTIONS=native|im2col|auto`` (default ``auto``) forces either path or measures.
The backends considered are those of :func:`backends_in_scope` (``build_model`` sets its
``backends``), else ``$TIR_BYOC_BACKENDS``, else all; the reference convolution (priority 0,
the oracle) never takes a convolution from im2col.

Entry points: :func:`native_convolution`, :func:`choose` and :func:`backends_in_scope`.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import time
from contextvars import ContextVar

import numpy as np
from tvm import tirx

from .. import toolchain
from ..match import Match
from ..match.conv_records import CONV_ENTRY
from ..registry import REGISTRY, Registry, backend_order, choose_one
from ..signature import PACKED_WEIGHT_FLAG, DtypeSignature

#: ``native``, ``im2col`` or ``auto`` (the default: measured).
MODE_ENV = "TIR_BYOC_CONVOLUTIONS"
_MODES = ("native", "im2col", "auto")

_F32 = DtypeSignature.parse("float32")
_BACKENDS: ContextVar = ContextVar("tir_byoc_convolution_backends", default=None)


@contextlib.contextmanager
def backends_in_scope(backends):
    """Within the block, :func:`native_convolution` considers ``backends`` (None: all)."""
    token = _BACKENDS.set(backends)
    try:
        yield
    finally:
        _BACKENDS.reset(token)


def mode() -> str:
    """``$TIR_BYOC_CONVOLUTIONS``, checked."""
    value = os.environ.get(MODE_ENV, "auto") or "auto"
    if value not in _MODES:
        raise ValueError(f"${MODE_ENV}: expected one of {list(_MODES)}, got {value!r}")
    return value


def native_convolution(registry: Registry = REGISTRY) -> str | None:
    """The convolution intrinsic that takes convolutions whole in place of im2col, or None:
    the first allowed, available one of priority above 0, by backend order or priority."""
    order = backend_order(_BACKENDS.get(), registry)
    found = [i for i in registry if i.pattern == CONV_ENTRY and i.priority > 0]
    if order is not None:
        rank = {b: r for r, b in enumerate(order)}
        found = sorted((i for i in found if i.backend in rank), key=lambda i: rank[i.backend])
    else:
        found.sort(key=lambda i: -i.priority)
    for intrinsic in found:
        if toolchain.unavailable(intrinsic.backend, registry) is None:
            return intrinsic.name
    return None


def _median_seconds(call, repeats: int = 5) -> float:
    call()  # warm-up: primitive creation, pages, caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _buffer(count: int, seed: int):
    values = np.random.default_rng(seed).uniform(-1, 1, max(count, 1)).astype("float32")
    return values, ctypes.c_void_p(values.ctypes.data)


def _time_conv(intrinsic, geometry, registry) -> float:
    """Median seconds of the conv entry point on ``geometry``, its weight in the form the
    backend's pack function chooses for it (as ``build_model`` packs a constant weight)."""
    backend = registry[intrinsic].backend
    conv = toolchain.entry_point(backend, "conv", registry)
    pack = toolchain.entry_point(backend, "conv_pack", registry)
    args = geometry.call_arguments()
    n, c, o = args[2:5]
    x = _buffer(n * c * math.prod(geometry.in_size), 1)
    w = _buffer(o * (c // geometry.groups) * math.prod(geometry.kernel), 2)
    y = _buffer(n * o * math.prod(geometry.out_size), 3)
    null = ctypes.c_void_p(0)
    weight, dtypes, block = w[1], _F32.code, None
    if pack is not None:
        form, size = ctypes.c_int32(-1), ctypes.c_int64(0)  # TIR_BYOC_PACK_CHOOSE
        head = [w[1], _F32.code, *args, 0, *([0.0] * 6)]
        if pack(*head, ctypes.byref(form), None, ctypes.byref(size)) == 0 and size.value:
            block = np.zeros(size.value + 64, "uint8")
            start = (-block.ctypes.data) % 64
            address = ctypes.c_void_p(block.ctypes.data + start)
            if pack(*head, ctypes.byref(form), address, ctypes.byref(size)) == 0:
                weight, dtypes = address, _F32.code | PACKED_WEIGHT_FLAG

    def call():
        status = conv(x[1], weight, y[1], dtypes, *args, 0, *([0.0] * 6), *([null] * 4))
        if status != 0:
            raise RuntimeError(f"{intrinsic} failed with status {status} while timed")

    return _median_seconds(call)


def _gemm_backend(registry) -> str | None:
    """The backend that would serve im2col's GEMM (a ``matmul`` of the columns)."""
    one = tirx.IntImm("int64", 1)
    stand_in = Match("f", "matmul", (), _F32, one, one, one, *([None] * 4))
    order = backend_order(_BACKENDS.get(), registry)
    choice = choose_one(stand_in, registry, lambda b: toolchain.unavailable(b, registry), order)
    return registry[choice.intrinsic].backend if choice.intrinsic else None


def _time_gemm(backend, geometry, registry) -> float:
    gemm = toolchain.entry_point(backend, "gemm", registry)
    m = geometry.batch * math.prod(geometry.out_size)
    n = geometry.out_channels // geometry.groups
    k = geometry.channels // geometry.groups * math.prod(geometry.kernel)
    x, w, y = _buffer(m * k, 1), _buffer(k * n, 2), _buffer(m * n, 3)
    null = ctypes.c_void_p(0)

    def call():
        for _ in range(geometry.groups):
            status = gemm(
                x[1],
                w[1],
                y[1],
                m,
                n,
                k,
                _F32.code,
                1,
                1,
                1,
                0,
                0,
                0,
                0,
                0,
                *([0.0] * 6),
                *([null] * 4),
            )
            if status != 0:
                raise RuntimeError(f"{backend}.gemm failed with status {status} while timed")

    return _median_seconds(call)


def choose(geometry, registry: Registry = REGISTRY) -> tuple[bool, str]:
    """``(native, why)``: whether the convolution of ``geometry`` stays a convolution for the
    native convolution intrinsic, and why (for the logs and ``explain``)."""
    chosen = mode()
    native = native_convolution(registry)
    if native is None:
        return False, "no backend allowed here has a convolution of its own"
    if chosen == "native":
        return True, f"${MODE_ENV}=native"
    if chosen == "im2col":
        return False, f"${MODE_ENV}=im2col"
    if geometry.depthwise:
        return True, "depthwise: im2col leaves it to TVM's loop"
    backend = _gemm_backend(registry)
    if backend is None or toolchain.entry_point(backend, "gemm", registry) is None:
        return True, "no backend serves im2col's GEMM here"
    conv_time = _time_conv(native, geometry, registry)
    gemm_time = _time_gemm(backend, geometry, registry)
    # A window wider than one position makes im2col gather each input value that many times
    # before its GEMM: the convolution keeps a near tie there (ResNet-50 ran 6 % faster so than
    # with the 5 % margin); a 1x1 one must win by 5 %.
    margin = 0.95 if math.prod(geometry.kernel) == 1 else 1.05
    if conv_time > margin * gemm_time:
        return False, (
            f"im2col's GEMM alone on {backend} took {gemm_time * 1e3:.3g} ms, {native} "
            f"{conv_time * 1e3:.3g} ms"
        )
    return True, (
        f"{native} took {conv_time * 1e3:.3g} ms, im2col's GEMM alone on {backend} "
        f"{gemm_time * 1e3:.3g} ms"
    )


__all__ = ["MODE_ENV", "backends_in_scope", "choose", "mode", "native_convolution"]
