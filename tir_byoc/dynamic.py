"""Dynamic dims: how a user names them, and how a built model checks a call against them.

A torch model's dims are made dynamic the way ``torch.export`` takes them
(``dynamic_shapes=``, with ``torch.export.Dim(name, min=, max=)``), or with a short form,
``dynamic={"input_ids": {0: "batch", 1: "seq"}}``: each input (by name or position) maps axes
to a dim's name, a ``Dim``, or ``(name, min, max)``; a name used on several inputs is one dim
(their sizes must be equal), and a bare name's range is 1 and up.  :func:`export_spec` turns
either into what ``torch.export`` takes; after the import :func:`name_dims` gives the Relax
module's symbolic dims the user's names (``batch`` rather than ``s77``), bounds included.
A Relax or TIR module keeps its own symbolic dims and their bounds
(the ``tir_var_lower_bound`` / ``tir_var_upper_bound`` attributes of its function).

Entry points: :func:`export_spec`, :func:`name_dims` (the build) and :class:`Signature` (the
call): each input's shape as dims (an integer, a symbolic dim, or an expression of dims),
checked with :meth:`Signature.check`, whose ``ValueError`` names the input and the dim,
``tir_byoc.Model: input 0 (input_ids) dim 1 (seq) is 600, expected 1..512``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, relax, sym, tirx

LOWER, UPPER = "tir_var_lower_bound", "tir_var_upper_bound"


def _fail(message: str):
    raise ValueError(f"tir_byoc.build_model: {message}")


def export_spec(model, inputs: tuple, dynamic_shapes=None, dynamic=None):
    """What ``torch.export.export(..., dynamic_shapes=)`` takes for the user's ``dynamic_shapes``
    (passed as given) or ``dynamic`` (the short form), or None for neither.

    Raises
    ------
    ValueError
        Both given, an input or axis that does not exist, a dim that is not a name, a ``Dim``
        or ``(name, min, max)``.
    """
    if dynamic_shapes is not None and dynamic is not None:
        _fail(
            "expected dynamic_shapes= (torch.export's form) or dynamic= (the short form), got both"
        )
    if dynamic is None:
        return dynamic_shapes
    import torch

    if not isinstance(dynamic, dict):
        _fail(f"expected dynamic= as {{input: {{axis: name}}}}, got {type(dynamic).__name__}")
    names = list(inspect.signature(model.forward).parameters)[: len(inputs)]
    dims: dict[str, object] = {}
    spec: list[dict | None] = [None] * len(inputs)
    for key, axes in dynamic.items():
        position = key if isinstance(key, int) else names.index(key) if key in names else None
        if position is None or not 0 <= position < len(inputs):
            _fail(f"dynamic= names input {key!r}; expected one of {names} or 0..{len(inputs) - 1}")
        if not isinstance(axes, dict):
            _fail(f"expected dynamic[{key!r}] as {{axis: name}}, got {type(axes).__name__}")
        rank = inputs[position].dim()
        spec[position] = {}
        for axis, dim in axes.items():
            if not isinstance(axis, int) or not -rank <= axis < rank:
                _fail(f"dynamic[{key!r}] has axis {axis!r}; the input has {rank} axes")
            spec[position][axis % rank] = _dim(torch, dim, dims, key)
    return tuple(spec)


def _dim(torch, dim, dims: dict, key):
    """A ``torch.export.Dim`` for a short-form dim, one per name."""
    if isinstance(dim, str):
        name, low, high = dim, 1, None
    elif isinstance(dim, tuple) and len(dim) == 3 and isinstance(dim[0], str):
        name, low, high = dim
    else:
        if type(dim).__name__ in ("Dim", "_Dim", "_DerivedDim") or hasattr(dim, "__name__"):
            return dim
        _fail(
            f"dynamic[{key!r}] has dim {dim!r}; expected a name, (name, min, max) or a "
            "torch.export.Dim"
        )
    if not isinstance(low, int) or not (high is None or isinstance(high, int)):
        _fail(f"dynamic[{key!r}] has dim {dim!r}; expected integer bounds (name, min, max)")
    if low < 0 or (high is not None and high <= low):
        _fail(
            f"dynamic[{key!r}] has dim {name!r} from {low} to {high}; expected 0 <= min < max "
            "(a size with one value is static: leave the axis out of dynamic=)"
        )
    if name not in dims:
        options = {"min": low} if high is None else {"min": low, "max": high}
        dims[name] = torch.export.Dim(name, **options)
    return dims[name]


def user_names(exported, spec) -> dict[str, str]:
    """The symbol torch gave each dynamic dim (``"s77"``), with the name the user gave it."""
    if spec is None:
        return {}
    placeholders = [
        node
        for node in exported.graph.nodes
        if node.op == "placeholder" and node.name in exported.graph_signature.user_inputs
    ]
    flat = spec if isinstance(spec, tuple | list) else tuple(spec.values())
    names = {}
    for node, axes in zip(placeholders, flat, strict=False):
        shape = getattr(node.meta.get("val"), "shape", ())
        for axis, dim in (axes or {}).items() if isinstance(axes, dict) else ():
            symbol = str(shape[axis]) if axis < len(shape) else ""
            name = getattr(dim, "__name__", None)
            if name and symbol.isidentifier() and not symbol.isdigit():
                names.setdefault(symbol, name)
    return names


def name_dims(mod: tvm.IRModule, names: dict[str, str]) -> tvm.IRModule:
    """``mod`` with each symbolic dim of its ``main`` named as ``names`` says (attributes
    included)."""
    func = mod["main"]
    if not names:
        return mod
    renames = {
        var: tirx.Var(names[var.name], var.ty.dtype)
        for var in relax.analysis.defined_symbolic_vars(func)
        if var.name in names and len(set(names.values())) == len(names)
    }
    if not renames:
        return mod
    mod = relax.transform.BindSymbolicVars(renames, "main")(mod)
    func = mod["main"]
    for attr in (LOWER, UPPER):
        given = (func.attrs or {}).get(attr)
        if given:
            func = func.with_attr(attr, {names.get(str(k), str(k)): v for k, v in given.items()})
    mod["main"] = func
    return mod


def bounds_of(func) -> dict[str, tuple[int, int | None]]:
    """Each symbolic dim's (lower, upper) bound by name, from ``func``'s attributes; a dim with
    none given is 0 and up."""
    attrs = func.attrs or {}
    lower = {str(k): int(v) for k, v in (attrs.get(LOWER) or {}).items()}
    upper = {str(k): int(v) for k, v in (attrs.get(UPPER) or {}).items()}
    return {n: (lower.get(n, 0), upper.get(n)) for n in {*lower, *upper}}


@dataclass(frozen=True)
class Input:
    """One input: its name, dims (an int, a ``tirx.Var`` or an expression of them; None for
    a rank not known) and dtype."""

    name: str
    dims: tuple | None
    dtype: str

    def text(self) -> str:
        if self.dims is None:
            return "(any)"
        return "(" + ", ".join(str(d) for d in self.dims) + (",)" if len(self.dims) == 1 else ")")


@dataclass(frozen=True)
class Signature:
    """What a call must give: each :class:`Input`, and the bounds of the symbolic dims."""

    inputs: tuple[Input, ...]
    bounds: dict

    @property
    def is_dynamic(self) -> bool:
        return any(
            not isinstance(d, int) for i in self.inputs if i.dims is not None for d in i.dims
        )

    @property
    def dims(self) -> dict[str, tuple[int, int | None]]:
        """Each symbolic dim the inputs use, by name, with its (lower, upper) bound."""
        found = {}
        for item in self.inputs:
            for dim in item.dims or ():
                if isinstance(dim, tirx.Var):
                    found[dim.name] = self.bounds.get(dim.name, (0, None))
        return found

    def check(self, given: list[tuple[tuple, str]]) -> None:
        """A one-line ``ValueError`` unless the (shape, dtype) of each input conforms: the
        static dims equal, each symbolic dim within its bounds and the same wherever it
        appears, each dim computed from others equal to what they give."""
        values: dict = {}
        where: dict = {}
        for index, ((shape, dtype), item) in enumerate(zip(given, self.inputs, strict=True)):
            if dtype != item.dtype or (item.dims is not None and len(shape) != len(item.dims)):
                raise ValueError(
                    f"tir_byoc.Model: input {index} ({item.name}) expected shape "
                    f"{item.text()} {item.dtype}, got {tuple(shape)} {dtype}"
                )
            for axis, (dim, size) in enumerate(zip(item.dims or (), shape, strict=True)):
                at = f"input {index} ({item.name}) dim {axis}"
                if isinstance(dim, int):
                    if dim != size:
                        raise ValueError(
                            f"tir_byoc.Model: {at} is {size}, expected {dim} (input {index} "
                            f"expected shape {item.text()} {item.dtype}, got {tuple(shape)})"
                        )
                elif isinstance(dim, tirx.Var):
                    self._bind(dim, size, at, values, where)
        for index, ((shape, _), item) in enumerate(zip(given, self.inputs, strict=True)):
            for axis, (dim, size) in enumerate(zip(item.dims or (), shape, strict=True)):
                if isinstance(dim, int | tirx.Var):
                    continue
                expected = evaluate(dim, values)
                if expected is not None and expected != size:
                    raise ValueError(
                        f"tir_byoc.Model: input {index} ({item.name}) dim {axis} ({dim}) is "
                        f"{size}, expected {expected}"
                    )

    def _bind(self, dim, size: int, at: str, values: dict, where: dict) -> None:
        name = dim.name
        if name in values:
            if values[name] != size:
                raise ValueError(
                    f"tir_byoc.Model: {at} ({name}) is {size}, expected {values[name]}, as "
                    f"{where[name]} ({name}) is"
                )
            return
        low, high = self.bounds.get(name, (0, None))
        if size < low or (high is not None and size > high):
            raise ValueError(f"tir_byoc.Model: {at} ({name}) is {size}, expected {span(low, high)}")
        values[name], where[name] = size, at


def span(low: int, high: int | None) -> str:
    """A dim's bounds as the errors write them: ``1..16``, or ``1 or more``."""
    return f"{low}..{high}" if high is not None else f"{low} or more"


#: The PrimFunc :func:`with_bounds_check` adds, called by name first thing in the entry.
CHECK_BOUNDS = "tir_byoc_check_bounds"


def with_bounds_check(mod: tvm.IRModule, entry: str = "main") -> tvm.IRModule:
    """``mod`` whose Relax function ``entry`` first checks its symbolic dims against their
    bounds, so that the library checks a call wherever it is loaded: with
    ``tvm.runtime.load_module`` and a plain ``relax.VirtualMachine`` no :class:`Signature`
    checks anything, and a size outside the bounds ran silently (Relax plans memory at the
    upper bounds).

    A PrimFunc :data:`CHECK_BOUNDS`, compiled into the library, takes each bounded dim that is
    an input's dim (the first place it appears) and asserts it within its bounds; a call
    outside them stops with a ``ValueError`` worded as :meth:`Signature.check`'s, but for the
    size, which a TIR assert cannot print (``tir_byoc.Model: input 0 (input_ids) dim 1 (seq)
    is out of its bounds, expected 1..512``).  The entry calls it by name, outside any
    dataflow block, and is marked impure for it.  ``mod`` itself when nothing is bounded."""
    func = mod[entry] if any(g.name_hint == entry for g in mod.get_global_vars()) else None
    if not isinstance(func, relax.Function) or CHECK_BOUNDS in [
        g.name_hint for g in mod.get_global_vars()
    ]:
        return mod
    known = bounds_of(func)
    checks: dict = {}  # dim's name -> (its var in the check, condition, message)
    for index, param in enumerate(func.params):
        for axis, dim in enumerate(getattr(getattr(param.ty, "shape", None), "values", ())):
            if not isinstance(dim, tirx.Var) or dim.name in checks or dim.name not in known:
                continue
            low, high = known[dim.name]
            var = tirx.Var(dim.name, dim.ty.dtype)
            condition = var >= low if high is None else tirx.And(var >= low, var <= high)
            message = (
                f"tir_byoc.Model: input {index} ({param.name}) dim {axis} ({dim.name}) is out "
                f"of its bounds, expected {span(low, high)}"
            )
            checks[dim.name] = (dim, var, condition, message)
    if not checks:
        return mod
    # Step 1. The check: one assert per dim.
    asserts = [
        tirx.AssertStmt(condition, ir.StringImm("ValueError"), [ir.StringImm(message)])
        for _, _, condition, message in checks.values()
    ]
    body = tirx.SeqStmt([*asserts, tirx.Evaluate(tirx.const(0, "int32"))])
    params = [var for _, var, _, _ in checks.values()]
    check = tirx.PrimFunc(params, body).with_attr("global_symbol", CHECK_BOUNDS)
    # Step 2. Its call, first in the entry.
    call = relax.Call(
        relax.ExternFunc(CHECK_BOUNDS),
        [relax.prim_value(dim) for dim, _, _, _ in checks.values()],
        ty_args=[relax.ObjectType()],
    )
    first = relax.BindingBlock(
        [relax.VarBinding(relax.Var("bounds_checked", relax.ObjectType()), call)]
    )
    body = relax.SeqExpr([first, *func.body.blocks], func.body.body)
    checked = relax.Function(func.params, body, func.ret_ty, False, func.attrs, func.span)
    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    mod[entry] = checked
    mod[CHECK_BOUNDS] = check
    return mod


def evaluate(expr, values: dict) -> int | None:
    """``expr`` with its dims replaced by ``values`` (ints by dim name), as an int; None if a
    dim is unknown."""
    free = []
    tvm_ffi.structural_walk(expr, (tirx.Var, free.append))
    if any(v.name not in values for v in free):
        return None
    analyzer = sym.Analyzer()
    for var in free:
        analyzer.bind(var, tirx.const(values[var.name], var.ty.dtype))
    bound = analyzer.simplify(expr)
    return int(bound.value) if isinstance(bound, tirx.IntImm) else None


def constraint_advice(error: BaseException) -> str:
    """torch.export's refusal of the dynamic dims as given, in one line: which dims, why (the
    guard the model's code needs) and the change torch suggests, if any."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    first = next((ln for ln in lines if "Constraints violated" in ln), lines[0] if lines else "")
    first = first.split("! For more information")[0]
    why = [ln.lstrip("- ") for ln in lines if ln.startswith("- ")]
    fixes = [ln for ln in lines if "= Dim(" in ln and not ln.startswith("def ")]
    text = f"torch.export cannot keep the dims dynamic as given ({first}"
    text += f": {'; '.join(why[:2])})" if why else ")"
    return text + (f"; torch suggests {', '.join(fixes[:4])}" if fixes else "")


def symbolic_dims(func) -> list[str]:
    """The names of the symbolic dims of a Relax function's or PrimFunc's parameters, sorted."""
    if isinstance(func, relax.Function):
        return sorted({v.name for v in relax.analysis.defined_symbolic_vars(func)})
    found = []
    for param in func.params:
        for dim in getattr(param.ty, "shape", None) or ():
            tvm_ffi.structural_walk(dim, (tirx.Var, found.append))
    return sorted({v.name for v in found})
