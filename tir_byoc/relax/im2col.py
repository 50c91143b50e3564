"""Building a convolution as im2col and a GEMM: what :mod:`.convolutions` rewrites it to.

Entry point: :func:`build`, which emits each :class:`ConvolutionSite` (found by
:func:`tir_byoc.relax.convolutions.find`) in the convolution's place: the input copied with its
zero padding (and its transpose, when it is one) where it needs it (:func:`_padded`), the gather
of the columns (:func:`_gather`), the GEMM on the flattened weight with the elementwise ops
that followed the convolution, and (when the weight is on the right) the transpose back.  The
two forms and why each is exact are in :mod:`tir_byoc.relax.convolutions`.  A weight computed
from constants alone is computed once, here (:func:`_folded`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import ir, relax, te, tirx

from .analysis import static_dims


@dataclass(frozen=True)
class ConvolutionSite:
    """What the rewrite of one convolution needs: the binding ``var = conv(x, weight)`` of
    ``function``, and how to compute it."""

    function: str
    var: relax.Var
    x: relax.Expr
    weight: relax.Expr
    out_dims: tuple[int, ...]  # (B, O, spatial...)
    kernel: tuple[int, ...]  # the window (KW,), (KH, KW) or (KD, KH, KW)
    strides: tuple[int, ...]
    pad_before: tuple[int, ...]
    pad_after: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    # The bindings that compute the weight from constants alone, in order (see
    # ``_constant_bindings`` in :mod:`.convolutions`), folded into one constant by the rewrite.
    weight_bindings: tuple[tuple[relax.Var, relax.Call], ...] = ()
    # The elementwise ops after the convolution computed on the GEMM's output instead, each
    # ("bias", its (1, O, 1...) tensor) or ("unary", its call), and the variables they bound.
    tail: tuple[tuple[str, object], ...] = ()
    tail_vars: tuple[relax.Var, ...] = ()
    # x's binding when x is a permute_dims that moves the last axis ((the permuted tensor,
    # the axes), see ``_transposed_input`` in :mod:`.convolutions`), and whether the
    # convolution is its one use.
    transposed: tuple[relax.Expr, tuple[int, ...]] | None = None
    transposed_dropped: bool = False


def build(mod: tvm.IRModule, sites: tuple[ConvolutionSite, ...]) -> tvm.IRModule:
    """``mod`` with each convolution of ``sites`` computed as im2col and a GEMM; ``mod``
    itself when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    found = {}
    for gvar, _ in mod.functions_items():
        for site in sites:
            if site.function == gvar.name_hint:
                if site.weight_bindings:
                    weight = _folded(site.weight, site.weight_bindings)
                    folded = {"weight": weight} if weight is not None else {"weight_bindings": ()}
                    site = dataclasses.replace(site, **folded)
                found.setdefault(gvar, {})[site.var] = site
    return _Rewriter(mod, found).transform()


def _padded(tensor: te.Tensor, site: ConvolutionSite) -> te.Tensor:
    """The convolution's input as a copy of its own: ``permute_dims`` applied when the site's
    input is one (``_transposed_input`` in :mod:`.convolutions`), and zero-padded along the
    spatial axes, so that the gather reads every element it copies, with no bound check (a
    check that differs between the lanes of a vector makes TVM's vectoriser turn the copy into
    scalar code)."""
    axes = site.transposed[1] if site.transposed is not None else tuple(range(len(tensor.shape)))
    dims = [int(tensor.shape[a]) for a in axes]
    before = (0, 0, *site.pad_before)
    shape = [d + b + a for d, b, a in zip(dims, before, (0, 0, *site.pad_after), strict=True)]

    def element(*index):
        source, inside = [None] * len(axes), []
        for position, axis in enumerate(axes):
            at = index[position] - before[position]
            source[axis] = at
            if before[position] or shape[position] != dims[position]:
                inside.append(tirx.all(at >= 0, at < dims[position]))
        value = tensor[tuple(source)]
        if not inside:
            return value
        return tirx.if_then_else(tirx.all(*inside), value, tirx.const(0.0, tensor.dtype))

    return te.compute(shape, element, name="gather_input")


#: The operator pattern ``AnnotateTIROpPattern`` leaves as it finds it and ``FuseOps`` fuses
#: nothing into or out of (TVM's ``kOpaque``).
_OPAQUE = 8


def _folded(var, bindings) -> ir.Constant | None:
    """The value of ``var``, computed by ``bindings`` from constants, as one constant: Relax's
    ``FoldConstant`` on a function of those bindings alone; None if it does not fold."""
    builder = relax.BlockBuilder()
    remap = {}

    def remapped(value):
        if isinstance(value, relax.Tuple):
            return relax.Tuple([remapped(field) for field in value.fields])
        return remap.get(value, value)

    with builder.function("weight", []):
        with builder.dataflow():
            for bound, call in bindings:
                args = [remapped(arg) for arg in call.args]
                remap[bound] = builder.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            out = builder.emit_output(remap[var])
        builder.emit_func_output(out)
    folded = relax.transform.FoldConstant()(builder.get())["weight"].body
    value = folded.body if isinstance(folded, relax.SeqExpr) else folded
    if isinstance(folded, relax.SeqExpr) and isinstance(value, relax.Var):
        bound = {b.var: b.value for block in folded.blocks for b in block.bindings}
        value = bound.get(value, value)
    return value if isinstance(value, ir.Constant) else None


def _gather(x: te.Tensor, site: ConvolutionSite, channels_first: bool) -> te.Tensor:
    """The im2col of ``x``, the convolution's input already padded (:func:`_padded`), with the
    output positions and the kernel window as axes of their own: cols[b, p..., c, r...] =
    x[b, c, p * stride + r * dilation], or with groups, cols[b, g, p..., c', r...] for input
    channel c = g * C/G + c'.  With ``channels_first`` the positions come last, cols[b, (g,) c,
    r..., p...]: the transposed columns, read along the input's rows.  Every index is inside
    ``x``, so the copy has no bound check."""
    spatial = len(site.kernel)
    out_positions = site.out_dims[2:]
    channels = int(x.shape[1]) // site.groups
    sizes = [int(d) for d in x.shape[2:]]
    grouped = site.groups > 1

    def element(b, *axes):
        g, axes = (axes[0], axes[1:]) if grouped else (0, axes)
        if channels_first:
            c, window, positions = axes[0], axes[1 : spatial + 1], axes[spatial + 1 :]
        else:
            positions, c, window = axes[:spatial], axes[spatial], axes[spatial + 1 :]
        index = [
            p * stride + r * dilation
            for p, r, stride, dilation in zip(
                positions, window, site.strides, site.dilation, strict=True
            )
        ]
        return x[(b, g * channels + c if grouped else c, *index)]

    for count, extent, stride, dilation, size in zip(
        out_positions, site.kernel, site.strides, site.dilation, sizes, strict=True
    ):
        if (count - 1) * stride + (extent - 1) * dilation >= size:  # the largest index read
            raise ValueError(
                f"tir_byoc.relax.convolutions: a window reads past the padded input ({size} "
                f"positions for {count} outputs of a {extent}-wide window): expected a convolution "
                "whose output shape fits its input"
            )

    groups = (site.groups,) if grouped else ()
    if channels_first:
        shape = (x.shape[0], *groups, channels, *site.kernel, *out_positions)
    else:
        shape = (x.shape[0], *groups, *out_positions, channels, *site.kernel)
    return te.compute(shape, element, name="im2col")


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    """Emits each site's gather, GEMM and (in the first form) transpose back in the
    convolution's place."""

    def __init__(self, mod: tvm.IRModule, sites: dict):
        super().__init__(mod)
        self.mod = mod
        self.sites = sites

    def transform(self) -> tvm.IRModule:
        for gvar, sites in self.sites.items():
            # Each site is emitted where the last op of its chain was bound (every operand of
            # the chain is bound by then); the convolution and the rest of the chain are not.
            self.here = {(site.tail_vars or (var,))[-1]: site for var, site in sites.items()}
            self.dropped = {
                v
                for var, site in sites.items()
                for v in (
                    var,
                    *site.tail_vars,
                    *(b for b, _ in site.weight_bindings),
                    *((site.x,) if site.transposed_dropped else ()),
                )
            }
            self.builder_.update_func(gvar, self.visit_expr(self.mod[gvar]))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        site = self.here.get(binding.var)
        if site is None:
            if binding.var not in self.dropped:
                super().visit_var_binding_(binding)
            return
        batch, out_channels, *positions = site.out_dims
        groups, count = site.groups, math.prod(positions)
        window = math.prod(site.kernel) * int(static_dims(site.x)[1]) // groups
        # The weight on the left (see the module doc) unless a bias moves into the call; with
        # groups it never does.
        left = not any(kind == "bias" for kind, _ in site.tail)
        source = self.visit_expr(site.x)
        if site.transposed is not None or any(site.pad_before) or any(site.pad_after):
            source = self.builder_.emit_te(
                lambda t: _padded(t, site),
                self.visit_expr(site.transposed[0]) if site.transposed is not None else source,
                primfunc_name_hint="gather_input",
                primfunc_attrs={"op_pattern": _OPAQUE},
            )
        gathered = self.builder_.emit_te(
            lambda x: _gather(x, site, channels_first=left), source, primfunc_name_hint="im2col"
        )
        if left:  # (G, O/G, window) or (O, window) by (B, (G,) window, positions) columns
            grouping = (groups,) if groups > 1 else ()
            cols = relax.op.reshape(gathered, (batch, *grouping, window, count))
            cols = self.builder_.emit(cols, "cols")
            rows = (groups, out_channels // groups) if groups > 1 else (out_channels,)
            operands = (self._flat(site.weight, (*rows, window)), cols)
        else:  # (B, positions, window) columns by the (window, O) weight
            cols = self.builder_.emit(relax.op.reshape(gathered, (batch, count, window)), "cols")
            operands = (
                cols,
                relax.op.permute_dims(self._flat(site.weight, (out_channels, window))),
            )
        product = self.builder_.emit(relax.op.matmul(*operands), "conv_gemm")
        for kind, operand in site.tail:
            if kind == "bias":
                bias = self._flat(operand, (out_channels,))
                product = self.builder_.emit(relax.op.add(product, bias), "conv_bias")
            else:
                unary = relax.Call(operand.op, [product], operand.attrs)
                product = self.builder_.emit(unary, "conv_act")
        if left:  # (B, (G,) O', positions): the convolution's layout already
            out = relax.op.reshape(product, site.out_dims)
        else:  # (B, positions, O) -> (B, O, positions)
            unflat = self.builder_.emit(
                relax.op.reshape(product, (batch, *positions, out_channels)), "conv_rows"
            )
            spatial = len(positions)
            out = relax.op.permute_dims(unflat, [0, spatial + 1, *range(1, spatial + 1)])
        self.set_var_remap(binding.var, self.builder_.emit(out))

    def _flat(self, tensor, shape):
        """``tensor`` (a weight or a bias) reshaped to ``shape``: a new constant for a constant,
        else an ``R.reshape`` (run on every call)."""
        if isinstance(tensor, ir.Constant):
            flat = tensor.value.numpy().reshape(shape)
            return relax.const(np.ascontiguousarray(flat), "float32")
        return self.builder_.emit(relax.op.reshape(self.visit_expr(tensor), shape), "conv_flat")


__all__ = ["ConvolutionSite", "build"]
