"""float32 ``exp`` and ``erf`` calls written out in vector arithmetic, where the target can.

Entry points: :func:`applies` (whether the target has what the expressions need) and
:func:`expand` (a PrimFunc with its float32 ``exp`` and ``erf`` calls replaced by
:func:`~.vector_exp.exp_float32` and :func:`~.vector_erf.erf_float32`), which
:func:`tir_byoc.schedules.default_schedule` applies to the functions its rules schedule, and
MetaSchedule's builds to the functions it tunes, so that a tuner measures what is run.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.target import Target
from tvm.target.codegen import llvm_cpu_has_features

from .vector_erf import erf_float32
from .vector_exp import exp_float32

#: float32 calls written out, by op name, and the expression each becomes.
_WRITTEN_OUT = {"tirx.exp": exp_float32, "tirx.erf": erf_float32}


def applies(target: Target) -> bool:
    """Whether ``target`` rounds in vector registers (SSE4.1's ``roundps`` or later): without
    it ``floor`` (in exp) is one libm call per lane too, and nothing is gained."""
    return target.kind.name == "llvm" and bool(llvm_cpu_has_features("sse4.1", target))


def expand(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float32 ``exp`` and ``erf`` call written out; ``func`` itself when
    it has none."""
    found = []

    def on_call(call, mutator):
        call = mutator.default_mutate(call)
        if not isinstance(call.op, tvm.ir.Op) or not is_float32(call):
            return call
        expression = _WRITTEN_OUT.get(call.op.name)
        if expression is None:
            return call
        found.append(call)
        return expression(call.args[0])

    body = tvm_ffi.structural_mutate(func.body, [(tvm.ir.Call, on_call)])
    return func.with_body(body) if found else func


def is_float32(expr: tirx.PrimExpr) -> bool:
    """Whether ``expr`` is a float32 scalar; False for handles and other pointers (a sort's
    workspace, a packed call), whose type has no dtype."""
    return isinstance(expr.ty, tvm.ir.PrimType) and str(expr.ty.dtype) == "float32"
