"""Multiply by a transposed activation without writing the transpose: attention's ``q @ k^T``.

``torch.export`` writes ``q @ k.transpose(-1, -2)`` on (B, H, S, D) tensors as a transpose, an
``expand`` and a ``view`` to (B*H, D, S), then ``bmm``; the torch frontend imports that as::

    p = R.permute_dims(y, axes=[0, 1, 3, 2])    # (B, H, D, S): the last two axes swapped
    e = R.broadcast_to(p, (B, H, D, S))          # the expand: no broadcast at all
    r = R.reshape(e, (B*H, D, S))
    m = R.matmul(a, r)                           # (B*H, S, S)

``FuseOps`` fuses the transpose into the function that produces ``y`` (the head split, or
LLaMA's rotary embedding), which then writes K transposed: a strided write or gather over the
whole tensor, on every call.  A batched product that reads the second operand as (N, K)
matrices is one tir_byoc serves as it is (``bmm_dense``), so here ::

    r = R.reshape(y, (B*H, S, D))                # no transpose: the last two axes as in y
    m = NT_matmul(a, r)                          # m[b, i, j] = sum_k a[b, i, k] * r[b, j, k]

Entry point: :class:`UntransposeBatchMatmuls`, a module pass before ``LegalizeOps``
(:mod:`tir_byoc.relax.pipeline`); :func:`find` lists the products it rewrites
(:class:`UntransposedProduct`) and :func:`rewrite` rewrites them.  A binding
``m = R.matmul(a, r)`` is rewritten when

1. ``a`` and ``r`` are 3-D float tensors of static shapes, ``m`` of their dtype, and ``a`` is
   of shape (G, M, K) (the product broadcasts neither operand over the batch);
2. ``r = R.reshape(e, (G, K, N))`` and ``e`` is ``R.broadcast_to(s, shape)`` to s's own shape,
   or ``s`` itself;
3. ``s`` is ``p`` multiplied by zero or more scalar constants (``nn.MultiheadAttention``
   scales K^T), and ``p = R.permute_dims(y, axes)`` swaps the last two of y's axes and keeps
   the others (y is of shape (l..., N, K), p of (l..., K, N)); y is not a constant (a weight's
   transpose is :mod:`tir_byoc.relax.weight_copies`'s);
4. the product of the leading dims l... is G (the reshape merges them and keeps K and N);
5. ``r``, ``e`` and ``p`` each have no other user.

The scalings then apply to y, in the same order: a product by a scalar is elementwise, so
``(p * c)[l, k, n] = y[l, n, k] * c = (y * c)[l, n, k]``, the same operation on the same
element.  Why the values are the same: reshapes are row-major, so with ``g = flat(l)``,
``r[g, k, n] = p[l, k, n] = y[l, n, k]`` and ``reshape(y, (G, N, K))[g, n, k] = y[l, n, k]``;
``matmul(a, r)[g, i, n] = sum_k a[g, i, k] * r[g, k, n]`` is the NT product of the same
elements, summed over k in the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import ir, relax, sym, te, tirx

from .analysis import bound_call, static_dims, tensor_dims, variable_uses

_MATMUL = ir.Op.get("relax.matmul")
_RESHAPE = ir.Op.get("relax.reshape")
_BROADCAST = ir.Op.get("relax.broadcast_to")
_PERMUTE = ir.Op.get("relax.permute_dims")
_MULTIPLY = ir.Op.get("relax.multiply")


@dataclass(frozen=True)
class UntransposedProduct:
    """A binding ``matmul = R.matmul(a, r)`` of ``function`` whose ``r`` is the transpose of
    ``y`` (times ``scales``, in order): it becomes the NT product of ``a`` and ``y`` reshaped
    to ``shape``, (G, N, K).  ``chain`` holds ``r``'s bindings back to the transpose, which go
    with the rewrite."""

    function: str
    matmul: relax.Var
    a: relax.Expr
    y: relax.Expr
    scales: tuple[relax.Expr, ...]
    shape: tuple[int, int, int]
    chain: tuple[relax.Var, ...]


def find(mod: tvm.IRModule) -> tuple[tuple[UntransposedProduct, ...], tuple]:
    """``(sites, declines)``: the batched matmuls of ``mod``'s Relax functions that
    :func:`rewrite` computes on the untransposed operand, in binding order; any other matmul
    stays as it is, so there are no declines."""
    sites = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            sites += _sites(gvar.name_hint, func)
    return tuple(sites), ()


def rewrite(mod: tvm.IRModule, sites: tuple[UntransposedProduct, ...]) -> tvm.IRModule:
    """``mod`` with each product of ``sites`` reading its operand untransposed; ``mod`` itself
    when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    return _Rewriter(mod, sites).transform()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.UntransposeBatchMatmuls")
class UntransposeBatchMatmuls:
    """Each batched product by a transposed activation computed without the transpose:
    :func:`find`, then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, _ = find(mod)
        return rewrite(mod, sites)


def _scalar(expr) -> bool:
    """A constant of one element and rank 0."""
    return isinstance(expr, ir.Constant) and static_dims(expr) == []


def _sites(function: str, func: relax.Function) -> list[UntransposedProduct]:
    uses = variable_uses(func)
    sites = []
    for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else ():
        if not isinstance(block, relax.DataflowBlock):
            continue
        values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        for var, value in values.items():
            site = _site(var, value, values, uses)
            if site is not None:
                sites.append(UntransposedProduct(function, var, *site))
    return sites


def _site(var, value, values, uses):
    # Condition 1 (and m a variable of the block only, which the new product can stand for).
    if not isinstance(value, relax.Call) or not value.op.same_as(_MATMUL):
        return None
    if not isinstance(var, relax.DataflowVar):
        return None
    a, r = value.args
    dtype = var.ty.dtype if isinstance(var.ty, relax.TensorType) else None
    shapes = [_dims(x) for x in (a, r, var)]
    if any(s is None or len(s) != 3 for s in shapes) or not str(dtype).startswith("float"):
        return None
    if a.ty.dtype != dtype or r.ty.dtype != dtype:
        return None
    # Condition 2.
    reshape = bound_call(values, r, _RESHAPE)
    if reshape is None:
        return None
    e = reshape.args[0]
    chain = [r]
    broadcast = bound_call(values, e, _BROADCAST)
    p = e
    if broadcast is not None:
        if not _same(_dims(broadcast.args[0]), _dims(e)):
            return None
        p = broadcast.args[0]
        chain.append(e)
    # Condition 3, after any scalings by a constant scalar (an elementwise op commutes with the
    # transpose: it is applied to y instead).
    scales = []
    while (scaling := bound_call(values, p, _MULTIPLY)) is not None and _scalar(scaling.args[1]):
        chain.append(p)
        scales.append(scaling.args[1])
        p = scaling.args[0]
    permute = bound_call(values, p, _PERMUTE)
    if permute is None:
        return None
    y = permute.args[0]
    y_dims = _dims(y)
    if y_dims is None or len(y_dims) < 3 or isinstance(y, ir.Constant):
        return None
    axes = permute.attrs.axes
    swapped = [*range(len(y_dims) - 2), len(y_dims) - 1, len(y_dims) - 2]
    if axes is None or [int(x) for x in axes] != swapped:
        return None
    chain.append(p)
    # Condition 4, and no broadcast in the product itself: a of (G, M, K), m of (G, M, N).
    groups, k, n = shapes[1]
    if not _same(y_dims[-2:], [n, k]) or not _same([math.prod(y_dims[:-2])], [groups]):
        return None
    rows = shapes[0][1]
    if not _same(shapes[0], [groups, rows, k]) or not _same(shapes[2], [groups, rows, n]):
        return None
    # Condition 5.
    if any(uses[v] != 1 for v in chain):
        return None
    return a, y, tuple(reversed(scales)), (groups, n, k), tuple(chain)


def _dims(expr) -> list | None:
    """A tensor's dims: integers where static, else the symbolic expressions."""
    dims = tensor_dims(expr)
    return None if dims is None else [int(d) if isinstance(d, tirx.IntImm) else d for d in dims]


def _same(dims, other) -> bool:
    """Whether two lists of dims are equal: integers as integers, symbolic dims when the
    analyzer proves them equal (``batch * 4`` and ``4 * batch``)."""
    if dims is None or other is None or len(dims) != len(other):
        return False
    analyzer = sym.Analyzer()
    for a, b in zip(dims, other, strict=True):
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                return False
        elif not analyzer.can_prove_equal(a, b):
            return False
    return True


def _nt_matmul(a: te.Tensor, b: te.Tensor) -> te.Tensor:
    """m[g, i, j] = sum_k a[g, i, k] * b[g, j, k]."""
    groups, rows, depth = a.shape
    k = te.reduce_axis((0, depth), name="k")
    return te.compute(
        (groups, rows, b.shape[1]),
        lambda g, i, j: te.sum(a[g, i, k] * b[g, j, k], axis=k),
        name="NT_matmul",
    )


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Drops each site's transpose chain and emits the reshape of y and the NT product in the
    matmul's place; every other binding as it was."""

    def __init__(self, mod: tvm.IRModule, sites: tuple[UntransposedProduct, ...]):
        super().__init__(mod)
        self.mod = mod
        self.sites = {site.matmul: site for site in sites}
        self.dropped = {v for site in sites for v in site.chain}
        self.functions = {site.function for site in sites}

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if gvar.name_hint in self.functions:
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.dropped:
            return
        site = self.sites.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        value = self.visit_expr(site.y)
        for scale in site.scales:
            value = self.builder_.emit(relax.op.multiply(value, scale), "scaled")
        untransposed = self.builder_.emit(
            relax.op.reshape(value, relax.ShapeExpr(list(site.shape))), "untransposed"
        )
        product = self.builder_.emit_te(
            _nt_matmul, self.visit_expr(site.a), untransposed, primfunc_name_hint="NT_matmul"
        )
        self.set_var_remap(binding.var, product)


__all__ = ["UntransposeBatchMatmuls", "UntransposedProduct", "find", "rewrite"]
