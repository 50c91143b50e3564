"""The PrimFuncs of a built model as plain C functions: prepared, lowered, printed.

Entry point: :func:`compile_kernels`, which takes the PrimFuncs a
:class:`~tir_byoc.aot.program.Program` calls (offloaded and scheduled as
:func:`tir_byoc.build_model` left them) and returns one :class:`Kernel` each.

Each PrimFunc is first made a plain C function, the way TVM itself keeps a PrimFunc without a
``global_symbol`` (:mod:`tvm.tirx.transform.MakePackedAPI` leaves it alone):

1. its buffer parameters become element pointers, each declared as the buffer it was
   (``DeclBuffer``), and it returns an int32 status (0 at the end);
2. it goes through TVM's own TIR lowering (``tvm.tirx.get_tir_pipeline("s_tir")``, the one
   ``tvm.compile`` runs) for the ``c`` target, with ``tirx.disable_vectorize`` (vector lanes
   become scalar loops that the C compiler vectorizes itself), then ``LowerIntrin`` (math as
   libm calls) - but without ``LowerTVMBuiltin``, which is where allocations and parallel loops
   would become ``TVMBackendAllocWorkspace`` and ``TVMBackendParallelLaunch``;
3. :mod:`tir_byoc.aot.c_kernel` prints it.

A PrimFunc whose whole body is one intrinsic call (the forum's ``dense_bias_relu``) is also
read as an :class:`IntrinsicCall`, so that the entry calls the intrinsic itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import tvm
from tvm import tirx

from .c_expr import KernelSource
from .c_kernel import print_kernel
from .c_spelling import identifier, literal
from .errors import Unsupported
from .program import written_params


@dataclass(frozen=True)
class IntrinsicCall:
    """A PrimFunc that is one intrinsic call and its status check.

    ``args`` are, per argument of the call, the index of the PrimFunc parameter whose data it
    passes (an int) or the argument's C literal (a str).
    """

    symbol: str
    args: tuple[int | str, ...]


@dataclass(frozen=True)
class Kernel:
    """One PrimFunc as C.

    Attributes
    ----------
    name : str
        Its name in the module (what the Relax program calls).
    c_name : str
        Its C symbol (the model's name, then ``name``).
    written : tuple of bool
        Whether it writes each parameter (the others are ``const``).
    source : KernelSource
        The C definition, what it calls, the scratch it needs.
    call : IntrinsicCall or None
        Set when the function is one intrinsic call.
    """

    name: str
    c_name: str
    written: tuple[bool, ...]
    source: KernelSource
    call: IntrinsicCall | None

    @property
    def scratch_bytes(self) -> int:
        return self.source.scratch_bytes


def compile_kernels(module: tvm.IRModule, names, prefix: str) -> dict[str, Kernel]:
    """Prepare, lower and print the PrimFuncs ``names`` of ``module``; C symbols are
    ``<prefix>_<name>``."""
    names = sorted(set(names))
    functions = {name: module[name] for name in names}
    written = {name: written_params(func) for name, func in functions.items()}
    prepared = tvm.IRModule({name: _prepare(func, name) for name, func in functions.items()})
    lowered = lower(prepared)
    kernels = {}
    for name in names:
        func, original = lowered[name], functions[name]
        flags = tuple(p.name in written[name] for p in original.params)
        pointers = tuple(isinstance(p.ty, tirx.BufferType) for p in original.params)
        const = frozenset(i for i, (w, p) in enumerate(zip(flags, pointers)) if p and not w)
        c_name = f"{prefix}_{identifier(name)}"
        kernels[name] = Kernel(
            name=name,
            c_name=c_name,
            written=flags,
            source=print_kernel(func, c_name, name, const),
            call=intrinsic_call(func, name),
        )
    return kernels


def lower(module: tvm.IRModule) -> tvm.IRModule:
    """TVM's TIR lowering for plain C, without the passes that call into the TVM runtime."""
    target = tvm.target.Target("c")
    module = tirx.transform.BindTarget(target)(module)
    pipeline, _, _ = tvm.tirx.get_tir_pipeline("s_tir")
    with tvm.transform.PassContext(config={"tirx.disable_vectorize": True}):
        module = pipeline(module)
        return tirx.transform.LowerIntrin()(module)


def _prepare(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """``func`` with element-pointer parameters, an int32 result and no ``global_symbol``."""
    params, declarations = [], []
    for param in func.params:
        if isinstance(param.ty, tirx.BufferType):
            dtype = str(param.ty.dtype)
            pointer = tirx.Var(param.name, tvm.ir.PointerType(tvm.ir.PrimType(dtype)))
            params.append(pointer)
            declarations.append(tirx.DeclBuffer(param, data=pointer))
        elif isinstance(param.ty, tvm.ir.PrimType):
            params.append(param)
        else:
            raise Unsupported(f"the parameter {param.name} of type {param.ty}", name)
    body = tirx.SeqStmt([*declarations, func.body, tirx.Return(tirx.IntImm("int32", 0))])
    attrs = {k: v for k, v in (func.attrs or {}).items() if k != "global_symbol"}
    return tirx.PrimFunc(params, body, tvm.ir.PrimType("int32")).with_attrs(attrs)


def intrinsic_call(func: tirx.PrimFunc, name: str) -> IntrinsicCall | None:
    """The intrinsic call ``func`` consists of, if it is nothing else: buffer declarations of
    its parameters, ``status = call_extern(...)``, ``assert status == 0``, ``return 0``."""
    body = func.body
    items = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    declared = {}  # buffer Var -> parameter index
    for index, param in enumerate(func.params):
        for item in items:
            if isinstance(item, tirx.DeclBuffer) and item.data.same_as(param):
                declared[item.buffer] = index
    rest = [item for item in items if not isinstance(item, tirx.DeclBuffer)]
    if len(rest) != 3:
        return None
    bind, check, end = rest
    if not (
        isinstance(bind, tirx.Bind)
        and isinstance(bind.value, tvm.ir.Call)
        and isinstance(bind.value.op, tvm.ir.Op)
        and bind.value.op.name == "tirx.call_extern"
        and isinstance(check, tirx.AssertStmt)
        and isinstance(check.condition, tirx.EQ)
        and check.condition.a.same_as(bind.var)
        and isinstance(end, tirx.Return)
    ):
        return None
    args = []
    for arg in list(bind.value.args)[1:]:
        spelled = _call_argument(arg, declared, name)
        if spelled is None:
            return None
        args.append(spelled)
    return IntrinsicCall(str(bind.value.args[0].value), tuple(args))


def _call_argument(arg, declared: Mapping, name: str) -> int | str | None:
    if isinstance(arg, tirx.IntImm | tirx.FloatImm):
        return literal(arg.value, str(arg.ty.dtype), name)
    if isinstance(arg, tvm.ir.Call) and isinstance(arg.op, tvm.ir.Op):
        if arg.op.name == "tirx.buffer_data" and arg.args[0] in declared:
            return declared[arg.args[0]]
        zero = arg.args[0] if arg.args else None
        if arg.op.name == "tirx.reinterpret" and isinstance(zero, tirx.IntImm) and not zero.value:
            return "NULL"
    return None
