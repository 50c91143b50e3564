"""A 1 x 1 convolution and the depthwise 3 x 3 that alone reads its output, as one oneDNN call.

Entry point: :func:`pair_convolutions`, which :func:`tir_byoc.offload` runs on Relax modules
after the PrimFuncs are rewritten and before the weights are packed (:mod:`tir_byoc.packing`).
MobileNetV2's inverted residuals are such pairs: an expansion (1 x 1, ReLU6), then a depthwise
3 x 3 (ReLU6).  oneDNN computes the two as one primitive (the depthwise convolution as the
1 x 1's ``append_dw`` post-op), without writing the intermediate, which is the largest tensor
of the block, to memory.

Two ``R.call_tir`` bindings of the same dataflow block are paired when

- each calls a PrimFunc that is one oneDNN convolution call and nothing else (the whole
  PrimFunc offloaded), with static shapes but for the batch;
- the second's input is the first's output, and nothing else reads that output;
- both weights are constants of the model (the pair's block holds both);
- oneDNN's ``tir_byoc_onednn_conv_pair_pack`` accepts the pair: a 1 x 1 (stride 1, no padding,
  one group) and a depthwise 3 x 3 (stride 1 or 2, its output ceil(input / stride): padding 1
  on both sides, or TensorFlow's "SAME" padding of a stride 2, 0 before and 1 after, as
  transformers' MobileNetV2 has it), channels last, each with a
  bias and at most one relu or clip; a fused kernel on this machine (oneDNN 3.2 has one only
  where the intermediate is larger than about twice the L2 cache of its threads, so mostly at
  larger batches); a fused form of each clip that gives what the C epilogue gives, NaN
  included (probed on the call's shape); and the fused call timed at least 5 % faster than
  the two convolutions in the forms the packing would give them.

The pair becomes one PrimFunc (``<first>_pair``) calling ``tir_byoc_onednn_conv_pair`` on the
first's input, the block and both biases.  Where the block meets a process whose fused
primitive asks for other weight layouts (another CPU or thread count), the call runs the two
convolutions one after the other on the weights reordered to plain: correct, and slower.

A symbolic batch (a dynamic build) is laid out for a batch of
:data:`~tir_byoc.pack_calls.PACK_BATCH`, as a lone convolution's weight is, and timed there and
at batch 1.  Its block also holds each convolution's own block, as the packing would make it
for the convolution alone.  A call runs the fused primitive from the least batch where it was
timed faster (1 or ``PACK_BATCH``) where oneDNN serves that batch with the block's layouts, and
the two convolutions on their own blocks at every other batch.
Every pair considered and not fused is in :attr:`PairReport.kept` with the reason (logged at
INFO, as the packing's are, and in :attr:`tir_byoc.Model.declines`).
"""

from __future__ import annotations

import ctypes
import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from . import toolchain
from .calls import INTRINSIC_ATTR
from .decline import CONV_PAIR, Decline
from .epilogues import MAX_TENSORS
from .match.conv_records import ConvMatch
from .pack_calls import PACK_BATCH, PACK_CHOOSE, PACK_CHOOSE_ANY_M
from .packing import _block_param, _replace_calls
from .registry import Registry
from .rewrite import _null, _pointer, extern_block
from .signature import PACKED_WEIGHT_FLAG, DtypeSignature

logger = logging.getLogger("tir_byoc")

#: The block annotation, and the symbol, of a pair's call.
PAIR_INTRINSIC = "onednn.conv_pair"
PAIR_SYMBOL = "tir_byoc_onednn_conv_pair"
_CONV_SYMBOL = "tir_byoc_onednn_conv"
#: Entry points that are no registered intrinsic: their name in block annotations, and the
#: registered intrinsic whose library (and source) defines them, which a model calling them
#: links (:mod:`tir_byoc.aot`).
UNREGISTERED = {PAIR_SYMBOL: (PAIR_INTRINSIC, _CONV_SYMBOL)}
_CALL_TIR = ir.Op.get("relax.call_tir")
_CALL_EXTERN = ir.Op.get("tirx.call_extern")
_BUFFER_DATA = ir.Op.get("tirx.buffer_data")
_F32 = DtypeSignature.parse("float32").code

#: The pack function's choice codes of a fused pair: for one batch, for every batch of a
#: symbolic one, and from PACK_BATCH up (the two convolutions below it).
FUSED = {1: "", 7: " (at every batch)", 8: f" (from batch {PACK_BATCH}; below it, two calls)"}
#: Why the pack function did not fuse a pair, by its choice code.
NOT_FUSED = {
    0: "oneDNN ran the two convolutions alone as fast as the fused pair (timed here)",
    2: "not a pair oneDNN fuses (a 1 x 1 of stride 1, no padding and one group, then a "
    "depthwise 3 x 3 of stride 1 or 2 whose output is ceil(input / stride), padded 1 before "
    "or not, channels last, each with a bias and at most one relu or clip)",
    3: "oneDNN has no fused kernel for this pair on this machine (only its reference, which "
    "runs the two one after the other)",
    4: "no fused form of the epilogue gives what the C epilogue gives on NaN and infinities",
    5: "a weight holds an infinity or NaN",
    6: "TIR_BYOC_ONEDNN_PAIR=separate",
}


@dataclass
class PairReport:
    """What :func:`pair_convolutions` did: the pairs fused (``main: lv12 -> lv13 ->
    fused_conv2d1_pair``), and a :data:`~tir_byoc.decline.CONV_PAIR` decline for each pair
    considered and not fused."""

    paired: list[str] = field(default_factory=list)
    kept: list[Decline] = field(default_factory=list)
    #: The bindings each pair replaced (the second, now the pair's call) or dropped (the first).
    bindings: set = field(default_factory=set)


@dataclass(frozen=True)
class _Conv:
    """One PrimFunc that is a single oneDNN convolution call: the call's scalar arguments and
    the parameter index of each of its tensors."""

    func: tirx.PrimFunc
    match: ConvMatch
    ints: tuple  # layout, weight layout, n, c, o, groups, the 6 x 3 geometry, ops (None: symbolic)
    constants: tuple  # c0..c5
    arguments: tuple  # the call's arguments from the layout to c5, as PrimExprs
    x: int
    w: int
    tensors: tuple  # parameter indices of t0.. (None past the last)

    @property
    def depthwise(self) -> bool:
        groups = self.ints[5]
        return groups is not None and groups > 1 and groups == self.ints[3] == self.ints[4]

    @property
    def pointwise(self) -> bool:
        return self.ints[5] == 1 and self.ints[12:15] == (1, 1, 1)


def _only_call(func: tirx.PrimFunc):
    """The ``tir_byoc_onednn_conv`` call ``func`` consists of, or None."""
    blocks, calls = [], []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
    offloaded = [b for b in blocks if b.annotations and INTRINSIC_ATTR in b.annotations]
    if len(offloaded) != 1 or len(blocks) != 2:  # the root and the call
        return None

    def on_call(call):
        if call.op.same_as(_CALL_EXTERN):
            calls.append(call)

    tvm_ffi.structural_walk(offloaded[0].body, (tvm.ir.Call, on_call))
    if len(calls) != 1 or str(calls[0].args[0].value) != _CONV_SYMBOL:
        return None
    return calls[0]


def _conv(func: tirx.PrimFunc, offloaded) -> _Conv | None:
    """``func`` as a :class:`_Conv`; None where it is more than one fp32 oneDNN convolution
    call (TVM code beside it, another intrinsic, another dtype): no half of a pair."""
    if len(offloaded) != 1 or not isinstance(offloaded[0][0], ConvMatch):
        return None
    call = _only_call(func)
    if call is None:
        return None
    args = list(call.args[1:])
    if int(args[3].value) != _F32:
        return None
    params = list(func.params)

    def index(arg):
        if isinstance(arg, tvm.ir.Call) and arg.op.same_as(_BUFFER_DATA):
            return next((i for i, p in enumerate(params) if p.same_as(arg.args[0])), None)
        return None

    x, w, y = (index(a) for a in args[:3])
    tensors = tuple(index(a) for a in args[35:39])
    if None in (x, w, y) or y != len(func.params) - 1:
        return None  # an operand that is not a parameter
    return _Conv(
        func,
        offloaded[0][0],
        tuple(int(a.value) if isinstance(a, tirx.IntImm) else None for a in args[4:29]),
        tuple(float(a.value) for a in args[29:35]),
        tuple(args[4:35]),
        x,
        w,
        tensors,
    )


def _pack(conv_a: _Conv, conv_b: _Conv, wa, wb, registry: Registry, choice: int, out=None):
    """``tir_byoc_onednn_conv_pair_pack`` on two plain weights: (choice, size).  A symbolic
    batch is laid out for PACK_BATCH."""
    pack = toolchain.entry_point("onednn", "conv_pair_pack", registry)
    arrays = [np.ascontiguousarray(np.from_dlpack(w)) for w in (wa, wb)]
    ints = [
        (ctypes.c_int64 * 25)(*(PACK_BATCH if v is None else v for v in c.ints))
        for c in (conv_a, conv_b)
    ]
    constants = [(ctypes.c_double * 6)(*c.constants) for c in (conv_a, conv_b)]
    chosen, size = ctypes.c_int32(choice), ctypes.c_int64(0 if out is None else out[1])
    status = pack(
        arrays[0].ctypes.data,
        arrays[1].ctypes.data,
        _F32,
        ints[0],
        constants[0],
        ints[1],
        constants[1],
        ctypes.byref(chosen),
        None if out is None else ctypes.c_void_p(out[0]),
        ctypes.byref(size),
    )
    if status != 0:
        raise RuntimeError(f"tir_byoc_onednn_conv_pair_pack failed with status {status}")
    return chosen.value, size.value


def _block(conv_a, conv_b, wa, wb, registry, choice: int, size: int) -> tvm.runtime.Tensor:
    block = tvm.runtime.empty((size,), "uint8")
    address = np.from_dlpack(block).ctypes.data
    if address % 64:  # TVM allocates 64-byte aligned (kAllocAlignment); the block needs it
        raise RuntimeError(f"expected a 64-byte aligned tensor from TVM, got one at {address:#x}")
    _pack(conv_a, conv_b, wa, wb, registry, choice, (address, size))
    return block


def _pair_func(conv_a: _Conv, conv_b: _Conv, size: int, name: str) -> tirx.PrimFunc:
    """The PrimFunc of a pair: (x, block, a's tensors, b's tensors, y)."""
    pa, pb = list(conv_a.func.params), list(conv_b.func.params)
    x, y = pa[conv_a.x], pb[-1]
    block = _block_param(pa[conv_a.w], size)
    tensors_a = [pa[i] for i in conv_a.tensors if i is not None]
    tensors_b = [pb[i] for i in conv_b.tensors if i is not None]

    def half(conv: _Conv, tensors):
        # The batch of a dynamic build is the variable of the half's own buffers, which the
        # pair's parameters (the first's input, the second's output) define.
        args = list(conv.arguments)
        args += [_pointer(t) for t in tensors] + [_null()] * (MAX_TENSORS - len(tensors))
        return args

    dtypes = tirx.IntImm("int32", _F32 | PACKED_WEIGHT_FLAG)
    args = [_pointer(x), _pointer(block), _pointer(y), dtypes]
    args += half(conv_a, tensors_a) + half(conv_b, tensors_b)
    blocks = [*conv_a.match.blocks, *conv_b.match.blocks]
    call = extern_block(
        PAIR_INTRINSIC,
        PAIR_SYMBOL,
        args,
        [x, block, *tensors_a, *tensors_b],
        y,
        "conv2d_pair_onednn",
        blocks,
        name,
    )
    root = s_tir.SBlock(iter_vars=[], reads=[], writes=[], name_hint="root", body=call)
    body = s_tir.SBlockRealize([], True, root)
    params = [x, block, *tensors_a, *tensors_b, y]
    return tirx.PrimFunc(params, body, conv_b.func.ret_type, conv_b.func.attrs)


def _uses(func: relax.Function) -> Counter:
    """How many bindings (and the function's result) use each variable of ``func``."""
    counts: Counter = Counter()
    for block in func.body.blocks:
        for binding in block.bindings:
            counts.update(set(relax.analysis.free_vars(binding.value)))
    counts.update(set(relax.analysis.free_vars(func.body.body)))
    return counts


@dataclass(frozen=True)
class _Site:
    """One ``R.call_tir`` of a lone convolution PrimFunc: its callee, what that is, its binding."""

    callee: ir.GlobalVar
    conv: _Conv
    binding: relax.VarBinding

    @property
    def fields(self) -> list:
        return list(self.binding.value.args[1].fields)


def _candidates(func: relax.Function, convs: dict):
    """(a, b) per depthwise convolution site ``b`` of ``func`` whose input is the output of a
    1 x 1 convolution site ``a`` of the same dataflow block."""
    for block in func.body.blocks:
        sites = {}
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
                conv = convs.get(value.args[0].name_hint)
                if conv is not None:
                    sites[binding.var] = _Site(value.args[0], conv, binding)
        for b in sites.values():
            a = sites.get(b.fields[b.conv.x]) if b.conv.depthwise else None
            if a is not None and a.conv.pointwise:
                yield a, b


def _refusal(a: _Site, b: _Site, uses: Counter) -> str | None:
    """Why the pair ``a``, ``b`` is not even offered to oneDNN, or None."""
    middle = a.binding.var
    again = [f for i, f in enumerate(b.fields) if i != b.conv.x and f.same_as(middle)]
    if uses[middle] != 1 or again or b.conv.x in b.conv.tensors:
        return f"{middle.name} is also read elsewhere"
    # (The matcher takes a convolution of a symbolic batch only; this guards the block.)
    symbolic = [i for c in (a.conv, b.conv) for i, v in enumerate(c.ints) if v is None]
    if any(i != 2 for i in symbolic):
        return "a symbolic extent other than the batch (a pair's block is made for one shape)"
    weights = (a.fields[a.conv.w], b.fields[b.conv.w])
    if not all(isinstance(w, ir.Constant) for w in weights):
        return "a weight is not a constant of the model"
    return None


def pair_convolutions(mod: tvm.IRModule, rewritten, registry: Registry):
    """Fuse each 1 x 1 + depthwise pair of ``mod``'s Relax functions (see the module's
    docstring).

    Parameters
    ----------
    mod : tvm.IRModule
        The Relax module, its PrimFuncs rewritten.
    rewritten : list of (GlobalVar, PrimFunc, list of (Match, Intrinsic))
        As for :func:`tir_byoc.packing.pack_constant_weights`.
    registry : Registry

    Returns
    -------
    (tvm.IRModule, PairReport)
    """
    report = PairReport()
    convs = {}
    for gvar, _before, offloaded in rewritten:
        if all(i.name == "onednn.conv" for _, i in offloaded):
            conv = _conv(mod[gvar], offloaded)
            if conv is not None:
                convs[gvar.name_hint] = conv
    if not convs or toolchain.entry_point("onednn", "conv_pair_pack", registry) is None:
        return mod, report
    builder = relax.BlockBuilder(mod)
    replacements, removed, made = {}, set(), {}
    for fvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        uses = _uses(func)
        for a, b in _candidates(func, convs):
            where = f"{fvar.name_hint}: {a.binding.var.name} -> {b.binding.var.name}"
            # Step 1. Whether the pair is fused: the checks here, then oneDNN's (and its timing).
            reason = _refusal(a, b, uses)
            if reason is None:
                wa, wb = a.fields[a.conv.w].value, b.fields[b.conv.w].value
                any_batch = None in (a.conv.ints[2], b.conv.ints[2])
                chosen = PACK_CHOOSE_ANY_M if any_batch else PACK_CHOOSE
                choice, size = _pack(a.conv, b.conv, wa, wb, registry, chosen)
                reason = None if choice in FUSED else NOT_FUSED.get(choice, f"choice {choice}")
            if reason is not None:
                sites = (a.binding.var.name, b.binding.var.name)
                report.kept.append(Decline(fvar.name_hint, sites, CONV_PAIR, reason))
                continue
            # Step 2. The pair's PrimFunc (one per pair of callees) and its call.
            key = (a.callee.name_hint, b.callee.name_hint)
            if key not in made:
                name = f"{a.callee.name_hint}_pair"
                made[key] = builder.add_func(_pair_func(a.conv, b.conv, size, name), name)
            block = _block(a.conv, b.conv, wa, wb, registry, choice, size)
            args = [a.fields[a.conv.x], relax.const(block, "uint8")]
            args += [a.fields[i] for i in a.conv.tensors if i is not None]
            args += [b.fields[i] for i in b.conv.tensors if i is not None]
            call = relax.op.call_tir(made[key], relax.Tuple(args), list(b.binding.value.ty_args))
            replacements[b.binding.var] = relax.BlockBuilder().normalize(call)
            removed.add(a.binding.var)
            report.paired.append(f"{where} -> {made[key].name_hint}{FUSED[choice]}")
    if replacements:
        mod = _replace_calls(builder.get(), replacements, removed)
        report.bindings = set(replacements) | removed
    for line in report.paired:
        logger.info("paired: %s", line)
    for decline in report.kept:
        logger.info(
            "not paired: %s: %s: %s", decline.func, " -> ".join(decline.blocks), decline.reason
        )
    return mod, report


__all__ = [
    "FUSED",
    "NOT_FUSED",
    "PAIR_INTRINSIC",
    "PAIR_SYMBOL",
    "UNREGISTERED",
    "PairReport",
    "pair_convolutions",
]
