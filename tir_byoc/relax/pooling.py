"""Pooling windows clipped to the input, so that the loops run over positions that exist.

torch lets a pooling window reach past its input: with ``ceil_mode=True`` a window may start
inside the input and run past its end, and EfficientNet's final pooling is written
``nn.AvgPool2d(1280, ceil_mode=True)`` over a 7 x 7 map, one window of 1280 x 1280 of which 49
positions are real.  TVM 0.27 lowers such a pool to loops over the whole window, each step
checking whether its position exists: 1.6 million steps for each of 49 real ones.

Along one spatial axis of size n, with padding p before and after, a window of k positions
starting at -p (there is one output position along that axis) covers [-p, -p + k) and torch
reads ::

    max:                     the max over [0, n) of the positions it covers
    avg, count_include_pad:  their sum / (min(-p + k, n + p) + p)   (the window clipped at
                             the far padding's end, not at the input's)
    avg, otherwise:          their sum / the number of them

So a window that covers the whole axis, k >= n + p, reads the same as one of k' = min(k,
n + 2p): the same positions, the same divisor.  :func:`rewrite` does that in two forms:

1. **whole input**: when there is one output position along every spatial axis and each
   window covers its axis, the pool is a reduction over the spatial axes (keepdims):
   ``R.max``, or ``R.sum`` divided by the divisor above (the product over the axes; the
   number of real positions without ``count_include_pad``).  Only the real positions are read.
2. **clipped**: otherwise each axis whose window is longer than the padded input, k > n + 2p
   (it has one output position), gets k' = n + 2p, the other attributes kept; what TVM then
   reads along that axis is the padded input, no position beyond it.

A pool is a candidate when a window reaches past the input (k - p > n along an axis with
one output position) or, for form 2, past the padded input; one whose windows lie inside its
padded input is no candidate.  A candidate is declined, with the reason, when its layout is not
the default (``NCW``, ``NCHW``, ``NCDHW``), a shape is not static, its dilation is not 1 on a
clipped axis, an average's padding differs before and after (the divisor above is torch's, for
equal padding), or the rewritten pool's shape would differ from the original's.  The sums and
the max are over the same values as before; a sum may add them in another order.

Entry point: :class:`ClipPoolWindows`, a module pass before ``LegalizeOps``
(:mod:`tir_byoc.relax.pipeline`); :func:`find` gives the pools it rewrites
(:class:`PoolSite`) and the candidates it declines (:class:`~tir_byoc.decline.Decline`);
:func:`rewrite` rewrites them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import tvm
from tvm import ir, relax

from ..decline import Decline
from .analysis import static_dims

logger = logging.getLogger("tir_byoc")

#: The kind of site of this rewrite's declines (:attr:`tir_byoc.decline.Decline.what`).
POOL_CLIP = "pooling window clip"

_LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}
_POOLS = {
    ir.Op.get(f"relax.nn.{kind}_pool{d}d"): (kind, d, getattr(relax.op.nn, f"{kind}_pool{d}d"))
    for kind in ("avg", "max")
    for d in (1, 2, 3)
}


@dataclass(frozen=True)
class PoolSite:
    """A pool of ``function`` rewritten: ``var = call`` becomes ``form`` (``"whole input"``:
    a reduction over ``axes`` divided by ``divisor``, 0 for a max; ``"clipped"``: the same
    pool with ``pool_size``)."""

    function: str
    var: relax.Var
    call: relax.Call
    form: str
    axes: tuple[int, ...] = ()
    divisor: int = 0
    pool_size: tuple[int, ...] = ()


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _site(function: str, var, call: relax.Call) -> PoolSite | str | None:
    """The rewrite of one pool, why there is none (a candidate declined), or None (no
    candidate: every window lies inside the padded input)."""
    kind, spatial, _ = _POOLS[call.op]
    attrs = call.attrs
    in_dims, out_dims = static_dims(call.args[0]), static_dims(var)
    if in_dims is None or out_dims is None:
        return "a shape is not static"
    sizes, outs = in_dims[2:], out_dims[2:]
    kernel, padding = _ints(attrs.pool_size), _ints(attrs.padding)
    before, after = padding[:spatial], padding[spatial:] or padding[:spatial]
    padded = [n + b + a for n, b, a in zip(sizes, before, after)]
    # Step 1. Is it a candidate: does a window reach past the input on an axis of one output?
    reach = [(k - 1) * d + 1 for k, d in zip(kernel, _ints(attrs.dilation))]
    covers = [o == 1 and r - b >= n for o, r, b, n in zip(outs, reach, before, sizes)]
    beyond = [o == 1 and r - b > n for o, r, b, n in zip(outs, reach, before, sizes)]
    if not any(beyond):
        return None
    # Step 2. What it must be to be rewritten.
    layouts = (str(attrs.layout), str(attrs.out_layout))
    if layouts != (_LAYOUTS[spatial],) * 2:
        return f"layouts {'/'.join(layouts)}; the clip reads {_LAYOUTS[spatial]}"
    if any(d != 1 for d in _ints(attrs.dilation)):
        return f"dilation {list(_ints(attrs.dilation))}; the clip reads windows of dilation 1"
    if kind == "avg" and before != after:
        return f"padding {list(padding)} differs before and after; torch's divisor needs equal"
    # Step 3. The form.
    if all(covers):
        axes = tuple(range(2, 2 + spatial))
        if kind == "max":
            return PoolSite(function, var, call, "whole input", axes)
        counts = [min(k, p) for k, p in zip(kernel, padded)]
        divisor = math.prod(counts if attrs.count_include_pad else sizes)
        return PoolSite(function, var, call, "whole input", axes, divisor)
    clipped = tuple(min(k, p) if o == 1 else k for k, p, o in zip(kernel, padded, outs))
    if clipped == kernel:
        return None
    return PoolSite(function, var, call, "clipped", pool_size=clipped)


def find(mod: tvm.IRModule) -> tuple[tuple[PoolSite, ...], tuple[Decline, ...]]:
    """``(sites, declines)``: the pools of ``mod``'s Relax functions whose windows reach past
    their input, those :func:`rewrite` rewrites and those it declines with the reason, each in
    binding order."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"tir_byoc.relax.pooling: expected a tvm.IRModule, got {type(mod).__name__}"
        )
    sites, declines = [], []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if not isinstance(call, relax.Call) or call.op not in _POOLS:
                    continue
                site = _site(gvar.name_hint, binding.var, call)
                if isinstance(site, PoolSite) and not _same_shape(site):
                    site = "the rewritten pool's shape would differ from the original's"
                if isinstance(site, str):
                    where = (binding.var.name,)
                    declines.append(Decline(gvar.name_hint, where, POOL_CLIP, site, call.op.name))
                elif site is not None:
                    sites.append(site)
    return tuple(sites), tuple(declines)


def _replacement(site: PoolSite, x) -> relax.Expr:
    """What ``site.var`` is bound to instead, reading ``x``."""
    call = site.call
    kind, _, make = _POOLS[call.op]
    if site.form == "clipped":
        attrs = call.attrs
        return make(
            x,
            site.pool_size,
            _ints(attrs.strides),
            _ints(attrs.padding),
            _ints(attrs.dilation),
            bool(attrs.ceil_mode),
            bool(attrs.count_include_pad),
            str(attrs.layout),
            str(attrs.out_layout),
        )
    if kind == "max":
        return relax.op.max(x, list(site.axes), keepdims=True)
    total = relax.op.sum(x, list(site.axes), keepdims=True)
    return relax.op.divide(total, relax.const(float(site.divisor), str(site.var.ty.dtype)))


def _same_shape(site: PoolSite) -> bool:
    """Whether the clipped pool has the original's shape and dtype (a reduction over the
    spatial axes with keepdims has them: every spatial output axis is 1)."""
    if site.form != "clipped":
        return True
    clipped = relax.BlockBuilder().normalize(_replacement(site, site.call.args[0]))
    return static_dims(clipped) == static_dims(site.var) and clipped.ty.dtype == site.var.ty.dtype


def rewrite(mod: tvm.IRModule, sites: tuple[PoolSite, ...]) -> tvm.IRModule:
    """``mod`` with each pool of ``sites`` rewritten (see the module docstring); ``mod`` itself
    when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    return _Clipper(mod, sites).transform()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.ClipPoolWindows")
class ClipPoolWindows:
    """Every pool whose windows reach past its input reads only what is there: :func:`find`
    (the declines logged with the reason), then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, declines = find(mod)
        for decline in declines:
            logger.info("%s", decline)
        return rewrite(mod, sites)


@relax.expr_functor.mutator
class _Clipper(relax.PyExprMutator):
    """Emits each pool of the sites in its rewritten form; every other binding as it was."""

    def __init__(self, mod: tvm.IRModule, sites: tuple[PoolSite, ...]):
        super().__init__(mod)
        self.mod = mod
        self.functions = {site.function for site in sites}
        self.pools = {site.var: site for site in sites}

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if gvar.name_hint in self.functions:
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        site = self.pools.get(binding.var)
        if site is None:
            super().visit_var_binding_(binding)
            return
        value = _replacement(site, self.visit_expr(site.call.args[0]))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))


__all__ = ["POOL_CLIP", "ClipPoolWindows", "PoolSite", "find", "rewrite"]
