"""Random inputs for running PrimFuncs and kernels: the one place tests and benchmarks get them.

Entry points: :func:`random_array` (one array of a shape and dtype, from a NumPy
``Generator``) and :func:`random_arguments` (one array per buffer parameter of a PrimFunc,
symbolic extents taken from ``sizes``).  :func:`parameter_shapes` gives the concrete shapes
and dtypes those arrays have, and :func:`numpy_dtype` the NumPy dtype of a TVM dtype name.

The values are chosen so that the patterns' results stay exact where they can be and finite
everywhere: floats are standard normal; int8 and uint8 cover their whole range (an
int32 accumulator holds any sum of their products for K < 2**16); wider integers stay
within [-1000, 1000] (unsigned: [0, 1000]) so that sums of products cannot overflow.
Floats may be asked for larger (``magnitude``: normal times it, clipped to the dtype's finite
range) or with special values (``special``: that share of the elements, at random, replaced
by NaN, +inf or -inf).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tvm_ffi
from tvm import sym, tirx

#: The bound of integers wider than a byte.
WIDE_INTEGER_BOUND = 1000


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of ``dtype``: a TVM dtype name (``"bfloat16"`` is ml_dtypes'), a NumPy
    dtype or a scalar type."""
    if str(dtype) == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def random_array(
    shape: Sequence[int],
    dtype,
    rng: np.random.Generator,
    *,
    magnitude: float = 1.0,
    special: float = 0.0,
) -> np.ndarray:
    """A random array of ``shape`` and ``dtype`` drawn from ``rng`` (see the module notes).

    Parameters
    ----------
    shape : sequence of int
    dtype : str, numpy dtype or scalar type
        A float (including bfloat16) or integer dtype.
    rng : numpy.random.Generator
    magnitude : float
        Floats are standard normal times this (clipped to the dtype's finite range).
    special : float
        The share of float elements replaced by NaN, +inf or -inf (each as likely).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> random_array((2, 3), "int8", rng).dtype
    dtype('int8')
    """
    dtype = numpy_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if dtype.itemsize == 1:
            low, high = info.min, info.max
        else:
            low, high = max(info.min, -WIDE_INTEGER_BOUND), WIDE_INTEGER_BOUND
        return np.asarray(rng.integers(low, high, size=shape, endpoint=True)).astype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        values = np.asarray(rng.standard_normal(shape)) * magnitude
        if magnitude != 1.0:
            finite = float(_finfo(dtype).max)
            values = np.clip(values, -finite, finite)
        if special:
            chosen = rng.random(shape) < special
            values = np.where(chosen, rng.choice([np.nan, np.inf, -np.inf], size=shape), values)
        return np.asarray(values).astype(dtype)
    raise ValueError(f"random_array: expected a float or integer dtype, got {dtype}")


def _finfo(dtype: np.dtype):
    if dtype.name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.finfo(dtype)
    return np.finfo(dtype)


def concrete_extent(expr, sizes: Mapping, default_extent: int | None = None) -> int:
    """The value of a shape, stride or loop extent: a constant, a variable given in
    ``sizes``, or an expression of those (such as a stride ``m * 4``)."""
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        for var, value in sizes.items():
            if (var if isinstance(var, str) else var.name) == expr.name:
                return int(value)
        if default_extent is not None:
            return default_extent
    else:
        analyzer = sym.Analyzer()
        found = []
        tvm_ffi.structural_walk(expr, (tirx.Var, found.append))
        for var in found:
            analyzer.bind(var, concrete_extent(var, sizes, default_extent))
        value = analyzer.simplify(expr)
        if isinstance(value, tirx.IntImm):
            return int(value.value)
    raise ValueError(
        f"shape {expr} is neither a constant nor a variable given in sizes "
        f"(got {sorted(str(v) for v in sizes)})"
    )


def parameter_shapes(
    func: tirx.PrimFunc, sizes: Mapping | None = None, *, default_extent: int | None = None
) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of every parameter of ``func``, symbolic extents resolved.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A function whose parameters are all buffers.
    sizes : mapping, optional
        Values of the symbolic shape variables, keyed by ``Var`` or by name.
    default_extent : int, optional
        The value of a variable ``sizes`` does not give; without it such a variable is an
        error.
    """
    shapes = []
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            raise ValueError(f"parameter {param.name} is a scalar; expected only buffer parameters")
        shape = tuple(concrete_extent(e, sizes or {}, default_extent) for e in param.ty.shape)
        shapes.append((shape, str(param.ty.dtype.dtype)))
    return shapes


def resolved_sizes(
    func: tirx.PrimFunc, sizes: Mapping | None = None, *, default_extent: int | None = None
) -> dict[str, int]:
    """The value of every symbolic extent in ``func``'s parameter shapes, by name."""
    resolved = {}
    for param in func.params:
        for expr in param.ty.shape:
            if isinstance(expr, tirx.Var):
                resolved[expr.name] = concrete_extent(expr, sizes or {}, default_extent)
    return resolved


def random_arguments(
    func: tirx.PrimFunc,
    sizes: Mapping | None = None,
    seed: int = 0,
    *,
    default_extent: int | None = None,
    magnitude: float = 1.0,
    special: float = 0.0,
) -> list[np.ndarray]:
    """One random array per buffer parameter of ``func``, in order, from one seed.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
    sizes : mapping, optional
        Values of the symbolic shape variables, by ``Var`` or by name (a ``Program``'s
        ``bindings`` will do).
    seed : int
        Seed of the ``numpy.random.Generator`` the arrays are drawn from.
    default_extent : int, optional
        The value of a symbolic extent ``sizes`` does not give (else that is an error).
    magnitude, special : float
        As for :func:`random_array`, for every float parameter.
    """
    rng = np.random.default_rng(seed)
    shapes = parameter_shapes(func, sizes, default_extent=default_extent)
    return [
        random_array(shape, dtype, rng, magnitude=magnitude, special=special)
        for shape, dtype in shapes
    ]


__all__ = [
    "WIDE_INTEGER_BOUND",
    "concrete_extent",
    "numpy_dtype",
    "parameter_shapes",
    "random_arguments",
    "random_array",
    "resolved_sizes",
]
