"""Reading TIR expressions: constants, dtypes and shapes, and the words reports use for them.

Used by every other module of the matcher; imports only :mod:`.traversal`.
"""

from __future__ import annotations

import re

import tvm
from tvm import ir, tirx

from .traversal import elements

INT_LITERAL = re.compile(r"T\.u?int[0-9]+\((-?[0-9]+)\)")


def expr_text(expr) -> str:
    if isinstance(expr, tirx.IntImm):
        return str(expr.value)
    if isinstance(expr, tirx.Var):
        return expr.name
    return str(expr)


OPERATION_WORDS = {
    tirx.Add: "a sum (+)",
    tirx.Sub: "a difference (-)",
    tirx.Mul: "a product (*)",
    tirx.Div: "a quotient (/)",
    tirx.FloorDiv: "a floor division (//)",
    tirx.FloorMod: "a remainder (%)",
    tirx.Max: "max()",
    tirx.Min: "min()",
    tirx.Select: "select()",
}


def operation_text(expr) -> str:
    """What an expression computes, in the words of a TVMScript reader."""
    for kind, words in OPERATION_WORDS.items():
        if isinstance(expr, kind):
            return words
    if isinstance(expr, ir.TensorLoad):
        return f"a plain read of {expr.source.name}"
    if isinstance(expr, tirx.Cast):
        return f"a cast to {dtype_of(expr)}"
    if isinstance(expr, tvm.ir.Call):
        return f"a call to {getattr(expr.op, 'name', expr.op)}"
    value = const_value(expr)
    if value is not None:
        return f"the constant {value}"
    return type(expr).__name__


#: Node types :func:`const_value` reads at once: constants, and types that are never one
#: (neither a number, a cast nor a constant; filled as they are met).
CONSTANT_TYPES = frozenset({tirx.IntImm, tirx.FloatImm})
_NEVER_CONSTANT: set[type] = set()
_MAYBE_CONSTANT = (int, float, tirx.Cast, tirx.FloatImm, tirx.IntImm)


def const_value(expr):
    """The value of a numeric constant (also through casts), else None."""
    kind = type(expr)
    if kind in CONSTANT_TYPES:
        return expr.value
    if kind in _NEVER_CONSTANT:  # an isinstance test that fails costs an ABC lookup
        return None
    if not issubclass(kind, _MAYBE_CONSTANT):
        _NEVER_CONSTANT.add(kind)
        return None
    if isinstance(expr, (int, float)):
        return expr
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    if isinstance(expr, (tirx.FloatImm, tirx.IntImm)):
        return expr.value
    return None


def is_zero(expr) -> bool:
    value = const_value(expr)
    return value is not None and value == 0


def element_of(expr):
    """The buffer element ``expr`` reads, possibly through casts, or None."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    return expr if isinstance(expr, ir.TensorLoad) else None


def is_element(expr) -> bool:
    """True for a buffer element, possibly through casts."""
    return element_of(expr) is not None


def is_buffer(var) -> bool:
    return isinstance(var, ir.Var) and isinstance(var.ty, tirx.BufferType)


def dtype_of(node) -> str:
    """Element dtype of a buffer Var, or dtype of a scalar expression."""
    return str(node.ty.dtype)


def as_int64(value) -> tirx.PrimExpr:
    """An int, an integer constant or an integer expression as an int64 expression: constants
    (also through casts) as an ``IntImm``, another dtype cast."""
    found = value if isinstance(value, int) else const_value(value)
    if found is not None:
        return tirx.IntImm("int64", int(found))
    return value if dtype_of(value) == "int64" else tirx.Cast("int64", value)


def shape_of(var) -> tuple:
    return elements(var.ty.shape)


def is_var(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def index_text(load) -> str:
    return "[" + ", ".join(expr_text(e) for e in load.indices) + "]"


def last_index(extent) -> str:
    value = const_value(extent)
    if value is not None:
        return str(value - 1)
    text = INT_LITERAL.sub(r"\1", expr_text(extent))
    return f"({text})-1"
