"""Facts about Relax functions that more than one rewrite reads.

The rewrites of this package import these and nothing of each other: a tensor's dims as its
struct info gives them (:func:`tensor_dims`, :func:`static_dims`), how often each variable of a
function is used (:func:`variable_uses`), and the call bound to a variable of a dataflow block
(:func:`bound_call`).
"""

from __future__ import annotations

from collections import Counter

from tvm import ir, relax, tirx


def tensor_dims(expr) -> tuple | None:
    """The dims of a tensor's struct info, or None if its shape is not known."""
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return tuple(ty.shape.values)


def static_dims(expr) -> list[int] | None:
    """The dims of a tensor's struct info as integers, or None unless every one is a constant."""
    dims = tensor_dims(expr)
    if dims is None or not all(isinstance(d, tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]


def variable_uses(func: relax.Function) -> Counter:
    """How often each Relax variable of ``func`` is used (definitions not counted)."""
    counter = _UseCounter()
    counter.visit_expr(func)
    return counter.uses


@relax.expr_functor.visitor
class _UseCounter(relax.PyExprVisitor):
    def __init__(self):
        self.uses = Counter()

    def visit_var_(self, var):
        self.uses[var] += 1

    def visit_dataflow_var_(self, var):
        self.uses[var] += 1


def bound_call(values: dict, var, op=None) -> relax.Call | None:
    """The call bound to ``var`` in the dataflow block (of operator ``op``, if given).

    ``values`` maps the block's variables to the values bound to them.
    """
    value = values.get(var) if isinstance(var, relax.Var) else None
    if not isinstance(value, relax.Call) or not isinstance(value.op, ir.Op):
        return None
    return value if op is None or value.op.same_as(op) else None


__all__ = ["bound_call", "static_dims", "tensor_dims", "variable_uses"]
