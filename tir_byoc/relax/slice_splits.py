"""Take a part of a split tensor as a slice of it, not through a transposed copy of the whole.

``nn.MultiheadAttention`` splits its packed q/k/v projection (L, B, 3E) as
``proj.unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2)`` and then takes q, k
and v by index; the torch frontend imports that as::

    w = R.reshape(y, (L, B, 3, E))
    x = R.expand_dims(w, axis=[0])                   # (1, L, B, 3, E)
    z = R.permute_dims(x, axes=[3, 1, 2, 0, 4])      # (3, L, B, 1, E)
    s = R.squeeze(z, axis=[-2])                      # (3, L, B, E)
    q = R.take(s, R.const(0), axis=0)                # (L, B, E), and k, v likewise

Lowered, the permute writes all of ``y`` again in the new order (a PrimFunc of its own), and
each ``take`` copies a third of that.  The three parts are slices of ``y`` itself::

    q = R.strided_slice(y, axes=[2], begin=[0], end=[E])

Entry point: :func:`SliceSplits`, a module pass before ``LegalizeOps``
(:data:`tir_byoc.model.LOWERING`).  A binding ``t = R.take(s, i, axis=a)`` is rewritten when

1. ``i`` is a constant integer scalar (rank 0) with ``0 <= i < n``, so that every mode of
   ``take`` reads the same element;
2. ``s`` comes from ``w = R.reshape(y, (l..., n, E))``, where ``y`` is of shape
   (l..., n * E) (the last axis split in two), through ``expand_dims``, ``permute_dims``
   and ``squeeze`` only, each squeeze removing only axes an ``expand_dims`` of the chain
   inserted; every shape static;
3. the chain moved the axis of size n to axis ``a`` and kept the others in their order, so
   that ``s`` is ``w`` with that axis moved and nothing else changed.

Why the values are the same: ``expand_dims`` and ``squeeze`` of unit axes and a permutation
only rename indices, so with condition 3, ``s[.., k at a, ..] = w[l..., k, e]``; the reshape
is row-major, so ``w[l..., k, e] = y[l..., k * E + e]``; hence
``t[l..., e] = y[l..., i * E + e]``, which is the slice.  The element is copied, not
computed: nothing is rounded.  The chain's bindings that only the takes read are removed.
"""

from __future__ import annotations

from collections import Counter

import tvm
from tvm import ir, relax

from .analysis import bound_call, static_dims, variable_uses

_TAKE = ir.Op.get("relax.take")
_RESHAPE = ir.Op.get("relax.reshape")
_EXPAND = ir.Op.get("relax.expand_dims")
_PERMUTE = ir.Op.get("relax.permute_dims")
_SQUEEZE = ir.Op.get("relax.squeeze")


def slice_splits(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each qualifying ``take`` read as a slice (see the module docstring);
    ``mod`` itself when there is none.  ``mod`` is never modified."""
    found = {
        gvar: sites
        for gvar, func in mod.functions_items()
        if isinstance(func, relax.Function) and (sites := _sites(func))[0]
    }
    if not found:
        return mod
    return _Rewriter(mod, found).transform()


def SliceSplits() -> tvm.transform.Pass:
    """:func:`slice_splits` as a module pass."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: slice_splits(mod), opt_level=0, name="tir_byoc.SliceSplits"
    )


def _sites(func: relax.Function) -> tuple[dict, set]:
    """({take's variable: (y, last axis of y, begin, end)} for each binding that qualifies,
    the variables of the chains that only those takes read)."""
    sites, chains, lost = {}, {}, Counter()
    for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else ():
        if not isinstance(block, relax.DataflowBlock):
            continue
        values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        for var, value in values.items():
            if isinstance(value, relax.Call) and value.op.same_as(_TAKE):
                site = _site(var, value, values)
                if site is not None:
                    *part, chain = site
                    sites[var], chains[chain[0]] = tuple(part), chain
                    lost[chain[0]] += 1  # the take, now a slice, no longer reads it
    return sites, (_unused_after(func, chains, lost) if sites else set())


def _unused_after(func: relax.Function, chains: dict, lost: Counter) -> set:
    """The chain variables (from the take's argument back to the reshape's result) left
    without a user once the takes are slices; ``lost`` counts the uses the takes made."""
    uses = variable_uses(func)
    unused = set()
    for chain in chains.values():
        for i, var in enumerate(chain):
            if uses[var] != lost[var]:
                break
            unused.add(var)
            if i + 1 < len(chain):
                lost[chain[i + 1]] += 1  # var's binding, dropped, read its argument once
    return unused


def _site(var, take: relax.Call, values: dict):
    data, index = take.args
    if take.attrs.axis is None:
        return None
    # Condition 2: back through the layout ops to the reshape, each axis of `data` labelled by
    # the axis of the reshape's result it is (None for a unit axis expand_dims inserted).
    layout = []
    chain = [data]
    while (call := bound_call(values, chain[-1])) is not None and not call.op.same_as(_RESHAPE):
        if not any(call.op.same_as(op) for op in (_EXPAND, _PERMUTE, _SQUEEZE)):
            return None
        layout.append(call)
        chain.append(call.args[0])
    source = chain[-1]
    reshape = bound_call(values, source, _RESHAPE)
    if reshape is None:
        return None
    y = reshape.args[0]
    y_dims, w_dims = static_dims(y), static_dims(source)
    if y_dims is None or w_dims is None or len(w_dims) != len(y_dims) + 1 or not y_dims:
        return None
    parts, width = w_dims[-2:]
    if w_dims[:-2] != y_dims[:-1] or parts * width != y_dims[-1]:
        return None
    labels = list(range(len(w_dims)))
    for call in reversed(layout):
        labels = _relabel(call, labels)
        if labels is None or static_dims(call) is None:
            return None
    # Condition 3: the split axis at `axis`, the others in order, no unit axis left.
    axis = int(take.attrs.axis) % len(labels)
    split = len(w_dims) - 2
    if labels[axis] != split or labels[:axis] + labels[axis + 1 :] != [
        a for a in range(len(w_dims)) if a != split
    ]:
        return None
    # Condition 1.
    if not isinstance(index, ir.Constant) or static_dims(index) != []:
        return None
    if not str(index.ty.dtype).startswith(("int", "uint")):
        return None
    i = int(index.value.numpy())
    if not 0 <= i < parts or static_dims(var) != [*y_dims[:-1], width]:
        return None
    return y, len(y_dims) - 1, i * width, (i + 1) * width, chain


def _relabel(call: relax.Call, labels: list) -> list | None:
    """The labels of ``call``'s result from those of its argument; None if it does more than
    rename axes (a squeeze of an axis that was not inserted)."""
    if call.op.same_as(_EXPAND):
        rank = len(labels) + len(call.attrs.axis)
        out = list(labels)
        for position in sorted(int(a) % rank for a in call.attrs.axis):
            out.insert(position, None)
        return out
    if call.op.same_as(_PERMUTE):
        axes = call.attrs.axes
        order = reversed(range(len(labels))) if axes is None else [int(a) for a in axes]
        return [labels[a] for a in order]
    dims = static_dims(call.args[0])
    if dims is None:
        return None
    if call.attrs.axis is None:
        removed = {a for a, d in enumerate(dims) if d == 1}
    else:
        removed = {int(a) % len(labels) for a in call.attrs.axis}
    if any(labels[a] is not None for a in removed):
        return None
    return [label for a, label in enumerate(labels) if a not in removed]


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Emits each site's slice in the take's place and drops the chain bindings only the takes
    read; every other binding as it was."""

    def __init__(self, mod: tvm.IRModule, found: dict):
        super().__init__(mod)
        self.mod = mod
        self.found = found

    def transform(self) -> tvm.IRModule:
        for gvar, (sites, unused) in self.found.items():
            self.sites, self.unused = sites, unused
            self.builder_.update_func(gvar, self.visit_expr(self.mod[gvar]))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if binding.var in self.unused:
            return
        site = self.sites.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        y, axis, begin, end = site
        part = relax.op.strided_slice(self.visit_expr(y), [axis], [begin], [end])
        # The take's own variable, now bound to the slice: a function's output stays one.
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(part)))


__all__ = ["SliceSplits", "slice_splits"]
