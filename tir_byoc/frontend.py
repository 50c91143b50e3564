"""From a torch model to a Relax module, and what to change when TVM 0.27 cannot take it.

Entry point: :func:`import_torch` (``torch.export`` under ``no_grad``, then
``from_exported_program``, parameters bound as constants).  torch is imported only when a
torch model is given: ``import tir_byoc`` never imports it.

The frontend problems seen with TVM 0.27 and transformers are data, :data:`KNOWN_PROBLEMS`:
each names the stage where it shows, the text of the error it raises and the change that
avoids it.  None has an exact workaround tir_byoc could apply without changing the model, so
each is reported as :class:`UnsupportedModel`, one line saying what to change, with the
original error as its ``__cause__``.  Among them, TVM 0.27's LLVM code generator takes bool
for a float type and cannot compile comparisons or arithmetic on booleans: the message names
which (:func:`boolean_operations`) and the functions that perform them.  A torch model's
arithmetic on bool tensors, which torch computes as logic (``a + b`` is ``a or b``), is
written as that logic after the import (:func:`tir_byoc.frontend_ops.boolean_logic`) and
builds; comparisons of booleans are refused.

Some problems raise nothing and give wrong values.  Those with exact workarounds have them
applied on every model: a negative index (:mod:`tir_byoc.relax.wrap_indices`, in the lowering); a
true division of integer tensors, which TVM 0.27 imports as an integer division (``i / 4``
with i an int64 tensor gives ``trunc(i / 4)`` cast to float): :func:`divide_in_float` casts
the integer operands of such a division to its result's dtype in the exported graph, before
the import, as torch computes it (both operands in the result's dtype, then divided); and
two operators whose TVM converters misread them, imported by the converters of
:mod:`tir_byoc.frontend_ops` instead: ``aten.elu``, whose ``scale`` TVM dropped (``nn.SELU``,
which torch decomposes into a scaled elu, was 5 % off), and ``aten.grid_sampler_2d``, whose
``(N, H, W, 2)`` grid TVM read as ``(N, 2, H, W)``.  A problem with no exact workaround here
is refused before the import, in one line (:func:`misread_indexing`): index tensors on several
axes with a ``:`` among them, which TVM 0.27 takes as an outer product of the indices.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from . import dynamic
from .frontend_ops import CONVERTERS, UnsupportedModel, boolean_logic


@dataclass(frozen=True)
class FrontendProblem:
    """A known failure of the flow, recognised by the error it raises.

    Attributes
    ----------
    stage : str
        Where it shows: ``"export"`` (``torch.export``), ``"import"``
        (``from_exported_program``, which also runs torch's decompositions) or ``"compile"``
        (``tvm.compile``).
    symptom : str
        Text the error's message contains.
    advice : str
        What the user should change, one sentence; ``{functions}`` is replaced by the
        PrimFuncs that compare booleans (for the compile-stage mask problem), ``{arithmetic}``
        by the arithmetic on booleans and where it is (``"addition in add"``).
    requires_op : str or None
        The problem applies only if the exported graph calls an operator whose name contains
        this; at the compile stage, the module's operations on booleans count as operators
        too (see :func:`diagnose`).  ``None``: always.
    """

    stage: str
    symptom: str
    advice: str
    requires_op: str | None = None

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"expected a stage in {STAGES}, got {self.stage!r}")


STAGES = ("export", "import", "compile")

_USE_CACHE = (
    "the model returns a key/value cache (use_cache=True), which torch.export and TVM 0.27 "
    "cannot take: pass use_cache=False (in its config or to forward)"
)

# TVM 0.27's LLVM code generator takes bool for a float type: it emits == on booleans as a
# float compare, which LLVM rejects ("fcmp oeq i1"), and fails a check on <, +, *, max ...
# transformers builds its causal mask from such comparisons.
_BOOLEAN_COMPARE = (
    "TVM 0.27 cannot compile comparisons of booleans ({functions}); if they build an attention "
    "mask (transformers' causal mask does), pass a prepared additive float attention_mask (0 "
    "where attended, torch.finfo(dtype).min elsewhere) so that the model does not build one"
)
_BOOLEAN_ARITHMETIC = (
    "TVM 0.27 cannot compile arithmetic on booleans ({arithmetic}): write it as logic "
    "(logical_or for an addition or a maximum, logical_and for a multiplication or a minimum) "
    "or cast the booleans to an integer dtype first"
)

#: Known frontend problems, first match wins.
KNOWN_PROBLEMS = (
    FrontendProblem("export", "cache_utils", _USE_CACHE),
    FrontendProblem("import", "Concat expects all input tensors to have same ndim", _USE_CACHE),
    FrontendProblem(
        "import",
        "Cannot view a tensor with shape",
        "torch could not decompose scaled_dot_product_attention for TVM: build the model "
        "with attn_implementation='eager'",
        requires_op="scaled_dot_product_attention",
    ),
    FrontendProblem(
        "compile",
        "Invalid operand types for FCmp",
        _BOOLEAN_COMPARE,
        requires_op="boolean comparison",
    ),
    FrontendProblem(
        "compile",
        "MatchesCode(DLDataTypeCode::kDLFloat)",
        _BOOLEAN_ARITHMETIC,
        requires_op="boolean arithmetic",
    ),
    FrontendProblem(
        "compile",
        "MatchesCode(DLDataTypeCode::kDLFloat)",
        _BOOLEAN_COMPARE,
        requires_op="boolean comparison",
    ),
)


def diagnose(stage: str, error: BaseException, *, graph_ops=(), module=None) -> str | None:
    """The advice of the first :data:`KNOWN_PROBLEMS` entry ``error`` shows, or None.

    Parameters
    ----------
    stage : str
        One of :data:`STAGES`.
    error : BaseException
        What the stage raised.
    graph_ops : iterable of str
        Operators the exported graph calls (for :attr:`FrontendProblem.requires_op`).
    module : tvm.IRModule, optional
        The module being compiled: its operations on booleans (:func:`boolean_operations`)
        count as operators ``"boolean comparison"`` and ``"boolean arithmetic (addition)"``
        ..., and the advice names the functions that perform them.
    """
    if stage not in STAGES:
        raise ValueError(f"expected a stage in {STAGES}, got {stage!r}")
    text = str(error)
    operations = boolean_operations(module) if module is not None else {}
    ops = [*graph_ops, *(_operator_name(word) for word in operations)]
    for problem in KNOWN_PROBLEMS:
        if problem.stage != stage or problem.symptom not in text:
            continue
        if problem.requires_op and not any(problem.requires_op in op for op in ops):
            continue
        arithmetic = "; ".join(
            f"{word} in {', '.join(functions)}"
            for word, functions in operations.items()
            if word != "comparison"
        )
        return problem.advice.format(
            functions=", ".join(operations.get("comparison", ())) or "?",
            arithmetic=arithmetic or "?",
        )
    return None


#: Operations on booleans that TVM 0.27's LLVM code generator cannot compile, by TIR node, as
#: :func:`boolean_operations` names them.
BOOLEAN_OPERATIONS = {
    **dict.fromkeys((tirx.EQ, tirx.NE, tirx.LT, tirx.LE, tirx.GT, tirx.GE), "comparison"),
    tirx.Add: "addition",
    tirx.Sub: "subtraction",
    tirx.Mul: "multiplication",
    tirx.Max: "maximum",
    tirx.Min: "minimum",
}


def _operator_name(word: str) -> str:
    return "boolean comparison" if word == "comparison" else f"boolean arithmetic ({word})"


def boolean_operations(mod: tvm.IRModule) -> dict[str, list[str]]:
    """The :data:`BOOLEAN_OPERATIONS` the PrimFuncs of ``mod`` perform on bool operands: each
    operation's name (``"comparison"``, ``"addition"`` ...) with the functions, sorted."""
    found: dict[str, set[str]] = {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue

        def on_operation(node, name=gvar.name_hint):
            ty = node.a.ty
            if isinstance(ty, tvm.ir.PrimType) and str(ty.dtype).startswith("bool"):
                found.setdefault(BOOLEAN_OPERATIONS[type(node)], set()).add(name)

        tvm_ffi.structural_walk(func.body, (tuple(BOOLEAN_OPERATIONS), on_operation))
    return {word: sorted(found[word]) for word in sorted(found)}


def boolean_comparisons(mod: tvm.IRModule) -> list[str]:
    """PrimFuncs of ``mod`` that compare booleans (``==``, ``<`` ... on bool operands)."""
    return boolean_operations(mod).get("comparison", [])


def causal_mask(sequence: int, dtype=None):
    """The prepared additive causal mask that :data:`_BOOLEAN_COMPARE` asks for.

    A ``(1, 1, sequence, sequence)`` torch tensor of ``dtype`` (default float32): 0 where a
    token may attend (itself and earlier tokens), ``torch.finfo(dtype).min`` elsewhere.  Passed
    as a transformers decoder's ``attention_mask``, it is added to the attention scores as
    given, so the model builds no boolean mask of its own.
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    future = torch.triu(torch.ones(sequence, sequence, dtype=torch.bool), diagonal=1)
    mask = torch.zeros(1, 1, sequence, sequence, dtype=dtype)
    return mask.masked_fill(future, torch.finfo(dtype).min)


def first_line(error: BaseException) -> str:
    """The first non-empty line of ``error``'s message, with its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    first, kind = (lines[0] if lines else ""), type(error).__name__
    return first if first.startswith(f"{kind}: ") else f"{kind}: {first}"


def is_torch_module(obj) -> bool:
    """True for a ``torch.nn.Module``; never imports torch (if it is not loaded, obj is not one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def is_torch_tensor(obj) -> bool:
    """True for a ``torch.Tensor``; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def example_tuple(example_inputs) -> tuple:
    """``example_inputs`` as a tuple of torch tensors, or a one-line ``ValueError``."""
    if example_inputs is None:
        raise ValueError(
            "tir_byoc.build_model: a torch model needs example_inputs (a tensor or a tuple of "
            "tensors to export it with), got None"
        )
    inputs = (example_inputs,) if is_torch_tensor(example_inputs) else example_inputs
    if not isinstance(inputs, tuple | list) or not all(is_torch_tensor(t) for t in inputs):
        found = (
            type(example_inputs).__name__
            if not isinstance(inputs, tuple | list)
            else "a sequence of " + ", ".join(sorted({type(t).__name__ for t in inputs}))
        )
        raise ValueError(
            "tir_byoc.build_model: expected example_inputs as a torch.Tensor or a tuple of "
            f"them, got {found}"
        )
    return tuple(inputs)


def _fail(stage: str, error: BaseException, **context):
    advice = diagnose(stage, error, **context)
    if advice is None:
        raise error
    raise UnsupportedModel(f"tir_byoc.build_model: {advice} ({symptom_line(error)})") from error


def symptom_line(error: BaseException) -> str:
    """The line of ``error``'s message that shows a known problem (else its first line)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    symptoms = [p.symptom for p in KNOWN_PROBLEMS]
    shown = next((ln for ln in lines if any(s in ln for s in symptoms)), None)
    return f"{type(error).__name__}: {shown}" if shown else first_line(error)


def import_torch(model, example_inputs, dynamic_shapes=None):
    """Export ``model`` with ``example_inputs`` and import it into Relax.

    ``dynamic_shapes`` is passed to ``torch.export`` (:func:`tir_byoc.dynamic.export_spec`
    makes it from the short form); the module's symbolic dims then carry the names the user
    gave them, and their bounds.

    Returns
    -------
    tuple of (tvm.IRModule, torch.utils._pytree.TreeSpec)
        The Relax module (entry ``main``, parameters bound as constants) and the structure of
        the model's output, for giving results back in the same shape.

    Raises
    ------
    ValueError
        Missing or malformed example inputs, or a model in training mode.
    UnsupportedModel
        A :data:`KNOWN_PROBLEMS` entry; the message says what to change.
    """
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    # Step 1. Inputs and mode; dropout or batch-norm statistics in training mode would be
    # exported as they behave in training.
    inputs = example_tuple(example_inputs)
    if model.training:
        raise ValueError(
            "tir_byoc.build_model: expected a model in eval mode, got one in training mode "
            "(call model.eval() first)"
        )
    # Step 2. torch.export.
    try:
        with torch.no_grad():
            exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as error:
        if dynamic_shapes is not None and "Constraints violated" in str(error):
            raise ValueError(f"tir_byoc.build_model: {dynamic.constraint_advice(error)}") from None
        _fail("export", error)
    # Step 3. Into Relax; torch's decompositions run here.
    divide_in_float(exported)
    refused = [why for node in exported.graph.nodes if (why := misread_indexing(node))]
    if refused:
        raise UnsupportedModel(f"tir_byoc.build_model: {refused[0]}")
    ops = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    try:
        mod = from_exported_program(exported, custom_convert_map=CONVERTERS)
    except Exception as error:
        _fail("import", error, graph_ops=ops)
    mod = dynamic.name_dims(mod, dynamic.user_names(exported, dynamic_shapes))
    return boolean_logic(mod), exported.call_spec.out_spec


def divide_in_float(exported) -> int:
    """Cast the integer operands of each true division in ``exported``'s graph to its result
    dtype (see the module docstring); the number of divisions changed.

    A division is ``aten.div.Tensor`` or ``aten.div.Scalar`` (no rounding mode) whose result
    is floating point: its integer or boolean tensor operands get an ``aten._to_copy`` to that
    dtype, its int scalar operands become floats.  Divisions with a rounding mode, and those
    already on floats, are left as they are.  The graph is changed in place.
    """
    import torch

    aten = torch.ops.aten
    graph, changed = exported.graph_module.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.div.Tensor, aten.div.Scalar):
            continue
        result = node.meta.get("val")
        if not isinstance(result, torch.Tensor) or not result.dtype.is_floating_point:
            continue
        values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args]
        integers = [isinstance(v, torch.Tensor) and not v.dtype.is_floating_point for v in values]
        if not any(integers):
            continue
        args = []
        for arg, value, integer in zip(node.args, values, integers, strict=True):
            if integer:
                with graph.inserting_before(node):
                    cast = graph.call_function(
                        aten._to_copy.default, (arg,), {"dtype": result.dtype}
                    )
                cast.meta["val"] = value.to(result.dtype)
                arg = cast
            elif isinstance(arg, int | bool):
                arg = float(arg)
            args.append(arg)
        node.args = tuple(args)
        changed += 1
    if changed:
        graph.lint()
        exported.graph_module.recompile()
    return changed


def misread_indexing(node) -> str | None:
    """Why TVM 0.27 would import ``node``, an ``aten.index.Tensor`` with index tensors on
    several axes and a ``:`` among them, with other values than torch's; None if it would not.

    TVM takes such an index one axis at a time, which gives every combination of the index
    tensors' entries (an outer product), in the axes' own places.  torch pairs the entries of
    the index tensors broadcast together, and puts the result's axes first when a ``:``
    separates the indexed axes.  The two agree only when the indexed axes are adjacent and
    the index tensors broadcast as an outer product (``i[:, None]`` with ``j``), which is what
    is accepted here.
    """
    import torch

    if node.op != "call_function" or node.target is not torch.ops.aten.index.Tensor:
        return None
    indices = list(node.args[1])
    axes = [a for a, index in enumerate(indices) if index is not None]
    if len(axes) < 2 or len(axes) == len(indices):
        return None  # one take, or TVM's index_tensor, which pairs them as torch does
    shapes = [tuple(indices[a].meta["val"].shape) for a in axes]
    squeezed = [[d for d in shape if d != 1] for shape in shapes]
    adjacent = axes == list(range(axes[0], axes[-1] + 1))
    outer = all(len(s) <= 1 for s in squeezed) and list(torch.broadcast_shapes(*shapes)) == [
        s[0] if s else 1 for s in squeezed
    ]
    if adjacent and outer and all(len(shape) <= 2 for shape in shapes):
        return None
    return (
        f"TVM 0.27 imports {node.name} (index tensors on axes {axes} of a "
        f"{node.args[0].meta['val'].dim()}-D tensor, with ':' on the others) as an outer "
        "product of the indices, not torch's pairing; index one axis at a time "
        "(x[i][:, j] ...) or give every axis an index tensor"
    )


def compile_module(mod: tvm.IRModule, target, **kwargs):
    """``tvm.compile``, with a known problem reported as :class:`UnsupportedModel`."""
    try:
        return tvm.compile(mod, target, **kwargs)
    except Exception as error:
        _fail("compile", error, module=mod)
