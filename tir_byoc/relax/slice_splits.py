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

Entry point: :class:`SliceSplits`, a module pass before ``LegalizeOps``
(:mod:`tir_byoc.relax.pipeline`); :func:`find` lists the takes it rewrites (:class:`SplitPart`)
and :func:`rewrite` rewrites them.  A binding ``t = R.take(s, i, axis=a)`` is rewritten when

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
from dataclasses import dataclass

import tvm
from tvm import ir, relax

from .analysis import bound_call, static_dims, variable_uses

_TAKE = ir.Op.get("relax.take")
_RESHAPE = ir.Op.get("relax.reshape")
_EXPAND = ir.Op.get("relax.expand_dims")
_PERMUTE = ir.Op.get("relax.permute_dims")
_SQUEEZE = ir.Op.get("relax.squeeze")


@dataclass(frozen=True)
class SplitPart:
    """A binding ``take = R.take(s, i, axis=a)`` of ``function`` that reads
    ``source[..., begin:end]`` on ``source``'s last axis, ``axis``.

    ``chain`` holds the variables from the take's argument ``s`` back to the reshape's result
    ``w``; those that only takes read go with the rewrite.
    """

    function: str
    take: relax.Var
    source: relax.Expr
    axis: int
    begin: int
    end: int
    chain: tuple[relax.Var, ...]


def find(mod: tvm.IRModule) -> tuple[tuple[SplitPart, ...], tuple]:
    """``(sites, declines)``: the takes of ``mod``'s Relax functions that :func:`rewrite` reads
    as slices, in binding order; a take that is not a part of a split stays as it is, so there
    are no declines."""
    sites = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else ():
            if not isinstance(block, relax.DataflowBlock):
                continue
            values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
            for var, value in values.items():
                if isinstance(value, relax.Call) and value.op.same_as(_TAKE):
                    site = _site(var, value, values)
                    if site is not None:
                        sites.append(SplitPart(gvar.name_hint, var, *site))
    return tuple(sites), ()


def rewrite(mod: tvm.IRModule, sites: tuple[SplitPart, ...]) -> tvm.IRModule:
    """``mod`` with each take of ``sites`` read as a slice, and the chain bindings that only
    those takes read removed; ``mod`` itself when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    found = {}
    for gvar, func in mod.functions_items():
        own = [site for site in sites if site.function == gvar.name_hint]
        if own:
            found[gvar] = ({site.take: site for site in own}, _unused_after(func, own))
    return _Rewriter(mod, found).transform()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.SliceSplits")
class SliceSplits:
    """Each part of a split tensor taken as a slice of it: :func:`find`, then
    :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, _ = find(mod)
        return rewrite(mod, sites)


def _unused_after(func: relax.Function, sites: list[SplitPart]) -> set:
    """The chain variables (from the take's argument back to the reshape's result) left
    without a user once the takes of ``sites`` are slices."""
    chains, lost = {}, Counter()
    for site in sites:
        chains[site.chain[0]] = site.chain
        lost[site.chain[0]] += 1  # the take, now a slice, no longer reads it
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
    return y, len(y_dims) - 1, i * width, (i + 1) * width, tuple(chain)


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
        part = relax.op.strided_slice(
            self.visit_expr(site.source), [site.axis], [site.begin], [site.end]
        )
        # The take's own variable, now bound to the slice: a function's output stays one.
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(part)))


__all__ = ["SliceSplits", "SplitPart", "find", "rewrite"]
