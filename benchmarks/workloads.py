"""The benchmark's workloads, as data, as TIR and as random arrays.

Entry points: :data:`WORKLOADS` (the layers: ``MxK->N`` with a dense N x K weight, and the
batch forms ``BxMxK->N``), :data:`GROUPS` and :func:`select` (what ``--workload`` takes),
:data:`MLP` (the seed MLP on the Relax VM), :data:`DTYPES`, :func:`prim_func` (a workload's
TIR: :func:`tir_byoc.patterns.describe` of its pattern with its static B, M, N, K) and
:func:`arrays` (its random inputs, from :mod:`tir_byoc.testing.inputs`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The name prefixes of the batch forms (the non-empty values of
#: :data:`tir_byoc.patterns.BATCH_FORMS`; spelt out so that the command line need not load TVM).
BATCH_PREFIXES = ("batch_", "bmm_")


@dataclass(frozen=True)
class Workload:
    """One layer: ``pattern`` (a name of :data:`tir_byoc.patterns.PATTERNS`) at M, N, K.

    ``batch`` is B, the batch dim of a ``batch_`` pattern (X (B, M, K) and Y (B, M, N) over a
    2-D weight) or of a ``bmm_`` one (X, W and Y all lead with B), and None for a 2-D pattern.
    ``describe`` builds one batch dim, so several (8 x 12 attention heads) are flattened into
    one (96).
    """

    name: str
    m: int
    n: int
    k: int
    pattern: str
    batch: int | None = None

    def __post_init__(self):
        batch_form = self.pattern.startswith(BATCH_PREFIXES)
        if batch_form != (self.batch is not None):
            raise ValueError(
                f"workload {self.name!r}: pattern {self.pattern!r} expected "
                f"{'a batch' if batch_form else 'no batch'}, got batch={self.batch!r}"
            )

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.n * self.k

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
    # Attention of 8 sequences x 12 heads, 128 tokens, head dim 64: the batch is 96.
    Workload("attn Q.K^T 96x128x64->128", 128, 128, 64, "bmm_matmul", batch=96),
    Workload("attn P.V 96x128x128->64", 128, 64, 128, "bmm_matmul", batch=96),
    # A Linear on (8, 128, 768): one 2-D dense with M = 1024 serves it.
    Workload("Linear 8x128x768->3072", 128, 3072, 768, "batch_dense", batch=8),
)
#: Names ``--workload`` takes for several workloads at once: the 2-D layers, the batch forms.
GROUPS = {
    "2d": tuple(w.name for w in WORKLOADS if w.batch is None),
    "batch": tuple(w.name for w in WORKLOADS if w.batch is not None),
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
    """:func:`prim_func` as the ``main`` of an IRModule."""
    import tvm

    return tvm.IRModule({"main": prim_func(workload, signature)})


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
    """(operands, output): random inputs of the workload's parameters, and its output array."""
    from tir_byoc.testing.inputs import random_arguments

    *operands, out = random_arguments(prim_func(workload, signature), seed=seed)
    return operands, out
