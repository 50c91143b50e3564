"""Shared test helpers: compile a PrimFunc before and after offloading and compare every buffer.

(Not in conftest.py: tests/properties has a conftest of its own, and ``from byoc_testing import``
would pick whichever was imported first.)
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

import tir_byoc

TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "float64": (1e-9, 1e-9)}


def _concrete_shape(var, sizes):
    shape = []
    for dim in var.ty.shape:
        if isinstance(dim, tirx.IntImm):
            shape.append(int(dim.value))
        elif isinstance(dim, tirx.Var):
            shape.append(sizes.get(dim.name, 5))
        else:
            raise ValueError(f"cannot pick a concrete size for {dim}")
    return tuple(shape)


def random_arguments(func: tirx.PrimFunc, sizes=None, seed=0) -> list[np.ndarray]:
    """One random array per buffer parameter (symbolic dims from ``sizes``, default 5)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for param in func.params:
        dtype = str(param.ty.dtype)
        shape = _concrete_shape(param, sizes or {})
        if dtype.startswith("float"):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            info = np.iinfo(dtype)
            low, high = max(info.min, -100), min(info.max, 100)
            arrays.append(rng.integers(low, high, size=shape).astype(dtype))
    return arrays


def run(func: tirx.PrimFunc, arrays) -> list[np.ndarray]:
    """Build ``func`` for llvm, run it on copies of ``arrays``, return every buffer after."""
    built = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")
    tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
    built["main"](*tensors)
    return [t.numpy() for t in tensors]


def assert_equivalent(func: tirx.PrimFunc, sizes=None, expect_calls=None, **offload_options):
    """Offload ``func`` and check that every buffer ends up the same as without offloading.

    Returns the offloaded function.  ``expect_calls`` (dict intrinsic -> count) is checked
    against the offloaded blocks' annotations.
    """
    offloaded = tir_byoc.offload(func, **offload_options)
    arrays = random_arguments(func, sizes)
    expected, actual = run(func, arrays), run(offloaded, arrays)
    for param, want, got in zip(func.params, expected, actual):
        rtol, atol = TOLERANCE.get(str(param.ty.dtype), (0, 0))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=param.name)
    if expect_calls is not None:
        assert intrinsic_calls(offloaded) == expect_calls
    return offloaded


def intrinsic_calls(func: tirx.PrimFunc) -> dict[str, int]:
    """How many offloaded blocks call each intrinsic."""
    counts: dict[str, int] = {}

    def on_block(block):
        name = block.annotations.get(tir_byoc.rewrite.INTRINSIC_ATTR) if block.annotations else None
        if name is not None:
            counts[str(name)] = counts.get(str(name), 0) + 1

    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, on_block))
    return counts


def only_match(func) -> tir_byoc.Match:
    matches = tir_byoc.scan(func)
    assert len(matches) == 1, matches
    return matches[0]


def reasons(func) -> list[str]:
    return [r.reason for r in tir_byoc.explain(func)]
