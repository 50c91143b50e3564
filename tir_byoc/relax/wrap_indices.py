"""Gathers that read a negative index the way torch does, not out of bounds.

torch counts a negative index from the end (``x[..., [-2], :]`` is the second last row; Falcon
splits its fused q/k/v projection that way).  The torch frontend of TVM 0.27 imports such an
``aten.index.Tensor`` as ``R.take(x, i, axis, mode="fast")`` or ``R.index_tensor(x, (i, ..))``,
and both read ``x[-2]`` as the element 2 before the start of the axis: memory that is not the
tensor's, so the model's output is garbage that changes from run to run, and TVM only logs a
warning.  The indices a model reaches with are no concern of the GEMM offload, but a
:func:`tir_byoc.build_model` result that differs from the model is the worst outcome this
project has, so the lowering (:mod:`tir_byoc.relax.pipeline`) reads them as torch does.

Entry point: :class:`WrapIndices`, a module pass before ``LegalizeOps``
(:mod:`tir_byoc.relax.pipeline`); :func:`find` lists the gathers it changes (:class:`Gather`)
and :func:`rewrite` changes them.  For each binding of a Relax function:

1. ``R.take(x, i, axis, mode="fast")``, the axis of size n:

   - ``i`` a constant whose every value lies in [0, n): unchanged (nothing to wrap);
   - ``i`` a constant whose every value lies in [-n, n): the constant replaced by its values
     mod n (numpy's ``%``, whose result takes the sign of n), the mode kept;
   - otherwise (``i`` computed at run time, as token ids are, or a constant out of range):
     ``mode="wrap"``, which TVM lowers to ``(i % n + n) % n``;

2. ``R.index_tensor(x, (i0, .., ik))``, each ``ij`` on axis j of x of static size nj: a
   constant as in case 1, a run-time index (or a constant out of range) ``R.floor_mod(ij,
   nj)`` (an index tensor on an axis of symbolic size is left as it is).

Takes in ``"wrap"`` or ``"clip"`` mode are left alone.

Why the values are the same: for an index ``v`` in [-n, n), the element torch reads is
``v + n`` if ``v < 0`` and ``v`` otherwise, which is ``v mod n`` with the result in [0, n)
(the floored modulo of numpy's ``%``, TVM's ``floor_mod`` and ``wrap`` mode alike).  An index
in [0, n) is its own residue, so every index torch accepts reads the same element as before
where the old read was in bounds; torch raises on any other index, so no defined result
changes.  An element is copied, not computed: nothing is rounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import ir, relax

from .analysis import static_dims

_TAKE = ir.Op.get("relax.take")
_INDEX_TENSOR = ir.Op.get("relax.index_tensor")


@dataclass(frozen=True)
class Gather:
    """A binding ``var = R.take(...)`` or ``R.index_tensor(...)`` of ``function`` that reads
    a negative index as torch does only once rewritten (see the module docstring)."""

    function: str
    var: relax.Var
    op: str


def find(mod: tvm.IRModule) -> tuple[tuple[Gather, ...], tuple]:
    """``(sites, declines)``: the gathers of ``mod``'s Relax functions that :func:`rewrite`
    changes, in binding order; a gather that stays reads every index as torch does already, so
    there are no declines."""
    sites = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            finder = _Finder(gvar.name_hint)
            finder.visit_expr(func)
            sites += finder.sites
    return tuple(sites), ()


def rewrite(mod: tvm.IRModule, sites: tuple[Gather, ...]) -> tvm.IRModule:
    """``mod`` with each gather of ``sites`` reading negative indices as torch does; ``mod``
    itself when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    return _Wrapper(mod, sites).transform()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.WrapIndices")
class WrapIndices:
    """Every gather of a Relax module reads negative indices as torch does: :func:`find`,
    then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, _ = find(mod)
        return rewrite(mod, sites)


@relax.expr_functor.visitor
class _Finder(relax.PyExprVisitor):
    """Collects the bindings of one function whose gather :class:`_Wrapper` changes."""

    def __init__(self, function: str):
        self.function = function
        self.sites: list[Gather] = []

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if isinstance(value, relax.Call) and (
            (value.op.same_as(_TAKE) and _take_change(value) is not None)
            or (
                value.op.same_as(_INDEX_TENSOR)
                and any(change is not None for change in _index_changes(value))
            )
        ):
            self.sites.append(Gather(self.function, binding.var, value.op.name))
        super().visit_var_binding_(binding)


def _wrapped_constant(index, size: int):
    """``index`` (a constant) with its values mod ``size``; itself if they already lie in
    [0, size); None if one lies outside [-size, size)."""
    values = index.value.numpy()
    if values.size == 0 or ((values >= 0) & (values < size)).all():
        return index
    if not ((values >= -size) & (values < size)).all():
        return None
    return relax.const(values % size, str(values.dtype))


def _axis_size(x, axis) -> int | None:
    dims = static_dims(x)
    if dims is None:
        return None
    axis = 0 if axis is None else int(axis)
    return dims[axis] if -len(dims) <= axis < len(dims) else None


def _take_change(call: relax.Call):
    """The call that replaces a ``take`` (see case 1), or None when it stays."""
    if str(call.attrs.mode) != "fast":
        return None
    x, index = call.args
    size = _axis_size(x, call.attrs.axis)
    if isinstance(index, ir.Constant) and size is not None:
        wrapped = _wrapped_constant(index, size)
        if wrapped is index:
            return None
        if wrapped is not None:
            return relax.op.take(x, wrapped, call.attrs.axis, "fast")
    return relax.op.take(x, index, call.attrs.axis, "wrap")


def _index_changes(call: relax.Call) -> list:
    """Per index of an ``index_tensor`` (case 2): None (kept), a constant, or the axis size to
    take a run-time index modulo."""
    x, indices = call.args
    dims = static_dims(x)
    if dims is None or not isinstance(indices, relax.Tuple):
        return []
    changes = []
    for axis, index in enumerate(indices.fields):
        if axis >= len(dims):
            changes.append(None)
        elif isinstance(index, ir.Constant):
            wrapped = _wrapped_constant(index, dims[axis])
            # A constant out of range is taken modulo at run time, as a take wraps it.
            changes.append(None if wrapped is index else dims[axis] if wrapped is None else wrapped)
        else:
            changes.append(dims[axis])
    return changes


@relax.expr_functor.mutator
class _Wrapper(relax.PyExprMutator):
    """Emits each gather that needs it in its wrapped form; every other binding as it was."""

    def __init__(self, mod: tvm.IRModule, sites: tuple[Gather, ...]):
        super().__init__(mod)
        self.mod = mod
        self.functions = {site.function for site in sites}
        self.gathers = {site.var for site in sites}

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if gvar.name_hint in self.functions:
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        replaced = self._wrapped(binding.value) if binding.var in self.gathers else None
        if replaced is None:
            super().visit_var_binding_(binding)
            return
        # The gather's own variable, now bound to the wrapped one: an output stays one.
        self.builder_.emit_normalized(
            relax.VarBinding(binding.var, self.builder_.normalize(replaced))
        )

    def _wrapped(self, call: relax.Call):
        if call.op.same_as(_TAKE):
            replaced = _take_change(call)
            # Its arguments are the take's: map them.
            return self.visit_expr(replaced) if replaced is not None else None
        return self._index_tensor(call)

    def _index_tensor(self, call: relax.Call):
        changes = _index_changes(call)
        if all(change is None for change in changes):
            return None
        x, indices = call.args
        fields = []
        for index, change in zip(indices.fields, changes):
            if isinstance(change, ir.Constant):
                fields.append(change)
            elif change is None:
                fields.append(self.visit_expr(index))
            else:
                size = relax.const(change, str(index.ty.dtype))
                fields.append(self.builder_.emit(relax.op.floor_mod(self.visit_expr(index), size)))
        return relax.op.index_tensor(self.visit_expr(x), fields)


__all__ = ["Gather", "WrapIndices", "find", "rewrite"]
