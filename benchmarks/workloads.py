"""The benchmark's workloads, as data, as TIR and as random arrays.

Entry points: :data:`WORKLOADS` (the layers, ``MxK->N`` with a dense N x K weight),
:data:`MLP` (the seed MLP on the Relax VM), :data:`DTYPES`, :func:`prim_func` (a workload's
TIR: :func:`tir_byoc.patterns.describe` of its pattern with its static M, N, K) and
:func:`arrays` (its random inputs, from :mod:`tir_byoc.testing.inputs`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """One layer: ``pattern`` (a name of :data:`tir_byoc.patterns.PATTERNS`) at M, N, K."""

    name: str
    m: int
    n: int
    k: int
    pattern: str

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def has_bias(self) -> bool:
        return "bias" in self.pattern

    @property
    def has_relu(self) -> bool:
        return "relu" in self.pattern


WORKLOADS = (
    Workload("64x800->500 +bias+relu", 64, 500, 800, "dense_bias_relu"),
    Workload("64x500->10 +bias", 64, 10, 500, "dense_bias"),
    Workload("128x1024->1024", 128, 1024, 1024, "dense"),
    Workload("512x4096->4096", 512, 4096, 4096, "dense"),
    Workload("1x4096->4096", 1, 4096, 4096, "dense"),
)
MLP = Workload("seed MLP (Relax VM)", 64, 0, 0, "mlp")
MLP_FLOPS = 2.0 * 64 * (800 * 500 + 500 * 10)
#: dtype label -> tir_byoc signature; bf16 / int8 only for implementations that take them.
DTYPES = {"fp32": "float32", "bf16": "bfloat16,bfloat16->float32", "int8": "uint8,int8->int32"}
#: The flops of every row's workload, by name.
FLOPS = {w.name: w.flops for w in WORKLOADS} | {MLP.name: MLP_FLOPS}


def target():
    """This machine's LLVM target, with ``TVM_NUM_THREADS`` (else every core) as its cores."""
    import tvm

    cores = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": cores})


def prim_func(workload: Workload, signature: str):
    """The workload as TVM lowers it: tir_byoc's description of its pattern, static shapes.

    ``int32`` extents, as TE writes static shapes: the result is structurally equal to the TE
    matmul with bias / relu blocks this benchmark built itself before, so MetaSchedule's
    tuning records of that function still apply.
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
    sizes = {"M": workload.m, "N": workload.n, "K": workload.k}
    return static_shapes(func, sizes).with_attr("global_symbol", "main")


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
