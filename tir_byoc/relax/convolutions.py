"""Convolutions as GEMMs: ``conv1d``, ``conv2d`` and ``conv3d`` as im2col and a library GEMM.

TVM lowers a convolution to one loop nest that reduces over the input channels and the kernel
window, a nest no pattern of the family is, and its default CPU schedule runs it far from a
GEMM's speed (Whisper's first two convolutions, 80 x 3000 -> 384 channels: about 1.9 s a run
on a 2-vCPU AMD EPYC, against about 40 ms in torch).  Every output of a convolution with one
group is a dot product of the weight's row for its channel with the input window it sees, so ::

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
input's rows (Wav2Vec2's feature encoder, 512 channels over 8,207 positions: 254 -> 215 ms of
PrimFuncs a run at one thread on the Intel Xeon VM, the transposes gone, the first gather
16 -> 5 ms).  Its bias would be a vector indexed by the GEMM's row, which no call takes.

With G groups, output channel o = g * O/G + o' sees only the input channels c = g * C/G + c':
the gather puts the group first, ``colsT[b, g, (c', r...), p]``, and ``out[b, g, o', p]`` is
one matrix product per group, a batched ``matmul`` of the weight as (G, O/G, C/G * window)
with the columns, which the library serves as one batched call.  A depthwise convolution (one
input channel per group) is left to TVM: as G products of one window each it ran slower than
TVM's own loop, and :class:`tir_byoc.schedules.window.SlidingWindow` schedules that loop.

A padded convolution's input is first copied with its zeros (:func:`_padded`), in a function
``FuseOps`` leaves alone, so that the gather copies without a bound check, in vectors: a
check that differs between the lanes of a vector makes TVM's vectoriser write the whole copy
lane by lane.  An input that is a transpose moving the last axis (Wav2Vec2's positional
convolution reads its (B, T, C) hidden states as (B, C, T)) is copied so too, transposed
(:func:`_transposed_input`): fused into the gather, the transpose would have it read the
input across its rows.  Wav2Vec2-base's positional gather, 12.7 million columns: 14.9 -> 8.2
ms at one thread (Intel Xeon VM), the copy 0.2 ms.

The elementwise ops that follow the convolution, each the only use of the value before it,
move into the call: a bias of shape (1, O, 1...) (how torch's ``Conv`` adds its bias) becomes
the GEMM's (O,) bias (in the first form), and an activation (:data:`_UNARY`) is computed on
``y``: the same op on the same element.  They then fuse into the GEMM's PrimFunc, and the
library call computes them as its epilogue (Whisper's bias and GELU).  With groups only the
activations move: the bias would be a (G, O/G) tensor, one row per batch index, which no
call takes, so it stays TVM code after the product.

Entry point: :func:`ConvolutionsAsGemms`, a module pass before ``LegalizeOps``
(:data:`tir_byoc.model.LOWERING`), and :func:`find_convolutions`, which says for each
convolution whether it is served so and, if not, why.  A binding ``out = R.nn.conv1d(x, w)``
(``conv2d``, ``conv3d``) is rewritten when

1. the layouts are the default ones (``NCW``/``NCHW``/``NCDHW`` data and output,
   ``OIW``/``OIHW``/``OIDHW`` kernel), and the groups are not depthwise (:func:`_site`);
2. x, w and out are float32 of static shapes, and out a variable of a dataflow block;
3. the gathered columns hold at most :data:`MAX_COLUMNS` elements (the kernel window times
   the input, about: a 3 x 3 window reads each input value nine times).

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
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import ir, relax, te, tirx

from .analysis import static_dims, variable_uses

logger = logging.getLogger("tir_byoc")

_CONVS = {
    "relax.nn.conv1d": ("NCW", "OIW"),
    "relax.nn.conv2d": ("NCHW", "OIHW"),
    "relax.nn.conv3d": ("NCDHW", "OIDHW"),
}
_OPS = {ir.Op.get(name): layouts for name, layouts in _CONVS.items()}
#: Convolutions :func:`find_convolutions` reports but im2col does not serve.
_TRANSPOSED = frozenset(ir.Op.get(f"relax.nn.conv{d}d_transpose") for d in (1, 2, 3))

#: The most elements the gathered columns of one convolution may hold (1 GiB of float32).
MAX_COLUMNS = 1 << 28


@dataclass(frozen=True)
class Convolution:
    """One convolution of a Relax function: served as a GEMM, or ``reason`` why not."""

    function: str
    var: str
    op: str
    reason: str | None = None

    def __str__(self) -> str:
        where = f"{self.function}: {self.var} = {self.op}"
        return (
            f"{where}: a GEMM" if self.reason is None else f"{where}: left to TVM ({self.reason})"
        )


@dataclass(frozen=True)
class _Site:
    """What the rewrite of one convolution needs."""

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
    # :func:`_constant_bindings`), folded into one constant by the rewrite.
    weight_bindings: tuple[tuple[relax.Var, relax.Call], ...] = ()
    # The elementwise ops after the convolution computed on the GEMM's output instead, each
    # ("bias", its (1, O, 1...) tensor) or ("unary", its call), and the variables they bound.
    tail: tuple[tuple[str, object], ...] = ()
    tail_vars: tuple[relax.Var, ...] = ()
    # x's binding when x is a permute_dims that moves the last axis ((the permuted tensor,
    # the axes), see :func:`_transposed_input`), and whether the convolution is its one use.
    transposed: tuple[relax.Expr, tuple[int, ...]] | None = None
    transposed_dropped: bool = False


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _site(call: relax.Call, out_var) -> _Site | str:
    """The rewrite of a conv call, or why there is none (the conditions of the module doc)."""
    data_layout, kernel_layout = _OPS[call.op]
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
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
    if groups > 1 and w_dims[1] == 1:
        # One input channel per group: G products of (positions x window) by (window x O/G),
        # which ran slower as a batched call than TVM's own loop (ConvNeXt's 7 x 7 over 96
        # channels of 56 x 56: 52 against 29 ms on a 2-vCPU AMD EPYC).
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
    return _Site(
        x, weight, tuple(out_dims), kernel, strides, padding[:spatial], after, dilation, groups
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


def _tail(site: _Site, var, values: dict, users: dict, uses) -> _Site:
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
            if str(other.ty.dtype) != "float32":
                break
            tail.append(("bias", other))
        else:
            break
        tail_vars.append(user)
        var = user
    return dataclasses.replace(site, tail=tuple(tail), tail_vars=tuple(tail_vars))


_PERMUTE_DIMS = ir.Op.get("relax.permute_dims")


def _transposed_input(site: _Site, values: dict, uses) -> _Site:
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


def _padded(tensor: te.Tensor, site: _Site) -> te.Tensor:
    """The convolution's input as a copy of its own: ``permute_dims`` applied when the site's
    input is one (:func:`_transposed_input`), and zero-padded along the spatial axes, so that
    the gather reads every element it copies, with no bound check (a check that differs
    between the lanes of a vector makes TVM's vectoriser turn the copy into scalar code)."""
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


def _gather(x: te.Tensor, site: _Site, channels_first: bool) -> te.Tensor:
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


def _scan(mod: tvm.IRModule):
    """({gvar: {var: _Site}}, [Convolution]) over the Relax functions of ``mod``."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(
            f"tir_byoc.relax.convolutions: expected a tvm.IRModule, got {type(mod).__name__}"
        )
    sites, found = {}, []
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
                    site = _site(call, var)
                if isinstance(site, _Site) and not isinstance(var, relax.DataflowVar):
                    site = "its result is not a variable of a dataflow block"
                reason = site if isinstance(site, str) else None
                found.append(Convolution(gvar.name_hint, var.name, call.op.name, reason))
                if reason is None:
                    site = _tail(site, var, values, users, uses)
                    site = _transposed_input(site, values, uses)
                    if isinstance(site.weight, relax.Var):
                        bindings = _constant_bindings(site.weight, values, uses)
                        if bindings:
                            site = dataclasses.replace(site, weight_bindings=bindings)
                    sites.setdefault(gvar, {})[var] = site
    return sites, found


def find_convolutions(mod: tvm.IRModule) -> tuple[Convolution, ...]:
    """Every convolution of ``mod``'s Relax functions: served as a GEMM, or why not."""
    return tuple(_scan(mod)[1])


def convolutions_as_gemms(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each qualifying convolution computed as im2col and a GEMM (see the module
    docstring); ``mod`` itself when there is none.  ``mod`` is never modified."""
    sites, found = _scan(mod)
    for conv in found:
        if conv.reason is not None:
            logger.info("%s", conv)
    if not sites:
        return mod
    for by_var in sites.values():
        for var, site in by_var.items():
            if site.weight_bindings:
                weight = _folded(site.weight, site.weight_bindings)
                folded = {"weight": weight} if weight is not None else {"weight_bindings": ()}
                by_var[var] = dataclasses.replace(site, **folded)
    return _Rewriter(mod, sites).transform()


def ConvolutionsAsGemms() -> tvm.transform.Pass:
    """:func:`convolutions_as_gemms` as a module pass."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: convolutions_as_gemms(mod),
        opt_level=0,
        name="tir_byoc.ConvolutionsAsGemms",
    )


__all__ = ["Convolution", "ConvolutionsAsGemms", "convolutions_as_gemms", "find_convolutions"]
