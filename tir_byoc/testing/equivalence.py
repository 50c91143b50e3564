"""Check that a rewritten PrimFunc computes what the original did: compile, run, compare.

Entry point: :func:`assert_equivalent` (or :func:`differences`, which returns the
mismatches instead of raising).  Both functions are compiled into one module with
``tvm.compile`` (the extern symbols of offloaded calls must already be loaded, as
:func:`tir_byoc.offload` does), run on the same random contents of *every* parameter
(:func:`tir_byoc.testing.inputs.random_arguments`), and every parameter is compared
afterwards, so an output nobody matched, an input written by mistake or an output left
unwritten all show up.  :func:`run` runs one function the same way.  A parameter bound with
a symbolic element offset is passed as a view into a larger tensor, so that the offset is
not 0; one declared with explicit strides is passed with those strides, its elements spread
over a larger storage.

Tolerances are per dtype, widened with the longest reduction (see :func:`tolerance`);
integer results must be exact.  NaN must come out where the original puts it and nowhere
else, infinities with their sign.  For inputs far from 1 (``magnitude``) or epilogues that
scale the product's rounding errors up, ``normwise`` compares the finite values with the
absolute tolerance times the largest finite value of the parameter: a sum of large products
with opposite signs may cancel to a small result whose few correct digits differ between two
summation orders.  This is the one implementation of compiling, running and
comparing that tir_byoc's tests use.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .inputs import concrete_extent, numpy_dtype, parameter_shapes, random_arguments

#: Relative tolerance per float dtype; the absolute one also grows with sqrt(K).
_RTOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 2e-2, "float64": 1e-10}

#: Compiled modules, most recently used last: (functions by name, target) -> executable.
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


def longest_reduction(func: tirx.PrimFunc, bindings: Mapping | None = None) -> int:
    """The largest extent of a reduction iterator in ``func`` (1 if it has none).

    Extents are constants or variables given in ``bindings`` (by Var or name); one that is
    neither (an expression) is left out.
    """
    extents = [1]

    def on_block(block):
        for iter_var in block.iter_vars:
            if iter_var.iter_type != tirx.IterVar.CommReduce:
                continue
            extent = iter_var.dom.extent
            if isinstance(extent, (tirx.IntImm, tirx.Var)):
                extents.append(concrete_extent(extent, bindings or {}))

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return max(extents)


def compile_functions(functions: Mapping[str, tirx.PrimFunc], target="llvm"):
    """``tvm.compile`` the functions into one module, each callable by its key.

    The last few modules are kept: compiling structurally equal functions again for the same
    target returns the module already built.
    """
    named = {name: func.with_attr("global_symbol", name) for name, func in functions.items()}
    key = (tuple((name, tvm_ffi.structural_hash(f)) for name, f in named.items()), str(target))
    cached = _compiled.get(key)
    if cached is not None and all(
        tvm_ffi.structural_equal(cached[0][name], func) for name, func in named.items()
    ):
        _compiled.move_to_end(key)
        return cached[1]
    executable = tvm.compile(tvm.IRModule(named), target=target)
    _compiled[key] = (named, executable)
    if len(_compiled) > _CACHE_SIZE:
        _compiled.popitem(last=False)
    return executable


#: Bytes in front of a parameter bound with an element offset (a multiple of every alignment).
_VIEW_PADDING = 64


def _argument(array, param, device, bindings):
    """(tensor holding ``array``, reader of its contents after the call).

    The tensor is a view at an offset when ``param`` has a symbolic offset, and has
    ``param``'s strides when it declares explicit ones.
    """
    if len(param.ty.strides):
        return _strided(array, param, bindings)
    if isinstance(param.ty.elem_offset, (tirx.IntImm, type(None))):
        tensor = tvm.runtime.tensor(array, device)
        return tensor, tensor.numpy
    padding = _VIEW_PADDING // array.itemsize
    storage = np.zeros(array.size + padding, array.dtype)
    storage[padding:] = array.ravel()
    view = tvm.runtime.tensor(storage, device)._create_view(
        array.shape, relative_byte_offset=_VIEW_PADDING
    )
    return view, view.numpy


def _strided(array, param, bindings):
    """``array`` laid out with ``param``'s explicit strides in aligned storage, shared with
    the tensor passed (so the reader sees what the call wrote).  It goes through DLPack,
    which has no bfloat16."""
    if numpy_dtype(param.ty.dtype.dtype).name == "bfloat16":
        raise ValueError(
            f"parameter {param.name}: explicit strides on a bfloat16 buffer cannot be passed "
            "(DLPack has no bfloat16)"
        )
    strides = [concrete_extent(s, bindings) for s in param.ty.strides]
    span = 1 + sum((extent - 1) * stride for extent, stride in zip(array.shape, strides))
    itemsize = numpy_dtype(array.dtype).itemsize
    raw = np.zeros(max(span, 1) * itemsize + _VIEW_PADDING, np.uint8)
    start = -raw.ctypes.data % _VIEW_PADDING  # the kernels may assume aligned data
    storage = raw[start : start + max(span, 1) * itemsize].view(array.dtype)
    view = np.lib.stride_tricks.as_strided(
        storage, array.shape, [s * itemsize for s in strides], writeable=True
    )
    view[...] = array
    tensor = tvm_ffi.from_dlpack(view, require_alignment=0, require_contiguous=False)
    return tensor, view.copy


def _call(executable, name, func, arrays, bindings=None) -> list[np.ndarray]:
    device = tvm.cpu()
    placed = [_argument(a, p, device, bindings or {}) for a, p in zip(arrays, func.params)]
    executable[name](*(tensor for tensor, _ in placed))
    return [read() for _, read in placed]


def run(
    func: tirx.PrimFunc,
    arrays: Sequence[np.ndarray],
    *,
    bindings: Mapping | None = None,
    target="llvm",
) -> list[np.ndarray]:
    """Compile ``func``, run it on copies of ``arrays`` (one per parameter), return every
    parameter's contents afterwards.  ``arrays`` are left as they were; ``bindings`` give
    symbolic extents that explicit strides use."""
    executable = compile_functions({"main": func}, target)
    return _call(executable, "main", func, arrays, bindings)


def differences(
    original: tirx.PrimFunc,
    rewritten: tirx.PrimFunc,
    *,
    bindings: Mapping | None = None,
    seed: int = 0,
    target="llvm",
    magnitude: float = 1.0,
    special: float = 0.0,
    normwise: bool = False,
    replaced: Mapping[int, Callable[[np.ndarray], np.ndarray]] | None = None,
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
    magnitude, special : float
        How the float arguments are drawn (see :func:`~.inputs.random_array`): normal times
        ``magnitude``, ``special`` of the elements NaN or infinite.
    normwise : bool
        Compare finite values with the absolute tolerance scaled by the parameter's largest
        finite value (see the module notes).
    replaced : mapping of int to callable, optional
        Parameters ``rewritten`` takes in another form, by index: each callable makes the
        argument ``rewritten`` gets from the one ``original`` gets (a packed weight's block
        from the weight).  Those parameters are not compared.

    Returns
    -------
    list of str
        One line per differing parameter; empty when they agree.
    """
    bindings, replaced = bindings or {}, replaced or {}
    shapes = [parameter_shapes(f, bindings) for f in (original, rewritten)]
    if len(shapes[0]) != len(shapes[1]) or any(
        a != b for i, (a, b) in enumerate(zip(*shapes)) if i not in replaced
    ):
        return ["the two functions take different parameters"]
    arrays = random_arguments(original, bindings, seed, magnitude=magnitude, special=special)
    executable = compile_functions({"original": original, "rewritten": rewritten}, target)
    expected = _call(executable, "original", original, arrays, bindings)
    given = [replaced[i](a) if i in replaced else a for i, a in enumerate(arrays)]
    actual = _call(executable, "rewritten", rewritten, given, bindings)
    k = longest_reduction(original, bindings)
    problems = []
    for i, (param, want, got) in enumerate(zip(original.params, expected, actual)):
        if i in replaced:
            continue
        problem = _difference(param, want, got, k, normwise)
        if problem:
            problems.append(problem)
    return problems


def _difference(param, want, got, k, normwise=False) -> str | None:
    dtype = str(param.ty.dtype.dtype)
    rtol, atol = tolerance(dtype, k)
    want64, got64 = want.astype(np.float64), got.astype(np.float64)
    finite = want64[np.isfinite(want64)]
    if normwise and finite.size:
        atol = max(atol, atol * float(np.abs(finite).max()))
    # isclose: NaN only equals NaN (equal_nan), an infinity only itself.
    close = np.isclose(got64, want64, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    where = tuple(int(i) for i in np.argwhere(~close)[0])
    return (
        f"{param.name} ({dtype}, rtol={rtol:g}, atol={atol:g}): "
        f"{int((~close).sum())} of {close.size} elements differ; first at {where}: "
        f"original {want64[where]!r}, rewritten {got64[where]!r}"
    )


def assert_equivalent(original, rewritten, **kwargs) -> None:
    """Raise AssertionError naming each parameter whose contents differ after both runs.

    Keyword arguments are those of :func:`differences`.
    """
    problems = differences(original, rewritten, **kwargs)
    if problems:
        raise AssertionError("results differ after the rewrite:\n  " + "\n  ".join(problems))


__all__ = [
    "assert_equivalent",
    "compile_functions",
    "differences",
    "longest_reduction",
    "random_arguments",
    "run",
    "tolerance",
]
