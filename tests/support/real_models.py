"""The real models through the whole flow, and how much of their GEMM work tir_byoc serves.

The models are :mod:`tir_byoc.testing.models`' (:data:`~tir_byoc.testing.models.MODELS`:
encoders, decoders, vision and audio transformers, built from configs with random weights).
Each goes the way a user's model goes: ``torch.export`` -> ``from_exported_program`` (as
:func:`tir_byoc.frontend.import_torch` runs them) -> the standard Relax lowering ->
:func:`tir_byoc.offload` -> ``tvm.compile`` for llvm -> the Relax VM.

The GEMM work is counted twice, each side without asking tir_byoc's matcher:

- :func:`torch_gemm_flops`, what the model computes: torch's ``FlopCounterMode`` on the eager
  model (2 * M * N * K per product, times the batch);
- :func:`library_calls`, what the offloaded module hands to the library: every
  ``tir_byoc_*`` extern call reached from Relax ``main``, read from the call's own arguments
  (the calling convention of ``intrinsics/include/tir_byoc.h``).

Their ratio is the fraction offloaded; :func:`refusals` says why the rest was not.

Entry points: :func:`compile_model` (-> :class:`Compiled`), :func:`torch_gemm_flops`,
:func:`library_calls`, :func:`refusals`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
import tvm
import tvm_ffi
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from tvm import relax, s_tir, tirx

import tir_byoc
from tir_byoc.testing.models import RealModel

#: The aten operators ``FlopCounterMode`` counts that are GEMMs (or, for the attention
#: kernels, two batched GEMMs, and for a convolution the GEMM of its im2col, which is how
#: tir_byoc serves it: :mod:`tir_byoc.relax.convolutions`); a count from any other operator is an
#: error, not GEMM work.
GEMM_OPS = frozenset(
    {
        "aten.convolution",
        "aten.mm",
        "aten.addmm",
        "aten.bmm",
        "aten.baddbmm",
        "aten._scaled_mm",
        "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_cudnn_attention",
        "aten._flash_attention_forward",
        "aten._efficient_attention_forward",
    }
)

#: Prefix of every tir_byoc intrinsic's C symbol.
SYMBOL_PREFIX = "tir_byoc_"

_CALL_EXTERN = tvm.ir.Op.get("tirx.call_extern")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@contextlib.contextmanager
def _plain_attention():
    """Attention as the matmuls that ``FlopCounterMode`` counts.

    In eval mode without grad ``nn.TransformerEncoderLayer`` takes a fused fast path, and on
    CPU ``scaled_dot_product_attention`` runs a flash kernel; the counter has no formula for
    either and would count their GEMMs as zero.  The math backend computes the same products
    with ``bmm``.
    """
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def torch_gemm_flops(model: RealModel) -> dict[str, int]:
    """The GEMM FLOPs of one eager forward pass, by aten operator.

    Raises
    ------
    ValueError
        If the counter attributes FLOPs to an operator that is not a GEMM.
    """
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), _plain_attention(), counter:
        model.module(*model.inputs)
    counts = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items() if n}
    unknown = sorted(set(counts) - GEMM_OPS)
    if unknown:
        raise ValueError(f"expected FLOPs from GEMM operators only, got some from {unknown}")
    return counts


def lower(model: RealModel) -> tvm.IRModule:
    """Export with torch, import into Relax (weights bound as constants), lower and fuse.

    The import is :func:`tir_byoc.build_model`'s (:func:`tir_byoc.frontend.import_torch`:
    ``torch.export``, then ``from_exported_program`` with integer true divisions cast to
    float first, which TVM 0.27 would import as integer divisions).  The lowering is
    :func:`tir_byoc.build_model`'s, :func:`tir_byoc.relax.pipeline.lower`: the
    reshapes around each Linear folded (:mod:`tir_byoc.relax.linear_reshapes`), so that an
    activation or a residual add after a projection fuses into its GEMM's PrimFunc, then
    ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FuseOps``, ``FuseTIR``.
    """
    from tir_byoc.relax import pipeline

    mod, _ = tir_byoc.frontend.import_torch(model.module, model.inputs)
    return pipeline.lower(mod)


@dataclass(frozen=True)
class Compiled:
    """A model lowered, offloaded and built, with torch's result for its inputs.

    Attributes
    ----------
    model : RealModel
    offloaded : tvm.IRModule
        What :func:`tir_byoc.offload` made of the lowered model.
    executable : tvm.runtime.Executable
        ``offloaded`` built for llvm.
    expected : numpy.ndarray
        The eager torch model's output.
    """

    model: RealModel
    offloaded: tvm.IRModule
    executable: tvm.runtime.Executable
    expected: np.ndarray

    def run(self) -> np.ndarray:
        """The output of ``main`` on the Relax VM, for the model's inputs."""
        vm = relax.VirtualMachine(self.executable, tvm.cpu())
        args = [tvm.runtime.tensor(t.numpy()) for t in self.model.inputs]
        (output,) = vm["main"](*args)
        return output.numpy()


def compile_model(model: RealModel) -> Compiled:
    """Lower ``model``, offload it with every available backend, build it for llvm."""
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    offloaded = tir_byoc.offload(lower(model))
    executable = tvm.compile(offloaded, target="llvm")
    return Compiled(model, offloaded, executable, expected)


@dataclass(frozen=True)
class ExternCall:
    """One ``tir_byoc_*`` call as the offloaded module makes it.

    ``times`` is how often one call of its PrimFunc runs it (the trip count of the loops
    around it); ``batch`` is 1 except for the batched ``*_bmm_*`` entry points.
    """

    func: str
    symbol: str
    m: int
    n: int
    k: int
    batch: int
    times: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch * self.times


def _static(expr, what: str, symbol: str) -> int:
    if not isinstance(expr, tirx.IntImm):
        raise ValueError(f"{symbol}: expected a constant {what}, got {expr}")
    return int(expr.value)


def _extern_call(func: str, call: tvm.ir.Call, times: int) -> ExternCall:
    """Read M, N, K and the batch count from a call's arguments (see ``tir_byoc.h``).

    The arguments are the operand pointers, then ``m, n, k`` (int64) and ``dtypes`` (int32,
    the first int32 constant); a ``*_bmm_*`` entry point follows with ``batch0, batch1`` and
    the operands' strides.
    """
    symbol = str(call.args[0].value)
    args = list(call.args[1:])
    if symbol.endswith("_conv"):
        # x, w, y, dtypes, layout, weight layout, n, c, o, groups, in, out, kernel (3 each), ...
        return _conv_call(func, symbol, args[6:19], times)
    int32 = [isinstance(a, tirx.IntImm) and str(a.ty.dtype) == "int32" for a in args]
    dtypes = int32.index(True) if True in int32 else None
    if dtypes is None or dtypes < 3:
        raise ValueError(f"{symbol}: expected m, n, k then an int32 dtypes argument, got {args}")
    m, n, k = (_static(a, name, symbol) for a, name in zip(args[dtypes - 3 : dtypes], "mnk"))
    batch = 1
    # A bmm_ entry point has the batch after dtypes; the gemm one after dtypes and layout.
    first = {"bmm": dtypes + 1, "gemm": dtypes + 2}.get(
        "bmm" if "_bmm_" in symbol else "gemm" if symbol.endswith("_gemm") else None
    )
    if first is not None:
        batch0, batch1 = args[first], args[first + 1]
        batch = _static(batch0, "batch0", symbol) * _static(batch1, "batch1", symbol)
    return ExternCall(func, symbol, m, n, k, batch, times)


def _conv_call(func: str, symbol: str, shape, times: int) -> ExternCall:
    """One convolution's record from its n, c, o, groups, in, out and kernel (3 each)."""
    n, c, o, groups, *geometry = (_static(a, "a conv extent", symbol) for a in shape)
    positions, window = math.prod(geometry[3:6]), math.prod(geometry[6:9])
    m, k = n * positions, c // groups * window
    return ExternCall(func, symbol, m, o // groups, k, groups, times)


def _extern_calls(func: str, call: tvm.ir.Call, times: int) -> list[ExternCall]:
    """A call's records: one, or two for a fused convolution pair (``*_conv_pair``: x, block,
    y, dtypes, then each convolution's arguments as the conv entry point takes them after its
    dtypes, 35 each)."""
    symbol = str(call.args[0].value)
    if symbol.endswith("_conv_pair"):
        args = list(call.args[1:])
        return [_conv_call(func, symbol, args[at + 2 : at + 15], times) for at in (4, 39)]
    return [_extern_call(func, call, times)]


def epilogues_left_behind(mod: tvm.IRModule) -> list[str]:
    """Blocks that read an offloaded call's output inside the call's own PrimFunc.

    After the Relax fold of the Linear reshapes, an activation, gate or residual add of a GEMM
    sits in the GEMM's PrimFunc; one that is still TVM code there reads the call's output.  A
    block writing another shape than the call's output is no epilogue of it (a slice after a
    convolution kept whole, as Wav2Vec2's positional one has, or the next one's padding).
    """
    left = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        blocks = []
        tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
        calls = [b for b in blocks if b.annotations and "tir_byoc.intrinsic" in b.annotations]
        outputs = {
            w.source: str(c.annotations["tir_byoc.intrinsic"]) for c in calls for w in c.writes
        }
        for block in blocks:
            for region in block.reads:
                if region.source in outputs and block not in calls:
                    shape = [str(d) for d in region.source.ty.shape]
                    if any([str(d) for d in w.source.ty.shape] != shape for w in block.writes):
                        continue
                    left.append(
                        f"{gvar.name_hint}: block {block.name_hint} reads {region.source.name}, "
                        f"the output of {outputs[region.source]}"
                    )
    return left


def extern_calls(name: str, func: tirx.PrimFunc) -> list[ExternCall]:
    """The ``tir_byoc_*`` calls of one PrimFunc, each with the trip count of its loops."""
    found: list[ExternCall] = []
    loops: list[tirx.For] = []

    def on_loop(loop, visitor):
        loops.append(loop)
        visitor.default_visit(loop)
        loops.pop()

    def on_call(call, visitor):
        if call.op.same_as(_CALL_EXTERN) and str(call.args[0].value).startswith(SYMBOL_PREFIX):
            symbol = str(call.args[0].value)
            times = math.prod(_static(loop.extent, "loop extent", symbol) for loop in loops)
            found.extend(_extern_calls(name, call, times))
        visitor.default_visit(call)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_loop), (tvm.ir.Call, on_call)])
    return found


def call_sites(mod: tvm.IRModule, entry: str = "main") -> list[str]:
    """The PrimFunc of every ``R.call_tir`` run by one call of ``entry``, once per call site.

    A call of another Relax function of ``mod`` contributes that function's call sites, once
    per call.
    """
    callees: list[str] = []

    def on_call(call):
        if call.op.same_as(_CALL_TIR):
            callees.append(call.args[0].name_hint)
        elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
            callees.extend(call_sites(mod, call.op.name_hint))

    tvm_ffi.structural_walk(mod[entry].body, (relax.Call, on_call))
    return callees


def library_calls(mod: tvm.IRModule, entry: str = "main") -> list[ExternCall]:
    """Every library call one run of ``entry`` makes, one record per call (FLOPs: ``.flops``)."""
    sites = call_sites(mod, entry)
    calls = {callee: extern_calls(callee, mod[callee]) for callee in set(sites)}
    return [c for callee in sites for c in calls[callee]]


def refusals(offloaded: tvm.IRModule) -> list[str]:
    """Why what is left of the GEMM work was not offloaded: tir_byoc's own reasons.

    The candidates :func:`tir_byoc.explain` refused, and the matches :func:`tir_byoc.scan`
    found no intrinsic for, in the offloaded module's PrimFuncs called from ``main``.
    """
    called = set(call_sites(offloaded))
    refused = [str(r) for r in tir_byoc.explain(offloaded) if r.func in called]
    unserved = [
        f"{c.func}: {', '.join(c.blocks)} ({c.pattern}, {c.dtype}): no intrinsic: {c.reason}"
        for c in tir_byoc.scan(offloaded)
        if c.intrinsic is None and c.func in called
    ]
    return refused + unserved
