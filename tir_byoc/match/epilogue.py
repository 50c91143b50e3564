"""Epilogue recognition: which operations of :data:`tir_byoc.epilogues.OPS` an expression applies.

Entry points: :func:`read_elementwise`, the checks an elementwise block must pass to join a
chain, and :class:`EpilogueParser`, which reads one expression of the product ``Y[..., i, j]``
(the chain's blocks composed into one by :mod:`.chain`, so an op spread over several blocks,
such as gelu's five, is one expression) into a tuple of :class:`~.records.Step` or raises
:class:`~tir_byoc.decline.Declined` saying what differs.  Reads :mod:`.stir`, :mod:`.exprs` and
:func:`.reduction.bias_vector`.

The ops are recognised two ways: the ones whose records say ``template`` (the formulas of
fixed form: gelu, gelu_tanh, silu, sigmoid, tanh, swish, hardswish) by their spellings, the
templates of :mod:`.templates`; the others (scale, div, bias, relu, clip, leaky_relu, add,
mul, channel_scale) by the rules of :data:`RULES`, since what they accept (a bound, a slope, a
tensor) needs its own check.  Each result records the spelling's NaN behaviour where
spellings differ (relu, clip), so the call computes it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm_ffi
from tvm import ir, tirx

from ..decline import Declined
from ..epilogues import OPS, RELU_KEEP_NAN_CODE
from .exprs import const_value, dtype_of, expr_text, index_text, is_var, is_zero, operation_text
from .extents import Extents, check_shape, dim_names
from .records import Step
from .reduction import Reduction, bias_vector
from .stir import DATA_PAR, Nest, check_binding, check_covers, compact_global
from .templates import TEMPLATES_BY_ROOT, VALUE, constants_of, root_operation, unify
from .traversal import elements, walk


@dataclass(frozen=True)
class Elementwise:
    """A block ``out[axes] = value`` over the chain's output shape."""

    nest: Nest
    out: ir.Var
    value: tirx.PrimExpr
    axes: tuple[tirx.Var, ...]  # the block's iterators, in the order of out's dims


def read_elementwise(nest: Nest, chain: Reduction, extents: Extents) -> Elementwise:
    """Check that ``nest`` is elementwise over the chain's output shape; Declined if not."""
    block = nest.block
    iterators = nest.iterators
    if any(it.iter_type != DATA_PAR for it in iterators) or block.init is not None:
        raise Declined(f"block {block.name_hint} is a reduction, not an elementwise epilogue")
    shape = chain.out_shape
    if len(iterators) != len(shape):
        raise Declined(
            f"block {block.name_hint} has {len(iterators)} axes, expected {len(shape)} "
            f"(the axes of {chain.out.name})"
        )
    check_binding(nest, extents)
    store = block.body
    out = store.buffer
    indices = elements(store.indices)
    variables = {it.handle for it in iterators}
    if (
        len(indices) != len(shape)
        or not all(e.__chandle__() in variables for e in indices)
        or len(set(indices)) != len(indices)
    ):
        raise Declined(f"output {out.name} is not indexed by the block's iterators, one per axis")
    check_shape(out, shape, dim_names(len(shape)), extents)
    check_covers(nest, indices, shape, extents)
    if dtype_of(out) != chain.dtype.out:
        raise Declined(
            f"output {out.name} is {dtype_of(out)}, the chain computes {chain.dtype.out}"
        )
    reason = compact_global(out)
    if reason:
        raise Declined(reason)
    return Elementwise(nest, out, store.value, indices)


def tir_max(a: float, b: float) -> float:
    """TVM's ``max(a, b)`` on floats: ``a > b ? a : b`` (so a NaN in a gives b)."""
    return a if a > b else b


def tir_min(a: float, b: float) -> float:
    """TVM's ``min(a, b)``: ``a < b ? a : b``."""
    return a if a < b else b


class EpilogueParser:
    """Turns an expression of ``source[axes]`` into the :class:`Step` tuple it computes.

    :meth:`parse` peels the outermost op (a template of :mod:`.templates`, else the rules of
    :data:`RULES` for its root), then parses the value it was applied to, down to the plain
    read of ``source``.  Every tensor an op reads is checked (a bias is an (n,) vector, a
    residual has the output's shape, a scale is a constant or a scalar).

    One parser reads every prefix of a chain: what it found for an expression (its steps or
    its refusal, whether it reads ``source``) is kept by the expression's node, and the
    composed expression of a longer prefix holds the shorter one's node, so each prefix is
    read from where the previous one ended, not from scratch.
    """

    def __init__(self, source, axes, chain: Reduction, extents: Extents, params):
        self.source, self.axes = source, axes
        self.vi, self.vj = axes[-2], axes[-1]
        self.chain, self.extents = chain, extents
        self.params = params  # buffers a scalar scale may be read from
        # Node handle -> (the node, kept alive so that its handle is not reused; the result).
        self._parsed: dict[int, tuple] = {}
        self._contains: dict[int, tuple] = {}

    def parse(self, expr) -> tuple[Step, ...]:
        """The steps ``expr`` applies to ``source[axes]``; Declined saying what differs."""
        handle = expr.__chandle__()
        known = self._parsed.get(handle)
        if known is None:
            try:
                known = (expr, self._parse(expr))
                # Every parse ends at a read of source inside expr.
                self._contains[handle] = (expr, True)
            except Declined as refused:
                known = (expr, refused)
            self._parsed[handle] = known
        if isinstance(known[1], Declined):
            raise known[1]
        return known[1]

    def _parse(self, expr) -> tuple[Step, ...]:
        if isinstance(expr, ir.TensorLoad) and expr.source.same_as(self.source):
            indices = elements(expr.indices)
            if len(indices) == len(self.axes) and all(
                is_var(e, v) for e, v in zip(indices, self.axes)
            ):
                return ()
            names = ", ".join(v.name for v in self.axes)
            raise Declined(
                f"reads {self.source.name}{index_text(expr)}, not "
                f"{self.source.name}[{names}] (indices are mixed up)"
            )
        root = root_operation(expr)
        for op, template in TEMPLATES_BY_ROOT.get(root, ()):
            binding = unify(template, expr, {})
            if binding is not None and self.contains_source(binding[VALUE]):
                return (*self.parse(binding[VALUE]), constants_of(op, binding))
        for rule in RULES.get(root, ()):
            found = rule(self, expr)
            if found is not None:
                inner, step = found
                return (*self.parse(inner), step)
        refusal = NOT_IN_FAMILY.get(root)
        if refusal is not None:
            reason, op = refusal
            raise Declined(reason.format(dtype=dtype_of(expr)), op=op)
        raise Declined(
            f"computes {operation_text(expr)}, which is not an epilogue op of the family"
        )

    def contains_source(self, expr) -> bool:
        handle = expr.__chandle__()
        known = self._contains.get(handle)
        if known is None:
            loads = []
            walk(expr, ir.TensorLoad, loads.append)
            found = any(load.source.same_as(self.source) for load in loads)
            known = self._contains[handle] = (expr, found)
        return known[1]

    # The rules of the ops with their own checks.
    def _operand(self, expr) -> str:
        """What a non-value operand is: "vector", "full", "scalar" or "other"."""
        if const_value(expr) is not None:
            return "scalar"
        if isinstance(expr, ir.TensorLoad):
            indices = elements(expr.indices)
            if all(const_value(i) is not None for i in indices):
                return "scalar"
            if len(indices) == len(self.axes) and all(
                is_var(e, v) for e, v in zip(indices, self.axes)
            ):
                return "full"
            return "vector"
        return "other"

    def _split(self, expr, what):
        """(value, other) for a binary node with the value on one side only; else Declined."""
        a_has, b_has = self.contains_source(expr.a), self.contains_source(expr.b)
        if a_has and b_has:
            raise Declined(f"{what} the value by a computed value of itself")
        if not (a_has or b_has):
            raise Declined(f"{what} values that do not depend on {self.source.name}")
        return (expr.a, expr.b) if a_has else (expr.b, expr.a)

    def _vector(self, load, op: str, role: str) -> Step:
        """The step of ``op`` reading the (n,) vector ``load`` (a bias, a layer scale)."""
        try:
            vector = bias_vector(
                load, self.vi, self.vj, self.chain.n, self.chain.dtype.out, self.extents, role
            )
        except Declined as refused:
            raise Declined(refused.reason, op=op) from None
        return Step(op, OPS[op].code, (), vector)

    def _add(self, expr):
        value, other = self._split(expr, "adds")
        kind = self._operand(other)
        if kind == "vector":
            return value, self._vector(other, "bias", "bias")
        if kind == "full":
            return value, Step("add", OPS["add"].code, (), self._full(other, "adds"))
        what = const_value(other)
        what = f"the constant {what}" if what is not None else expr_text(other)
        raise Declined(
            f"adds {what}, not a bias vector b[j] or a tensor of the output's shape", op="bias"
        )

    def _full(self, load, verb) -> ir.Var:
        """The buffer of a residual or gate read ``R[axes]``, checked; else Declined."""
        buf = load.source
        shape = self.chain.out_shape
        check_shape(buf, shape, dim_names(len(shape)), self.extents)
        if dtype_of(buf) != self.chain.dtype.out:
            raise Declined(
                f"{verb} {buf.name}, which is {dtype_of(buf)}, expected {self.chain.dtype.out}"
            )
        reason = compact_global(buf)
        if reason:
            raise Declined(reason)
        return buf

    def _mul(self, expr):
        value, other = self._split(expr, "multiplies")
        kind = self._operand(other)
        if kind == "full":
            return value, Step("mul", OPS["mul"].code, (), self._full(other, "multiplies by"))
        if kind == "scalar":
            return value, Step("scale", OPS["scale"].code, (self._scalar(other),))
        if kind == "vector":
            return value, self._vector(other, "channel_scale", "layer scale")
        raise Declined(
            f"multiplies by {expr_text(other)}: neither a constant, a scalar, an (N,) vector nor "
            "a tensor of the output's shape",
            op="scale",
        )

    def _div(self, expr):
        if self.contains_source(expr.b) or not self.contains_source(expr.a):
            raise Declined("divides by the value, not the value by a constant", op="scale")
        if self._operand(expr.b) != "scalar":
            raise Declined(
                f"divides by {expr_text(expr.b)}, not by a constant or a scalar", op="scale"
            )
        return expr.a, Step("div", OPS["div"].code, (self._scalar(expr.b),))

    def _scalar(self, expr):
        value = const_value(expr)
        if value is not None:
            return float(value)
        if dtype_of(expr) != self.chain.dtype.out:
            raise Declined(f"scales by {expr_text(expr)}, which is {dtype_of(expr)}", op="scale")
        if expr.source not in self.params:
            raise Declined(
                f"scales by {expr.source.name}{index_text(expr)}, not a parameter", op="scale"
            )
        return expr

    def _max(self, expr):
        # max(a, b) is a > b ? a : b: a NaN in a gives b, a NaN in b stays.
        for value, bound, value_first in ((expr.a, expr.b, True), (expr.b, expr.a, False)):
            if not self.contains_source(value) or self.contains_source(bound):
                continue
            if isinstance(value, tirx.Min) and const_value(bound) is not None:
                clip = self._clip(expr, value, bound, value_first)
                if clip is not None:
                    return clip
            threshold = const_value(bound)
            if threshold is None:
                leaky = self._leaky_max(value, bound)
                if leaky is not None:
                    return leaky
                raise Declined(
                    f"max() against {expr_text(bound)}, not against a constant", op="relu"
                )
            if threshold != 0:
                raise Declined(
                    f"max() against {threshold} alone: a relu needs 0, a clip needs both bounds",
                    op="relu",
                )
            nan = tir_max(math.nan, 0.0) if value_first else tir_max(0.0, math.nan)
            return value, self._relu(nan)
        if self.contains_source(expr.a) and self.contains_source(expr.b):
            leaky = self._leaky_max(expr.a, expr.b) or self._leaky_max(expr.b, expr.a)
            if leaky is not None:
                return leaky
        raise Declined("max() of two computed values that is not a leaky relu", op="relu")

    def _min(self, expr):
        for value, bound, value_first in ((expr.a, expr.b, True), (expr.b, expr.a, False)):
            if (
                isinstance(value, tirx.Max)
                and self.contains_source(value)
                and const_value(bound) is not None
            ):
                clip = self._clip(expr, value, bound, value_first)
                if clip is not None:
                    return clip
        raise Declined(
            "min() without a max() against a constant: a clip needs both bounds", op="clip"
        )

    def _clip(self, outer, inner, outer_bound, inner_first):
        """``max(min(z, hi), lo)`` or ``min(max(z, lo), hi)`` in any operand order, or None."""
        for value, bound, value_first in (
            (inner.a, inner.b, True),
            (inner.b, inner.a, False),
        ):
            if const_value(bound) is None or not self.contains_source(value):
                continue
            outer_fn, inner_fn = (
                (tir_max, tir_min) if isinstance(outer, tirx.Max) else (tir_min, tir_max)
            )
            outer_c, inner_c = float(const_value(outer_bound)), float(const_value(bound))
            lo, hi = (outer_c, inner_c) if outer_fn is tir_max else (inner_c, outer_c)
            if lo > hi:
                raise Declined(f"clip bounds are swapped: lower {lo} > upper {hi}", op="clip")
            # What a NaN becomes, computed the way this spelling computes it.
            nan = inner_fn(math.nan, inner_c) if value_first else inner_fn(inner_c, math.nan)
            nan = outer_fn(nan, outer_c) if inner_first else outer_fn(outer_c, nan)
            return value, Step("clip", OPS["clip"].code, (lo, hi, nan))
        return None

    def _leaky_max(self, value, scaled):
        """``max(z, a * z)`` with 0 <= a <= 1, or None."""
        if not isinstance(scaled, tirx.Mul):
            return None
        for v, slope in ((scaled.a, scaled.b), (scaled.b, scaled.a)):
            if tvm_ffi.structural_equal(v, value) and const_value(slope) is not None:
                return value, self._leaky(const_value(slope), "max(z, a * z)")
        return None

    def _leaky(self, slope, spelled) -> Step:
        if not 0 <= slope <= 1:
            raise Declined(
                f"leaky relu slope {slope} is outside [0, 1]: {spelled} is not a leaky relu then",
                op="leaky_relu",
            )
        if slope == 0:
            # TVM's simplifier folds z * 0 to 0, so the TIR turns -inf and NaN into 0 where
            # the library's leaky relu gives NaN; which one a build computes is not ours to know.
            raise Declined(
                f"leaky relu slope 0: TVM folds the z * 0 of {spelled} to 0, so -inf and NaN "
                "give 0 there and NaN in the library; spell it as a relu",
                op="leaky_relu",
            )
        return Step("leaky_relu", OPS["leaky_relu"].code, (float(slope),))

    def _relu(self, nan) -> Step:
        keep = math.isnan(nan)
        return Step("relu", RELU_KEEP_NAN_CODE if keep else OPS["relu"].code)

    def _select_node(self, expr):
        return self._select(expr.condition, expr.true_value, expr.false_value, "select()")

    def _if_then_else(self, expr):
        return self._select(*expr.args, spelled="if_then_else()")

    def _select(self, cond, then, other, spelled):
        # Every comparison with NaN is false, so a NaN takes the false branch.
        for kept, low, keep_when in ((then, other, "positive"), (other, then, "negative")):
            if not self.contains_source(kept):
                continue
            if not is_relu_condition(cond, kept, keep_when):
                if is_zero(low) or self._leaky_max(kept, low) is not None:
                    raise Declined(
                        f"{spelled} condition {cond} does not compare the value with 0",
                        op="relu",
                    )
                continue
            if is_zero(low):
                nan = math.nan if keep_when == "negative" else 0.0
                return kept, self._relu(nan)
            leaky = self._leaky_max(kept, low)
            if leaky is not None:
                return kept, self._leaky(leaky[1].constants[0], spelled)
        raise Declined(
            f"{spelled} does not choose between the value and 0 (a relu) or a * value "
            "(a leaky relu) by the value's sign",
            op="relu",
        )


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


IF_THEN_ELSE = "prim.if_then_else"

#: The rules, by root operation: ``rule(parser, expr)`` returns (the value the op applies to,
#: its Step), None when it does not apply, or raises Declined saying what differs.
RULES = {
    tirx.Add: (EpilogueParser._add,),
    tirx.Mul: (EpilogueParser._mul,),
    tirx.Div: (EpilogueParser._div,),
    tirx.Max: (EpilogueParser._max,),
    tirx.Min: (EpilogueParser._min,),
    tirx.Select: (EpilogueParser._select_node,),
    IF_THEN_ELSE: (EpilogueParser._if_then_else,),
}

#: Roots that are close to an op but are not one: (reason, the op it resembles).
NOT_IN_FAMILY = {
    tirx.Cast: ("casts the result to {dtype}", None),
    tirx.Sub: ("combines with -, not a bias add (+)", None),
    "tirx.erf": ("applies erf() alone, not as part of a gelu", "gelu"),
}
