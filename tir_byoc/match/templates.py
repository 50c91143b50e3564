"""The templates of the epilogue ops of fixed form, read from the ops' records.

An op whose record says ``template`` (gelu, gelu_tanh, silu, sigmoid, tanh, swish, hardswish:
:data:`tir_byoc.epilogues.OPS`) is recognised by the formulas of its spellings: each spelling,
its blocks put into one expression of a variable ``z``, is a template.  :func:`unify` matches
a template against an expression up to the order of the operands of ``+`` and ``*`` (every
other operation, ``max`` and ``min`` included, in the order written: their NaN results depend
on it).  A constant of the template matches any constant; :func:`constants_of` then compares
each with what the op allows, so that a near miss says which constant differs.

Entry points: :data:`TEMPLATES_BY_ROOT`, :func:`unify` and :func:`constants_of`, which
:class:`~.epilogue.EpilogueParser` calls.  Reads :mod:`.exprs` and :mod:`.records`.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, tirx

from ..decline import Declined
from ..epilogues import LITERALS, OPS, OpSpec, Spelling, Terms
from .exprs import CONSTANT_TYPES, const_value
from .records import Step
from .traversal import elements, walk

#: The key of the op's input in a binding of :func:`unify`.
VALUE = "value"

#: The variable a template's ``z`` is.
_Z = tirx.Var("z", "float32")

#: Operations whose operands :func:`unify` tries in either order.
_COMMUTATIVE = (tirx.Add, tirx.Mul)


def template(spec: OpSpec, spelling: Spelling) -> ir.Expr:
    """``spelling`` of ``spec`` as one expression of ``z``: the op's constants as variables
    ``c0``, ``c1``... (its :attr:`~tir_byoc.epilogues.OpSpec.constants`, in order), the
    literals (0.5, 1, ...) as constants."""
    free = {name: tirx.Var(f"c{i}", "float32") for i, name in enumerate(spec.constants)}
    expr = spelling.inline(_Z, Terms("float32", {**LITERALS, **free}))
    found = set()
    walk(expr, tirx.Var, lambda var: found.add(var.name))
    if found != {"z", *(var.name for var in free.values())}:
        raise ValueError(
            f"template of {spelling.name!r}: expected z and each constant of {spec.name}, "
            f"got {sorted(found)}"
        )
    return expr


def root_operation(expr):
    """The key of ``expr`` in the tables by root: its node type, or the operator of a call."""
    if isinstance(expr, tvm.ir.Call):
        return getattr(expr.op, "name", None)
    return type(expr)


#: Root (node type or call name) -> the (op, template) pairs whose expression has that root.
TEMPLATES_BY_ROOT: dict = {}
for _spec in OPS.values():
    for _spelling in _spec.spellings if _spec.template else ():
        _template = template(_spec, _spelling)
        TEMPLATES_BY_ROOT.setdefault(root_operation(_template), []).append((_spec.name, _template))


def unify(template, expr, binding: dict) -> dict | None:
    """``binding`` extended so that ``template`` spells ``expr``, or None if it does not.

    The binding holds the value ``z`` stands for (:data:`VALUE`) and, by the name of each
    constant of the template, its occurrences: (the value found, the value it must have, or
    None for one of the op's own).
    """
    kind = type(template)
    if kind is tirx.Var:
        if template.same_as(_Z):
            if VALUE in binding:
                # A node is equal to itself; an op reading its input twice reads one node twice.
                bound = binding[VALUE]
                same = bound.same_as(expr) or tvm_ffi.structural_equal(bound, expr)
                return binding if same else None
            return {**binding, VALUE: expr}
        return _constant(template.name, None, expr, binding)
    if kind in CONSTANT_TYPES:
        return _constant(str(template.value), template.value, expr, binding)
    if type(expr) is not kind:
        return None
    if kind in _COMMUTATIVE:
        for a, b in ((expr.a, expr.b), (expr.b, expr.a)):
            found = unify(template.a, a, binding)
            found = found and unify(template.b, b, found)
            if found:
                return found
        return None
    if kind is tvm.ir.Call:
        inner, values = elements(template.args), elements(expr.args)
        if getattr(expr.op, "name", None) != template.op.name or len(inner) != len(values):
            return None
        pairs = zip(inner, values)
    elif hasattr(template, "a") and hasattr(template, "b"):
        pairs = [(template.a, expr.a), (template.b, expr.b)]
    else:
        return None
    for inner, value in pairs:
        binding = unify(inner, value, binding)
        if binding is None:
            return None
    return binding


def _constant(name: str, fixed, expr, binding: dict) -> dict | None:
    value = const_value(expr)
    if value is None:
        return None
    seen = binding.get(name, ())  # each occurrence is checked
    return {**binding, name: (*seen, (value, fixed))}


def constants_of(op: str, binding: dict) -> Step:
    """The Step of a template of ``op`` that ``binding`` unified, if its constants are the op's;
    else Declined saying which differs.

    A literal must have its value; the op's own constants must have its example when the op
    is ``pinned`` (gelu's sqrt(1/2)), else each the value of its first occurrence (swish's
    alpha).
    """
    spec = OPS[op]
    free = {}
    for name in sorted(k for k in binding if k != VALUE):
        occurrences = binding[name]
        want = occurrences[0][1]
        if want is None:  # c<i>, the op's constant i
            index = int(name[1:])
            want = np.float32(spec.example[index]) if spec.pinned else occurrences[0][0]
            free[index] = float(np.float32(want))
        for found, _ in occurrences:
            if np.float32(found) != np.float32(want):
                raise Declined(
                    f"{op}: a constant is {found} where {op} has {float(want):.9g}", op=op
                )
    return Step(op, spec.code, tuple(free[i] for i in sorted(free)))


__all__ = ["TEMPLATES_BY_ROOT", "VALUE", "constants_of", "root_operation", "template", "unify"]
