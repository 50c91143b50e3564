"""A built model's entry as a straight-line program: which PrimFunc runs on which tensors.

Entry point: :func:`read_program`.  It reads :attr:`tir_byoc.Model.module` as TVM's Relax build
pipeline leaves it (VM-lowered ``main``: ``R.vm.alloc_storage``, ``R.vm.alloc_tensor``, direct
calls of PrimFuncs, ``vm.builtin.reshape``, ``R.vm.kill_object``, the shape checks) and returns
a :class:`Program`:

- every tensor the program touches lives in one :class:`Buffer`: an input, a constant (its
  array kept), or an intermediate (each ``alloc_tensor`` is one; the VM's storages, which
  ``StaticPlanBlockMemory`` shares between tensors, are only counted, for comparison);
- a reshape is a :class:`TensorRef` to its source's buffer (views share bytes);
- :attr:`Program.steps` are the PrimFunc calls in ``main``'s order;
- :attr:`Program.outputs` are the returned tensors, a tuple flattened.

A TIR model (a module of PrimFuncs) is one step: the entry PrimFunc on its parameters, those
it writes being the outputs.  The shape checks (static shapes only) and ``kill_object`` are
dropped; anything else (control flow, a symbolic shape, another packed function) raises
:class:`~tir_byoc.aot.errors.Unsupported`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from .c_spelling import itemsize
from .errors import Unsupported

#: Packed functions of the VM-lowered ``main`` that only check what static shapes guarantee.
_CHECKS = frozenset({"vm.builtin.check_tensor_info", "vm.builtin.match_shape"})
_RESHAPE = "vm.builtin.reshape"
_DROPPED_OPS = frozenset({"relax.vm.kill_object", "relax.null_value"})
#: What a :class:`Buffer` is: given by the caller (an input, or a TIR entry's written
#: parameter, an output), a constant, or an intermediate the workspace holds.
INPUT, OUTPUT, CONSTANT, INTERMEDIATE = "input", "output", "constant", "intermediate"


@dataclass(frozen=True, eq=False)
class Buffer:
    """Bytes the program reads or writes: an input, a constant or an intermediate.

    ``eq=False``: two buffers are the same only if they are the same object.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    array: np.ndarray | None = None  # a constant's value

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * itemsize(self.dtype)


@dataclass(frozen=True)
class TensorRef:
    """A tensor: a buffer seen with a shape and dtype (a reshape is another ref to it)."""

    buffer: Buffer
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Scalar:
    """A scalar argument of a PrimFunc call (an int or float the Relax program passes)."""

    value: int | float
    dtype: str


@dataclass(frozen=True)
class Step:
    """One call: ``callee`` (a PrimFunc of the module) on ``args``."""

    callee: str
    args: tuple[TensorRef | Scalar, ...]


@dataclass(frozen=True)
class Program:
    """The entry of a built model as calls on buffers; made by :func:`read_program`."""

    function: str
    inputs: tuple[Buffer, ...]
    constants: tuple[Buffer, ...]
    intermediates: tuple[Buffer, ...]
    steps: tuple[Step, ...]
    outputs: tuple[TensorRef, ...]
    vm_storage_bytes: int  # what the Relax VM allocates for the same program (its storages)


def read_program(module: tvm.IRModule, entry: str) -> Program:
    """Read ``module[entry]`` (a VM-lowered Relax function, or a PrimFunc) as a Program."""
    func = module[entry]
    if isinstance(func, tirx.PrimFunc):
        return _tir_program(func, entry)
    if not isinstance(func, relax.Function):
        raise Unsupported(f"an entry of type {type(func).__name__}", entry)
    return _RelaxReader(module, entry).read(func)


# -- Relax ---------------------------------------------------------------------------------


class _RelaxReader:
    def __init__(self, module: tvm.IRModule, entry: str):
        self.module = module
        self.entry = entry
        self.values: dict = {}  # relax.Var -> TensorRef, or a tuple of them
        self.constants: list[Buffer] = []
        self._constant_of: dict = {}  # tvm Tensor -> Buffer (a constant used twice is one)
        self.intermediates: list[Buffer] = []
        self.steps: list[Step] = []
        self.storage_bytes = 0

    def read(self, func: relax.Function) -> Program:
        inputs = []
        for param in func.params:
            shape, dtype = self._tensor_type(param.ty, f"parameter {param.name}")
            buffer = Buffer(param.name, INPUT, shape, dtype)
            inputs.append(buffer)
            self.values[param] = TensorRef(buffer, shape, dtype)
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            raise Unsupported(f"a body of type {type(body).__name__}", self.entry)
        for block in body.blocks:
            for binding in block.bindings:
                self._bind(binding)
        outputs = tuple(self._flatten(self._value(body.body), "the returned value"))
        return Program(
            self.entry,
            tuple(inputs),
            tuple(self.constants),
            tuple(self.intermediates),
            tuple(self.steps),
            outputs,
            self.storage_bytes,
        )

    # Step 1. Bindings.
    def _bind(self, binding) -> None:
        if not isinstance(binding, relax.VarBinding):
            raise Unsupported(f"a {type(binding).__name__} binding", self.entry)
        value = binding.value
        if isinstance(value, relax.If):
            raise Unsupported("control flow (R.If)", self.entry)
        if isinstance(value, relax.Tuple):
            self.values[binding.var] = tuple(self._value(f) for f in value.fields)
        elif isinstance(value, relax.TupleGetItem):
            self.values[binding.var] = self._item(value)
        elif isinstance(value, relax.Var):
            self.values[binding.var] = self._value(value)
        elif isinstance(value, relax.Call):
            result = self._call(value, binding.var)
            if result is not None:
                self.values[binding.var] = result
        else:
            raise Unsupported(f"a binding of {type(value).__name__}", self.entry)

    def _call(self, call: relax.Call, var):
        op = call.op
        if isinstance(op, tvm.ir.GlobalVar):
            return self._step(call, op)
        if isinstance(op, relax.ExternFunc):
            name = str(op.global_symbol)
            if name in _CHECKS:
                return None
            if name == _RESHAPE:
                source = self._value(call.args[0])
                shape = self._static_shape(call.args[1], f"the reshape to {var.name}")
                return TensorRef(source.buffer, shape, source.dtype)
            raise Unsupported(f"packed call {name}", self.entry)
        name = getattr(op, "name", type(op).__name__)
        if name in _DROPPED_OPS:
            return None
        if name == "relax.vm.alloc_storage":
            size = self._static_shape(call.args[0], f"storage {var.name}")
            self.storage_bytes += int(np.prod(size, dtype=np.int64))
            return None
        if name == "relax.vm.alloc_tensor":
            shape = self._static_shape(call.args[2], f"tensor {var.name}")
            dtype = str(call.args[3].value)
            buffer = Buffer(var.name, INTERMEDIATE, shape, dtype)
            self.intermediates.append(buffer)
            return TensorRef(buffer, shape, dtype)
        raise Unsupported(f"Relax operator {name}", self.entry)

    def _step(self, call: relax.Call, gvar: tvm.ir.GlobalVar) -> None:
        callee = self.module[gvar]
        if not isinstance(callee, tirx.PrimFunc):
            raise Unsupported(f"a call of the Relax function {gvar.name_hint}", self.entry)
        args = tuple(self._argument(a, gvar.name_hint) for a in call.args)
        self.steps.append(Step(gvar.name_hint, args))

    # Step 2. Values.
    def _argument(self, arg, callee: str):
        if isinstance(arg, tirx.IntImm | tirx.FloatImm):
            return Scalar(arg.value, str(arg.ty.dtype))
        if isinstance(arg, relax.ShapeExpr):
            raise Unsupported(f"a shape argument of {callee}", self.entry)
        if isinstance(getattr(arg, "ty", None), tvm.ir.PrimType):
            raise Unsupported(f"the symbolic scalar argument {arg} of {callee}", self.entry)
        return self._value(arg)

    def _value(self, expr):
        if isinstance(expr, tvm.ir.GenericConst) and isinstance(expr.value, tvm.runtime.Tensor):
            return self._constant(expr)
        if isinstance(expr, relax.Var):
            if expr not in self.values:
                raise Unsupported(f"the value of {expr.name} (not a tensor)", self.entry)
            return self.values[expr]
        if isinstance(expr, relax.Tuple):
            return tuple(self._value(f) for f in expr.fields)
        raise Unsupported(f"an argument of type {type(expr).__name__}", self.entry)

    def _item(self, item: relax.TupleGetItem):
        fields = self._value(item.tuple_value)
        if not isinstance(fields, tuple):
            raise Unsupported("an item of a non-tuple", self.entry)
        return fields[item.index]

    def _constant(self, const) -> TensorRef:
        tensor = const.value
        buffer = self._constant_of.get(tensor)
        if buffer is None:
            array = tensor.numpy()
            name = f"const{len(self.constants)}"
            buffer = Buffer(name, CONSTANT, tuple(array.shape), str(array.dtype), array)
            self.constants.append(buffer)
            self._constant_of[tensor] = buffer
        return TensorRef(buffer, buffer.shape, buffer.dtype)

    def _flatten(self, value, what: str):
        if isinstance(value, TensorRef):
            yield value
        elif isinstance(value, tuple):
            for field in value:
                yield from self._flatten(field, what)
        else:
            raise Unsupported(f"{what} of type {type(value).__name__}", self.entry)

    # Step 3. Types.
    def _tensor_type(self, ty, what: str) -> tuple[tuple[int, ...], str]:
        if not isinstance(ty, relax.TensorType):
            raise Unsupported(f"{what} of type {ty}", self.entry, "expected tensors only")
        if ty.shape is None:
            raise Unsupported(f"{what} without a known shape", self.entry)
        return self._static_shape(ty.shape, what), str(ty.dtype.dtype)

    def _static_shape(self, shape, what: str) -> tuple[int, ...]:
        values = getattr(shape, "values", None)
        if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
            raise Unsupported(f"symbolic shape {shape} of {what}", self.entry)
        return tuple(int(v.value) for v in values)


# -- TIR -----------------------------------------------------------------------------------


def written_params(func: tirx.PrimFunc) -> frozenset[str]:
    """The buffer parameters ``func`` writes: the writes of its blocks (an offloaded block
    keeps its output there) and its buffer stores."""
    targets = []
    tvm_ffi.structural_walk(
        func.body,
        [
            (s_tir.SBlock, lambda block: targets.extend(r.source for r in block.writes)),
            (tirx.BufferStore, lambda store: targets.append(store.buffer)),
        ],
    )
    return frozenset(p.name for p in func.params if any(p.same_as(t) for t in targets))


def _tir_program(func: tirx.PrimFunc, entry: str) -> Program:
    written = written_params(func)
    refs, inputs, outputs = [], [], []
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            raise Unsupported(f"the scalar parameter {param.name}", entry)
        shape = []
        for extent in param.ty.shape:
            if not isinstance(extent, tirx.IntImm):
                raise Unsupported(f"symbolic shape of {param.name}", entry)
            shape.append(int(extent.value))
        kind = OUTPUT if param.name in written else INPUT
        buffer = Buffer(param.name, kind, tuple(shape), str(param.ty.dtype))
        ref = TensorRef(buffer, buffer.shape, buffer.dtype)
        refs.append(ref)
        (outputs if kind == OUTPUT else inputs).append(ref)
    if not outputs:
        raise Unsupported("an entry that writes none of its parameters", entry)
    return Program(
        entry,
        tuple(r.buffer for r in inputs),
        (),
        (),
        (Step(entry, tuple(refs)),),
        tuple(outputs),
        0,
    )
