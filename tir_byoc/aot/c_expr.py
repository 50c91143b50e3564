"""TIR expressions as C: the expression half of the kernel printer.

Entry point: :class:`ExpressionPrinter`, which :mod:`tir_byoc.aot.c_kernel` extends with
statements.  It keeps what expressions need: the C name of each variable, the C pointer of each
buffer, the declarations a ``Let`` hoists before the statement being printed, and what the
function calls (:class:`ExternSignature`, read off each external call) and the inline helpers
it uses (bit casts through ``memcpy``, integer floor division).  Everything is scalar: a vector
lane, fp16 or a call TVM's lowering should have removed raises
:class:`~tir_byoc.aot.errors.Unsupported`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import tirx

from .c_spelling import Names, c_type, itemsize, literal, wrap
from .errors import Unsupported

_BINARY = {
    "Add": "+", "Sub": "-", "Mul": "*", "EQ": "==", "NE": "!=", "LT": "<", "LE": "<=",
    "GT": ">", "GE": ">=", "And": "&&", "Or": "||", "BitwiseAnd": "&", "BitwiseOr": "|",
    "BitwiseXor": "^", "LShift": "<<", "RShift": ">>",
}  # fmt: skip
_MATH = {
    "exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "tanh",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erf", "floor", "ceil", "trunc", "round", "nearbyint", "fabs", "pow", "fmod", "atan2",
    "hypot", "copysign", "ldexp", "nextafter",
}  # fmt: skip
#: Those libm declares, as ``name`` (double) and ``namef`` (float).
_LIBM = _MATH - {"rsqrt"}
_CLASSIFY = {"tirx.isnan": "isnan", "tirx.isinf": "isinf", "tirx.isfinite": "isfinite"}


#: How a pointer argument of an external call is passed: read only, written (or a local
#: buffer, which may be), or NULL (either).
READ, WRITTEN, NULL = "const void *", "void *", None


@dataclass(frozen=True)
class ExternSignature:
    """An external function's C result type and argument types, read off a call; a pointer
    argument is :data:`READ`, :data:`WRITTEN` or :data:`NULL`."""

    result: str
    args: tuple[str | None, ...]

    def merge(self, other: ExternSignature, symbol: str, function: str) -> ExternSignature:
        """One signature for two calls: a pointer written by either is written."""
        if self.result != other.result or len(self.args) != len(other.args):
            raise Unsupported(f"calls of {symbol} with different signatures", function)
        args = []
        for mine, theirs in zip(self.args, other.args, strict=True):
            if mine is NULL or theirs is NULL or mine == theirs:
                args.append(theirs if mine is NULL else mine)
            elif {mine, theirs} == {READ, WRITTEN}:
                args.append(WRITTEN)
            else:
                raise Unsupported(f"calls of {symbol} with different argument types", function)
        return ExternSignature(self.result, tuple(args))

    def prototype(self, symbol: str) -> list[str]:
        args = [READ if a is NULL else a for a in self.args] or ["void"]
        return wrap(f"{self.result} {symbol}(", args, ");")


@dataclass
class KernelSource:
    """The C of one PrimFunc.

    Attributes
    ----------
    text : str
        The function's definition.
    signature : tuple of str
        Its name and parameters, as in ``int32_t name(params)``.
    externs : dict of str to ExternSignature
        The signature of each external function it calls, by symbol (libm's excluded).
    helpers : dict of str to str
        The small inline helpers it uses (a bit cast, a floor division), by name.
    scratch_bytes : int
        The scratch its large allocations take (0: it takes no scratch argument).
    """

    text: str
    signature: tuple[str, ...] = ()
    externs: dict[str, ExternSignature] = field(default_factory=dict)
    helpers: dict[str, str] = field(default_factory=dict)
    scratch_bytes: int = 0


#: Inline helpers for integer floor division, by name.
_FLOOR_HELPERS = {
    "floordiv_i32": "static inline int32_t floordiv_i32(int32_t a, int32_t b) "
    "{ int32_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }",
    "floordiv_i64": "static inline int64_t floordiv_i64(int64_t a, int64_t b) "
    "{ int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }",
    "floormod_i32": "static inline int32_t floormod_i32(int32_t a, int32_t b) "
    "{ int32_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }",
    "floormod_i64": "static inline int64_t floormod_i64(int64_t a, int64_t b) "
    "{ int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }",
}


def _bit_cast_helper(source: str, target: str) -> tuple[str, str]:
    name = f"bits_{source}_as_{target}"
    c_source, c_target = c_type(source, name), c_type(target, name)
    text = (
        f"static inline {c_target} {name}({c_source} v) "
        f"{{ {c_target} r; memcpy(&r, &v, sizeof r); return r; }}"
    )
    return name, text


@dataclass
class BufferView:
    """A buffer as C: the expression of its element pointer and its element dtype."""

    data: str  # a C expression of the element pointer
    dtype: str


class ExpressionPrinter:
    """Prints TIR expressions of one function as C; ``where`` names the function in errors."""

    def __init__(self, where: str):
        self.where = where
        self.names = Names()
        self.vars: dict = {}  # tirx.Var -> C name
        self.buffers: dict = {}  # buffer Var -> BufferView
        self.pending: list[str] = []  # declarations the expression being printed needs first
        self.source = KernelSource("")
        self.read_only: set = set()  # buffers over a const parameter

    # -- expressions ------------------------------------------------------------------------
    def expr(self, node) -> str:
        kind = type(node).__name__
        self._check_scalar(node)
        if kind in _BINARY:
            return f"({self.expr(node.a)} {_BINARY[kind]} {self.expr(node.b)})"
        handler = getattr(self, f"_expr_{kind}", None)
        if handler is None:
            raise Unsupported(f"the TIR expression {kind}", self.where)
        return handler(node)

    def _check_scalar(self, node) -> None:
        ty = getattr(node, "ty", None)
        if isinstance(ty, tvm.ir.PrimType) and ty.dtype.lanes != 1:
            raise Unsupported(f"a vector of {ty.dtype.lanes} lanes ({ty.dtype})", self.where)

    def _expr_Var(self, node):
        name = self.vars.get(node)
        if name is None:
            raise Unsupported(f"the free variable {node.name} (a symbolic shape?)", self.where)
        return name

    def _expr_IntImm(self, node):
        return literal(node.value, str(node.ty.dtype), self.where)

    def _expr_FloatImm(self, node):
        return literal(node.value, str(node.ty.dtype), self.where)

    def _expr_Ramp(self, node):
        raise Unsupported("vector lanes (Ramp)", self.where, "the C is scalar; -O3 vectorizes it")

    def _expr_Broadcast(self, node):
        raise Unsupported("vector lanes (Broadcast)", self.where, "the C is scalar")

    def _expr_StringImm(self, node):
        raise Unsupported("a string value", self.where)

    def _expr_Div(self, node):
        return f"({self.expr(node.a)} / {self.expr(node.b)})"

    def _expr_Mod(self, node):
        a, b = self.expr(node.a), self.expr(node.b)
        dtype = self._dtype(node)
        if dtype.startswith("float"):
            return f"{'fmodf' if dtype == 'float32' else 'fmod'}({a}, {b})"
        return f"({a} % {b})"

    def _expr_FloorDiv(self, node):
        return self._floor(node, "div")

    def _expr_FloorMod(self, node):
        return self._floor(node, "mod")

    def _floor(self, node, which):
        a, b = self.expr(node.a), self.expr(node.b)
        dtype = self._dtype(node)
        if dtype.startswith("float"):
            floor = "floorf" if dtype == "float32" else "floor"
            quotient = f"{floor}({a} / {b})"
            return quotient if which == "div" else f"({a} - {quotient} * {b})"
        if dtype not in ("int32", "int64"):
            raise Unsupported(f"floor{which} of {dtype}", self.where)
        helper = f"floor{which}_i{dtype[3:]}"
        self.source.helpers[helper] = _FLOOR_HELPERS[helper]
        return f"{helper}({a}, {b})"

    def _expr_Min(self, node):
        a, b = self.expr(node.a), self.expr(node.b)
        return f"(({a}) < ({b}) ? ({a}) : ({b}))"

    def _expr_Max(self, node):
        a, b = self.expr(node.a), self.expr(node.b)
        return f"(({a}) > ({b}) ? ({a}) : ({b}))"

    def _expr_Not(self, node):
        return f"(!{self.expr(node.a)})"

    def _expr_BitwiseNot(self, node):
        # On bool, C's ~ would turn true (1) into -2, which is true again.
        operator = "!" if self._dtype(node) == "bool" else "~"
        return f"({operator}{self.expr(node.a)})"

    def _expr_Select(self, node):
        condition = self.expr(node.condition)
        return f"({condition} ? {self.expr(node.true_value)} : {self.expr(node.false_value)})"

    def _expr_Cast(self, node):
        dtype = self._dtype(node)
        value = self.expr(node.value)
        if dtype == "bool":
            return f"({value} != 0)"
        return f"(({c_type(dtype, self.where)}){value})"

    def _expr_Let(self, node):
        value = self.expr(node.value)
        name = self._declare(node.var)
        self.pending.append(f"{self._type_of(node.var)} {name} = {unwrap(value)};")
        return self.expr(node.body)

    def _expr_TensorLoad(self, node):
        return self._element(node.source, node.indices)

    def _expr_Call(self, node):
        op = node.op
        if isinstance(op, tvm.ir.GlobalVar):
            raise Unsupported(f"a call of the PrimFunc {op.name_hint}", self.where)
        name = op.name
        args = list(node.args)
        if name in ("tirx.call_extern", "tirx.call_pure_extern"):
            return self._extern(node, str(args[0].value), args[1:], name)
        if name == "tirx.buffer_data":
            return self._view(args[0]).data
        if name == "tirx.address_of":
            load = args[0]
            return f"(&{self._element(load.source, load.indices)})"
        if name in ("tirx.if_then_else", "prim.if_then_else"):
            a, b, c = (self.expr(x) for x in args)
            return f"({a} ? {b} : {c})"
        if name == "tirx.likely":
            return self.expr(args[0])
        if name == "tirx.reinterpret":
            return self._reinterpret(node, args[0])
        if name in _CLASSIFY:
            return f"{_CLASSIFY[name]}({self.expr(args[0])})"
        if name == "tirx.bitwise_not":
            operator = "!" if self._dtype(node) == "bool" else "~"
            return f"({operator}{self.expr(args[0])})"
        short = name.split(".")[-1]
        if short in _MATH:
            return self._math(node, short, args)
        raise Unsupported(f"the TIR call {name}", self.where)

    def _math(self, node, short, args):
        dtype = self._dtype(node)
        if dtype not in ("float32", "float64"):
            raise Unsupported(f"{short} of {dtype}", self.where)
        values = [self.expr(a) for a in args]
        if short == "rsqrt":
            one = "1.0f" if dtype == "float32" else "1.0"
            return f"({one} / sqrt{'f' if dtype == 'float32' else ''}({values[0]}))"
        symbol = f"{short}f" if dtype == "float32" else short
        return f"{symbol}({', '.join(values)})"

    def _extern(self, node, symbol, args, kind) -> str:
        values = [self.expr(a) for a in args]
        if kind == "tirx.call_pure_extern" and _is_libm(symbol):
            return f"{symbol}({', '.join(values)})"  # declared by math.h
        result = self._c_type_of(node) if isinstance(node.ty, tvm.ir.PrimType) else "void"
        signature = ExternSignature(result, tuple(self._extern_arg(a) for a in args))
        known = self.source.externs.get(symbol)
        if known is not None:
            signature = known.merge(signature, symbol, self.where)
        self.source.externs[symbol] = signature
        return f"{symbol}({', '.join(values)})"

    def _extern_arg(self, arg) -> str | None:
        """How an external call takes ``arg``: a pointer as READ, WRITTEN or NULL."""
        if not isinstance(arg.ty, tvm.ir.PointerType):
            return self._c_type_of(arg)
        if isinstance(arg, tvm.ir.Call) and isinstance(arg.op, tvm.ir.Op):
            if arg.op.name == "tirx.reinterpret" and isinstance(arg.args[0], tirx.IntImm):
                return NULL if arg.args[0].value == 0 else WRITTEN
            if arg.op.name == "tirx.buffer_data" and arg.args[0] in self.read_only:
                return READ
        return WRITTEN

    def _reinterpret(self, node, value) -> str:
        if isinstance(node.ty, tvm.ir.PointerType):
            if isinstance(value, tirx.IntImm) and value.value == 0:
                return "NULL"
            return f"((void *)(uintptr_t){self.expr(value)})"
        source, target = str(value.ty.dtype), self._dtype(node)
        if itemsize(source) != itemsize(target):
            raise Unsupported(f"a bit cast from {source} to {target}", self.where)
        name, text = _bit_cast_helper(source, target)
        self.source.helpers[name] = text
        return f"{name}({self.expr(value)})"

    # -- names, types, buffers --------------------------------------------------------------
    def _declare(self, var) -> str:
        name = self.names.fresh(var.name)
        self.vars[var] = name
        return name

    def _dtype(self, node) -> str:
        return str(node.ty.dtype)

    def _type_of(self, var) -> str:
        return self._c_type_of(var)

    def _c_type_of(self, node) -> str:
        ty = node.ty
        if isinstance(ty, tvm.ir.PointerType):
            element = getattr(ty, "element_type", None)
            if isinstance(element, tvm.ir.PrimType) and str(element.dtype) != "void":
                return f"{c_type(str(element.dtype), self.where)} *"
            return "void *"
        if isinstance(ty, tvm.ir.PrimType):
            if str(ty.dtype) in ("handle", "void"):
                return "void *"
            return c_type(str(ty.dtype), self.where)
        raise Unsupported(f"a value of type {ty}", self.where)

    def _view(self, buffer) -> BufferView:
        view = self.buffers.get(buffer)
        if view is None:
            raise Unsupported(f"the undeclared buffer {buffer.name}", self.where)
        return view

    def _element(self, buffer, indices) -> str:
        view = self._view(buffer)
        indices = list(indices)
        if len(indices) > 1:
            raise Unsupported(f"a {len(indices)}-D access of {buffer.name}", self.where)
        index = self.expr(indices[0]) if indices else "0"
        return f"{view.data}[{index}]"


def _is_libm(symbol: str) -> bool:
    return symbol in _LIBM or (symbol.endswith("f") and symbol[:-1] in _LIBM)


def unwrap(text: str) -> str:
    """``text`` without the parentheses around all of it, if it has them: ``(a + b)`` ->
    ``a + b``, but ``(a) + (b)`` as it is."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for position, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if depth == 0 and position < len(text) - 1:
            return text
    return text[1:-1]
