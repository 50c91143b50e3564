"""Every site tir_byoc leaves as it was in a module, and why: TIR and Relax alike.

Entry point: :func:`explain` (``tir_byoc.explain``, and ``tir-byoc explain``).  Each decline is
a :class:`~tir_byoc.decline.Decline`.  For a TIR module or a PrimFunc they are the plan's
(:func:`tir_byoc.offload.offload_plan`): the matcher's, and the ends of chains no intrinsic
takes whole.  For a Relax module, in the order the pipeline (:mod:`tir_byoc.relax.pipeline`)
meets them:

1. the declines of the Relax rewrites before ``LegalizeOps`` (its ``BEFORE_LEGALIZE``: a
   convolution left to TVM, a reshape not folded, ...): each rewrite's ``find`` (the module
   its pass is defined in has it, :mod:`tir_byoc.relax`) run on the module the passes before
   it left;
2. the plan's declines of the module :func:`tir_byoc.offload` is given: the module lowered as
   the pipeline lowers it when it still has operators to legalize, else the module itself.
   They include the weight copies not folded.

Nothing is rewritten: the module given is not modified.
"""

from __future__ import annotations

import importlib

import tvm
import tvm_ffi
from tvm import ir, relax

from .decline import Decline
from .offload import offload_plan
from .planning import as_module
from .relax import pipeline


def explain(mod_or_func) -> list[Decline]:
    """Every candidate that was not rewritten or offloaded, with the first condition that
    failed.

    For a Relax module, the Relax rewrites' declines come first, then those of the lowered
    PrimFuncs (see the module docstring).  Deciding a fold of weight copies asks which
    intrinsics would serve the result, so for a Relax module ``explain`` resolves the
    backends as :func:`tir_byoc.scan` does.

    Parameters
    ----------
    mod_or_func : tvm.IRModule or tvm.tirx.PrimFunc
        TIR or Relax module (lowered or not), or one PrimFunc.  Not modified.

    Returns
    -------
    list of Decline
        Each names the function, the blocks (or the Relax binding), the kind of site, the
        nearest pattern and the first failed condition.
    """
    mod, wrapped = as_module(mod_or_func)
    if wrapped or not any(isinstance(f, relax.Function) for f in mod.functions.values()):
        return offload_plan(mod_or_func).rejections
    rewritten, declines = _run(pipeline.BEFORE_LEGALIZE, mod)
    if _to_legalize(rewritten):
        mod, lowering_declines = _run(pipeline.LOWERING, rewritten)
        declines += lowering_declines
    return [*declines, *offload_plan(mod).rejections]


def _run(passes, mod: tvm.IRModule) -> tuple[tvm.IRModule, list[Decline]]:
    """``passes`` of the pipeline, one by one, and what each rewrite's ``find`` declined on the
    module the passes before it left (a pass whose module has no ``find``, such as TVM's own,
    declines nothing)."""
    declines = []
    for make_pass in passes:
        find = getattr(importlib.import_module(make_pass.__module__), "find", None)
        if callable(find):
            declines += find(mod)[1]
        mod = make_pass()(mod)
    return mod, declines


def _to_legalize(mod: tvm.IRModule) -> bool:
    """Whether a Relax function of ``mod`` calls an operator ``LegalizeOps`` lowers to TIR."""
    found = []

    def on_call(call):
        # The walk does not visit an Op node itself: read each call's.
        if isinstance(call.op, ir.Op) and call.op.get_attr("FLegalize") is not None:
            found.append(call.op)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, (relax.Call, on_call))
            if found:
                return True
    return False


__all__ = ["explain"]
