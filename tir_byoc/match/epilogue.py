"""Epilogue recognition: which family operations an elementwise block applies.

Entry point: :func:`analyze_epilogue`, which reads ``out[i, j] = f(source[i, j])`` into an
:class:`Epilogue` (its ops, bias, output, and what its relu makes of NaN) or raises
:class:`~.records.Refused`.  Called by :mod:`.chain`; reads :mod:`.stir`, :mod:`.exprs` and
:func:`.reduction.bias_vector`.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, tirx

from .exprs import const_value, dtype_of, index_text, is_var, is_zero, operation_text
from .records import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO, Refused
from .reduction import Reduction, bias_vector
from .stir import (
    DATA_PAR,
    Extents,
    Nest,
    check_binding,
    check_covers,
    check_shape,
    compact_global,
    dim_names,
)


@dataclass(frozen=True)
class Epilogue:
    nest: Nest
    ops: tuple[str, ...]
    bias: ir.Var | None
    out: ir.Var
    relu_nan: str | None  # what the relu's spelling makes of NaN (RELU_NAN_TO_ZERO, ...)


def analyze_epilogue(nest: Nest, chain: Reduction, source, extents, index) -> Epilogue:
    """Read ``nest`` as ``out[..., i, j] = f(source[..., i, j])``, f made of bias adds and relus."""
    block = nest.block
    if any(iv.iter_type != DATA_PAR for iv in block.iter_vars) or block.init is not None:
        raise Refused(f"block {block.name_hint} is a reduction, not an elementwise epilogue")
    shape = chain.out_shape
    if len(block.iter_vars) != len(shape):
        raise Refused(
            f"block {block.name_hint} has {len(block.iter_vars)} axes, expected {len(shape)} "
            f"(the axes of {chain.out.name})"
        )
    check_binding(nest, extents)
    store = block.body
    out = store.buffer
    indices = tuple(store.indices)
    if (
        len(indices) != len(shape)
        or not all(
            isinstance(e, tirx.Var) and any(iv.var.same_as(e) for iv in block.iter_vars)
            for e in indices
        )
        or len(set(indices)) != len(indices)
    ):
        raise Refused(f"output {out.name} is not indexed by the block's iterators, one per axis")
    check_shape(out, shape, dim_names(len(shape)), extents)
    check_covers(block, indices, shape, extents)
    if dtype_of(out) != chain.dtype.out:
        raise Refused(f"output {out.name} is {dtype_of(out)}, the chain computes {chain.dtype.out}")
    reason = compact_global(out)
    if reason:
        raise Refused(reason)
    parser = EpilogueParser(source, indices, chain, extents)
    ops = parser.parse(store.value)
    if not ops:
        raise Refused(f"block {block.name_hint} only copies {source.name}")
    relu_nan = parser.relu_nan
    if relu_nan is not None and not chain.dtype.out.startswith(("float", "bfloat")):
        relu_nan = RELU_NAN_TO_ZERO  # integers have no NaN: every spelling agrees
    return Epilogue(nest, ops, parser.bias, out, relu_nan)


IF_THEN_ELSE = "prim.if_then_else"


def root_operation(expr):
    """The key of ``expr`` in :data:`RULES`: its node type, or the operator name of a call."""
    if isinstance(expr, tvm.ir.Call):
        return getattr(expr.op, "name", None)
    return type(expr)


class EpilogueParser:
    """Turns an elementwise expression of ``source[..., i, j]`` into a tuple of family ops.

    Each operation is read by the rules :data:`RULES` lists for its root (a rule returns the
    ops it read, None when it does not apply, or raises Refused saying what differs); a root
    no rule reads is refused with the words of :data:`NOT_IN_FAMILY`.

    It also records what the relu's spelling makes of NaN, which TVM's code keeps: ``max(a,
    b)`` and ``select(c, a, b)`` are ``a > b ? a : b`` and ``c ? a : b``, so a NaN reaching
    ``max(z, 0)`` or ``select(z > 0, z, 0)`` gives 0, and one reaching ``max(0, z)`` or
    ``select(z < 0, 0, z)`` stays NaN.
    """

    def __init__(self, source, indices, chain: Reduction, extents: Extents):
        self.source, self.indices = source, indices
        self.vi, self.vj = indices[-2], indices[-1]
        self.chain, self.extents = chain, extents
        self.bias = None
        self.relu_nan = None

    def parse(self, expr) -> tuple[str, ...]:
        if isinstance(expr, ir.TensorLoad) and expr.source.same_as(self.source):
            if len(expr.indices) == len(self.indices) and all(
                is_var(e, v) for e, v in zip(expr.indices, self.indices)
            ):
                return ()
            names = ", ".join(v.name for v in self.indices)
            raise Refused(
                f"reads {self.source.name}{index_text(expr)}, not "
                f"{self.source.name}[{names}] (indices are mixed up)"
            )
        root = root_operation(expr)
        for rule in RULES.get(root, ()):
            ops = rule(self, expr)
            if ops is not None:
                return ops
        refusal = NOT_IN_FAMILY.get(root)
        if refusal is not None:
            reason, op = refusal
            raise Refused(reason.format(dtype=dtype_of(expr)), op=op)
        raise Refused(f"computes {operation_text(expr)}, which is not a bias add or a relu")

    def _contains_source(self, expr) -> bool:
        found = []

        def on_load(load):
            if load.source.same_as(self.source):
                found.append(load)

        tvm_ffi.structural_walk(expr, (ir.TensorLoad, on_load))
        return bool(found)

    def _bias_add(self, expr) -> tuple[str, ...]:
        inner, bias = (expr.a, expr.b) if self._contains_source(expr.a) else (expr.b, expr.a)
        if self._contains_source(bias):
            raise Refused(f"adds {self.source.name} to itself", op="bias")
        ops = self.parse(inner)
        if not isinstance(bias, ir.TensorLoad):
            value = const_value(bias)
            what = f"the constant {value}" if value is not None else str(bias)
            raise Refused(f"adds {what}, not a bias vector b[j]", op="bias")
        try:
            self._check_bias(bias)
        except Refused as refused:
            raise Refused(refused.reason, op="bias") from None
        return (*ops, "bias")

    def _check_bias(self, load):
        chain = self.chain
        indices = list(load.indices)
        if len(self.indices) > 2 and len(indices) == len(self.indices):
            if all(is_var(e, v) for e, v in zip(indices, self.indices)):
                raise Refused(
                    f"adds {load.source.name}{index_text(load)}, a tensor of the output's "
                    "shape (a residual add), not a bias vector b[j]"
                )
        buf = bias_vector(load, self.vi, self.vj, chain.n, chain.dtype.out, self.extents)
        if self.bias is not None or chain.bias is not None:
            raise Refused("adds a second bias")
        self.bias = buf

    def _relu_max(self, expr) -> tuple[str, ...]:
        # max(a, b) is a > b ? a : b: NaN in a gives b, NaN in b stays.
        for value, bound, nan in (
            (expr.a, expr.b, RELU_NAN_TO_ZERO),
            (expr.b, expr.a, RELU_KEEPS_NAN),
        ):
            if self._contains_source(value) and not self._contains_source(bound):
                threshold = const_value(bound)
                if threshold is None:
                    raise Refused(
                        f"max() against {bound}, not against 0 (a relu needs 0)", op="relu"
                    )
                if threshold != 0:
                    raise Refused(f"relu threshold is {threshold}, not 0", op="relu")
                return self._relu(value, nan)
        raise Refused("max() of two computed values (a leaky relu is not in the family)", op="relu")

    def _relu_select_node(self, expr) -> tuple[str, ...]:
        return self._relu_select(expr.condition, expr.true_value, expr.false_value)

    def _relu_if_then_else(self, expr) -> tuple[str, ...]:
        return self._relu_select(*expr.args, spelled="if_then_else()")

    def _relu_select(self, cond, then, other, spelled="select()") -> tuple[str, ...]:
        # Every comparison with NaN is false, so NaN takes the false branch.
        branches = (
            (then, other, "positive", RELU_NAN_TO_ZERO),
            (other, then, "negative", RELU_KEEPS_NAN),
        )
        for value, zero, keep_when, nan in branches:
            if not is_zero(zero) or not self._contains_source(value):
                continue
            if is_relu_condition(cond, value, keep_when):
                return self._relu(value, nan)
            raise Refused(
                f"{spelled} condition {cond} does not compare the value with 0", op="relu"
            )
        raise Refused(f"{spelled} does not choose between the value and 0", op="relu")

    def _relu(self, value, nan) -> tuple[str, ...]:
        ops = self.parse(value)
        self.relu_nan = nan
        return (*ops, "relu")


def is_relu_condition(cond, value, keep_when) -> bool:
    """True if ``cond`` is ``value > 0`` (keep_when positive) or ``value < 0`` (negative)."""
    keep_value_if = {
        "positive": ((tirx.GT, tirx.GE), (tirx.LT, tirx.LE)),
        "negative": ((tirx.LT, tirx.LE), (tirx.GT, tirx.GE)),
    }[keep_when]
    value_left, value_right = keep_value_if
    if isinstance(cond, value_left) and is_zero(cond.b):
        return tvm_ffi.structural_equal(cond.a, value)
    if isinstance(cond, value_right) and is_zero(cond.a):
        return tvm_ffi.structural_equal(cond.b, value)
    return False


#: The epilogue rules, by root operation: each ``rule(parser, expr)`` returns the ops it read
#: (recursing into the value it wraps), None when it does not apply, or raises Refused.  A new
#: operation is one entry here (and one case in each backend's C).
RULES = {
    tirx.Add: (EpilogueParser._bias_add,),
    tirx.Max: (EpilogueParser._relu_max,),
    tirx.Select: (EpilogueParser._relu_select_node,),
    IF_THEN_ELSE: (EpilogueParser._relu_if_then_else,),
}

#: Roots that are close to a family operation but are not one: (reason, the op it resembles).
NOT_IN_FAMILY = {
    tirx.Min: ("applies min(): a clipped relu is not part of the family", "relu"),
    tirx.Cast: ("casts the result to {dtype}", None),
    tirx.Sub: ("combines with -, not a bias add (+)", None),
    tirx.Mul: ("multiplies the result (a scale or leaky relu is not in the family)", None),
}
