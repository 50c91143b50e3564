"""The pattern family tir_byoc offloads, declared once as data.

A pattern is a weight layout plus an epilogue:

* ``dense``:  ``Y[i, j] = sum_k X[i, k] * W[j, k]`` (weight N x K);
* ``matmul``: ``Y[i, j] = sum_k X[i, k] * W[k, j]`` (weight K x N);
* optionally followed by ``bias`` (``Z[i, j] = Y[i, j] + b[j]``) and/or ``relu``
  (``max(Z, 0)``), in that order.

:data:`PATTERNS` holds the eight variants.  :func:`describe` turns one into its TIR
description (an S-TIR PrimFunc with symbolic M, N, K, built with TE the way TVM lowers
the operators), which the tests scan to check that the matcher recognises every pattern
from its own description, and which doubles as a numerical oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

#: Weight layouts: the name of the pattern family and the weight's index order.
WEIGHT_LAYOUTS = {"dense": "nk", "matmul": "kn"}

#: Epilogue operations, in the only order the family allows.
EPILOGUE_OPS = ("bias", "relu")


@dataclass(frozen=True)
class Pattern:
    """One member of the family.

    Parameters
    ----------
    name : str
        ``dense``, ``dense_bias``, ..., ``matmul_bias_relu``.
    layout : str
        ``"dense"`` (weight N x K) or ``"matmul"`` (weight K x N).
    epilogue : tuple of str
        A subsequence of ``("bias", "relu")``.
    """

    name: str
    layout: str
    epilogue: tuple[str, ...]

    def __post_init__(self):
        if self.layout not in WEIGHT_LAYOUTS:
            raise ValueError(
                f"pattern {self.name!r}: expected layout in {sorted(WEIGHT_LAYOUTS)}, "
                f"got {self.layout!r}"
            )
        if tuple(op for op in EPILOGUE_OPS if op in self.epilogue) != self.epilogue:
            raise ValueError(
                f"pattern {self.name!r}: expected an epilogue ordered as {EPILOGUE_OPS}, "
                f"got {self.epilogue!r}"
            )

    @property
    def has_bias(self) -> bool:
        return "bias" in self.epilogue

    @property
    def has_relu(self) -> bool:
        return "relu" in self.epilogue


def _family() -> dict[str, Pattern]:
    patterns = {}
    for layout in WEIGHT_LAYOUTS:
        for epilogue in ((), ("bias",), ("relu",), ("bias", "relu")):
            name = "_".join((layout, *epilogue))
            patterns[name] = Pattern(name, layout, epilogue)
    return patterns


#: The eight patterns, by name.
PATTERNS: dict[str, Pattern] = _family()

_BY_FORM = {(p.layout, p.epilogue): p for p in PATTERNS.values()}


def pattern_for(layout: str, epilogue: tuple[str, ...]) -> Pattern | None:
    """The pattern with this weight layout and epilogue, or None if the family has none."""
    return _BY_FORM.get((layout, tuple(epilogue)))


def describe(
    name: str,
    *,
    x_dtype: str = "float32",
    w_dtype: str | None = None,
    out_dtype: str | None = None,
    index_dtype: str = "int64",
) -> tirx.PrimFunc:
    """Build the TIR description of pattern ``name`` with symbolic M, N, K.

    Parameters
    ----------
    name : str
        A key of :data:`PATTERNS`.
    x_dtype, w_dtype, out_dtype : str
        Element types; inputs narrower than ``out_dtype`` are cast inside the reduction,
        the way Relax lowers a matmul with ``out_dtype``.
    index_dtype : str
        Dtype of M, N, K.

    Returns
    -------
    tvm.tirx.PrimFunc
        An S-TIR PrimFunc ``(X, W, [b,] Y)`` whose blocks are ``name``'s loop nests.
    """
    if name not in PATTERNS:
        raise ValueError(f"unknown pattern {name!r}; expected one of {sorted(PATTERNS)}")
    pattern = PATTERNS[name]
    w_dtype = w_dtype or x_dtype
    out_dtype = out_dtype or x_dtype
    m, n, k = (tirx.Var(v, index_dtype) for v in "MNK")

    # Step 1. The reduction.
    x = te.placeholder((m, k), x_dtype, name="X")
    w_shape = (n, k) if pattern.layout == "dense" else (k, n)
    w = te.placeholder(w_shape, w_dtype, name="W")
    r = te.reduce_axis((0, k), name="k")

    def operand(load, dtype):
        return load if dtype == out_dtype else load.astype(out_dtype)

    def product(i, j):
        w_load = w[j, r] if pattern.layout == "dense" else w[r, j]
        return operand(x[i, r], x_dtype) * operand(w_load, w_dtype)

    y = te.compute((m, n), lambda i, j: te.sum(product(i, j), axis=r), name=pattern.layout)
    args = [x, w]

    # Step 2. The epilogue, one block per operation as Relax's FuseTIR emits it.
    if pattern.has_bias:
        b = te.placeholder((n,), out_dtype, name="b")
        args.append(b)
        y = _elementwise(y, lambda value, j: value + b[j], "T_add")
    if pattern.has_relu:
        zero = tirx.const(0, out_dtype)
        y = _elementwise(y, lambda value, j: te.max(value, zero), "compute")
    return te.create_prim_func([*args, y])


def _elementwise(producer: te.Tensor, fn, name: str) -> te.Tensor:
    return te.compute(producer.shape, lambda i, j: fn(producer[i, j], j), name=name)
