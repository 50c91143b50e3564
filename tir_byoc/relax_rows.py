"""Fuse an elementwise producer into the row reduction that alone reads it: one PrimFunc and one
pass over memory, where Relax's ``FuseOps`` leaves two.

``AnnotateTIROpPattern`` calls a reduction followed by elementwise ops (a mean then its divide,
a softmax) ``kOutEWiseFusable``, as it calls a matmul, and ``FuseOps`` fuses nothing *into* such
a function: only what follows it.  So the op before a row reduction stays a PrimFunc of its own,
which writes a whole tensor that the reduction then reads back:

- RMS norm (LLaMA): ``power(x, 2)``, then ``mean`` + ``rsqrt`` + the scaling;
- attention: the scores' reshape, scale and mask (``reshape`` + ``multiply`` + ``add``), then
  the softmax;
- BERT's post-norm: the residual ``add``, then ``layer_norm``.

Entry point: :func:`FuseIntoRows`, a module pass between ``FuseOps`` and ``FuseTIR``
(:data:`tir_byoc.model.LOWERING`).  For a binding ``c = C(..., p, ...)`` of a dataflow block,
where C is a group ``FuseOps`` made (a Relax function with ``Primitive``), it merges the binding
``p = P(...)`` into C's group when

1. C calls at least one PrimFunc that reduces (a block with a reduction iterator) and none
   whose reduction multiplies two buffer elements (a GEMM: the offload's, not this pass's);
2. P is a ``call_tir`` of one PrimFunc, or a group of them, that ``AnnotateTIROpPattern`` marks
   injective or simpler (elementwise, broadcast, injective);
3. ``p`` is bound in the same dataflow block and used exactly once in the function: here;
4. ``p`` has the shape and dtype of ``c``, so the two functions run over the same rows.

The merged group computes P's bindings and then C's, C reading P's value where it read ``p``:
every block is the block it was, in the same order.  The one difference in the values: with a
product and the sum it feeds now in one loop (RMS norm's squares), LLVM may fuse them into one
multiply-add, which TVM's code generator allows, and the sum then differs in the last bit.
``FuseTIR`` then makes one PrimFunc of it, and the default schedule
(:class:`tir_byoc.schedules.rows.VectorRows`) computes P's blocks inside each row, so the
intermediate tensor shrinks to one row.  A merged group can take another producer; the pass
repeats until none is left.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from .match.reduction import looks_like_gemm
from .match.stir import COMM_REDUCE
from .relax_reshape import static_dims, variable_uses

_CALL_TIR = ir.Op.get("relax.call_tir")
#: AnnotateTIROpPattern's kinds up to injective: elementwise 0, broadcast 1, injective 2.
_INJECTIVE = 2


def fuse_into_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each producer merged into its row reduction (see the module docstring);
    ``mod`` itself when there is none.  ``mod`` is never modified."""
    changed = True
    while changed:
        changed = False
        for gvar, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or _is_group(func):
                continue
            merged = _merge_one(mod, gvar, func)
            if merged is not None:
                mod, changed = merged, True
                break
    return mod


def FuseIntoRows() -> tvm.transform.Pass:
    """:func:`fuse_into_rows` as a module pass (for ``tvm.transform.Sequential``)."""
    return tvm.transform.module_pass(
        lambda mod, _ctx: fuse_into_rows(mod), opt_level=0, name="tir_byoc.FuseIntoRows"
    )


# --------------------------------------------------------------------------------------
# What may merge
# --------------------------------------------------------------------------------------


def _is_group(func) -> bool:
    return isinstance(func, relax.Function) and bool((func.attrs or {}).get("Primitive", False))


def _prim_funcs(mod: tvm.IRModule, call: relax.Call) -> list[tirx.PrimFunc] | None:
    """The PrimFuncs a binding's value runs: one ``call_tir``'s, or every ``call_tir``'s of the
    group it calls; None for anything else."""
    if call.op.same_as(_CALL_TIR):
        if len(call.args) != 2 or not isinstance(call.args[1], relax.Tuple):
            return None  # symbolic shapes passed as tir_vars, or a tuple from elsewhere
        callee = mod[call.args[0]]
        return [callee] if isinstance(callee, tirx.PrimFunc) else None
    if not isinstance(call.op, ir.GlobalVar) or not _is_group(mod[call.op]):
        return None
    body = mod[call.op].body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return None  # FuseOps makes one dataflow block per group; anything else is left alone
    funcs = []
    for binding in body.blocks[0].bindings:
        value = binding.value
        if not isinstance(value, relax.Call) or not value.op.same_as(_CALL_TIR):
            return None
        funcs.append(mod[value.args[0]])
    return funcs if all(isinstance(f, tirx.PrimFunc) for f in funcs) else None


def _reduction_blocks(func: tirx.PrimFunc) -> list:
    blocks = []

    def on_block(block):
        if any(iv.iter_type == COMM_REDUCE for iv in block.iter_vars):
            blocks.append(block)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return blocks


def _reduces_rows(funcs: list[tirx.PrimFunc]) -> bool:
    """Condition 1: some PrimFunc reduces, none is a GEMM."""
    reductions = [b for f in funcs for b in _reduction_blocks(f)]
    return bool(reductions) and not any(looks_like_gemm(b) for b in reductions)


def _injective(funcs: list[tirx.PrimFunc]) -> bool:
    """Condition 2: every PrimFunc is marked elementwise, broadcast or injective."""
    return all(int((f.attrs or {}).get("op_pattern", 99)) <= _INJECTIVE for f in funcs)


def _same_tensor_type(a: relax.Expr, b: relax.Expr) -> bool:
    """Condition 4: the same static shape and dtype."""
    dims = static_dims(a)
    return dims is not None and dims == static_dims(b) and a.ty.dtype == b.ty.dtype


# --------------------------------------------------------------------------------------
# The merge
# --------------------------------------------------------------------------------------


def _merge_one(mod: tvm.IRModule, gvar: ir.GlobalVar, func: relax.Function):
    """``mod`` with the first mergeable pair of ``func`` merged, or None if there is none."""
    if not isinstance(func.body, relax.SeqExpr):
        return None
    uses = variable_uses(func)
    for b, block in enumerate(func.body.blocks):
        if not isinstance(block, relax.DataflowBlock):
            continue
        bound = {binding.var: (i, binding.value) for i, binding in enumerate(block.bindings)}
        for c_index, binding in enumerate(block.bindings):
            consumer = binding.value
            if not isinstance(consumer, relax.Call):
                continue
            c_funcs = _prim_funcs(mod, consumer)
            if c_funcs is None or not _reduces_rows(c_funcs):
                continue
            for arg_index, arg in enumerate(_arguments(consumer)):
                if not isinstance(arg, relax.Var) or arg not in bound or uses[arg] != 1:
                    continue
                p_index, producer = bound[arg]
                if not isinstance(producer, relax.Call):
                    continue
                p_funcs = _prim_funcs(mod, producer)
                if p_funcs is None or not _injective(p_funcs):
                    continue
                if not _same_tensor_type(arg, binding.var):
                    continue
                return _rewrite(mod, gvar, func, b, p_index, c_index, arg_index)
    return None


def _as_group(mod: tvm.IRModule, call: relax.Call) -> relax.Function:
    """What a binding's value computes, as a group on fresh variables: the group it calls, or
    a group of its one ``call_tir``."""
    if not call.op.same_as(_CALL_TIR):
        return relax.utils.copy_with_new_vars(mod[call.op])
    params = [relax.Var(f"p{i}", arg.ty) for i, arg in enumerate(call.args[1].fields)]
    result = relax.Var("y", call.ty)
    value = relax.Call(call.op, [call.args[0], relax.Tuple(params)], call.attrs, call.ty_args)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(result, value)])], result)
    return relax.Function(params, body, call.ty).with_attr("Primitive", True)


def _arguments(call: relax.Call) -> list[relax.Expr]:
    return list(call.args[1].fields) if call.op.same_as(_CALL_TIR) else list(call.args)


def _rewrite(mod, gvar, func, b, p_index, c_index, arg_index):
    block = func.body.blocks[b]
    producer = block.bindings[p_index].value
    consumer_binding = block.bindings[c_index]
    consumer = consumer_binding.value
    p_group, c_group = _as_group(mod, producer), _as_group(mod, consumer)
    p_args, c_args = _arguments(producer), _arguments(consumer)
    (p_block,) = p_group.body.blocks

    # The consumer's parameter for `p` becomes the producer's result; a parameter the producer
    # also takes (the same Relax variable passed to both) becomes the producer's.
    binds = {c_group.params[arg_index]: p_group.body.body}
    for j, arg in enumerate(c_args):
        if j == arg_index or not isinstance(arg, relax.Var):
            continue
        for i, p_arg in enumerate(p_args):
            if p_arg.same_as(arg):
                binds[c_group.params[j]] = p_group.params[i]
                break
    kept = [j for j in range(len(c_args)) if c_group.params[j] not in binds]
    c_bound = c_group.bind_params(binds)
    (c_block,) = c_bound.body.blocks

    merged = relax.Function(
        list(p_group.params) + [c_group.params[j] for j in kept],
        relax.SeqExpr(
            [relax.DataflowBlock(list(p_block.bindings) + list(c_block.bindings))],
            c_bound.body.body,
        ),
        c_group.ret_ty,
        attrs=c_group.attrs,
    )
    builder = relax.BlockBuilder(mod)
    merged_gvar = builder.add_func(builder.normalize(merged), _merged_name(mod, producer, consumer))
    call = builder.normalize(relax.Call(merged_gvar, p_args + [c_args[j] for j in kept]))

    bindings = list(block.bindings)
    bindings[c_index] = relax.VarBinding(consumer_binding.var, call)
    del bindings[p_index]
    blocks = list(func.body.blocks)
    blocks[b] = relax.DataflowBlock(bindings)
    rewritten = relax.Function(
        func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs
    )
    builder.update_func(gvar, builder.normalize(rewritten))
    new_mod = builder.get()
    dropped = [c.op for c in (producer, consumer) if not c.op.same_as(_CALL_TIR)]
    functions = dict(new_mod.functions_items())
    for group in dropped:
        if not _still_called(new_mod, group):
            functions.pop(group)
    return tvm.IRModule(functions, attrs=new_mod.attrs, global_infos=new_mod.global_infos)


def _merged_name(mod, producer: relax.Call, consumer: relax.Call) -> str:
    def stem(call):
        gv = call.args[0] if call.op.same_as(_CALL_TIR) else call.op
        name = gv.name_hint
        return name[len("fused_") :] if name.startswith("fused_") else name

    base = f"fused_{stem(producer)}_{stem(consumer)}"
    taken = {g.name_hint for g in mod.get_global_vars()}
    name, n = base, 1
    while name in taken:
        name, n = f"{base}{n}", n + 1
    return name


def _still_called(mod: tvm.IRModule, gvar: ir.GlobalVar) -> bool:
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(
                func.body,
                (ir.GlobalVar, lambda g: found.append(g) if g.same_as(gvar) else None),
            )
    return bool(found)


__all__ = ["FuseIntoRows", "fuse_into_rows"]
