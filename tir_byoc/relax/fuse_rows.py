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

Entry point: :class:`FuseIntoRows`, a module pass between ``FuseOps`` and ``FuseTIR``
(:mod:`tir_byoc.relax.pipeline`); :func:`find` lists the merges it makes (:class:`RowMerge`)
and :func:`rewrite` makes them.  For a binding ``c = C(..., p, ...)`` of a dataflow block,
where C is a group ``FuseOps`` made (a Relax function with ``Primitive``), it merges the binding
``p = P(...)`` into C's group when

1. C calls at least one PrimFunc that reduces (a block with a reduction iterator) and none
   whose reduction multiplies two buffer elements (a GEMM: the offload's, not this pass's);
2. P is a ``call_tir`` of one PrimFunc, or a group of them, that ``AnnotateTIROpPattern`` marks
   injective or simpler (elementwise, broadcast, injective);
3. ``p`` is bound in the same dataflow block and used exactly once in the function: here;
4. ``p`` has the shape and dtype of ``c``, so the two functions run over the same rows.
5. every symbolic dim of ``c`` is a dim by itself of an argument of the merged group.

The merged group computes P's bindings and then C's, C reading P's value where it read ``p``:
every block is the block it was, in the same order.  The one difference in the values: with a
product and the sum it feeds now in one loop (RMS norm's squares), LLVM may fuse them into one
multiply-add, which TVM's code generator allows, and the sum then differs in the last bit.
``FuseTIR`` then makes one PrimFunc of it, and the default schedule
(:class:`tir_byoc.schedules.rows.VectorRows`) computes P's blocks inside each row, so the
intermediate tensor shrinks to one row.  A merged group can take another producer: a
consumer takes its producers one after another in a single pass over the block.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from ..match.reduction import looks_like_gemm
from ..match.stir import COMM_REDUCE
from .analysis import tensor_dims, variable_uses

_CALL_TIR = ir.Op.get("relax.call_tir")
#: AnnotateTIROpPattern's kinds up to injective: elementwise 0, broadcast 1, injective 2.
_INJECTIVE = 2


@dataclass(frozen=True)
class RowMerge:
    """The producers merged into the row reduction bound to ``consumer`` in ``function``.

    ``producers`` holds, in the order they merge, each producer's variable and the index of
    the argument it is among the consumer's arguments at that point (a merged group takes the
    producer's arguments first, then the consumer's others).
    """

    function: str
    consumer: relax.Var
    producers: tuple[tuple[relax.Var, int], ...]


def find(mod: tvm.IRModule) -> tuple[tuple[RowMerge, ...], tuple]:
    """``(sites, declines)``: the merges :func:`rewrite` makes in ``mod``'s Relax functions, in
    binding order; a producer that does not merge stays where ``FuseOps`` put it, so there are
    no declines.

    One pass over each dataflow block: a consumer takes its producers one after another (a
    merged group's new arguments are candidates too), so the cost grows with the module's size,
    not with its size times its merges.
    """
    finder = _Finder(mod)
    sites = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and not _is_group(func):
            sites += finder.function(gvar.name_hint, func)
    return tuple(sites), ()


def rewrite(mod: tvm.IRModule, sites: tuple[RowMerge, ...]) -> tvm.IRModule:
    """``mod`` with the merges of ``sites`` made; ``mod`` itself when there is none.  ``mod`` is
    never modified.  The module is rebuilt once, at the end."""
    if not sites:
        return mod
    merger = _Merger(mod)
    rewritten = {}
    for gvar, func in mod.functions_items():
        own = [site for site in sites if site.function == gvar.name_hint]
        if own:
            rewritten[gvar] = merger.function(func, own)
    return merger.module(rewritten)


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.FuseIntoRows")
class FuseIntoRows:
    """Each elementwise producer fused into the row reduction that alone reads it: :func:`find`,
    then :func:`rewrite`."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        sites, _ = find(mod)
        return rewrite(mod, sites)


# --------------------------------------------------------------------------------------
# What may merge
# --------------------------------------------------------------------------------------


def _is_group(func) -> bool:
    return isinstance(func, relax.Function) and bool((func.attrs or {}).get("Primitive", False))


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
    """Condition 4: the same shape and dtype; a symbolic dim the same variable (``seq``), not
    an expression (``batch * seq``, which the merged group could not define)."""
    dims, other = tensor_dims(a), tensor_dims(b)
    if dims is None or other is None or len(dims) != len(other) or a.ty.dtype != b.ty.dtype:
        return False
    return all(
        isinstance(x, tirx.IntImm | tirx.Var) and tvm_ffi.structural_equal(x, y)
        for x, y in zip(dims, other, strict=True)
    )


class _Finder:
    """Decides, function by function, which producers merge into which row reductions."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self._funcs: dict[ir.GlobalVar, list[tirx.PrimFunc] | None] = {}
        self._reduces: dict[ir.GlobalVar, bool] = {}

    # What a binding's value runs ------------------------------------------------------

    def prim_funcs(self, call: relax.Call) -> list[tirx.PrimFunc] | None:
        """The PrimFuncs a call runs: one ``call_tir``'s, or every ``call_tir``'s of the group
        it calls; None for anything else."""
        callee = _callee(call)
        if callee is None:
            return None
        if callee not in self._funcs:
            self._funcs[callee] = _prim_funcs_of(self.mod, callee, call.op.same_as(_CALL_TIR))
        return self._funcs[callee]

    def reduces_rows(self, value) -> bool:
        if isinstance(value, _Planned):
            return True  # a row reduction with producers merged in
        if not isinstance(value, relax.Call):
            return False
        funcs = self.prim_funcs(value)
        if funcs is None:
            return False
        callee = _callee(value)
        if callee not in self._reduces:
            self._reduces[callee] = _reduces_rows(funcs)
        return self._reduces[callee]

    def injective(self, value) -> bool:
        if not isinstance(value, relax.Call):
            return False  # a merged group reduces
        funcs = self.prim_funcs(value)
        return funcs is not None and _injective(funcs)

    # One function -----------------------------------------------------------------------

    def function(self, name: str, func: relax.Function) -> list[RowMerge]:
        """The merges of ``func`` (named ``name``), consumer by consumer in binding order."""
        if not isinstance(func.body, relax.SeqExpr):
            return []
        uses = None
        sites = []
        for block in func.body.blocks:
            if not isinstance(block, relax.DataflowBlock):
                continue
            values = [binding.value for binding in block.bindings]
            position = {binding.var: i for i, binding in enumerate(block.bindings)}
            for c, binding in enumerate(block.bindings):
                if not self.reduces_rows(values[c]):
                    continue
                uses = uses if uses is not None else variable_uses(func)
                producers = []
                while (found := self._producer(values, position, binding.var, uses)) is not None:
                    p, arg_index = found
                    shared, kept = _merged_arguments(values[p], values[c], arg_index)
                    for arg in shared.values():
                        uses[arg] -= 1  # passed once now
                    values[c] = _Planned(_arguments(values[p]) + kept)
                    producers.append((block.bindings[p].var, arg_index))
                if producers:
                    sites.append(RowMerge(name, binding.var, tuple(producers)))
        return sites

    def _producer(self, values, position, result: relax.Var, uses) -> tuple[int, int] | None:
        """The first argument of the consumer bound to ``result`` that may merge into it:
        (its binding's index, the argument's index); conditions 2-4 of the module docstring."""
        consumer = values[position[result]]
        for arg_index, arg in enumerate(_arguments(consumer)):
            if not isinstance(arg, relax.Var) or arg not in position or uses[arg] != 1:
                continue
            p = position[arg]
            if not (self.injective(values[p]) and _same_tensor_type(arg, result)):
                continue
            _, kept = _merged_arguments(values[p], consumer, arg_index)
            if _defines_result_dims(_arguments(values[p]) + kept, result):
                return p, arg_index
        return None


def _defines_result_dims(args: list[relax.Expr], result: relax.Var) -> bool:
    """Condition 5: each symbolic dim of ``result`` is a dim of one of ``args`` by itself, so
    that ``FuseTIR`` can give the merged group's output a shape.  A reshape of (3 b, 1, 1) to
    (b, 3, 1, 1) merged into a softmax over the latter would leave b defined by nothing, and
    ``FuseTIR`` gave the call an output of rank 4 and no shape, which no later pass builds."""
    definable = set()
    for arg in args:
        definable.update(relax.analysis.definable_tir_vars_in_type(arg.ty))
    return all(var in definable for var in relax.analysis.tir_vars_in_type(result.ty))


# --------------------------------------------------------------------------------------
# The merge
# --------------------------------------------------------------------------------------


@dataclass
class _Planned:
    """A consumer :class:`_Finder` has merged producers into: the arguments it then takes."""

    args: list[relax.Expr]


@dataclass
class _Merged:
    """A group made by merging, not yet in the module: its function, arguments and name."""

    group: relax.Function
    args: list[relax.Expr]
    name: str


def _same_symbolic_dims(p_group, c_group, arg_index: int, p_args, c_args) -> relax.Function:
    """The consumer's group with its symbolic dims renamed to the producer's (each group is a
    copy on fresh variables: else a dim only the replaced parameter defined, ``seq``, is
    defined by nothing in the merged group), matched on the parameters the two share."""
    pairs = [(c_group.params[arg_index], p_group.body.body)]
    for j, arg in enumerate(c_args):
        i = next((i for i, p_arg in enumerate(p_args) if p_arg.same_as(arg)), None)
        if j != arg_index and i is not None and isinstance(arg, relax.Var):
            pairs.append((c_group.params[j], p_group.params[i]))
    renames = {}
    for c_expr, p_expr in pairs:
        c_dims, p_dims = tensor_dims(c_expr), tensor_dims(p_expr)
        if c_dims is None or p_dims is None or len(c_dims) != len(p_dims):
            continue
        for c_dim, p_dim in zip(c_dims, p_dims, strict=True):
            if isinstance(c_dim, tirx.Var) and not c_dim.same_as(p_dim):
                renames.setdefault(c_dim, p_dim)
    return c_group.bind_symbolic_vars(renames) if renames else c_group


def _merged_arguments(producer, consumer, arg_index: int) -> tuple[dict[int, relax.Var], list]:
    """How the consumer's arguments fare when ``producer`` merges in as argument ``arg_index``:
    ``({j: arg}, kept)``, the arguments the producer also takes (the same Relax variable
    passed to both, by the consumer's index; they are passed once from then on), and the
    consumer's arguments the merged group still takes, in order."""
    p_args, c_args = _arguments(producer), _arguments(consumer)
    shared, kept = {}, []
    for j, arg in enumerate(c_args):
        if j == arg_index:
            continue
        if isinstance(arg, relax.Var) and any(p_arg.same_as(arg) for p_arg in p_args):
            shared[j] = arg
        else:
            kept.append(arg)
    return shared, kept


class _Merger:
    """Makes the merges :func:`find` found, function by function, then rebuilds the module."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self.builder = relax.BlockBuilder(mod)
        self.taken = {g.name_hint for g in mod.get_global_vars()}
        self.absorbed: set[ir.GlobalVar] = set()  # groups merged away, dropped if no longer called

    def function(self, func: relax.Function, sites: list[RowMerge]) -> relax.Function:
        """``func`` with the merges of ``sites`` made."""
        merges = {site.consumer: site.producers for site in sites}
        blocks = list(func.body.blocks)
        for b, block in enumerate(blocks):
            if not isinstance(block, relax.DataflowBlock):
                continue
            values = [binding.value for binding in block.bindings]
            position = {binding.var: i for i, binding in enumerate(block.bindings)}
            merged_away = set()
            for c, binding in enumerate(block.bindings):
                for producer, arg_index in merges.get(binding.var, ()):
                    p = position[producer]
                    values[c] = self._merge(values[p], values[c], arg_index)
                    merged_away.add(p)
            if not merged_away:
                continue
            bindings = []
            for i, binding in enumerate(block.bindings):
                if i in merged_away:
                    continue
                if isinstance(values[i], _Merged):
                    binding = relax.VarBinding(binding.var, self._add(values[i]))
                bindings.append(binding)
            blocks[b] = relax.DataflowBlock(bindings)
        return relax.Function(
            func.params,
            relax.SeqExpr(blocks, func.body.body),
            func.ret_ty,
            func.is_pure,
            func.attrs,
        )

    def _merge(self, producer: relax.Call, consumer, arg_index: int) -> _Merged:
        """One group computing ``producer``'s bindings, then ``consumer``'s reading them."""
        p_group, c_group = self._group(producer), self._group(consumer)
        p_args, c_args = _arguments(producer), _arguments(consumer)
        (p_block,) = p_group.body.blocks
        c_group = _same_symbolic_dims(p_group, c_group, arg_index, p_args, c_args)

        # The consumer's parameter for `p` becomes the producer's result; a parameter the
        # producer also takes (the same Relax variable passed to both) becomes the producer's.
        shared, _ = _merged_arguments(producer, consumer, arg_index)
        binds = {c_group.params[arg_index]: p_group.body.body}
        for j, arg in shared.items():
            i = next(i for i, p_arg in enumerate(p_args) if p_arg.same_as(arg))
            binds[c_group.params[j]] = p_group.params[i]
        kept = [j for j in range(len(c_args)) if c_group.params[j] not in binds]
        c_bound = c_group.bind_params(binds)
        (c_block,) = c_bound.body.blocks
        group = relax.Function(
            list(p_group.params) + [c_group.params[j] for j in kept],
            relax.SeqExpr(
                [relax.DataflowBlock(list(p_block.bindings) + list(c_block.bindings))],
                c_bound.body.body,
            ),
            c_group.ret_ty,
            attrs=c_group.attrs,
        )
        for call in (producer, consumer):
            if isinstance(call, relax.Call) and not call.op.same_as(_CALL_TIR):
                self.absorbed.add(call.op)
        args = p_args + [c_args[j] for j in kept]
        return _Merged(self.builder.normalize(group), args, self._name(producer, consumer))

    def _group(self, value) -> relax.Function:
        """What a binding's value computes, as a group on fresh variables: the group it calls
        or was merged into, or a group of its one ``call_tir``."""
        if isinstance(value, _Merged):
            return relax.utils.copy_with_new_vars(value.group)
        if not value.op.same_as(_CALL_TIR):
            return relax.utils.copy_with_new_vars(self.mod[value.op])
        params = [relax.Var(f"p{i}", arg.ty) for i, arg in enumerate(value.args[1].fields)]
        result = relax.Var("y", value.ty)
        call = relax.Call(
            value.op, [value.args[0], relax.Tuple(params)], value.attrs, value.ty_args
        )
        body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(result, call)])], result)
        return relax.Function(params, body, value.ty).with_attr("Primitive", True)

    def _name(self, producer: relax.Call, consumer) -> str:
        def stem(value):
            if isinstance(value, _Merged):
                name = value.name
            else:
                name = (value.args[0] if value.op.same_as(_CALL_TIR) else value.op).name_hint
            return name[len("fused_") :] if name.startswith("fused_") else name

        base = f"fused_{stem(producer)}_{stem(consumer)}"
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}{n}", n + 1
        self.taken.add(name)
        return name

    def _add(self, merged: _Merged) -> relax.Call:
        """The merged group added to the module, and the call of it."""
        gvar = self.builder.add_func(merged.group, merged.name)
        return self.builder.normalize(relax.Call(gvar, merged.args))

    # The module -------------------------------------------------------------------------

    def module(self, rewritten: dict[ir.GlobalVar, relax.Function]) -> tvm.IRModule:
        """The module with ``rewritten`` functions, and without the groups merged away."""
        for gvar, func in rewritten.items():
            self.builder.update_func(gvar, self.builder.normalize(func))
        new_mod = self.builder.get()
        called = _called(new_mod)
        functions = {
            gvar: func
            for gvar, func in new_mod.functions_items()
            if gvar not in self.absorbed or gvar in called
        }
        return tvm.IRModule(functions, attrs=new_mod.attrs, global_infos=new_mod.global_infos)


def _callee(call: relax.Call) -> ir.GlobalVar | None:
    if call.op.same_as(_CALL_TIR):
        if len(call.args) != 2 or not isinstance(call.args[1], relax.Tuple):
            return None  # symbolic shapes passed as tir_vars, or a tuple from elsewhere
        return call.args[0]
    return call.op if isinstance(call.op, ir.GlobalVar) else None


def _prim_funcs_of(mod: tvm.IRModule, callee: ir.GlobalVar, is_call_tir: bool):
    if is_call_tir:
        func = mod[callee]
        return [func] if isinstance(func, tirx.PrimFunc) else None
    if not _is_group(mod[callee]):
        return None
    body = mod[callee].body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return None  # FuseOps makes one dataflow block per group; anything else is left alone
    funcs = []
    for binding in body.blocks[0].bindings:
        value = binding.value
        if not isinstance(value, relax.Call) or not value.op.same_as(_CALL_TIR):
            return None
        funcs.append(mod[value.args[0]])
    return funcs if all(isinstance(f, tirx.PrimFunc) for f in funcs) else None


def _arguments(value) -> list[relax.Expr]:
    if isinstance(value, _Merged | _Planned):
        return list(value.args)
    return list(value.args[1].fields) if value.op.same_as(_CALL_TIR) else list(value.args)


def _called(mod: tvm.IRModule) -> set[ir.GlobalVar]:
    """Every GlobalVar a Relax function of ``mod`` refers to."""
    found = set()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func.body, (ir.GlobalVar, found.add))
    return found


__all__ = ["FuseIntoRows", "RowMerge", "find", "rewrite"]
