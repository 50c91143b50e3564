"""Convolutions as GEMMs: ``conv1d``, ``conv2d`` and ``conv3d`` as im2col and a library GEMM.

TVM lowers a convolution to one loop nest that reduces over the input channels and the kernel
window, a nest no pattern of the family is, and its default CPU schedule runs it far from a
GEMM's speed (Whisper's first two convolutions, 80 x 3000 -> 384 channels, ran about fifty times
slower than in torch).  Every output of a convolution with one group is a dot product of the
weight's row for its channel with the input window it sees, so ::

    cols[b, p, (c, r...)] = x[b, c, p * stride + r * dilation - pad]   (0 outside x)
    y[b, p, o]            = sum over (c, r...) of cols[b, p, (c, r...)] * w[o, (c, r...)]
    out[b, o, p]          = y[b, p, o]

where p runs over the output positions (oh, ow row-major for conv2d), r over the kernel window
and (c, r...) is the row-major flattening of w's (C, KH, KW) axes.  Here the gather ``cols``
is a function of its own (an injective copy the default rules parallelise and vectorise),
``y`` is a ``matmul`` of ``cols`` with the transposed, flattened weight (the form ``nn.Linear``
imports as, which the library serves), and ``out`` is a reshape and transpose back to the
convolution's layout.  The products and sums are those of the convolution; the library sums
them in its own order, as for any GEMM it serves.

That form is kept for a convolution whose bias moves into the call (below).  Every other one
takes the same product the other way round, the weight on the left::

    colsT[b, (c, r...), p] = x[b, c, p * stride + r * dilation - pad]
    out[b, o, p]           = sum over (c, r...) of w[o, (c, r...)] * colsT[b, (c, r...), p]

which is already the convolution's layout: no transpose back, and the gather reads along the
input's rows (in Wav2Vec2's feature encoder, 512 channels over 8,207 positions, the transposes
are gone and the first gather takes a third of its time in the first form).  Its bias would be
a vector indexed by the GEMM's row, which no call takes.

With G groups, output channel o = g * O/G + o' sees only the input channels c = g * C/G + c':
the gather puts the group first, ``colsT[b, g, (c', r...), p]``, and ``out[b, g, o', p]`` is
one matrix product per group, a batched ``matmul`` of the weight as (G, O/G, C/G * window)
with the columns, which the library serves as one batched call.  A depthwise convolution (one
input channel per group) is left to TVM: as G products of one window each it ran slower than
TVM's own loop, and :class:`tir_byoc.schedules.window.SlidingWindow` schedules that loop.

A padded convolution's input is first copied with its zeros (:mod:`.im2col`), in a function
``FuseOps`` leaves alone, so that the gather copies without a bound check, in vectors: a
check that differs between the lanes of a vector makes TVM's vectoriser write the whole copy
lane by lane.  An input that is a transpose moving the last axis (Wav2Vec2's positional
convolution reads its (B, T, C) hidden states as (B, C, T)) is copied so too, transposed
(:func:`_transposed_input`): fused into the gather, the transpose would have it read the
input across its rows (Wav2Vec2-base's positional gather, 12.7 million columns, takes about
half the time so, the copy a small part of it).

The elementwise ops that follow the convolution, each the only use of the value before it,
move into the call: a bias of shape (1, O, 1...) (how torch's ``Conv`` adds its bias) becomes
the GEMM's (O,) bias (in the first form), and an activation (:data:`_UNARY`) is computed on
``y``: the same op on the same element.  They then fuse into the GEMM's PrimFunc, and the
library call computes them as its epilogue (Whisper's bias and GELU).  With groups only the
activations move: the bias would be a (G, O/G) tensor, one row per batch index, which no
call takes, so it stays TVM code after the product.

Entry point: :class:`ConvolutionsAsGemms`, a module pass before ``LegalizeOps``
(:mod:`tir_byoc.relax.pipeline`); :func:`find` gives the convolutions served so
(:class:`~tir_byoc.relax.im2col.ConvolutionSite`) and those left to TVM, with the reason
(:class:`~tir_byoc.decline.Decline`, its ``nearest`` the operator), and :func:`rewrite` builds
them (:mod:`tir_byoc.relax.im2col`).  A binding ``out = R.nn.conv1d(x, w)`` (``conv2d``,
``conv3d``) is rewritten when

1. the layouts are the default ones (``NCW``/``NCHW``/``NCDHW`` data and output,
   ``OIW``/``OIHW``/``OIDHW`` kernel), and the groups are not depthwise (:func:`_site`);
2. x, w and out are float32 of static shapes, and out a variable of a dataflow block;
3. the gathered columns hold at most :data:`MAX_COLUMNS` elements (the kernel window times
   the input, about: a 3 x 3 window reads each input value nine times);
4. no backend's own convolution takes it instead (:mod:`.conv_choice`: ``onednn.conv`` where
   it measures faster; such a convolution reaches TIR whole and is matched there,
   :mod:`tir_byoc.match.conv`, and the decline says so).

A constant weight (a torch model's) is flattened once, here; a weight given as a parameter
is flattened by an ``R.reshape`` on every run.  A weight computed from constants alone, each
step used by the next only (a weight norm's ``g * v / ||v||``, as Wav2Vec2's positional
convolution has), is computed once here, by Relax's ``FoldConstant`` on that computation
alone, and its bindings are dropped: otherwise every run recomputes it.  Transposed
convolutions are reported and left to TVM.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import tvm
from tvm import ir, relax

from ..decline import CONVOLUTION, Decline
from ..match.conv_records import CHANNELS_FIRST, WEIGHT_OIK, ConvGeometry
from . import conv_choice
from .analysis import static_dims, variable_uses
from .im2col import ConvolutionSite, build

logger = logging.getLogger("tir_byoc")

_CONVS = {
    "relax.nn.conv1d": ("NCW", "OIW"),
    "relax.nn.conv2d": ("NCHW", "OIHW"),
    "relax.nn.conv3d": ("NCDHW", "OIDHW"),
}
_OPS = {ir.Op.get(name): layouts for name, layouts in _CONVS.items()}
#: Convolutions :func:`find` reports but im2col does not serve.
_TRANSPOSED = frozenset(ir.Op.get(f"relax.nn.conv{d}d_transpose") for d in (1, 2, 3))

#: The most elements the gathered columns of one convolution may hold (1 GiB of float32).
MAX_COLUMNS = 1 << 28


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _site(function: str, out_var, call: relax.Call) -> ConvolutionSite | str:
    """The rewrite of a conv call, or why there is none (the conditions of the module doc)."""
    data_layout, kernel_layout = _OPS[call.op]
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    native = conv_choice.native_convolution() if conv_choice.mode() != "im2col" else None
    if layouts == ("NHWC", "HWIO", "NHWC") and native is not None:
        return f"channels-last: kept whole for {native}, matched in TIR"
    if layouts != (data_layout, kernel_layout, data_layout):
        return (
            f"layouts {'/'.join(layouts)}; im2col serves {data_layout}/{kernel_layout}/"
            f"{data_layout}"
        )
    x, weight = call.args
    dims = [static_dims(e) for e in (x, weight, out_var)]
    if any(d is None for d in dims):
        return "a shape is not static"
    dtypes = [str(e.ty.dtype) for e in (x, weight, out_var)]
    if dtypes != ["float32"] * 3:
        return f"dtypes {', '.join(dtypes)}; im2col serves float32"
    x_dims, w_dims, out_dims = dims
    spatial = len(x_dims) - 2
    strides, padding = _ints(attrs.strides), _ints(attrs.padding)
    batch, channels = x_dims[:2]
    groups = int(attrs.groups)
    if groups > 1 and w_dims[1] == 1 and native is not None:
        return f"depthwise (groups = {groups}): kept whole for {native}, matched in TIR"
    if groups > 1 and w_dims[1] == 1:
        # One input channel per group: G products of (positions x window) by (window x O/G),
        # which ran slower as a batched call than TVM's own loop (ConvNeXt's 7 x 7 over 96
        # channels of 56 x 56 took nearly twice TVM's time).
        return (
            f"depthwise (groups = {groups}, one input channel each): a batched GEMM of one "
            "window per product is slower than TVM's loop"
        )
    kernel = tuple(w_dims[2:])
    columns = batch * math.prod(out_dims[2:]) * channels * math.prod(kernel)
    if columns > MAX_COLUMNS:
        return f"its im2col columns would hold {columns} elements, more than {MAX_COLUMNS}"
    dilation = _ints(attrs.dilation)
    after = padding[spatial:] if len(padding) == 2 * spatial else padding[:spatial]
    # A backend's own convolution, where one serves and measures faster (conv_choice).
    geometry = ConvGeometry(
        CHANNELS_FIRST,
        WEIGHT_OIK,
        batch,
        channels,
        w_dims[0],
        groups,
        tuple(x_dims[2:]),
        tuple(out_dims[2:]),
        kernel,
        strides,
        dilation,
        padding[:spatial],
    )
    native, why = conv_choice.choose(geometry)
    if native:
        return f"kept whole for {conv_choice.native_convolution()}, matched in TIR: {why}"
    logger.info("%s: %s = %s as im2col + GEMM: %s", function, out_var.name, call.op.name, why)
    return ConvolutionSite(
        function,
        out_var,
        x,
        weight,
        tuple(out_dims),
        kernel,
        strides,
        padding[:spatial],
        after,
        dilation,
        groups,
    )


#: Unary elementwise ops that may follow a convolution into its GEMM's epilogue: computed on
#: the GEMM's output (before the transpose back, in the first form), each value is the same op
#: on the same element.
_UNARY = frozenset(
    ir.Op.get(name)
    for name in (
        "relax.nn.relu",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.nn.silu",
        "relax.sigmoid",
        "relax.tanh",
    )
)
_ADD = ir.Op.get("relax.add")


def _computed_from(value, convolutions, values: dict) -> bool:
    """Whether ``value`` is, or is computed in this block from, one of ``convolutions``."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if not isinstance(item, relax.Var) or item in seen:
            continue
        seen.add(item)
        if item in convolutions:
            return True
        call = values.get(item)
        if call is not None:
            pending.extend(call.args)
    return False


def _tail(
    site: ConvolutionSite, var, values: dict, users: dict, uses, convolutions
) -> ConvolutionSite:
    """``site`` with the chain of elementwise ops that follows its convolution (``var``): a
    bias add of a (1, O, 1...) tensor (how torch's ``Conv`` adds its bias) and the
    :data:`_UNARY` ops, each the one use of the value before it, inside the dataflow block."""
    out_channels, spatial = site.out_dims[1], len(site.kernel)
    bias_dims = [1, out_channels, *([1] * spatial)]
    tail, tail_vars = [], []
    while uses[var] == 1 and (user := users.get(var)) is not None:
        call = values[user]
        if not isinstance(user, relax.DataflowVar) or static_dims(user) != list(site.out_dims):
            break
        if call.op in _UNARY and len(call.args) == 1:
            tail.append(("unary", call))
        elif call.op.same_as(_ADD) and site.groups == 1:
            # With groups, a GEMM's batch index is its group: the bias would be a (G, O/G)
            # tensor, which no call takes, so it stays after the transpose back.
            other = call.args[1] if call.args[0].same_as(var) else call.args[0]
            if other.same_as(var) or static_dims(other) != bias_dims:
                break
            if _computed_from(other, convolutions, values):
                # Another convolution's (1, O, 1...) result (a 1 x 1 map at batch 1) is a
                # residual, not a bias: both convolutions would take the add into their call.
                break
            if str(other.ty.dtype) != "float32":
                break
            tail.append(("bias", other))
        else:
            break
        tail_vars.append(user)
        var = user
    return dataclasses.replace(site, tail=tuple(tail), tail_vars=tuple(tail_vars))


_PERMUTE_DIMS = ir.Op.get("relax.permute_dims")


def _transposed_input(site: ConvolutionSite, values: dict, uses) -> ConvolutionSite:
    """``site`` with its input's permute_dims noted, when x is one that moves the last axis
    (Wav2Vec2's positional convolution takes its (B, T, C) hidden states transposed).

    Fused into the gather, as ``FuseOps`` would fuse it, such a transpose has the gather read
    the input across its rows.  The rewrite copies the transposed input first (:func:`_padded`,
    a small copy), and the gather reads that along its rows."""
    call = values.get(site.x) if isinstance(site.x, relax.Var) else None
    if call is None or not call.op.same_as(_PERMUTE_DIMS) or call.attrs.axes is None:
        return site
    axes = _ints(call.attrs.axes)
    if axes[-1] == len(axes) - 1 or static_dims(call.args[0]) is None:
        return site
    return dataclasses.replace(
        site, transposed=(call.args[0], axes), transposed_dropped=uses[site.x] == 1
    )


#: Arguments a computation from constants may take besides constants and its own variables.
_LITERALS = (ir.Constant, relax.ShapeExpr, ir.StringImm)  # a prim value is an ir.Constant


def _constant_bindings(var, values: dict, uses) -> tuple | None:
    """The bindings of the dataflow block that compute ``var`` from constants alone, in the
    order they are bound, or None unless each is a call used once (by the next step, the last
    by the convolution), so that all of them go when the convolution's weight is folded."""
    found = []

    def visit(value) -> bool:
        if isinstance(value, _LITERALS):
            return True
        if isinstance(value, relax.Tuple):
            return all(visit(field) for field in value.fields)
        call = values.get(value) if isinstance(value, relax.Var) else None
        if call is None or uses[value] != 1 or not isinstance(call.op, ir.Op):
            return False
        if not all(visit(arg) for arg in call.args):
            return False
        found.append((value, call))
        return True

    return tuple(found) if visit(var) else None


def find(mod: tvm.IRModule) -> tuple[tuple[ConvolutionSite, ...], tuple[Decline, ...]]:
    """``(sites, declines)``: the convolutions of ``mod``'s Relax functions that :func:`rewrite`
    serves as GEMMs, and those it leaves to TVM with the reason, each in binding order."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"tir_byoc.relax.convolutions: expected a tvm.IRModule, got {type(mod).__name__}"
        )
    sites, declines = [], []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        uses = None
        for block in func.body.blocks:
            values = {
                b.var: b.value
                for b in block.bindings
                if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call)
            }
            convs = {v: c for v, c in values.items() if c.op in _OPS or c.op in _TRANSPOSED}
            if not convs:
                continue
            uses = uses if uses is not None else variable_uses(func)
            users = {arg: var for var, call in values.items() for arg in call.args}
            for var, call in convs.items():
                if call.op in _TRANSPOSED:
                    site = "a transposed convolution; im2col serves conv1d, conv2d and conv3d"
                else:
                    site = _site(gvar.name_hint, var, call)
                if isinstance(site, ConvolutionSite) and not isinstance(var, relax.DataflowVar):
                    site = "its result is not a variable of a dataflow block"
                if isinstance(site, str):
                    declines.append(
                        Decline(gvar.name_hint, (var.name,), CONVOLUTION, site, call.op.name)
                    )
                    continue
                site = _tail(site, var, values, users, uses, convs)
                site = _transposed_input(site, values, uses)
                if isinstance(site.weight, relax.Var):
                    bindings = _constant_bindings(site.weight, values, uses)
                    if bindings:
                        site = dataclasses.replace(site, weight_bindings=bindings)
                sites.append(site)
    return tuple(sites), tuple(declines)


def rewrite(mod: tvm.IRModule, sites: tuple[ConvolutionSite, ...]) -> tvm.IRModule:
    """``mod`` with each convolution of ``sites`` computed as im2col and a GEMM (see the module
    docstring; :func:`tir_byoc.relax.im2col.build`); ``mod`` itself when there is none.  ``mod``
    is never modified."""
    return build(mod, sites)


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.ConvolutionsAsGemms")
class ConvolutionsAsGemms:
    """Each convolution of one group computed as im2col and a GEMM: :func:`find` (the
    convolutions left to TVM logged with the reason), then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, declines = find(mod)
        for conv in declines:
            logger.info("%s", conv)
        return rewrite(mod, sites)


__all__ = ["ConvolutionSite", "ConvolutionsAsGemms", "find", "rewrite"]
