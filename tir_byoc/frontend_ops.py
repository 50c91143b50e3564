"""ATen operators that TVM 0.27's torch frontend imports with other values than torch's,
imported as torch computes them.

Entry points: :data:`CONVERTERS`, converters that take the place of TVM's own for some ATen
operators (:func:`tir_byoc.frontend.import_torch` passes them to ``from_exported_program`` as
its ``custom_convert_map``), and :func:`boolean_logic`, which writes the imported module's
arithmetic on booleans as the logic torch means by it.

A converter sees the graph TVM imports, after torch's decompositions (which
``from_exported_program`` runs itself): ``nn.SELU`` is exported as ``aten.selu`` and only
becomes ``aten.elu(x, alpha, scale)`` there, so a rewrite of the exported graph before the
import would have to know every operator that decomposes into a scaled ``elu``.

- ``aten.elu(x, alpha, scale, input_scale)``: TVM 0.27 reads ``alpha`` and drops the two
  scales (SELU's outputs came out 1.0507 times too small).  :func:`elu` computes torch's
  ``x * scale`` where ``x > 0``, else ``(exp(x * input_scale) - 1) * alpha * scale``.
- ``aten.grid_sampler_2d``: TVM 0.27 passes torch's ``(N, H_out, W_out, 2)`` grid to
  ``relax.image.grid_sample``, which reads its grid as ``(N, 2, H_out, W_out)`` (the TOPI
  layout), so it sampled at the wrong points and returned a ``(N, C, W_out, 2)`` result.
  :func:`grid_sample` moves the grid's last axis second first.  Every interpolation
  (bilinear, nearest, bicubic), padding mode and ``align_corners`` then agrees with torch (to a
  few float32 ulps), also outside [-1, 1] and at the ties of ``nearest``; TOPI casts the
  unnormalised coordinates to int32, so a bicubic sample more than 2**31 pixels outside the
  input (a grid value around 1e9) would differ.  ``padding_mode="reflection"`` with
  ``align_corners=True`` is refused unless every spatial axis is static and longer than 1:
  TOPI divides by the axis's size - 1 (TVM fails with "Divide by zero" on a static axis of 1).

torch adds, multiplies, and takes maxima and minima of bool tensors as logic (``a + b`` is
``a or b``, ``a * b`` is ``a and b``), with a bool result.  TVM 0.27 imports them as
``R.add``, ``R.multiply`` ... on bools, and its LLVM code generator fails on those, taking bool
for a float type ("Check failed: (t.MatchesCode(DLDataTypeCode::kDLFloat))").
:func:`boolean_logic` writes them as ``R.logical_or`` and ``R.logical_and``, which it
compiles, with the same values.
"""

from __future__ import annotations

import tvm
from tvm import ir, relax, tirx


class UnsupportedModel(ValueError):
    """A model TVM 0.27 cannot take as it is; the message says what to change.

    Raised by :mod:`tir_byoc.frontend` (which exports it) and by the converters here."""


#: torch's integer codes of grid_sample's interpolation and padding modes, as TVM names them.
_INTERPOLATION = ("bilinear", "nearest", "bicubic")
_PADDING = ("zeros", "border", "reflection")


def _argument(node, index: int, name: str, default):
    """Argument ``index`` (keyword ``name``) of the FX ``node``, else ``default``."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def elu(node, importer) -> relax.Var:
    """``aten.elu(x, alpha=1, scale=1, input_scale=1)`` as torch computes it: ``x * scale``
    where ``x > 0``, else ``(exp(x * input_scale) - 1) * (alpha * scale)``."""
    x = importer.env[node.args[0]]
    alpha = float(_argument(node, 1, "alpha", 1.0))
    scale = float(_argument(node, 2, "scale", 1.0))
    input_scale = float(_argument(node, 3, "input_scale", 1.0))
    dtype = x.ty.dtype

    def times(value, factor: float):
        return value if factor == 1.0 else relax.op.multiply(value, relax.const(factor, dtype))

    negative = relax.op.subtract(relax.op.exp(times(x, input_scale)), relax.const(1.0, dtype))
    return importer.block_builder.emit(
        relax.op.where(
            relax.op.greater(x, relax.const(0.0, dtype)),
            times(x, scale),
            times(negative, alpha * scale),
        )
    )


def grid_sample(node, importer) -> relax.Var:
    """``aten.grid_sampler_2d(input, grid, interpolation, padding, align_corners)`` with the
    grid in the layout ``relax.image.grid_sample`` reads, ``(N, 2, H_out, W_out)``.

    Raises
    ------
    UnsupportedModel
        Reflection padding with ``align_corners=True`` on a spatial axis that is not static
        and longer than 1.
    """
    data, grid = importer.env[node.args[0]], importer.env[node.args[1]]
    interpolation = _INTERPOLATION[int(_argument(node, 2, "interpolation_mode", 0))]
    padding = _PADDING[int(_argument(node, 3, "padding_mode", 0))]
    align_corners = bool(_argument(node, 4, "align_corners", False))
    if padding == "reflection" and align_corners:
        spatial = [int(n) if isinstance(n, tirx.IntImm) else n for n in list(data.ty.shape)[2:]]
        if not all(isinstance(n, int) and n > 1 for n in spatial):
            raise UnsupportedModel(
                f"tir_byoc.build_model: TVM 0.27 cannot build {node.name} (grid_sample with "
                "padding_mode='reflection' and align_corners=True) on an input whose spatial "
                f"axes ({', '.join(map(str, spatial))}) are not all static and longer than 1 "
                "(it divides by size - 1); use align_corners=False or padding_mode='border'"
            )
    builder = importer.block_builder
    grid = builder.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    return builder.emit(
        relax.op.image.grid_sample(
            data,
            grid,
            method=interpolation,
            layout="NCHW",
            padding_mode=padding,
            align_corners=align_corners,
        )
    )


#: Converters in the place of TVM 0.27's for these ATen operators (``custom_convert_map``).
CONVERTERS = {
    "elu.default": elu,
    "grid_sampler_2d.default": grid_sample,
}


#: Arithmetic on bool tensors and the logic torch computes for it (a bool result).
BOOLEAN_LOGIC = {
    "relax.add": relax.op.logical_or,
    "relax.maximum": relax.op.logical_or,
    "relax.multiply": relax.op.logical_and,
    "relax.minimum": relax.op.logical_and,
}


def boolean_logic(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each :data:`BOOLEAN_LOGIC` call whose operands are all bool tensors
    replaced by its logical operation; ``mod`` itself when there is none (it is never
    modified)."""
    found = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            finder = _BooleanArithmetic()
            finder.visit_expr(func)
            if finder.found:
                found.append(gvar)
    if not found:
        return mod
    return _AsLogic(mod).transform(found)


def _logic_of(call: relax.Call):
    """The logical operation to call instead of ``call``, or None."""
    if not isinstance(call.op, ir.Op) or call.op.name not in BOOLEAN_LOGIC:
        return None
    operands = [arg.ty for arg in call.args]
    if not all(isinstance(ty, relax.TensorType) and ty.dtype == "bool" for ty in operands):
        return None
    return BOOLEAN_LOGIC[call.op.name]


@relax.expr_functor.visitor
class _BooleanArithmetic(relax.PyExprVisitor):
    """Sets ``found`` on the first call :class:`_AsLogic` would replace."""

    def __init__(self):
        self.found = False

    def visit_call_(self, call: relax.Call) -> None:
        self.found |= _logic_of(call) is not None
        super().visit_call_(call)


@relax.expr_functor.mutator
class _AsLogic(relax.PyExprMutator):
    """Each arithmetic call on booleans as its logical operation; everything else as it was."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod

    def transform(self, gvars) -> tvm.IRModule:
        for gvar in gvars:
            self.builder_.update_func(gvar, self.visit_expr(self.mod[gvar]))
        return self.builder_.get()

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        logic = _logic_of(call)
        return call if logic is None else logic(*call.args)
