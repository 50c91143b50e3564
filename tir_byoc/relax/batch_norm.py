"""Batch norm folded into the convolution or Linear before it, or else a scale and a shift.

An eval-mode batch norm on axis ``a`` computes, per channel c of that axis, ::

    y = (x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c]  =  x * scale[c] + shift[c]
    scale = gamma / sqrt(var + eps),   shift = beta - mean * scale

The torch frontend imports it as ``t = R.nn.batch_norm(x, gamma, beta, mean, var, axis=a,
training=False)`` and ``y = t[0]``.  When x is a convolution's output channel (``a`` = 1) or
a Linear's output feature (``a`` the last axis), and x = conv(d, W) [+ b] or x = d @ W [+ b]
with W and b constants, then y = conv(d, W * scale) + (b * scale + shift): the weight's
output-channel slices scaled and the bias replaced, as inference graph optimisers (ONNX
Runtime's, TensorRT's, torch.fx's ``fuse``) fold it.  The batch norm and its pass over the
activation are gone, and the bias add that stands in their place is the one
:mod:`tir_byoc.relax.convolutions` moves into the GEMM's epilogue (a Linear's bias fuses with
its matmul anyway).

**Rounding.**  scale and shift are computed in float64 from the constants; each folded weight
element is ``W * scale`` and each bias element ``b * scale + shift`` (``shift`` when there was
no bias), computed in float64 and rounded once to the weight's dtype.  The products and sums of
the convolution are then those of the folded weight: the result differs from the unfolded one
by float rounding (as torch's own ``fuse_conv_bn_eval`` does), not by anything else.

Where the batch norm cannot be folded (its statistics are not constants, or what it follows is
not a GEMM with a constant weight used by it alone), it becomes ``y = x * scale + shift``
along its axis: with constant statistics, scale and shift are constants computed as above
(float64, rounded once); otherwise Relax computes them on each run, in the statistics' dtype.
After a Linear on the last axis, those two are the epilogue ops ``channel_scale`` and
``bias``.  A batch norm in training mode (statistics of the batch) is declined.

The convolutions folded into are those in NCHW/OIHW (and the 1-D and 3-D defaults) and
those :mod:`.channels_last` converted to NHWC/HWIO (the batch norm then on axis 3, the
weight's output channels its last axis).  An NCHW convolution of one group without a bias of
its own (ResNet's, MobileNetV2's 1 x 1) gets the scale and shift instead, unless
:data:`FOLD_INTO_UNBIASED_CONVOLUTIONS` is set: the folded shift would be its bias, which
:mod:`tir_byoc.relax.convolutions` takes only in its columns-first form, with a transpose
back, and that measured slower than its weight-first GEMM and one pass after it (the scale,
the shift and the activation, fused; TVM's own batch norm subtracts, divides and multiplies
per element in that pass).  In NHWC the library's convolution adds a bias in its epilogue,
so the fold is always made there.  A depthwise or grouped convolution, left to TVM's loop or
a batched GEMM with its bias after, is folded.

Entry point: :class:`FoldBatchNorms`, a module pass before ``LegalizeOps`` and before
:class:`~tir_byoc.relax.convolutions.ConvolutionsAsGemms` (:mod:`tir_byoc.relax.pipeline`);
:func:`find` gives the folds (:class:`Fold`), the scale-and-shift rewrites
(:class:`ScaleShift`, with why each was not folded) and the declines
(:class:`~tir_byoc.decline.Decline`); :func:`rewrite` applies the first two.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import ir, relax

from ..decline import Decline
from .analysis import bound_call, static_dims, variable_uses

logger = logging.getLogger("tir_byoc")

#: The kind of site of this rewrite's declines (:attr:`tir_byoc.decline.Decline.what`).
BATCH_NORM_FOLD = "batch-norm fold"

_BATCH_NORM = ir.Op.get("relax.nn.batch_norm")
#: Per convolution op, the (data, kernel) layouts a fold reads: the data's channel axis, the
#: weight's output-channel axis, and whether the library's own convolution takes the layout
#: (so a folded shift is a bias it adds for free: :mod:`.channels_last` converts to NHWC/HWIO).
_CONVS = {
    ir.Op.get("relax.nn.conv1d"): {("NCW", "OIW"): (1, 0, False)},
    ir.Op.get("relax.nn.conv2d"): {("NCHW", "OIHW"): (1, 0, False), ("NHWC", "HWIO"): (3, 3, True)},
    ir.Op.get("relax.nn.conv3d"): {("NCDHW", "OIDHW"): (1, 0, False)},
}
_MATMUL = ir.Op.get("relax.matmul")
_ADD = ir.Op.get("relax.add")
_PERMUTE_DIMS = ir.Op.get("relax.permute_dims")
_RESHAPE = ir.Op.get("relax.reshape")
#: Whether a batch norm is folded into a convolution of one group that has no bias of its own
#: (ResNet's, MobileNetV2's 1 x 1): the folded shift becomes its bias, and
#: :mod:`tir_byoc.relax.convolutions` takes a bias only in its columns-first form, with a
#: transpose back, which was slower than the weight-first GEMM and one elementwise pass
#: (the scale and shift here, fused with the activation) after it.  Off until the weight-first
#: form takes the bias (a bias along the GEMM's rows).
FOLD_INTO_UNBIASED_CONVOLUTIONS = False
#: Weight dtypes a fold computes for (numpy's own; bfloat16 is not).
_FLOATS = ("float16", "float32", "float64")


@dataclass(frozen=True)
class Fold:
    """A batch norm folded into the GEMM before it.

    Attributes
    ----------
    function : str
    norm, out : relax.Var
        ``norm = R.nn.batch_norm(...)`` and ``out = norm[0]``; ``out`` becomes
        ``gemm + bias`` (``bias + gemm`` when ``bias_first``).
    gemm : relax.Var
        The convolution's or matmul's result.
    weight_at : relax.Var
        The binding whose call takes the weight constant (the convolution, the matmul, or the
        ``permute_dims`` of a Linear's weight), as its argument ``weight_arg``.
    weight, bias : ir.Constant
        The folded weight and bias.
    dropped : tuple of relax.Var
        The bias add between the GEMM and the batch norm (and the reshape of its bias), which
        go.
    """

    function: str
    norm: relax.Var
    out: relax.Var
    gemm: relax.Var
    weight_at: relax.Var
    weight_arg: int
    weight: ir.Constant
    bias: ir.Constant
    bias_first: bool
    dropped: tuple[relax.Var, ...]


@dataclass(frozen=True)
class ScaleShift:
    """A batch norm computed as ``x * scale + shift`` along ``axis``, and why it was not
    folded (``reason``)."""

    function: str
    norm: relax.Var
    out: relax.Var
    call: relax.Call
    reason: str

    @property
    def decline(self) -> Decline:
        """The fold declined: what :func:`find` reports for this site."""
        reason = f"computed as a scale and a shift, not folded: {self.reason}"
        return _decline(self.function, self.norm, reason)


def _decline(function: str, norm, reason: str) -> Decline:
    return Decline(function, (norm.name,), BATCH_NORM_FOLD, reason, "relax.nn.batch_norm")


def _params(call: relax.Call) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) in float64 when the statistics are constants, else None."""
    _, gamma, beta, mean, var = call.args
    if not all(isinstance(p, ir.Constant) for p in (gamma, beta, mean, var)):
        return None
    gamma, beta, mean, var = (p.value.numpy().astype(np.float64) for p in (gamma, beta, mean, var))
    attrs = call.attrs
    gamma = gamma if attrs.scale else np.ones_like(gamma)
    beta = beta if attrs.center else np.zeros_like(beta)
    scale = gamma / np.sqrt(var + float(attrs.epsilon))
    return scale, beta - mean * scale


def _axis(call: relax.Call) -> int | None:
    dims = static_dims(call.args[0])
    ndim = len(dims) if dims is not None else getattr(call.args[0].ty, "ndim", -1)
    if ndim is None or ndim < 1:
        return None
    axis = int(call.attrs.axis)
    return axis + ndim if axis < 0 else axis


def _bias_operand(operand, values: dict, uses) -> tuple | None:
    """(values, shape, dropped) of a bias operand: a constant, or the reshape of a constant
    used by the add alone (how the torch frontend adds a convolution's bias)."""
    if isinstance(operand, ir.Constant):
        return operand.value.numpy(), [int(d) for d in operand.value.shape], ()
    reshape = bound_call(values, operand, _RESHAPE)
    if reshape is None or not isinstance(reshape.args[0], ir.Constant) or uses[operand] != 1:
        return None
    dims = static_dims(operand)
    return (None, None, ()) if dims is None else (reshape.args[0].value.numpy(), dims, (operand,))


def _split_bias(x, values: dict, uses) -> tuple:
    """(gemm, bias, bias_first, dropped): ``x`` itself and no bias, or the operands of
    ``x = gemm + b`` (``b`` as :func:`_bias_operand` reads it) and the bindings that go."""
    add = bound_call(values, x, _ADD)
    if add is None or uses[x] != 1:
        return x, None, False, ()
    for bias_first, (operand, gemm) in ((True, add.args), (False, add.args[::-1])):
        bias = _bias_operand(operand, values, uses)
        if bias is not None and bias[0] is not None and isinstance(gemm, relax.Var):
            return gemm, bias, bias_first, (x, *bias[2])
    return x, None, False, ()


def _weight(gemm, axis: int, values: dict, uses) -> tuple | str:
    """(weight_at, weight_arg, weight constant, its output-channel axis) or why none."""
    call = bound_call(values, gemm)
    if call is None:
        return "it does not follow a convolution or a matmul of its dataflow block"
    if uses[gemm] != 1:
        return f"{gemm.name} has another use besides the batch norm"
    if call.op in _CONVS:
        known = _CONVS[call.op]
        layouts = (str(call.attrs.data_layout), str(call.attrs.kernel_layout))
        if layouts not in known or str(call.attrs.out_layout) != layouts[0]:
            expected = " or ".join("/".join(pair) for pair in known)
            return f"its convolution's layouts are {'/'.join(layouts)}, not {expected}"
        channels, weight_channels, _ = known[layouts]
        if axis != channels:
            return f"it normalises axis {axis}, not the convolution's channels (axis {channels})"
        if not isinstance(call.args[1], ir.Constant):
            return "its convolution's weight is not a constant"
        return gemm, 1, call.args[1], weight_channels
    if not call.op.same_as(_MATMUL):
        return f"it follows {call.op.name}, not a convolution or a matmul"
    dims = static_dims(gemm)
    if dims is None or axis != len(dims) - 1:
        return "it does not normalise the matmul's last axis (its output features)"
    weight = call.args[1]
    if isinstance(weight, ir.Constant) and len(weight.value.shape) == 2:
        return gemm, 1, weight, 1
    permute = bound_call(values, weight, _PERMUTE_DIMS)
    if permute is None or not isinstance(permute.args[0], ir.Constant):
        return "its matmul's weight is not a constant (nor a transposed one)"
    if len(permute.args[0].value.shape) != 2 or uses[weight] != 1:
        return "its matmul's weight is not a 2-D transposed constant used by this matmul alone"
    return weight, 0, permute.args[0], 0


def _library_layout(conv: relax.Call) -> bool:
    """Whether ``conv``'s layouts are those the library's own convolution serves."""
    layouts = (str(conv.attrs.data_layout), str(conv.attrs.kernel_layout))
    return _CONVS[conv.op].get(layouts, (0, 0, False))[2]


def _fold(function: str, norm, out, call, values: dict, uses) -> Fold | str:
    """The fold of one batch norm, or why there is none."""
    params = _params(call)
    if params is None:
        return "its gamma, beta, mean or var is not a constant"
    axis = _axis(call)
    gemm, bias, bias_first, dropped = _split_bias(call.args[0], values, uses)
    found = _weight(gemm, axis, values, uses)
    if isinstance(found, str):
        return found
    conv = bound_call(values, gemm)
    if (
        not FOLD_INTO_UNBIASED_CONVOLUTIONS
        and bias is None
        and conv.op in _CONVS
        and int(conv.attrs.groups) == 1
        and not _library_layout(conv)
    ):
        return (
            "its convolution has no bias, and a folded shift would be one: "
            "relax.convolutions serves a convolution with a bias as a columns-first GEMM and a "
            "transpose back, slower than this pass after its weight-first GEMM"
        )
    weight_at, weight_arg, weight, channel_axis = found
    w = weight.value.numpy()
    dtype, channels = str(w.dtype), w.shape[channel_axis]
    scale, shift = params
    if dtype not in _FLOATS or scale.shape != (channels,):
        return (
            f"its weight is {dtype} with {channels} output channels; expected a float weight "
            f"of {scale.shape[0]}"
        )
    # The bias shapes torch's layers add: (1, O, 1...) after a convolution, (N,) or
    # (1..., N) after a Linear; the folded bias keeps the shape of the one it replaces.
    broadcast = [1] * call.args[0].ty.ndim
    broadcast[axis] = channels
    is_conv = bound_call(values, gemm).op in _CONVS
    shapes = [broadcast] if is_conv else [[channels], broadcast]
    old_bias = np.zeros(channels)
    if bias is not None:
        bias_values, found_shape, _ = bias
        if str(bias_values.dtype) != dtype or found_shape not in shapes:
            return (
                f"its bias is {bias_values.dtype} of shape {found_shape}, expected {dtype} of "
                f"shape {' or '.join(str(s) for s in shapes)}"
            )
        old_bias = bias_values.astype(np.float64).reshape(channels)
    bias_shape = found_shape if bias is not None else shapes[0]
    # Step 1. The weight scaled along its output channels, in float64, rounded once.
    view = [1] * w.ndim
    view[channel_axis] = channels
    folded_weight = (w.astype(np.float64) * scale.reshape(view)).astype(dtype)
    # Step 2. The bias: the old one scaled, plus the shift, in float64, rounded once.
    folded_bias = (old_bias * scale + shift).astype(dtype).reshape(bias_shape)
    return Fold(
        function,
        norm,
        out,
        gemm,
        weight_at,
        weight_arg,
        relax.const(folded_weight, dtype),
        relax.const(folded_bias, dtype),
        bias_first,
        dropped,
    )


def find(mod: tvm.IRModule) -> tuple[tuple[Fold | ScaleShift, ...], tuple[Decline, ...]]:
    """``(sites, declines)``: the batch norms of ``mod``'s Relax functions that :func:`rewrite`
    folds (:class:`Fold`) or computes as a scale and a shift (:class:`ScaleShift`), and the
    folds declined, with the reason, in binding order: a scale and a shift's
    (:attr:`ScaleShift.decline`) and those of the batch norms left alone."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"tir_byoc.relax.batch_norm: expected a tvm.IRModule, got {type(mod).__name__}"
        )
    sites, declines = [], []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        name, uses = gvar.name_hint, None
        for block in func.body.blocks:
            values = {
                b.var: b.value
                for b in block.bindings
                if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call)
            }
            items = {
                b.value.tuple_value: b.var
                for b in block.bindings
                if isinstance(b, relax.VarBinding)
                and isinstance(b.value, relax.TupleGetItem)
                and b.value.index == 0
            }
            for norm, call in values.items():
                if not call.op.same_as(_BATCH_NORM):
                    continue
                uses = uses if uses is not None else variable_uses(func)
                site = _site(name, norm, call, items.get(norm), values, uses)
                if not isinstance(site, Decline):
                    sites.append(site)
                if not isinstance(site, Fold):
                    declines.append(site if isinstance(site, Decline) else site.decline)
    return tuple(sites), tuple(declines)


def _site(name: str, norm, call, out, values: dict, uses) -> Fold | ScaleShift | Decline:
    if call.attrs.training:
        return _decline(
            name, norm, "in training mode: it normalises with the batch's own statistics"
        )
    if out is None or uses[norm] != 1:
        return _decline(
            name, norm, "its mean or variance output is used, not only the normalised value"
        )
    if _axis(call) is None:
        return _decline(name, norm, "its input's rank is not known")
    fold = _fold(name, norm, out, call, values, uses)
    return fold if isinstance(fold, Fold) else ScaleShift(name, norm, out, call, fold)


def rewrite(mod: tvm.IRModule, sites: tuple[Fold | ScaleShift, ...]) -> tvm.IRModule:
    """``mod`` with each batch norm of ``sites`` folded or computed as a scale and a shift (see
    the module docstring); ``mod`` itself when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    return _Folder(mod, sites).transform()


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.FoldBatchNorms")
class FoldBatchNorms:
    """Each eval-mode batch norm folded into the GEMM before it, or else a scale and a shift:
    :func:`find` (the folds declined logged with the reason), then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, declines = find(mod)
        for decline in declines:
            logger.info("%s", decline)
        return rewrite(mod, sites)


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    """Emits each site's bindings rewritten; every other binding as it was."""

    def __init__(self, mod: tvm.IRModule, sites: tuple):
        super().__init__(mod)
        self.mod = mod
        self.functions = {site.function for site in sites}
        self.weights = {s.weight_at: s for s in sites if isinstance(s, Fold)}
        self.dropped = {s.norm for s in sites} | {
            var for s in sites if isinstance(s, Fold) for var in s.dropped
        }
        self.outs = {s.out: s for s in sites}

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if gvar.name_hint in self.functions:
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        var = binding.var
        if var in self.dropped:
            return
        if var in self.weights:
            site = self.weights[var]
            args = [self.visit_expr(a) for a in binding.value.args]
            args[site.weight_arg] = site.weight
            value = relax.Call(binding.value.op, args, binding.value.attrs)
        elif var in self.outs:
            value = self._out(self.outs[var])
        else:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(var, self.builder_.normalize(value)))

    def _out(self, site):
        if isinstance(site, Fold):
            gemm = self.visit_expr(site.gemm)
            args = (site.bias, gemm) if site.bias_first else (gemm, site.bias)
            return relax.op.add(*args)
        return self._scale_shift(site.call)

    def _scale_shift(self, call: relax.Call):
        x = self.visit_expr(call.args[0])
        axis = _axis(call)
        shape = [1] * x.ty.ndim
        shape[axis] = -1
        params = _params(call)
        if params is not None:
            dtype = str(x.ty.dtype)
            scale, shift = (relax.const(p.astype(dtype).reshape(shape), dtype) for p in params)
        else:
            expand = [i for i in range(len(shape)) if i != axis]
            scale, shift = (
                self.builder_.emit(relax.op.expand_dims(p, expand)) for p in self._computed(call)
            )
        return relax.op.add(self.builder_.emit(relax.op.multiply(x, scale)), shift)

    def _computed(self, call: relax.Call) -> tuple:
        """scale and shift computed by Relax on each run, from statistics that are not
        constants (see the module docstring)."""
        _, gamma, beta, mean, var = (self.visit_expr(a) for a in call.args)
        attrs = call.attrs
        eps = relax.const(float(attrs.epsilon), str(var.ty.dtype))
        scale = self.builder_.emit(relax.op.rsqrt(self.builder_.emit(relax.op.add(var, eps))))
        if attrs.scale:
            scale = self.builder_.emit(relax.op.multiply(gamma, scale))
        moved = self.builder_.emit(relax.op.multiply(mean, scale))
        if attrs.center:
            return scale, self.builder_.emit(relax.op.subtract(beta, moved))
        return scale, self.builder_.emit(relax.op.negative(moved))


__all__ = ["BATCH_NORM_FOLD", "Fold", "FoldBatchNorms", "ScaleShift", "find", "rewrite"]
