"""Static copies of a symbolic PrimFunc, one per tuned size, and the function that dispatches
among them at run time.

Entry points: :func:`specializations` (from the calls of each PrimFunc, the values its own dims
take at each size the user names: a :class:`Specialization` each, or why none can be given),
:func:`static_copy` (the PrimFunc with its dims replaced by one specialization's values:
static extents, which MetaSchedule can tune) and :func:`dispatcher` (the symbolic function that
runs each tuned copy where its dims take that copy's values, and its own schedule at every
other size).

A PrimFunc's dims are its integer parameters and the variables that stand alone in its buffer
parameters' shapes; every other extent is an expression of them.  A dispatcher tests its own
dims, not the entry's: ``if batch == 1 and seq == 128`` in a function of ``(batch, seq, 64)``
buffers, whichever call passes them, so a branch runs exactly where its copy's extents hold.
Inside it the copy's buffer parameters are the function's own (their shapes are equal there),
so the branch computes what the copy computes.

``PrimFunc.specialize`` refuses buffers that are variables (TVM 0.27: "expected an
independent Var"), so :func:`static_copy` writes the copy itself: a buffer whose type reads a
dim gets a fresh variable of the static type, every dim becomes its value, and TVM's
``StmtSimplify`` folds the constants.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, sym, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from ..dynamic import evaluate
from ..relax.analysis import tensor_dims
from ..schedules.small_nests import fresh_copy

_CALL_TIR = ir.Op.get("relax.call_tir")


@dataclass(frozen=True)
class Specialization:
    """One size of one PrimFunc: each of its dims with the value it takes there."""

    function: str
    values: tuple[tuple[tirx.Var, int], ...]

    @property
    def label(self) -> str:
        """The size as the report writes it: ``batch=1, seq=128``."""
        return ", ".join(f"{var.name}={value}" for var, value in self.values)

    @property
    def name(self) -> str:
        """The static copy's name: ``layer_norm__batch_1_seq_128``."""
        parts = "_".join(f"{var.name}_{value}" for var, value in self.values)
        return re.sub(r"\W", "_", f"{self.function}__{parts}")

    def condition(self) -> tirx.PrimExpr:
        """Where the copy runs: each dim equal to its value."""
        tests = [tirx.EQ(var, _const(var, value)) for var, value in self.values]
        return functools.reduce(tirx.And, tests)


def _const(var: tirx.Var, value: int) -> tirx.IntImm:
    return tirx.IntImm(str(var.ty.dtype), value)


def _free_vars(expr) -> list:
    found: list = []
    if expr is not None:
        tvm_ffi.structural_walk(expr, (tirx.Var, found.append))
    return found


def _is_buffer(param) -> bool:
    return isinstance(param.ty, tirx.BufferType)


def function_dims(func: tirx.PrimFunc) -> list[tirx.Var] | str:
    """The dims of ``func`` by name (then in the order its parameters define them), or why its
    parameters do not define every variable their types read."""
    dims: list = []
    for param in func.params:
        if _is_buffer(param):
            found = [d for d in param.ty.shape if isinstance(d, tirx.Var)]
        elif isinstance(param.ty, ir.PrimType) and str(param.ty.dtype).startswith(("int", "uint")):
            found = [param]
        else:
            return f"its parameter {param.name} is neither a buffer nor an integer"
        dims.extend(d for d in found if not any(d.same_as(known) for known in dims))
    for param in filter(_is_buffer, func.params):
        ty = param.ty
        for expr in (*ty.shape, *ty.strides, ty.elem_offset):
            stray = [v for v in _free_vars(expr) if not any(v.same_as(d) for d in dims)]
            if stray:
                return (
                    f"buffer {param.name} reads {stray[0].name}, which no parameter defines "
                    "(a strided or offset buffer)"
                )
    return sorted(dims, key=lambda dim: dim.name)


# -- the values of a function's dims, from its calls -----------------------------------------


def _call_sites(mod: tvm.IRModule) -> tuple[dict, dict]:
    """Each PrimFunc's ``R.call_tir`` calls, as (caller's name, call), and how often each
    global is referred to at all in the Relax functions."""
    sites: dict = {}
    references: dict = {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue

        def on_call(call, caller=gvar.name_hint):
            target = call.args[0] if call.args else None
            if call.op.same_as(_CALL_TIR) and isinstance(target, ir.GlobalVar):
                sites.setdefault(target.name_hint, []).append((caller, call))

        def on_global(global_var):
            references[global_var.name_hint] = references.get(global_var.name_hint, 0) + 1

        tvm_ffi.structural_walk(func, [(relax.Call, on_call), (ir.GlobalVar, on_global)])
    return sites, references


def _passed(call: relax.Call) -> list | None:
    """What a ``call_tir`` passes for each parameter of its PrimFunc, in order: the arguments
    (tensors, or integer expressions), then the outputs' types."""
    args = call.args[1] if len(call.args) > 1 else None
    if not isinstance(args, relax.Tuple):
        return None
    outputs = []
    for ty in call.ty_args:
        outputs.extend(ty.fields if isinstance(ty, relax.TupleType) else [ty])
    return [*args.fields, *outputs]


def _shape_passed(value) -> tuple | None:
    """The dims of a tensor argument or output type, or None if they are not known."""
    if isinstance(value, relax.TensorType):
        shape = value.shape
        return tuple(shape.values) if isinstance(shape, relax.ShapeExpr) else None
    return tensor_dims(value)


def _value(expr, bound: list) -> int | None:
    """``expr`` with each (var, value) of ``bound`` put in, as an int, or None."""
    analyzer = sym.Analyzer()
    for var, value in bound:
        analyzer.bind(var, _const(var, value))
    simplified = analyzer.simplify(expr)
    return int(simplified.value) if isinstance(simplified, tirx.IntImm) else None


def _bind(func, dims, call, size: Mapping[str, int]) -> tuple | str:
    """The values ``func``'s dims take when ``call`` runs at ``size``, or why they cannot be
    told."""
    passed = _passed(call)
    if passed is None or len(passed) != len(func.params):
        return "a call passes its parameters in a form not read here"
    pairs = []  # (the function's dim or extent, its value at this size)
    for param, value in zip(func.params, passed, strict=True):
        if not _is_buffer(param):
            if not tvm.ir.is_prim_expr(value):
                return f"a call passes {param.name} as a Relax value, not an expression of dims"
            pairs.append((param, evaluate(value, size)))
            continue
        shape = _shape_passed(value)
        if shape is None or len(shape) != len(param.ty.shape):
            return f"a call passes {param.name} with a shape not known"
        pairs.extend((dim, evaluate(given, size)) for dim, given in zip(param.ty.shape, shape))
    unknown = next((expr for expr, value in pairs if value is None), None)
    if unknown is not None:
        return f"a call passes an extent for {unknown} that is not a function of the entry's dims"
    bound: list = []
    for expr, value in pairs:
        if isinstance(expr, tirx.Var) and not any(expr.same_as(v) for v, _ in bound):
            bound.append((expr, value))
    values = []
    for dim in dims:
        value = next((v for var, v in bound if var.same_as(dim)), None)
        if value is None:
            return f"no call gives its dim {dim.name}"
        values.append((dim, value))
    for expr, value in pairs:
        if _value(expr, values) != value:
            return f"its extent {expr} is not what a call passes for it ({value})"
    return tuple(values)


def specializations(
    mod: tvm.IRModule, entry: str, names: list[str], sizes: tuple[dict, ...]
) -> dict[str, tuple[Specialization, ...] | str]:
    """For each PrimFunc of ``names``: its specializations at ``sizes`` (sizes of the entry's
    dims, by name), in that order and without repeats; ``()`` for a static function; or why
    it has none.

    In a Relax module a function's dims are read from its calls, each ``R.call_tir`` of the
    entry (a function called from elsewhere, or referred to otherwise, has none); in a TIR
    module the entry's dims are the sizes' own, and no other function has any.
    """
    is_relax = any(isinstance(f, relax.Function) for f in mod.functions.values())
    sites, references = _call_sites(mod) if is_relax else ({}, {})
    found: dict = {}
    for name in names:
        func = mod[name]
        dims = function_dims(func)
        if isinstance(dims, str) or not dims:
            found[name] = dims if isinstance(dims, str) else ()
            continue
        if not is_relax:
            found[name] = (
                _entry_values(name, dims, sizes)
                if name == entry
                else (f"a symbolic PrimFunc other than the entry {entry}")
            )
            continue
        calls = sites.get(name, [])
        callers = sorted({caller for caller, _ in calls} - {entry})
        if not calls or callers or references.get(name, 0) != len(calls):
            found[name] = (
                f"called from {callers[0]}, not only from the entry {entry}"
                if callers
                else f"referred to otherwise than by R.call_tir in {entry}"
            )
            continue
        found[name] = _called_values(name, func, dims, calls, sizes)
    return found


def _entry_values(name, dims, sizes) -> tuple[Specialization, ...] | str:
    missing = [d.name for d in dims if d.name not in sizes[0]]
    if missing:
        return f"its dim {missing[0]} is not an input's dim"
    specs = [Specialization(name, tuple((d, size[d.name]) for d in dims)) for size in sizes]
    return _unique(specs)


def _called_values(name, func, dims, calls, sizes) -> tuple[Specialization, ...] | str:
    specs = []
    for size in sizes:
        for _, call in calls:
            values = _bind(func, dims, call, size)
            if isinstance(values, str):
                return values
            specs.append(Specialization(name, values))
    return _unique(specs)


def _unique(specs: list[Specialization]) -> tuple[Specialization, ...]:
    kept: dict = {}
    for spec in specs:
        kept.setdefault(tuple(value for _, value in spec.values), spec)
    return tuple(kept.values())


# -- the static copy -------------------------------------------------------------------------


def _allocated(stmt) -> list:
    """The buffers ``stmt`` allocates or declares: blocks' ``alloc_buffers`` and match
    buffers, ``AllocBuffer`` and ``DeclBuffer`` statements."""
    found: list = []

    def on_block(block):
        found.extend(block.alloc_buffers)
        found.extend(m.buffer for m in block.match_buffers)

    tvm_ffi.structural_walk(
        stmt,
        [
            (s_tir.SBlock, on_block),
            (tirx.AllocBuffer, lambda node: found.append(node.buffer)),
            (tirx.DeclBuffer, lambda node: found.append(node.buffer)),
        ],
    )
    return found


def _replaced(node, replacements: list):
    """``node`` with each variable of ``replacements`` ((old, new) pairs) replaced."""

    def on_var(var, _mutator):
        return next((new for old, new in replacements if var.same_as(old)), var)

    return tvm_ffi.structural_mutate(node, [(tirx.Var, on_var)])


def _static_type(ty, constants: list) -> tirx.BufferType | str | None:
    """``ty`` with its dims replaced by ``constants``: None if it reads none, or why it does
    not become static."""
    fields = (*ty.shape, *ty.strides, ty.elem_offset, ty.layout, *ty.allocated_addr)
    if not any(any(v.same_as(d) for d, _ in constants) for f in fields for v in _free_vars(f)):
        return None
    analyzer = sym.Analyzer()

    def fixed(expr):
        return None if expr is None else analyzer.simplify(_replaced(expr, constants))

    shape = [fixed(d) for d in ty.shape]
    if not all(isinstance(d, tirx.IntImm) for d in shape):
        return f"a buffer's shape ({', '.join(map(str, ty.shape))}) does not become static"
    layout = None if ty.layout is None else _replaced(ty.layout, constants)
    return _tirx_ffi.BufferType(
        ty.storage_scope,
        ty.dtype,
        shape,
        [fixed(s) for s in ty.strides],
        fixed(ty.elem_offset),
        ty.data_alignment,
        ty.offset_factor,
        layout,
        [fixed(a) for a in ty.allocated_addr],
        None,
    )


def static_copy(func: tirx.PrimFunc, spec: Specialization) -> tirx.PrimFunc | str:
    """``func`` at ``spec``'s size: every dim its value, every buffer whose type reads one a
    fresh buffer of the static type, integer parameters dropped (they are constants now),
    named ``spec.name``; or why it cannot be made static.

    The copy's parameters are ``func``'s buffer parameters, in order."""
    constants = [(var, _const(var, value)) for var, value in spec.values]
    # Step 1. A static type for each buffer whose type reads a dim.
    buffers = [*filter(_is_buffer, func.params), *_allocated(func.body)]
    replacements = list(constants)
    for buffer in buffers:
        if any(buffer.same_as(old) for old, _ in replacements):
            continue
        ty = _static_type(buffer.ty, constants)
        if isinstance(ty, str):
            return f"buffer {buffer.name}: {ty}"
        if ty is not None:
            replacements.append((buffer, _tirx_ffi.BufferVar(buffer.name, ty, None)))
    # Step 2. The body with dims constant and the buffers replaced, its constants folded.
    params = [_replaced(p, replacements) for p in func.params if _is_buffer(p)]
    body = _replaced(func.body, replacements)
    copy = tirx.PrimFunc(params, body, func.ret_type, attrs=func.attrs)
    copy = copy.with_attr("global_symbol", spec.name)
    copy = s_tir.transform.StmtSimplify()(tvm.IRModule({spec.name: copy}))[spec.name]
    # Step 3. Nothing symbolic is left.
    left = [v for v in _free_vars(copy.body) if any(v.same_as(d) for d, _ in constants)]
    if left:
        return f"its dim {left[0].name} is still read after the substitution"
    return copy


# -- the dispatcher --------------------------------------------------------------------------


def _branch(body, buffers, name: str, annotations) -> s_tir.SBlockRealize:
    """``body`` in an opaque block allocating ``buffers``, everything it defines a fresh
    variable (:func:`~tir_byoc.schedules.small_nests.fresh_copy`): no two branches of a
    dispatcher define one variable, though each copy is ``static_copy`` of one function."""
    body, buffers = fresh_copy(body, buffers)
    block = s_tir.SBlock([], [], [], name, body, alloc_buffers=buffers, annotations=annotations)
    return s_tir.SBlockRealize([], tirx.const(True, "bool"), block)


def dispatcher(
    fallback: tirx.PrimFunc, branches: list[tuple[Specialization, tirx.PrimFunc]]
) -> tirx.PrimFunc | str:
    """``fallback`` (the symbolic function, scheduled for every size) whose root runs each
    tuned static copy of ``branches`` where its dims take the copy's values, tested in order,
    and its own body at every other size; or why it cannot be written so.

    Each branch is an opaque block named after its size (``batch_1_seq_128``; the last
    ``other_sizes``) that holds the copy's root body and allocations, the copy's buffer
    parameters replaced by the function's."""
    realize = fallback.body
    if not isinstance(realize, s_tir.SBlockRealize):
        return "its body is not a root block"
    root = realize.block
    params = [p for p in fallback.params if _is_buffer(p)]
    chain = _branch(root.body, root.alloc_buffers, "other_sizes", {})
    for spec, tuned in reversed(branches):
        tuned_root = tuned.body.block if isinstance(tuned.body, s_tir.SBlockRealize) else None
        if tuned_root is None or len(tuned.params) != len(params):
            return f"the tuned copy {spec.name} does not have the function's parameters"
        body = _replaced(tuned_root.body, list(zip(tuned.params, params, strict=True)))
        block_name = spec.name.removeprefix(f"{spec.function}__")
        branch = _branch(body, tuned_root.alloc_buffers, block_name, tuned_root.annotations)
        chain = tirx.IfThenElse(spec.condition(), branch, chain)
    root = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        chain,
        root.init,
        [],
        root.match_buffers,
        root.annotations,
    )
    func = fallback.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, root))
    if not s_tir.analysis.verify_well_formed(func, assert_mode=False):
        return "the dispatcher written is not well formed"
    return func


__all__ = ["Specialization", "dispatcher", "function_dims", "specializations", "static_copy"]
