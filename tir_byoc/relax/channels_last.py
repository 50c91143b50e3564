"""Convolutional networks in channels-last layout: NHWC activations, HWIO weights.

torch hands a CNN over in NCHW, where one image's channel is a plane of rows.  The work
between its convolutions is per pixel and per channel: a depthwise convolution, a pooling
window, batch norm's scale and shift, ReLU6, a residual add.  In NCHW such a step walks a
plane at a time and reads its window with strides along the rows; in NHWC each pixel's
channels lie side by side, so the same step runs along the channels in full vectors whatever
the stride, and a library convolution (oneDNN's ``nhwc`` kernels) reads its input where it
lies.  MobileNetV2 left its depthwise convolutions and their epilogues to TVM's loops in NCHW;
in NHWC every one of them is the library's convolution with its epilogue fused.

For each Relax function holding a ``conv2d`` in NCHW/OIHW (a :class:`LayoutSite`),
:func:`rewrite`

1. writes each ``clip(x, lo, hi)`` (ReLU6) as ``maximum(minimum(x, hi), lo)``, the expression
   TVM lowers ``clip`` to (``topi.clip``), so the values are the same;  ``clip`` has no
   layout inference in TVM 0.27 and would be wrapped in two transposes, the other two have;
2. moves a zero ``pad`` of the spatial axes whose only use is an unpadded ``conv2d`` into
   that convolution's padding (transformers' MobileNetV2 pads "the TF way", explicitly and
   unevenly for a stride of 2): the convolution reads the same zeros.  ``nn.pad`` has no
   layout inference either; a pad that cannot move stays, and :func:`find` says why;
3. runs Relax's ``ConvertLayout`` with ``conv2d`` wanted in NHWC/HWIO: every op with a layout
   inference follows (elementwise ops, batch norm, pooling, means, ``permute_dims``), and a
   transpose goes where the layout meets one without (the input, a reshape or a flatten
   before the classifier);
4. transposes each constant that step 3 left transposed on every run (the weights, the
   biases, each bias's reshape made a constant in step 2) once, here: a copy of the same
   values.

Each elementwise value is then computed by the same operations on the same values, and a
pooling window or a mean reduces in the same order; a convolution sums its window in another
order (TVM's NHWC loop runs the channels innermost), as the library's convolution does in
either layout.

Applies only where a backend's convolution takes convolutions whole
(:func:`~tir_byoc.relax.conv_choice.native_convolution`): im2col + GEMM, the path of the other
backends, serves NCHW only; a build that offloads nothing keeps NCHW too
(:func:`kept_as_given`).  A function with a convolution symbolic in more than its batch is
kept as it is: the library's convolution is matched with a symbolic batch only, and TVM's own
loops run faster in NCHW.  ``TIR_BYOC_CHANNELS_LAST=0`` keeps every layout as it is.

Entry point: :class:`ChannelsLast`, a module pass before ``LegalizeOps``, after the pooling
windows are clipped and before batch norms are folded (:mod:`tir_byoc.relax.pipeline`);
:func:`find` gives the functions converted (:class:`LayoutSite`) and the declines
(:class:`~tir_byoc.decline.Decline`), :func:`rewrite` converts them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import ir, relax, tirx

from ..decline import Decline
from . import conv_choice
from .analysis import bound_call, static_dims, tensor_dims, variable_uses

logger = logging.getLogger("tir_byoc")

#: The kind of site of this rewrite's declines (:attr:`tir_byoc.decline.Decline.what`).
CHANNELS_LAST = "channels-last layout"
#: ``0`` keeps every function's layouts as they are.
ENV = "TIR_BYOC_CHANNELS_LAST"
#: What ``conv2d`` is converted to: data (and output), then weight.
LAYOUTS = ("NHWC", "HWIO")

_CONV2D = ir.Op.get("relax.nn.conv2d")
_CLIP = ir.Op.get("relax.clip")
_PAD = ir.Op.get("relax.nn.pad")
_PERMUTE_DIMS = ir.Op.get("relax.permute_dims")
_RESHAPE = ir.Op.get("relax.reshape")


@dataclass(frozen=True)
class LayoutSite:
    """A Relax function converted to channels-last.

    Attributes
    ----------
    function : str
    convolutions : tuple of relax.Var
        Its NCHW ``conv2d`` bindings.
    pads : tuple of relax.Var
        The ``pad`` bindings moved into the padding of the convolution that reads them.
    """

    function: str
    convolutions: tuple[relax.Var, ...]
    pads: tuple[relax.Var, ...]


_KEPT: ContextVar = ContextVar("tir_byoc_channels_last_kept", default=None)


@contextlib.contextmanager
def kept_as_given(reason: str):
    """Within the block, :func:`find` keeps every layout, giving ``reason`` (a build that
    offloads nothing: TVM's own loops run NCHW faster)."""
    token = _KEPT.set(reason)
    try:
        yield
    finally:
        _KEPT.reset(token)


def enabled() -> bool:
    """Whether ``$TIR_BYOC_CHANNELS_LAST`` allows the rewrite (anything but ``0``)."""
    return os.environ.get(ENV, "1").strip() != "0"


def _is_nchw(call: relax.Call) -> bool:
    attrs = call.attrs
    return (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)) == (
        "NCHW",
        "OIHW",
        "NCHW",
    )


def _pad_fold(pad: relax.Call, conv: relax.Call, uses: int) -> str | None:
    """Why the ``pad`` read by ``conv`` cannot become its padding, or None when it can."""
    attrs = pad.attrs
    widths = [int(w) for w in attrs.pad_width]
    value = float(attrs.pad_value)
    if str(attrs.pad_mode) != "constant" or value != 0.0 or math.copysign(1.0, value) < 0:
        return f"it pads with {attrs.pad_mode} {value}, not zeros"  # -0.0 is no conv's zero
    if len(widths) != 8 or any(widths[:4]):
        return "it pads more than the height and width"
    if any(w < 0 for w in widths):
        return "it crops (a negative width), which no padding does"
    if uses != 1:
        return "its result has another use besides the convolution"
    if any(int(p) for p in conv.attrs.padding):
        return "the convolution that reads it has a padding of its own"
    return None


def _function_site(name: str, func: relax.Function):
    """(site or None, declines) of one Relax function."""
    convolutions, pads, declines = [], [], []
    uses = None
    for block in func.body.blocks:
        values = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        for var, call in values.items():
            if not (isinstance(call, relax.Call) and call.op.same_as(_CONV2D) and _is_nchw(call)):
                continue
            convolutions.append(var)
            pad = bound_call(values, call.args[0], _PAD)
            if pad is None:
                continue
            uses = uses if uses is not None else variable_uses(func)
            why = _pad_fold(pad, call, uses[call.args[0]])
            if why is None:
                pads.append(call.args[0])
            else:
                reason = f"pad {call.args[0].name} kept, transposed to and from NHWC: {why}"
                declines.append(Decline(name, (var.name,), CHANNELS_LAST, reason, "relax.nn.pad"))
    if not convolutions:
        return None, []
    return LayoutSite(name, tuple(convolutions), tuple(pads)), declines


def find(mod: tvm.IRModule) -> tuple[tuple[LayoutSite, ...], tuple[Decline, ...]]:
    """``(sites, declines)``: the Relax functions of ``mod`` that :func:`rewrite` converts,
    and why a function or a pad in it is kept as it is."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"tir_byoc.relax.channels_last: expected a tvm.IRModule, got {type(mod).__name__}"
        )
    sites, declines = [], []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        site, kept = _function_site(gvar.name_hint, func)
        if site is None:
            continue
        why = _why_not(site)
        if why is not None:
            names = tuple(v.name for v in site.convolutions)
            declines.append(Decline(site.function, names, CHANNELS_LAST, why, "relax.nn.conv2d"))
            continue
        sites.append(site)
        declines.extend(kept)
    return tuple(sites), tuple(declines)


def _why_not(site: LayoutSite) -> str | None:
    if _KEPT.get() is not None:
        return _KEPT.get()
    if not enabled():
        return f"${ENV}=0 keeps NCHW"
    if conv_choice.mode() == "im2col":
        return f"${conv_choice.MODE_ENV}=im2col, and im2col + GEMM serves NCHW only"
    if conv_choice.native_convolution() is None:
        return "no backend in use has a convolution of its own; im2col + GEMM serves NCHW only"
    symbolic = [v.name for v in site.convolutions if not _static_but_batch(v)]
    if symbolic:
        # Measured on the zoo's small MobileNetV2 with a symbolic size: 5.6 ms a run in NHWC
        # against 1.3 ms in NCHW, every convolution TVM's loop in both.
        return (
            f"{symbolic[0]}'s shape is symbolic beyond its batch: the library's convolution "
            "is matched with a symbolic batch only, and TVM's own loops run NCHW faster"
        )
    return None


def _static_but_batch(var) -> bool:
    """Whether every dim of ``var``'s shape but the first is a constant."""
    dims = tensor_dims(var)
    return dims is not None and all(isinstance(d, tirx.IntImm) for d in dims[1:])


def rewrite(mod: tvm.IRModule, sites: tuple[LayoutSite, ...]) -> tvm.IRModule:
    """``mod`` with the functions of ``sites`` in channels-last layout (steps 1-4 of the module
    doc); ``mod`` itself when there is none.  ``mod`` is never modified."""
    if not sites:
        return mod
    names = {site.function for site in sites}
    pads = {pad for site in sites for pad in site.pads}
    # Steps 1 and 2: clip as minimum and maximum, pads into their convolutions (the pads,
    # now unread, go with the dead code at the end).
    prepared = _Prepare(mod, names, pads).transform()
    entries = [g.name_hint for g, f in prepared.functions_items() if isinstance(f, relax.Function)]
    # Step 3. Relax's layout conversion.
    desired = {"relax.nn.conv2d": list(LAYOUTS)}
    converted = relax.transform.ConvertLayout(desired)(prepared)
    # Step 4. The transposed constants, transposed once; then what no longer has a use (a
    # transpose feeding only the indices a max pool's import zeroes and drops).
    folded = _FoldTransposes(converted, names).transform()
    folded = relax.transform.CanonicalizeBindings()(folded)
    return relax.transform.DeadCodeElimination(entries)(folded)


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.ChannelsLast")
class ChannelsLast:
    """Every Relax function with an NCHW ``conv2d`` in channels-last layout: :func:`find` (the
    declines logged with the reason), then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, declines = find(mod)
        for decline in declines:
            logger.info("%s", decline)
        return rewrite(mod, sites)


class _Inliner(relax.PyExprMutator):
    """A mutator of the functions named that reads the variables of :attr:`constants` as
    their constants (so that a fold, a pack function or ConvertLayout sees the constant
    itself); a subclass fills it and drops their bindings."""

    def __init__(self, mod: tvm.IRModule, names: set):
        super().__init__(mod)
        self.mod, self.names = mod, names
        self.constants = {}

    def transform(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions_items():
            if gvar.name_hint in self.names:
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()

    def visit_dataflow_var_(self, var):
        return self.constants.get(var) or super().visit_dataflow_var_(var)

    def visit_var_(self, var):
        return self.constants.get(var) or super().visit_var_(var)


@relax.expr_functor.mutator
class _Prepare(_Inliner):
    """Steps 1 and 2 in the functions named: each clip as a minimum and a maximum, each pad of
    ``pads`` moved into the convolution that reads it (the pad, now unused, is dropped after),
    and each reshape of a constant (how torch's convolution shapes its bias) as the reshaped
    constant, so that step 4 finds the bias a constant once it is transposed."""

    def __init__(self, mod: tvm.IRModule, names: set, pads: set):
        super().__init__(mod, names)
        self.pads = pads
        self.values = {}

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        call = binding.value
        self.values[binding.var] = call
        if isinstance(call, relax.Call) and call.op.same_as(_CLIP):
            x, low, high = call.args
            dtype = str(x.ty.dtype)
            x = self.visit_expr(x)
            smaller = self.builder_.emit(relax.op.minimum(x, _scalar(high, dtype)))
            value = relax.op.maximum(smaller, _scalar(low, dtype))
        elif (
            isinstance(call, relax.Call)
            and call.op.same_as(_CONV2D)
            and isinstance(call.args[0], relax.Var)
            and call.args[0] in self.pads
        ):
            pad = self.values[call.args[0]]
            top, bottom, left, right = (int(w) for w in pad.attrs.pad_width[4:])
            attrs = call.attrs
            value = relax.op.nn.conv2d(
                self.visit_expr(pad.args[0]),
                self.visit_expr(call.args[1]),
                strides=attrs.strides,
                padding=(top, left, bottom, right),
                dilation=attrs.dilation,
                groups=attrs.groups,
                data_layout=attrs.data_layout,
                kernel_layout=attrs.kernel_layout,
                out_layout=attrs.out_layout,
                out_dtype=attrs.out_dtype,
            )
        elif (
            isinstance(call, relax.Call)
            and call.op.same_as(_RESHAPE)
            and isinstance(call.args[0], ir.Constant)
            and (dims := static_dims(binding.var)) is not None
        ):
            data = call.args[0].value.numpy()
            self.constants[binding.var] = relax.const(data.reshape(dims), str(data.dtype))
            return
        else:
            super().visit_var_binding_(binding)
            return
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))


def _scalar(value: relax.PrimValue, dtype: str) -> ir.Constant:
    """A clip bound as a scalar constant of ``dtype`` (what ``topi.clip`` casts it to)."""
    bound = value.value
    return relax.const(float(getattr(bound, "value", bound)), dtype)


@relax.expr_functor.mutator
class _FoldTransposes(_Inliner):
    """Step 4: ``permute_dims`` of a constant, in the functions named, as the transposed
    constant, in place of its variable wherever that is read."""

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        call = binding.value
        if (
            isinstance(call, relax.Call)
            and call.op.same_as(_PERMUTE_DIMS)
            and isinstance(call.args[0], ir.Constant)
        ):
            data = call.args[0].value.numpy()
            axes = call.attrs.axes
            order = [int(a) for a in axes] if axes is not None else list(range(data.ndim))[::-1]
            moved = np.ascontiguousarray(np.transpose(data, order))
            self.constants[binding.var] = relax.const(moved, str(data.dtype))
            return
        super().visit_var_binding_(binding)


__all__ = [
    "CHANNELS_LAST",
    "ENV",
    "LAYOUTS",
    "ChannelsLast",
    "LayoutSite",
    "find",
    "kept_as_given",
    "rewrite",
]
