"""Which reshapes around a Linear fold away (:mod:`.linear_reshapes`), and why not the rest.

Entry point: :func:`find`, which :mod:`.linear_reshapes` exposes.  Every reshape ``y`` of a
dataflow block whose argument is, through elementwise operations ``e1 .. en`` of
:data:`UNARY_OPS` or :data:`BROADCAST_OPS` bound in the same block
(0 <= n <= :data:`MAX_EPILOGUE`), a ``matmul`` is a candidate; it is folded
(:class:`LinearReshape`) when all of the following hold (otherwise it is left exactly as it
was, and a :class:`~tir_byoc.decline.Decline` gives the first condition that failed):

1. the matmul is 2-D: ``m = matmul(a, W)`` with ``a`` of shape (P, K) and ``W`` of (K, N);
2. ``y`` has shape (d0, ..., dr, N), r >= 1: the same last dim N, and d0 * ... * dr = P (a
   2-D ``y`` would be an identity reshape, nothing to fold);
3. each ``ei`` is a unary elementwise operation of the chain's value (its other arguments are
   not tensors), or a binary one of the chain's value, of the chain's shape (P, N), and one
   other tensor of shape (), (1,), (N,), (1, 1) or (1, N): a broadcast along the last dim only;
4. ``m`` and every ``ei`` is used exactly once, by the next link of the chain (no other user
   needs the 2-D value);
5. ``a = reshape(X, ...)`` in the same dataflow block, and either X has shape
   (d0, ..., dr, K), or ``a`` has no other user (it is then replaced by
   ``reshape(X, (d0, ..., dr, K))``, one reshape for another, which needs every symbolic dim
   of y defined by the function's parameters, so that it is in scope where ``a`` was).

Every dim is compared as a ``PrimExpr``: integers directly, symbolic dims with the arithmetic
analyzer (``can_prove_equal``); a dim that cannot be proven equal is a refusal.  The shapes are
read from the struct info Relax inferred, so a ``-1`` in a reshape's target is already resolved.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from dataclasses import dataclass

import tvm
from tvm import ir, relax, sym, tirx

from ..decline import RESHAPE_FOLD, Decline, Declined
from ..match.exprs import as_int64, expr_text
from .analysis import bound_call, tensor_dims, variable_uses

_RESHAPE = ir.Op.get("relax.reshape")
_MATMUL = ir.Op.get("relax.matmul")

#: The most elementwise operations searched between a matmul and its reshape back.
MAX_EPILOGUE = 32
#: Elementwise operations of one tensor (their other arguments are attributes or scalars).
UNARY_OPS = frozenset(
    {
        "relax.astype",
        "relax.clip",
        "relax.erf",
        "relax.exp",
        "relax.negative",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.nn.leakyrelu",
        "relax.nn.relu",
        "relax.nn.silu",
        "relax.rsqrt",
        "relax.sigmoid",
        "relax.sqrt",
        "relax.square",
        "relax.tanh",
    }
)
#: Elementwise operations of two tensors that broadcast (numpy rules).
BROADCAST_OPS = frozenset(
    {
        "relax.add",
        "relax.divide",
        "relax.maximum",
        "relax.minimum",
        "relax.multiply",
        "relax.power",
        "relax.subtract",
    }
)


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearReshape:
    """A Linear whose reshapes fold away: ``y = reshape(en(...e1(matmul(a, W))), (..., N))``.

    Attributes
    ----------
    function : str
        The Relax function.
    output : relax.Var
        ``y``, the reshape back to (d0, ..., dr, N); after the fold it is bound to the
        rewritten ``en`` (or ``m``).
    input : relax.Var
        ``a = reshape(X, (P, K))``, the matmul's input.
    activation : relax.Expr
        ``X``, the tensor ``a`` reshapes.
    matmul : relax.Var
        ``m = matmul(a, W)``.
    weight : relax.Expr
        ``W``, 2-D.
    epilogue : tuple of relax.Var
        ``e1 .. en``, from the matmul outwards.
    operations : tuple of str
        Their Relax operators (``relax.add``, ``relax.nn.gelu``, ...).
    reads_activation : bool
        True if X has shape (d0, ..., dr, K) and the matmul reads it directly; False if ``a``
        is replaced by ``reshape(X, (d0, ..., dr, K))``.
    """

    function: str
    output: relax.Var
    input: relax.Var
    activation: relax.Expr
    matmul: relax.Var
    weight: relax.Expr
    epilogue: tuple[relax.Var, ...]
    operations: tuple[str, ...]
    reads_activation: bool

    @property
    def chain(self) -> tuple[relax.Var, ...]:
        """``m, e1, .., en``: the bindings whose values become N-D."""
        return (self.matmul, *self.epilogue)

    @property
    def shape(self) -> tuple[tvm.ir.PrimExpr, ...]:
        """(d0, ..., dr, N), the shape every value of :attr:`chain` takes."""
        return tensor_dims(self.output)

    def __str__(self) -> str:
        inner = f"matmul({self.input.name}, {_name(self.weight)})"
        for op in self.operations:
            inner = f"{op.removeprefix('relax.')}({inner})"
        source = "reads " + _name(self.activation) if self.reads_activation else "reshapes it"
        return f"{self.function}: {self.output.name} = reshape({inner}): folded ({source})"


@dataclass(frozen=True)
class _Function:
    """What the checks read about one Relax function."""

    name: str
    uses: Counter
    #: The symbolic dims its parameters define (in scope at every binding).
    param_dims: tuple


# --------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------


def _name(expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else type(expr).__name__.lower()


def _shape_text(dims) -> str:
    inner = ", ".join(expr_text(d) for d in dims)
    return f"({inner},)" if len(dims) == 1 else f"({inner})"


class _Dims:
    """Proves dims equal: integers directly, symbolic ones with the arithmetic analyzer."""

    def __init__(self):
        self._analyzer = sym.Analyzer()

    def equal(self, a, b) -> bool:
        a, b = as_int64(a), as_int64(b)
        if isinstance(a, tirx.IntImm) and isinstance(b, tirx.IntImm):
            return a.value == b.value
        return bool(self._analyzer.can_prove_equal(a, b))

    def all_equal(self, a, b) -> bool:
        return len(a) == len(b) and all(self.equal(x, y) for x, y in zip(a, b, strict=True))

    def product(self, dims):
        return self._analyzer.simplify(functools.reduce(operator.mul, map(as_int64, dims)))


# --------------------------------------------------------------------------------------
# Finding: from each reshape back to a matmul, through the epilogue
# --------------------------------------------------------------------------------------


def _is_tensor(expr) -> bool:
    return isinstance(getattr(expr, "ty", None), relax.TensorType)


def _chain_operands(call: relax.Call, dims: _Dims) -> list[int]:
    """The arguments an epilogue operation may carry the chain's value in, in order."""
    name = call.op.name
    if name in UNARY_OPS:
        return [0]
    if name in BROADCAST_OPS:
        out = tensor_dims(call)
        return [
            i
            for i, arg in enumerate(call.args)
            if isinstance(arg, relax.Var) and out is not None and _same_dims(arg, out, dims)
        ]
    return []


def _same_dims(expr, dims_expected, dims: _Dims) -> bool:
    found = tensor_dims(expr)
    return found is not None and dims.all_equal(found, dims_expected)


def _walk(values: dict, var, dims: _Dims, dead_ends: set, depth: int = 0) -> list | None:
    """``[m, e1, .., en]`` (the chain from ``var`` back to a matmul), or None if none.

    ``dead_ends`` remembers the variables no chain starts from (the search is then linear in
    the block, however often its values are shared); at most :data:`MAX_EPILOGUE` operations
    are followed.
    """
    if bound_call(values, var, _MATMUL) is not None:
        return [var]
    call = bound_call(values, var)
    if call is None or depth == MAX_EPILOGUE or var in dead_ends:
        return None
    for index in _chain_operands(call, dims):
        chain = _walk(values, call.args[index], dims, dead_ends, depth + 1)
        if chain is not None:
            return [*chain, var]
    dead_ends.add(var)
    return None


def _candidates(func: relax.Function):
    """Each dataflow block's bindings as ``{var: value}``, and its reshapes of a matmul chain."""
    dims = _Dims()
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        dead_ends = set()
        for var, value in values.items():
            if bound_call(values, var, _RESHAPE) is None:
                continue
            chain = _walk(values, value.args[0], dims, dead_ends)
            if chain is not None:
                yield var, chain, values


def find(mod: tvm.IRModule) -> tuple[tuple[LinearReshape, ...], tuple[Decline, ...]]:
    """``(sites, declines)``: the reshapes of a matmul's (elementwise-continued) result that
    fold, and those that do not, each in the Relax functions' binding order."""
    folds, declines = [], []
    for gvar, func in mod.functions_items():
        if not _is_plain_relax(func):
            continue
        param_dims = tuple(v for p in func.params for v in relax.analysis.tir_vars_in_type(p.ty))
        context = _Function(gvar.name_hint, variable_uses(func), param_dims)
        for output, chain, values in _candidates(func):
            try:
                folds.append(_check(context, output, chain, values, _Dims()))
            except Declined as refused:
                why = refused.reason
                declines.append(
                    Decline(context.name, (output.name,), RESHAPE_FOLD, why, "relax.reshape")
                )
    return tuple(folds), tuple(declines)


def _is_plain_relax(func) -> bool:
    if not isinstance(func, relax.Function):
        return False
    attrs = func.attrs or {}
    return not any(key in attrs for key in ("Primitive", "Codegen"))


# --------------------------------------------------------------------------------------
# Checking: the conditions of the module docstring, in its order
# --------------------------------------------------------------------------------------


def _known(expr, what: str) -> tuple:
    found = tensor_dims(expr)
    if found is None:
        raise Declined(f"the shape of {what} is not known")
    return found


def _check(context: _Function, output, chain, values, dims: _Dims) -> LinearReshape:
    uses = context.uses
    matmul, epilogue = chain[0], chain[1:]
    call = values[matmul]
    a, weight = call.args
    # Condition 1. A 2-D matmul: (P, K) x (K, N).
    a_shape, w_shape = _known(a, "the matmul's input"), _known(weight, "the weight")
    if len(a_shape) != 2 or len(w_shape) != 2:
        raise Declined(
            f"{matmul.name} is a batched matmul (input of {len(a_shape)} dims, weight of "
            f"{len(w_shape)}); only a 2-D matmul on a 2-D weight is folded"
        )
    (p, k), n = a_shape, w_shape[1]
    # Condition 2. The reshape back keeps N and splits P into the leading dims.
    y_shape = _known(output, output.name)
    if len(y_shape) < 3:
        raise Declined(
            f"the reshape back to {_shape_text(y_shape)} is 2-D: nothing to fold (it can only "
            "be an identity reshape)"
        )
    if not dims.equal(y_shape[-1], n):
        raise Declined(
            f"the reshape back to {_shape_text(y_shape)} does not keep the last dim N = "
            f"{expr_text(n)} (it only may split the leading dim P = {expr_text(p)})"
        )
    if not dims.equal(dims.product(y_shape[:-1]), p):
        raise Declined(f"the leading dims of {_shape_text(y_shape)} do not multiply to P = {p}")
    # Condition 3. Each epilogue operation is elementwise, its other operand a last-dim broadcast.
    full = (p, n)
    for link, previous in zip(epilogue, chain, strict=False):
        _check_epilogue(link, values[link], previous, full, dims)
    # Condition 4. Nothing else reads the 2-D values.
    for var in chain:
        if uses[var] != 1:
            raise Declined(
                f"{var.name} is used {uses[var]} times; the fold needs its 2-D value used once, "
                "by the next step towards the reshape"
            )
    # Condition 5. The input is a reshape of the activation.
    source = bound_call(values, a, _RESHAPE)
    if source is None:
        raise Declined(f"the matmul's input {_name(a)} is not a reshape (folding would add one)")
    activation = source.args[0]
    x_shape = tensor_dims(activation)
    reads = x_shape is not None and dims.all_equal(x_shape, (*y_shape[:-1], k))
    if not reads:
        _check_reshape_in_place(context, a, activation, x_shape, (*y_shape[:-1], k), output)
    operations = tuple(values[link].op.name for link in epilogue)
    return LinearReshape(
        context.name, output, a, activation, matmul, weight, tuple(epilogue), operations, reads
    )


def _check_reshape_in_place(context: _Function, a, activation, x_shape, shape, output) -> None:
    """Condition 5, second case: ``reshape(X, shape)`` can take the place of ``a``."""
    if context.uses[a] != 1:
        shown = "an unknown shape" if x_shape is None else _shape_text(x_shape)
        raise Declined(
            f"{a.name} reshapes {_name(activation)} of {shown}, not {_shape_text(shape)}, "
            "and has other users"
        )
    # The new reshape sits where ``a`` was: the dims it takes from y must be defined there.
    later = [
        v
        for v in relax.analysis.tir_vars_in_type(output.ty)
        if not any(v.same_as(defined) for defined in context.param_dims)
    ]
    if later:
        raise Declined(
            f"the reshape of {_name(activation)} to {_shape_text(shape)} would need "
            f"{', '.join(v.name for v in later)}, not defined by the function's parameters"
        )


def _check_epilogue(link, call, previous, full, dims: _Dims) -> None:
    name = call.op.name
    others = [arg for arg in call.args if not arg.same_as(previous)]
    if len(others) != len(call.args) - 1:
        raise Declined(f"{link.name} = {name} reads {previous.name} more than once")
    if name in UNARY_OPS:
        tensors = [arg for arg in others if _is_tensor(arg)]
        if tensors:
            raise Declined(f"{link.name} = {name} takes another tensor, {_name(tensors[0])}")
    else:
        _check_broadcast(link, name, others, full, dims)
    if not _same_dims(link, full, dims):
        raise Declined(f"{link.name} = {name} changes the shape {_shape_text(full)}")


def _check_broadcast(link, name, others, full, dims: _Dims) -> None:
    (other,) = others
    shape = tensor_dims(other)
    n = full[1]
    last_dim_only = (
        shape is not None
        and len(shape) <= 2
        and all(dims.equal(d, 1) for d in shape[:-1])
        and (not shape or dims.equal(shape[-1], 1) or dims.equal(shape[-1], n))
    )
    if not last_dim_only:
        shown = "an unknown shape" if shape is None else _shape_text(shape)
        raise Declined(
            f"{link.name} = {name} with {_name(other)} of {shown}: expected a broadcast along "
            f"the last dim only, (), (N,) or (1, N) with N = {expr_text(n)}"
        )


__all__ = [
    "BROADCAST_OPS",
    "MAX_EPILOGUE",
    "UNARY_OPS",
    "LinearReshape",
    "find",
]
