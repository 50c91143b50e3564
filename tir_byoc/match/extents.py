"""Extents and shapes: proving two extents equal, and a buffer's shape what the loops cover.

:class:`Extents` proves extents equal (integers directly, symbolic ones with the arithmetic
analyzer) and reads buffers' shapes once; :func:`check_shape` is the check that a buffer has
the shape a nest's loops cover, saying which loop falls short; :func:`dim_names` names an
output's dims in reports.  Used by :mod:`.stir`, :mod:`.reduction`, :mod:`.batch` and
:mod:`.epilogue`; reads :mod:`.exprs`.
"""

from __future__ import annotations

import functools

from tvm import sym, tirx

from ..decline import Declined
from .exprs import CONSTANT_TYPES, const_value, dtype_of, expr_text, last_index, shape_of


class Extents:
    """Proves extents equal: integers directly, symbolic ones with the arithmetic analyzer.

    Also reads buffers' shapes, once per buffer: a GEMM's checks read each operand's shape
    three times.
    """

    def __init__(self):
        self._analyzer = None
        self._shapes: dict[int, tuple] = {}  # buffer handle -> (its shape, the buffer)

    def shape(self, buffer) -> tuple:
        """``shape_of(buffer)``."""
        known = self._shapes.get(buffer.__chandle__())
        if known is None:
            known = self._shapes[buffer.__chandle__()] = (shape_of(buffer), buffer)
        return known[0]

    def equal(self, a, b) -> bool:
        if type(a) in CONSTANT_TYPES and type(b) in CONSTANT_TYPES:  # the common case, at once
            return a.value == b.value
        a_value, b_value = const_value(a), const_value(b)
        if a_value is not None or b_value is not None:
            return a_value is not None and a_value == b_value
        if a.same_as(b):
            return True
        if self._analyzer is None:
            self._analyzer = sym.Analyzer()
        a, b = same_index_dtype(a, b)
        return bool(self._analyzer.can_prove_equal(a, b))


def same_index_dtype(a, b):
    if dtype_of(a) == dtype_of(b):
        return a, b
    return tirx.Cast("int64", a), tirx.Cast("int64", b)


@functools.cache
def dim_names(rank: int) -> tuple[str, ...]:
    """Names of an output's dims in reports: the batch dims B0, B1, ..., then M and N."""
    return (*(f"B{d}" for d in range(rank - 2)), "M", "N")


def check_shape(buf, dims, names, extents: Extents, what="output"):
    shape = extents.shape(buf)
    if len(shape) != len(dims):
        raise Declined(f"{what} {buf.name} has {len(shape)} dimensions, expected {len(dims)}")
    for axis, (actual, expected, name) in enumerate(zip(shape, dims, names)):
        if not extents.equal(actual, expected):
            iterator = {"M": "i", "N": "j", "K": "k"}.get(name, name.lower())
            raise Declined(
                f"{iterator} runs over 0..{last_index(expected)} of {expr_text(actual)} "
                f"(axis {axis} of {what} {buf.name}): the loops do not cover it whole"
            )


__all__ = ["Extents", "check_shape", "dim_names", "same_index_dtype"]
