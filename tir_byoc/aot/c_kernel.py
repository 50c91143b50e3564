"""Lowered TIR as plain C: one PrimFunc as one C function that needs no TVM runtime.

Entry point: :func:`print_kernel`, over a PrimFunc that :mod:`tir_byoc.aot.kernels` prepared
and lowered (pointer parameters, flat buffers, scalar loops).  It returns a
:class:`KernelSource`: the C definition, the external functions it calls (an intrinsic's
prototype is read off the call) and the bytes of scratch its large allocations take.

What becomes what:

- an allocation of less than :data:`STACK_BYTES` is a C array on the stack; a larger one a
  slice of the ``scratch`` argument, which the entry points into the workspace (no
  ``TVMBackendAllocWorkspace``, no ``malloc``);
- a parallel loop is a plain ``for`` preceded by ``TIR_BYOC_PARALLEL_FOR``, which is
  ``_Pragma("omp parallel for")`` when the C is compiled with ``-fopenmp`` and nothing
  otherwise (no ``TVMBackendParallelLaunch``); a loop whose body returns (OpenMP forbids it) or
  takes scratch (its iterations would share it) stays serial;
- an ``assert`` returns instead of raising: ``if (!(status == 0)) return status;`` after an
  intrinsic call, :data:`ASSERT_STATUS` for any other condition;
- constants are exact (``0.044715f``, ``INFINITY``), bit casts go through ``memcpy``.

A construct without a C spelling here (vector lanes, fp16, a packed call, a call of another
PrimFunc) raises :class:`~tir_byoc.aot.errors.Unsupported` naming it and the function.
"""

from __future__ import annotations

import tvm
from tvm import tirx

from .c_expr import BufferView, ExpressionPrinter, KernelSource, unwrap
from .c_spelling import c_type, itemsize, wrap
from .errors import Unsupported

#: Allocations below this many bytes stay on the stack (what TVM keeps on the stack too).
STACK_BYTES = 1024
#: What a failed ``assert`` of TVM's own code returns (an intrinsic's status is returned as is).
ASSERT_STATUS = 103
#: The parallel-for macro the kernels' prelude defines.
PARALLEL_FOR = "TIR_BYOC_PARALLEL_FOR"


def print_kernel(
    func: tirx.PrimFunc, c_name: str, function: str, const_params: frozenset[int] = frozenset()
) -> KernelSource:
    """C for a prepared, lowered PrimFunc; ``const_params`` are the indices of the pointer
    parameters it only reads; ``function`` names it in errors."""
    return _Printer(function).print(func, c_name, const_params)


class _Printer(ExpressionPrinter):
    """Statements and the function around them; expressions are the base class's."""

    def __init__(self, function: str):
        super().__init__(function)
        self.lines: list[str] = []
        self.depth = 1
        self.status_vars: set = set()  # vars bound to an extern call's int32 result
        self.scratch_taken = 0
        self.returns_seen = 0
        self.const_vars: set = set()  # the const parameters

    # -- the function -----------------------------------------------------------------------
    def print(self, func, c_name, const_params) -> KernelSource:
        params = []
        for index, param in enumerate(func.params):
            name = self.names.fresh(param.name)
            self.vars[param] = name
            if index in const_params:
                self.const_vars.add(param)
            params.append(self._param(param, name, index in const_params, func))
        self.stmt(func.body)
        self.source.helpers = dict(sorted(self.source.helpers.items()))
        if self.source.scratch_bytes:
            params.append("uint8_t *restrict scratch")
        self.source.signature = (c_name, *params)
        head = wrap(f"int32_t {c_name}(", params or ["void"], ") {")
        self.source.text = "\n".join([*head, *self.lines, "}"])
        self.source.externs = dict(sorted(self.source.externs.items()))
        return self.source

    def _param(self, param, name, read_only, func) -> str:
        ty = param.ty
        if isinstance(ty, tvm.ir.PointerType):
            element = c_type(self._element_dtype(ty), self.where)
            const = "const " if read_only else ""
            noalias = func.attrs is not None and bool(func.attrs.get("tirx.noalias", False))
            return f"{const}{element} *{'restrict ' if noalias else ''}{name}"
        if isinstance(ty, tvm.ir.PrimType):
            return f"{c_type(str(ty.dtype), self.where)} {name}"
        raise Unsupported(f"a parameter of type {ty}", self.where)

    def _element_dtype(self, ty) -> str:
        element = getattr(ty, "element_type", None)
        if isinstance(element, tvm.ir.PrimType):
            return str(element.dtype)
        raise Unsupported(f"a pointer to {element}", self.where)

    # -- statements -------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        for declaration in self.pending:
            self.lines.append("  " * self.depth + declaration)
        self.pending = []
        self.lines.append("  " * self.depth + line)

    def stmt(self, node) -> None:
        kind = type(node).__name__
        handler = getattr(self, f"_stmt_{kind}", None)
        if handler is None:
            raise Unsupported(f"the TIR statement {kind}", self.where)
        handler(node)

    def block(self, node) -> None:
        self.depth += 1
        self.stmt(node)
        self.depth -= 1

    def _stmt_SeqStmt(self, node):
        for item in node.seq:
            self.stmt(item)

    def _stmt_Evaluate(self, node):
        if isinstance(node.value, tirx.IntImm):
            return  # a no-op
        self.emit(f"{self.expr(node.value)};")

    def _stmt_Bind(self, node):
        value = unwrap(self.expr(node.value))
        name = self._declare(node.var)
        if self._is_extern_status(node.value):
            self.status_vars.add(node.var)
        self.emit(f"{self._type_of(node.var)} {name} = {value};")

    def _stmt_AttrStmt(self, node):
        if node.body is not None:
            self.stmt(node.body)

    def _stmt_DeclBuffer(self, node):
        data = self.expr(node.data)
        buffer = node.buffer
        dtype = str(buffer.ty.dtype)
        element = getattr(node.data.ty, "element_type", None)
        if not (isinstance(element, tvm.ir.PrimType) and str(element.dtype) == dtype):
            data = f"(({c_type(dtype, self.where)} *){data})"
        offset = buffer.ty.elem_offset
        if not (isinstance(offset, tirx.IntImm) and offset.value == 0):
            data = f"({data} + {self.expr(offset)})"
        self.buffers[buffer] = BufferView(data, dtype)
        if any(node.data.same_as(v) for v in self.const_vars):
            self.read_only.add(buffer)

    def _stmt_AllocBuffer(self, node):
        buffer = node.buffer
        dtype = str(buffer.ty.dtype)
        count = 1
        for extent in buffer.ty.shape:
            if not isinstance(extent, tirx.IntImm):
                raise Unsupported(f"the allocation {buffer.name} of symbolic size", self.where)
            count *= int(extent.value)
        name = self.names.fresh(buffer.name)
        element = c_type(dtype, self.where)
        nbytes = count * itemsize(dtype)
        if nbytes < STACK_BYTES:
            self.emit(f"{element} {name}[{max(count, 1)}];")
        else:
            offset = self.scratch_taken
            self.scratch_taken += -(-nbytes // 64) * 64
            self.source.scratch_bytes = self.scratch_taken
            self.emit(f"{element} *restrict {name} = ({element} *)(scratch + {offset});")
        self.buffers[buffer] = BufferView(name, dtype)

    def _stmt_BufferStore(self, node):
        target = self._element(node.buffer, node.indices)
        self.emit(f"{target} = {unwrap(self.expr(node.value))};")

    def _stmt_For(self, node):
        if node.thread_binding is not None:
            raise Unsupported("a thread-bound loop", self.where)
        var = node.loop_var
        start, extent = self.expr(node.min), self.expr(node.extent)
        stop = extent if start == "0" else f"{start} + {extent}"
        name = self._declare(var)
        step = f"{name} += {self.expr(node.step)}" if node.step is not None else f"++{name}"
        header = f"for ({self._type_of(var)} {name} = {start}; {name} < {stop}; {step}) {{"
        parallel = node.kind == tirx.ForKind.PARALLEL
        returns, scratch = self.returns_seen, self.scratch_taken
        if parallel:
            self.emit(PARALLEL_FOR)
            pragma = len(self.lines) - 1
        self.emit(header)
        self.block(node.body)
        self.emit("}")
        if parallel and (self.returns_seen != returns or self.scratch_taken != scratch):
            # OpenMP forbids a return out of the loop; shared scratch would race.
            self.lines.pop(pragma)

    def _stmt_While(self, node):
        condition = self.expr(node.condition)
        if self.pending:
            raise Unsupported("a let binding in a while condition", self.where)
        self.emit(f"while ({unwrap(condition)}) {{")
        self.block(node.body)
        self.emit("}")

    def _stmt_IfThenElse(self, node):
        self.emit(f"if ({unwrap(self.expr(node.condition))}) {{")
        self.block(node.then_case)
        if node.else_case is not None:
            self.emit("} else {")
            self.block(node.else_case)
        self.emit("}")

    def _stmt_AssertStmt(self, node):
        condition = node.condition
        status = None
        if isinstance(condition, tirx.EQ) and condition.a in self.status_vars:
            status = self.vars[condition.a]
        self.returns_seen += 1
        if status is not None and _is_zero(condition.b):
            self.emit(f"if ({status} != 0) return {status};")
            return
        text = self.expr(condition)
        negated = f"!{text}" if text.startswith("(") and text.endswith(")") else f"!({text})"
        message = "".join(str(part.value) for part in node.message_parts)
        message = " ".join(message.replace("*/", "* /").split())[:80] or "an assert"
        self.emit(f"if ({negated}) return {ASSERT_STATUS}; /* {message} */")

    def _stmt_Return(self, node):
        self.returns_seen += 1
        self.emit(f"return {self.expr(node.value)};")

    def _stmt_Break(self, node):
        self.emit("break;")

    def _stmt_Continue(self, node):
        self.emit("continue;")

    def _is_extern_status(self, value) -> bool:
        return (
            isinstance(value, tvm.ir.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name == "tirx.call_extern"
            and isinstance(value.ty, tvm.ir.PrimType)
            and str(value.ty.dtype) == "int32"
        )


def _is_zero(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == 0
