"""Shapes proved under the bounds of a function's symbolic dims, so that none is lost.

A Relax function with symbolic dims may carry their bounds as the attributes
``tir_var_lower_bound`` and ``tir_var_upper_bound`` (``from_exported_program`` writes what
``torch.export.Dim(min=, max=)`` gave; a user's module may write them).  Relax's shape inference
does not read them: BERT's position embeddings are sliced to ``min(seq, 32)`` rows, which
Relax cannot prove equal to ``seq``, so the add of ``(batch, seq, 64)`` and
``(1, min(seq, 32), 64)`` gets no shape at all, ``LegalizeOps`` leaves it as a Relax
operator, and the build fails.

Entry point: :class:`BoundShapes`, a module pass first in the lowering
(:mod:`tir_byoc.relax.pipeline`); :func:`find` lists the bindings it changes
(:class:`Proved`).  A binding whose shape holds an expression that simplifies to another under
the bounds (``min(seq, 32)`` to ``seq`` with ``seq <= 32``) is followed by an
``R.match_cast`` to the simplified shape, and its users read the cast's variable, so their
shapes are inferred again.  The cast is exact by the proof: within the bounds both shapes are
the same numbers; a call outside them (the raw VM, never :class:`tir_byoc.Model`, which checks
the bounds first) stops at the cast's shape check rather than compute anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, relax, sym, tirx

from .analysis import tensor_dims

LOWER, UPPER = "tir_var_lower_bound", "tir_var_upper_bound"


@dataclass(frozen=True)
class Proved:
    """A binding of ``function`` whose shape ``before`` is ``after`` within the bounds."""

    function: str
    var: str
    before: tuple[str, ...]
    after: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"{self.function}: {self.var}'s shape ({', '.join(self.before)}) is "
            f"({', '.join(self.after)}) within the dims' bounds"
        )


def bounds(func: relax.Function) -> dict[str, tuple[int | None, int | None]]:
    """Each symbolic dim's (lower, upper) bound, by name, as ``func``'s attributes give them
    (None where one is not given)."""
    attrs = func.attrs or {}
    lower = {str(k): int(v) for k, v in (attrs.get(LOWER) or {}).items()}
    upper = {str(k): int(v) for k, v in (attrs.get(UPPER) or {}).items()}
    return {name: (lower.get(name), upper.get(name)) for name in sorted({*lower, *upper})}


def analyzer_for(func: relax.Function) -> sym.Analyzer | None:
    """An analyzer that knows the bounds of ``func``'s symbolic dims; None without bounds."""
    known = bounds(func)
    if not known:
        return None
    analyzer = sym.Analyzer()
    for var in relax.analysis.defined_symbolic_vars(func):
        low, high = known.get(var.name, (None, None))
        if low is None and high is None:
            continue
        low = 0 if low is None else low
        if high is None:
            analyzer.update(var, sym.ConstIntBound(low, sym.ConstIntBound.POS_INF), True)
        else:
            analyzer.bind(var, tvm.ir.Range.from_min_extent(low, high - low + 1))
    return analyzer


def find(mod: tvm.IRModule) -> tuple[tuple[Proved, ...], tuple]:
    """The bindings :class:`BoundShapes` casts (nothing is declined: a shape that does not
    simplify is left as it is)."""
    found = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and (analyzer := analyzer_for(func)):
            _Casts(analyzer, gvar.name_hint, found).visit_expr(func)
    return tuple(found), ()


def _simplified(analyzer, var) -> list | None:
    dims = tensor_dims(var)
    if dims is None:
        return None
    after = [analyzer.simplify(d) for d in dims]
    if all(tvm_ffi.structural_equal(a, d) for a, d in zip(after, dims, strict=True)):
        return None
    return after


@relax.expr_functor.mutator
class _Casts(relax.PyExprMutator):
    """Casts every binding whose shape simplifies, and records each (see :func:`find`)."""

    def __init__(self, analyzer, function: str, found: list):
        super().__init__()
        self.analyzer = analyzer
        self.function = function
        self.found = found

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.visit_expr(binding.value)
        call = self._in_bounds(value) if isinstance(value, relax.Call) else value
        changed, value = call is not value, self.builder_.normalize(call)
        after = _simplified(self.analyzer, value)
        if not changed and after is None:
            super().visit_var_binding_(binding)
            return
        name = binding.var.name
        before = tensor_dims(binding.var) or ()
        proved = after if after is not None else tensor_dims(value) or ()
        self.found.append(
            Proved(
                self.function,
                name,
                tuple(str(d) for d in before),
                tuple(str(d) for d in proved),
            )
        )
        if after is None:  # the call itself now infers the proved shape
            new_var = type(binding.var)(name, value.ty)
            self.builder_.emit_normalized(relax.VarBinding(new_var, value))
            self.set_var_remap(binding.var, new_var)
            return
        # The value as inferred, then the cast to the proved shape under the old name.
        unbounded = self.builder_.emit(value, name + "_unbounded")
        ty = relax.TensorType(after, value.ty.dtype)
        bounded = type(binding.var)(name, ty)
        self.builder_.emit_normalized(relax.MatchCast(bounded, unbounded, ty))
        self.set_var_remap(binding.var, bounded)

    def _in_bounds(self, call: relax.Call) -> relax.Call:
        """A slice proved within its axes taken as in bounds (no clamping to compute), and a
        reshape's target shape simplified; any other call as it is."""
        if call.op.same_as(_RESHAPE) and isinstance(call.args[1], relax.ShapeExpr):
            old = list(call.args[1].values)
            values = [self.analyzer.simplify(v) for v in old]
            if all(tvm_ffi.structural_equal(a, b) for a, b in zip(old, values, strict=True)):
                return call
            return relax.op.reshape(call.args[0], relax.ShapeExpr(values))
        if not call.op.same_as(_STRIDED_SLICE) or call.attrs.assume_inbound:
            return call
        x, axes, begin, end = call.args[:4]
        dims = tensor_dims(x)
        strides = call.args[4] if len(call.args) > 4 else None
        parts = [_values(e) for e in (axes, begin, end)]
        if dims is None or any(p is None for p in parts):
            return call
        if strides is not None and any(
            not isinstance(v, tirx.IntImm) or int(v) != 1 for v in (_values(strides) or [0])
        ):
            return call
        prove = self.analyzer.can_prove
        for axis, low, high in zip(*parts, strict=True):
            dim = dims[int(axis)]
            if not (prove(low >= 0) and prove(low <= high) and prove(high <= dim)):
                return call
        return relax.op.strided_slice(x, axes, begin, end, strides, assume_inbound=True)


_RESHAPE = ir.Op.get("relax.reshape")
_STRIDED_SLICE = ir.Op.get("relax.strided_slice")


def _values(expr) -> list | None:
    """The values of a tuple of integer expressions (a slice's axes, begins, ends), or None."""
    fields = getattr(expr, "fields", None)
    if fields is None or not all(isinstance(getattr(f, "ty", None), ir.PrimType) for f in fields):
        return None
    return list(fields)


def rewrite(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each binding of :func:`find` cast to its simplified shape."""
    builder = relax.BlockBuilder(mod)
    changed = False
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (analyzer := analyzer_for(func)) is None:
            continue
        found = []
        mutator = _Casts(analyzer, gvar.name_hint, found)
        new_func = mutator.visit_expr(func)
        if found:
            builder.update_func(gvar, new_func)
            changed = True
    return builder.get() if changed else mod


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.BoundShapes")
class BoundShapes:
    """Each shape that simplifies under its dims' bounds, cast to the simplified shape."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite(mod)


__all__ = ["LOWER", "UPPER", "BoundShapes", "Proved", "analyzer_for", "bounds", "find", "rewrite"]
