"""Fold the reshapes around a Linear on an N-D activation, so that its epilogue fuses with it.

``torch.export`` writes a Linear on a (d0, ..., dr, K) activation X as ``view (P, K)`` ->
``addmm`` -> ``view (d0, ..., dr, N)`` with ``P = d0 * ... * dr``, and the torch frontend
imports that as::

    a = R.reshape(X, (P, K))
    m = R.matmul(a, W)                 # W: (K, N), often permute_dims of the (N, K) weight
    e = R.add(b, m)                    # bias (N,); zero or more elementwise ops
    y = R.reshape(e, (d0, ..., dr, N))
    g = R.nn.gelu(y)                   # activation, residual add, gate multiply, ...

A reshape is an injective operator, so ``FuseOps`` closes the GEMM's group before it: the GEMM
and its bias land in one PrimFunc, the reshape, the activation and the residual add in
another, and tir_byoc's matcher never sees the epilogue next to the GEMM.  Relax's ``matmul``
takes the N-D activation as it is (leading dims are batch dims over a 2-D weight), so the
reshapes are not needed at all::

    m = R.matmul(X, W)                 # (d0, ..., dr, N)
    y = R.add(b, m)
    g = R.nn.gelu(y)                   # now fuses with the matmul

Entry point: :class:`FoldLinearReshapes`, a module pass before ``LegalizeOps``
(:mod:`tir_byoc.relax.pipeline`): :func:`find` lists the reshapes it folds
(:class:`~.linear_reshape_checks.LinearReshape`), and why not the rest
(:class:`~tir_byoc.decline.Decline`; the conditions are those of
:mod:`.linear_reshape_checks`), and :func:`rewrite` folds them.

Why the rewrite computes bitwise the same values.  Write ``i = (i0, ..., ir)`` for an index of
(d0, ..., dr) and ``flat(i)`` for its row-major position in [0, P).  Relax reshapes are
row-major, and the last dim is K on the way in and N on the way out (conditions 1, 2, 5), so
``a[flat(i), k] = X'[i, k]`` where X' is X (or the replacing reshape of X: a reshape of a
reshape is the reshape of the original, both row-major) and ``y[i, j] = e[flat(i), j]``.  A
matmul with a 2-D weight treats the leading dims of its input as batch dims:
``matmul(X', W)[i, j] = sum_k X'[i, k] * W[k, j]``, the same products summed over the same k as
``m[flat(i), j]``.  An elementwise operation computes each element from the elements at the
same index; the other operand of a binary one (condition 3) holds at most N distinct elements,
indexed by j alone (or none), so it broadcasts against (d0, ..., dr, N) to the same element
``b[j]`` (or ``b[0]``) it broadcast against (P, N) to, and the result keeps the shape
(d0, ..., dr, N) (r >= 1 and its rank is at most 2).  By induction along the chain, every
element of the rewritten ``en`` is the element of ``y`` at the same index.  Condition 4 makes
sure nothing else read the 2-D values that are gone.  (Bitwise, given that the matmul sums each
row's products in the same order whichever leading dims it has: TVM's legalized ``matmul`` does,
and tir_byoc's intrinsics get the leading dims folded into M.  Three models of
``tir_byoc/testing/models.py`` give bitwise the same output with and without the fold.)

Where Relax infers for the rewritten value a struct info that differs from ``y``'s (dims equal
but written differently, e.g. symbolically), ``y`` is kept as an identity reshape of it;
otherwise ``y`` is bound to the rewritten value directly.  Nothing else in the module changes;
a module with nothing to fold is returned as it was (a second run folds nothing).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax

from .analysis import tensor_dims, variable_uses
from .linear_reshape_checks import LinearReshape, find


def rewrite(mod: tvm.IRModule, sites: tuple[LinearReshape, ...]) -> tvm.IRModule:
    """Fold the reshapes around each Linear of ``sites`` (see the module docstring).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module before ``LegalizeOps`` (a lowered one has no ``R.matmul`` left, and
        :func:`find` finds nothing in it).
    sites : tuple of LinearReshape
        What :func:`find` found to fold in ``mod``.

    Returns
    -------
    tvm.IRModule
        ``mod`` itself if nothing folds, else a new module; ``mod`` is never modified.
    """
    if not sites:
        return mod
    return _Rewriter(mod, list(sites)).transform()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.FoldLinearReshapes")
class FoldLinearReshapes:
    """The reshapes around each Linear on an N-D activation folded away: :func:`find`, then
    :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, _ = find(mod)
        return rewrite(mod, sites)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Re-emits each folded chain N-D, in place; every other binding as it was."""

    def __init__(self, mod: tvm.IRModule, folds: list[LinearReshape]):
        super().__init__(mod)
        self.mod = mod
        self.functions = {f.function for f in folds}
        self.steps: dict[relax.Var, Callable] = {}
        for fold in folds:
            if not fold.reads_activation:
                self.steps[fold.input] = functools.partial(self._reshape_input, fold)
            self.steps[fold.matmul] = functools.partial(self._matmul, fold)
            for link in fold.epilogue:
                self.steps[link] = functools.partial(self._link, fold)
            self.steps[fold.output] = functools.partial(self._output, fold)
        # An input reshape read by folded matmuls only is dead once they read X.
        uses_by_folds = Counter(f.input for f in folds if f.reads_activation)
        self.uses_by_folds = uses_by_folds
        self.replaced: dict[relax.Var, relax.Var] = {}
        self.bound_outputs: set[relax.Var] = set()

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if gvar.name_hint in self.functions:
                self.uses = variable_uses(func)
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        step = self.steps.get(var)
        if step is not None:
            step(binding)
        elif self.uses_by_folds.get(var, 0) == self.uses[var] > 0:
            return  # every user of this input reshape now reads the activation itself
        else:
            super().visit_var_binding_(binding)

    # Step 1. The input: X itself, or one reshape of X to (d0, ..., dr, K) in place of ``a``.
    def _reshape_input(self, fold: LinearReshape, binding: relax.VarBinding) -> None:
        k = tensor_dims(fold.input)[1]
        shape = relax.ShapeExpr([*fold.shape[:-1], k])
        value = relax.op.reshape(self.visit_expr(fold.activation), shape)
        self.replaced[fold.input] = self.builder_.emit(value, fold.input.name)

    # Step 2. The matmul on the N-D input.
    def _matmul(self, fold: LinearReshape, binding: relax.VarBinding) -> None:
        call = binding.value
        if fold.reads_activation:
            data = self.visit_expr(fold.activation)
        else:
            data = self.replaced[fold.input]
        value = relax.Call(call.op, [data, self.visit_expr(fold.weight)], call.attrs)
        self._emit(fold, binding.var, value)

    # Step 3. Each epilogue operation, on the N-D value of the previous one.
    def _link(self, fold: LinearReshape, binding: relax.VarBinding) -> None:
        self._emit(fold, binding.var, self.visit_expr(binding.value))

    def _emit(self, fold: LinearReshape, var: relax.Var, value: relax.Expr) -> None:
        value = self.builder_.normalize(value)
        if var.same_as(fold.chain[-1]) and tvm_ffi.structural_equal(value.ty, fold.output.ty):
            # The last step binds y itself: its users read the N-D value, no alias left.
            self.builder_.emit_normalized(relax.VarBinding(fold.output, value))
            self.bound_outputs.add(fold.output)
            return
        self.set_var_remap(var, self.builder_.emit(value, var.name))

    # Step 4. The reshape back: gone if step 3 bound y, else an identity reshape of the value.
    def _output(self, fold: LinearReshape, binding: relax.VarBinding) -> None:
        if fold.output not in self.bound_outputs:
            super().visit_var_binding_(binding)


__all__ = ["FoldLinearReshapes", "LinearReshape", "find", "rewrite"]
