"""Check that a rewritten PrimFunc computes what the original did.

Entry point: :func:`assert_equivalent` (or :func:`differences`, which returns the
mismatches instead of raising).  Both functions are compiled into one module with
``tvm.compile`` (the extern symbols of offloaded calls must already be loaded, as
:func:`tir_byoc.offload` does), run on the same random contents of *every* parameter, and
every parameter is compared afterwards, so an output nobody matched, an input written by
mistake or an output left unwritten all show up.  A parameter bound with a symbolic element
offset is passed as a view into a larger tensor, so that the offset is not 0.

Tolerances are per dtype, widened with the longest reduction (see :func:`tolerance`);
integer results must be exact.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx

#: Relative tolerance per float dtype; the absolute one also grows with sqrt(K).
_RTOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2, "float64": 1e-10}

_compiled: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


def tolerance(dtype: str, k: int) -> tuple[float, float]:
    """(rtol, atol) for comparing ``dtype`` values produced by sums of ``k`` products.

    Integers are compared exactly: (0, 0).
    """
    if dtype not in _RTOL:
        return 0.0, 0.0
    rtol = _RTOL[dtype]
    return rtol, rtol * math.sqrt(max(k, 1))


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def _extent(expr, bindings: Mapping) -> int:
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        for var, value in bindings.items():
            if (var if isinstance(var, str) else var.name) == expr.name:
                return int(value)
    raise ValueError(
        f"shape {expr} is neither a constant nor a variable given in bindings "
        f"(got {sorted(str(v) for v in bindings)})"
    )


def _shapes(func: tirx.PrimFunc, bindings: Mapping) -> list[tuple[tuple[int, ...], str]]:
    shapes = []
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            raise ValueError(f"parameter {param.name} is a scalar; expected only buffer parameters")
        shape = tuple(_extent(e, bindings) for e in param.ty.shape)
        shapes.append((shape, str(param.ty.dtype.dtype)))
    return shapes


def random_arguments(func: tirx.PrimFunc, bindings: Mapping | None = None, seed: int = 0):
    """Random NumPy arrays for every buffer parameter of ``func``.

    Floats are standard normal; int8/uint8 cover their whole range; wider integers stay
    within +-1000 so that sums of products cannot overflow.

    Parameters
    ----------
    bindings : mapping, optional
        Values of the symbolic shape variables, by Var or by name.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, dtype in _shapes(func, bindings or {}):
        if dtype.startswith(("float", "bfloat")):
            values = rng.standard_normal(shape)
        elif dtype in ("int8", "uint8"):
            info = np.iinfo(dtype)
            values = rng.integers(info.min, info.max, size=shape, endpoint=True)
        else:
            values = rng.integers(-1000, 1000, size=shape, endpoint=True)
        arrays.append(np.asarray(values).astype(_numpy_dtype(dtype)))
    return arrays


def longest_reduction(func: tirx.PrimFunc, bindings: Mapping | None = None) -> int:
    """The largest extent of a reduction iterator in ``func`` (1 if it has none)."""
    extents = [1]

    def on_block(block):
        for iter_var in block.iter_vars:
            if iter_var.iter_type == tirx.IterVar.CommReduce:
                extents.append(_extent(iter_var.dom.extent, bindings or {}))

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return max(extents)


def _compile(original: tirx.PrimFunc, rewritten: tirx.PrimFunc, target):
    key = (tvm_ffi.structural_hash(original), tvm_ffi.structural_hash(rewritten), str(target))
    if key in _compiled:
        _compiled.move_to_end(key)
        return _compiled[key]
    mod = tvm.IRModule(
        {
            "original": original.with_attr("global_symbol", "original"),
            "rewritten": rewritten.with_attr("global_symbol", "rewritten"),
        }
    )
    executable = tvm.compile(mod, target=target)
    _compiled[key] = executable
    if len(_compiled) > _CACHE_SIZE:
        _compiled.popitem(last=False)
    return executable


#: Bytes in front of a parameter bound with an element offset (a multiple of every alignment).
_VIEW_PADDING = 64


def _argument(array, param, device):
    """A tensor holding ``array``; a view at an offset when ``param`` has a symbolic offset."""
    if isinstance(param.ty.elem_offset, (tirx.IntImm, type(None))):
        return tvm.runtime.tensor(array, device)
    padding = _VIEW_PADDING // array.itemsize
    storage = np.zeros(array.size + padding, array.dtype)
    storage[padding:] = array.ravel()
    view = tvm.runtime.tensor(storage, device)._create_view(
        array.shape, relative_byte_offset=_VIEW_PADDING
    )
    return view


def _run(executable, name, func, arrays):
    device = tvm.cpu()
    tensors = [_argument(a, p, device) for a, p in zip(arrays, func.params)]
    executable[name](*tensors)
    return [t.numpy() for t in tensors]


def differences(
    original: tirx.PrimFunc,
    rewritten: tirx.PrimFunc,
    *,
    bindings: Mapping | None = None,
    seed: int = 0,
    target="llvm",
) -> list[str]:
    """Run both functions on the same random arguments; describe every parameter that differs.

    Parameters
    ----------
    original, rewritten : tvm.tirx.PrimFunc
        Functions with the same parameters (same shapes and dtypes).
    bindings : mapping, optional
        Run-time values of symbolic shape variables, by Var or by name.
    seed : int
        Seed of the random arguments.
    target : str or dict
        Passed to ``tvm.compile``.

    Returns
    -------
    list of str
        One line per differing parameter; empty when they agree.
    """
    bindings = bindings or {}
    if _shapes(original, bindings) != _shapes(rewritten, bindings):
        return ["the two functions take different parameters"]
    arrays = random_arguments(original, bindings, seed)
    executable = _compile(original, rewritten, target)
    expected = _run(executable, "original", original, arrays)
    actual = _run(executable, "rewritten", rewritten, arrays)
    k = longest_reduction(original, bindings)
    problems = []
    for param, want, got in zip(original.params, expected, actual):
        dtype = str(param.ty.dtype.dtype)
        rtol, atol = tolerance(dtype, k)
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        close = np.isclose(got64, want64, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            where = tuple(int(i) for i in np.argwhere(~close)[0])
            problems.append(
                f"{param.name} ({dtype}, rtol={rtol:g}, atol={atol:g}): "
                f"{int((~close).sum())} of {close.size} elements differ; first at {where}: "
                f"original {want64[where]!r}, rewritten {got64[where]!r}"
            )
    return problems


def assert_equivalent(original, rewritten, **kwargs) -> None:
    """Raise AssertionError naming each parameter whose contents differ after both runs.

    Keyword arguments are those of :func:`differences`.
    """
    problems = differences(original, rewritten, **kwargs)
    if problems:
        raise AssertionError("results differ after the rewrite:\n  " + "\n  ".join(problems))


__all__ = [
    "assert_equivalent",
    "differences",
    "longest_reduction",
    "random_arguments",
    "tolerance",
]
