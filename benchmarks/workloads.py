"""The benchmark's workloads, as data, as TIR and as random arrays.

Entry points: :data:`WORKLOADS` (the layers: ``MxK->N`` with a dense N x K weight, the
batch forms ``BxMxK->N``, and the epilogue workloads: GEMMs with a GELU, a gated MLP's SiLU and
gate, a residual add), :data:`GROUPS` and :func:`select` (what ``--workload`` takes),
:data:`MLP` (the seed MLP on the Relax VM), :data:`DTYPES`, :func:`prim_func` (a workload's
TIR: :func:`tir_byoc.patterns.describe` of its pattern with its static B, M, N, K),
:func:`ir_module` (what tir_byoc and TVM build: that PrimFunc, or a Relax ``main`` calling each
of a workload's PrimFuncs), :func:`arrays` (its random inputs, from
:mod:`tir_byoc.testing.inputs`) and :func:`expected` (its result, computed in float64).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

#: The name prefixes of the batch forms (the non-empty values of
#: :data:`tir_byoc.patterns.BATCH_FORMS`; spelt out so that the command line need not load TVM).
BATCH_PREFIXES = ("batch_", "bmm_")
#: The name suffixes of the epilogues with entry points of their own (after the layout; the
#: members of :data:`tir_byoc.patterns.FIXED_EPILOGUES`, spelt out likewise).  Any other
#: epilogue is served by the gemm entry point, which takes fp32 only.
FIXED_SUFFIXES = ("", "_bias", "_relu", "_bias_relu")


@dataclass(frozen=True)
class Workload:
    """One layer: ``pattern`` (a name of :data:`tir_byoc.patterns.PATTERNS`) at M, N, K.

    ``batch`` is B, the batch dim of a ``batch_`` pattern (X (B, M, K) and Y (B, M, N) over a
    2-D weight) or of a ``bmm_`` one (X, W and Y all lead with B), and None for a 2-D pattern.
    ``describe`` builds one batch dim, so several (8 x 12 attention heads) are flattened into
    one (96).

    ``tail_from`` names the pattern of a call that computes the tensor of the epilogue's add or
    mul, on the same X at the same M, N, K with a weight of its own, before the ``pattern``
    call (the gated MLP's up projection, whose output ``dense_silu_mul`` multiplies by); the
    workload is both calls, as Relax runs them: two PrimFuncs.  None: one call, whose tensor
    (if any) is an input.
    """

    name: str
    m: int
    n: int
    k: int
    pattern: str
    batch: int | None = None
    tail_from: str | None = None

    def __post_init__(self):
        batch_form = self.pattern.startswith(BATCH_PREFIXES)
        if batch_form != (self.batch is not None):
            raise ValueError(
                f"workload {self.name!r}: pattern {self.pattern!r} expected "
                f"{'a batch' if batch_form else 'no batch'}, got batch={self.batch!r}"
            )
        if self.tail_from is not None and (
            self.tail_from not in ("dense", "matmul")
            or not self.pattern.endswith(("_add", "_mul"))
            or batch_form
        ):
            raise ValueError(
                f"workload {self.name!r}: tail_from expected a plain 2-D dense or matmul feeding "
                f"a 2-D pattern ending in add or mul, got {self.tail_from!r} feeding "
                f"{self.pattern!r}"
            )

    @property
    def calls(self) -> tuple[str, ...]:
        """The patterns of the workload's calls, in the order they run."""
        return (self.pattern,) if self.tail_from is None else (self.tail_from, self.pattern)

    @property
    def flops(self) -> float:
        """The GEMMs' flops (an epilogue's few per element are not counted)."""
        return 2.0 * self.rows * self.n * self.k * len(self.calls)

    @property
    def group(self) -> str:
        """``"batch"``, ``"epilogue"`` (served by the gemm entry point) or ``"2d"``."""
        if self.batch is not None:
            return "batch"
        layout = "dense" if self.pattern.startswith("dense") else "matmul"
        fixed = self.pattern.removeprefix(layout) in FIXED_SUFFIXES
        return "2d" if fixed and self.tail_from is None else "epilogue"

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The keys of :data:`DTYPES` it is measured in: fp32 only for an epilogue workload."""
        return ("fp32",) if self.group == "epilogue" else tuple(DTYPES)

    @property
    def ops(self) -> tuple[str, ...]:
        """The epilogue ops of ``pattern``, in order (:data:`tir_byoc.epilogues.OPS` names)."""
        from tir_byoc.patterns import pattern

        return pattern(self.pattern).ops

    @property
    def rows(self) -> int:
        """B x M: the rows of X and Y over every batch index (M with the batch folded in)."""
        return (self.batch or 1) * self.m

    @property
    def batched(self) -> bool:
        """A batched matmul (``bmm_``): the weight carries the batch dim too."""
        return self.pattern.startswith("bmm_")

    @property
    def dense(self) -> bool:
        """The weight is N x K (``dense`` patterns), else K x N (``matmul`` ones)."""
        return "dense" in self.pattern

    @property
    def has_bias(self) -> bool:
        return "bias" in self.pattern

    @property
    def has_relu(self) -> bool:
        return "relu" in self.pattern

    @property
    def sizes(self) -> dict[str, int]:
        """The values of the extents ``describe`` names (B only for a batch form)."""
        sizes = {"M": self.m, "N": self.n, "K": self.k}
        return sizes if self.batch is None else {**sizes, "B": self.batch}


WORKLOADS = (
    Workload("64x800->500 +bias+relu", 64, 500, 800, "dense_bias_relu"),
    Workload("64x500->10 +bias", 64, 10, 500, "dense_bias"),
    Workload("128x1024->1024", 128, 1024, 1024, "dense"),
    Workload("512x4096->4096", 512, 4096, 4096, "dense"),
    Workload("1x4096->4096", 1, 4096, 4096, "dense"),
    # GPT-2's Conv1D (x @ W, W stored K x N): the MLP's first projection over 128 tokens.
    Workload("128x768->3072, K x N weight", 128, 3072, 768, "matmul"),
    # Attention of 8 sequences x 12 heads, 128 tokens, head dim 64: the batch is 96.
    Workload("attn Q.K^T 96x128x64->128", 128, 128, 64, "bmm_matmul", batch=96),
    Workload("attn P.V 96x128x128->64", 128, 64, 128, "bmm_matmul", batch=96),
    # A Linear on (8, 128, 768): one 2-D dense with M = 1024 serves it.
    Workload("Linear 8x128x768->3072", 128, 3072, 768, "batch_dense", batch=8),
    # Epilogues (issue 12), BERT-base and LLaMA sizes over 256 tokens: a Linear + GELU (erf, as
    # Relax lowers it), LLaMA's gated MLP silu(x Wg) * (x Wu) as Relax fuses it (the up
    # projection, then the gate GEMM with its SiLU and multiply), a Linear + residual add.
    Workload("Linear+GELU 256x768->3072", 256, 3072, 768, "dense_bias_gelu"),
    # GPT-2's MLP projection with its tanh GELU over 128 tokens (its K x N weight, packed once
    # to N x K as a constant, is a dense weight here).
    Workload("Linear+GELU(tanh) 128x768->3072", 128, 3072, 768, "dense_bias_gelu_tanh"),
    Workload("gated MLP 256x768->2x2048", 256, 2048, 768, "dense_silu_mul", tail_from="dense"),
    Workload("Linear+residual 256x768->768", 256, 768, 768, "dense_bias_add"),
)
#: Names ``--workload`` takes for several workloads at once: the 2-D layers, the batch forms,
#: the epilogue workloads.
GROUPS = {
    group: tuple(w.name for w in WORKLOADS if w.group == group)
    for group in ("2d", "batch", "epilogue")
}
MLP = Workload("seed MLP (Relax VM)", 64, 0, 0, "mlp")
MLP_FLOPS = 2.0 * 64 * (800 * 500 + 500 * 10)
#: dtype label -> tir_byoc signature; bf16 / int8 only for implementations that take them.
DTYPES = {"fp32": "float32", "bf16": "bfloat16,bfloat16->float32", "int8": "uint8,int8->int32"}
#: The flops of every row's workload, by name.
FLOPS = {w.name: w.flops for w in WORKLOADS} | {MLP.name: MLP_FLOPS}


def select(names: Iterable[str] | None) -> tuple[Workload, ...]:
    """The workloads ``names`` (workload or group names) select, in table order; all for None.

    Raises ValueError naming the workloads and groups for a name that is neither.
    """
    if not names:
        return WORKLOADS
    by_name = {w.name: (w.name,) for w in WORKLOADS} | GROUPS
    chosen = set()
    for name in names:
        if name not in by_name:
            raise ValueError(
                f"{name!r} is not a workload; expected one of "
                f"{', '.join(repr(w.name) for w in WORKLOADS)}, or a group: "
                f"{', '.join(repr(g) for g in GROUPS)}"
            )
        chosen.update(by_name[name])
    return tuple(w for w in WORKLOADS if w.name in chosen)


def target():
    """This machine's LLVM target, with ``TVM_NUM_THREADS`` (else every core) as its cores."""
    import tvm

    cores = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": cores})


def prim_func(workload: Workload, signature: str):
    """The workload as TVM lowers it: tir_byoc's description of its pattern, static shapes.

    ``int32`` extents, as TE writes static shapes: for the 2-D layers the result is
    structurally equal to the TE matmul with bias / relu blocks this benchmark built itself
    before, so MetaSchedule's tuning records of that function still apply.
    """
    from tir_byoc.patterns import describe
    from tir_byoc.signature import DtypeSignature

    dtypes = DtypeSignature.parse(signature)
    func = describe(
        workload.pattern,
        x_dtype=dtypes.x,
        w_dtype=dtypes.w,
        out_dtype=dtypes.out,
        index_dtype="int32",
    )
    return static_shapes(func, workload.sizes).with_attr("global_symbol", "main")


def ir_module(workload: Workload, signature: str):
    """What TVM and tir_byoc build: :func:`prim_func` as the ``main`` of an IRModule, or for a
    workload of two calls (``tail_from``) a Relax ``main`` that calls each PrimFunc as Relax's
    fusion leaves them: ``main(X, W, W_tail)`` computes ``T = tail_from(X, W_tail)``, then
    ``pattern(X, W, T)``, with the parameters of :func:`arrays`."""
    import tvm
    from tvm import relax

    func = prim_func(workload, signature)
    if workload.tail_from is None:
        return tvm.IRModule({"main": func})
    tail_func = prim_func(replace(workload, pattern=workload.tail_from, tail_from=None), signature)
    *operands, out = func.params
    tail_operands = tail_func.params[:-1]

    def tensor_type(param):
        return relax.TensorType([int(e) for e in param.ty.shape], str(param.ty.dtype.dtype))

    def var(param, suffix=""):
        return relax.Var(param.name + suffix, tensor_type(param))

    # Step 1. Parameters: the main call's operands but its tail tensor (the last one: its op
    # is in the last slot), then the tail call's operands but X.
    main_vars = [var(p) for p in operands]
    extra_vars = [var(p, "_tail") for p in tail_operands[1:]]
    params = main_vars[:-1] + extra_vars
    # Step 2. The two calls.
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            tail_gv = builder.add_func(tail_func.without_attr("global_symbol"), workload.tail_from)
            main_gv = builder.add_func(func.without_attr("global_symbol"), workload.pattern)
            tail_out = tensor_type(tail_func.params[-1])
            tail_args = relax.Tuple([main_vars[0], *extra_vars])
            tail = builder.emit(relax.op.call_tir(tail_gv, tail_args, tail_out))
            args = relax.Tuple([*main_vars[:-1], tail])
            result = builder.emit_output(relax.op.call_tir(main_gv, args, tensor_type(out)))
        builder.emit_func_output(result)
    return builder.get()


def static_shapes(func, sizes: Mapping[str, int]):
    """``func`` with the symbolic extents of its buffer parameters bound to ``sizes`` (by name).

    TVM 0.27's ``PrimFunc.specialize`` binds parameters, and an extent is not one: each buffer
    parameter is bound to a buffer of the concrete shape instead, which binds the extents its
    shape mentions, in the body too.
    """
    from tvm import tirx

    from tir_byoc.testing.inputs import concrete_extent

    buffers = {}
    for param in func.params:
        shape = [tirx.IntImm(e.ty.dtype, concrete_extent(e, sizes)) for e in param.ty.shape]
        buffers[param] = tirx.decl_buffer(shape, str(param.ty.dtype.dtype), name=param.name)
    return func.specialize(buffers)


def arrays(workload: Workload, signature: str, seed: int = 0):
    """(operands, output): random inputs of the workload's parameters, and its output array.

    A workload of two calls (``tail_from``) has the parameters of :func:`ir_module`'s
    ``main``: the main call's operands but its tail tensor (which the first call computes),
    then the first call's operands but X.
    """
    from tir_byoc.testing.inputs import random_arguments

    *operands, out = random_arguments(prim_func(workload, signature), seed=seed)
    if workload.tail_from is None:
        return operands, out
    tail = replace(workload, pattern=workload.tail_from, tail_from=None)
    _, *tail_operands, _ = random_arguments(prim_func(tail, signature), seed=seed + 1)
    return [*operands[:-1], *tail_operands], out  # the tail tensor is the last operand


def expected(workload: Workload, operands):
    """The workload's result on ``operands`` (:func:`arrays`), computed in float64: the oracle
    every implementation's fp32 result is checked against, once, before it is timed."""
    import math

    import numpy as np

    x, w, *rest = (np.asarray(a, dtype=np.float64) for a in operands)

    def product(weight):
        return x @ (np.swapaxes(weight, -1, -2) if workload.dense else weight)

    if workload.tail_from is not None:  # its weight comes last, where its output goes
        rest[-1] = product(rest[-1])
    z, tensors = product(w), iter(rest)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    formulas = {
        "bias": lambda z: z + next(tensors),
        "relu": lambda z: np.maximum(z, 0.0),
        "gelu": lambda z: 0.5 * z * (1.0 + erf(z / math.sqrt(2.0))),
        "gelu_tanh": lambda z: (
            0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
        ),
        "silu": lambda z: z / (1.0 + np.exp(-z)),
        "add": lambda z: z + next(tensors),
        "mul": lambda z: z * next(tensors),
    }
    with np.errstate(over="ignore"):  # silu's exp(-z) of a large negative z: z / inf = -0
        for op in workload.ops:
            if op not in formulas:
                raise ValueError(f"expected: no float64 formula for {op!r}; add one to formulas")
            z = formulas[op](z)
    return z
