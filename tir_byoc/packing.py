"""Constant weights packed once, at build time, into the layout the library prefers.

Entry point: :func:`pack_constant_weights`, called by :func:`tir_byoc.offload` on Relax
modules after the PrimFuncs are rewritten.  A GEMM's weight is packed when

- every ``R.call_tir`` of its PrimFunc that passes a Relax constant for it is packed (a call
  passing anything else keeps the plain PrimFunc, so a weight that is not provably constant is
  never packed, and nothing is cached by pointer at run time);
- the backend serving it packs (:attr:`tir_byoc.registry.Backend.packs`: oneDNN; OpenBLAS and
  the reference kernel keep the plain path) and its ``gemm`` entry point takes the epilogue;
- the call is fp32, without batch (a ``batch_`` match folds its batch into M), with static N
  and K.  A static M gets the form fastest for it; a symbolic one a form that serves every M
  (``TIR_BYOC_PACK_CHOOSE_ANY_M``, timed at 1, 32 and 256 rows): the transposed weight, or
  the library's layouts by M (``library_by_m``: a copy of the weight in each layout the
  library asks for over a sample of M, at most four, the call picking its M's);
- nothing else in the PrimFunc reads the weight.

A convolution's weight is packed the same way, by ``tir_byoc_<backend>_conv_pack``.

The backend chooses the form once per GEMM, on the first constant's weight: oneDNN times the
call with the plain weight, transposed (a K x N weight as N x K, or the reverse) and in the
layout it prefers, and packs only if a form is at least 5 % faster (``tir_byoc_onednn_pack``;
``TIR_BYOC_ONEDNN_PACK=library|transposed|plain`` names the form instead).  The packed
PrimFunc (``<name>_packed``) takes a uint8 block where the weight was and calls the backend's
gemm entry point with ``TIR_BYOC_PACKED_WEIGHT``; each constant call site gets its weight
packed in that form, and the plain constant is left to dead-code elimination when nothing
else uses it.  The block names the form and layout it holds, so a block met by a call it was
not made for fails with ``TIR_BYOC_EPACKED`` rather than compute.  :mod:`tir_byoc.pack_calls`
calls the backend's pack function.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from . import toolchain
from .calls import INTRINSIC_ATTR
from .decline import WEIGHT_PACK, Decline
from .match import Match
from .match.conv_records import ConvMatch
from .match.exprs import const_value
from .pack_calls import PACK_CHOOSE, PACK_CHOOSE_ANY_M, PACK_FORMS, pack_call
from .patterns import GEMM_ENTRY
from .registry import Intrinsic, Registry
from .signature import DtypeSignature

logger = logging.getLogger("tir_byoc")


_CALL_TIR = ir.Op.get("relax.call_tir")
_F32 = DtypeSignature.parse("float32")


@dataclass(frozen=True)
class Packing:
    """One GEMM whose weight is packed: the gemm intrinsic called, the block's parameter, and
    the form the block holds (a key of :data:`PACK_FORMS`)."""

    match: Match
    intrinsic: Intrinsic
    param: ir.Var
    size: int
    form: int


@dataclass
class PackReport:
    """What :func:`pack_constant_weights` did: packed call sites, and why others were not
    (a :data:`~tir_byoc.decline.WEIGHT_PACK` decline per weight left plain)."""

    packed: list[str] = field(default_factory=list)
    kept: list[Decline] = field(default_factory=list)


def unpackable(match: Match, intrinsic: Intrinsic, registry: Registry) -> str | None:
    """Why ``match``'s weight cannot be packed for ``intrinsic``'s backend, or None."""
    backend = registry.backend(intrinsic.backend)
    if not backend.packs:
        return f"backend {backend.name} does not pack weights"
    if isinstance(match, ConvMatch):
        # A convolution is packed by tir_byoc_<backend>_conv_pack, for its conv entry point.
        if not intrinsic.is_conv:
            return f"{intrinsic.name} is not a conv entry point"
        if toolchain.entry_point(backend.name, "conv_pack", registry) is None:
            return f"backend {backend.name} has no conv_pack function"
        if any(s.op == "scale" and not _static(s) for s in match.epilogue):
            return "a scale by a parameter (a pack is made for one epilogue, known at build time)"
        return None
    gemm = f"{backend.name}.{GEMM_ENTRY}"
    if gemm not in registry or not registry[gemm].serves(match.pattern):
        return f"{gemm} is not registered for {match.pattern}"
    if match.dtype != _F32:
        return f"packing is for float32, the match is {match.dtype}"
    if match.batch is not None and match.batch.form == "batched":
        return "a batched weight is not packed"
    if any(const_value(e) is None for e in (match.n, match.k)):
        return "N or K is symbolic: a pack is made for one weight shape"
    if any(s.op == "scale" and not _static(s) for s in match.epilogue):
        return "a scale by a parameter (a pack is made for one epilogue, known at build time)"
    return None


def _static(step) -> bool:
    return all(isinstance(c, (int, float)) for c in step.constants)


def _block_param(old: ir.Var, size: int) -> ir.Var:
    ty = old.ty
    buffer_type = _tirx_ffi.BufferType(
        ty.storage_scope,
        "uint8",
        [tirx.IntImm("int64", size)],
        [],
        ty.elem_offset,
        64,
        ty.offset_factor,
        None,
        (),
        None,
    )
    return _tirx_ffi.BufferVar(f"{old.name}_packed", buffer_type, None)


def _readers(func: tirx.PrimFunc, var: ir.Var) -> set[str]:
    """Names of the blocks of ``func`` that read ``var``."""
    names = set()

    def on_block(block):
        if any(r.source.same_as(var) for r in block.reads):
            names.add(block.name_hint)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return names


def _call_sites(mod: tvm.IRModule, gvar: ir.GlobalVar):
    """(relax function's gvar, binding) of each ``R.call_tir`` of ``gvar`` in ``mod``."""
    sites = []
    for fvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if (
                    isinstance(value, relax.Call)
                    and value.op.same_as(_CALL_TIR)
                    and value.args[0].same_as(gvar)
                ):
                    sites.append((fvar, binding))
    return sites


@dataclass
class PackedVariant:
    """The packed variant of one offloaded PrimFunc, before it joins the module.

    Attributes
    ----------
    gvar : tvm.ir.GlobalVar
        The plain PrimFunc's global var.
    func : tvm.tirx.PrimFunc
        The packed variant (a uint8 block parameter where each packed weight was).
    packings : list of (Packing, int, callable, tvm.runtime.Tensor)
        Per packed weight: the packing, the weight's parameter index, the backend's pack
        function, and the block made from the first constant call site's weight.
    constant, sites : list of (GlobalVar, relax.VarBinding)
        The call sites passing constants for every packed weight, and all call sites.
    """

    gvar: ir.GlobalVar
    func: tirx.PrimFunc
    packings: list
    constant: list
    sites: list

    def blocks(self) -> dict[int, tvm.runtime.Tensor]:
        """The first constant call site's blocks, by the packed variant's parameter index."""
        return {index: block for _, index, _, block in self.packings}

    @property
    def forms(self) -> tuple[str, ...]:
        return tuple(PACK_FORMS[p.form] for p, *_ in self.packings)


def packed_variant(
    mod, gvar, before, after, offloaded, rewrite, registry: Registry, report: PackReport
) -> PackedVariant | None:
    """The packed variant of one offloaded PrimFunc of ``mod``, or None (why, in ``report``).

    Parameters
    ----------
    mod : tvm.IRModule
        The Relax module whose ``R.call_tir`` sites call ``gvar``.
    gvar : tvm.ir.GlobalVar
    before, after : tvm.tirx.PrimFunc
        The PrimFunc before and after its rewrite.
    offloaded : list of (Match, Intrinsic)
        What the rewrite offloaded in ``before``.
    rewrite, registry
        As for :func:`pack_constant_weights`.
    report : PackReport
        Gets a line for each weight left plain.
    """
    sites = _call_sites(mod, gvar)
    name = gvar.name_hint
    # Step 1. The GEMMs whose weight may be packed, and the weight's position.
    chosen = packable(name, before, after, offloaded, registry, report)
    if not chosen or not sites:
        return None
    constant = [
        (fvar, binding)
        for fvar, binding in sites
        if all(isinstance(binding.value.args[1].fields[i], ir.Constant) for *_, i in chosen)
    ]
    if not constant:
        blocks = tuple(b for match, *_ in chosen for b in match.blocks)
        report.kept.append(
            Decline(name, blocks, WEIGHT_PACK, "the weights are not constants of the model")
        )
        return None
    # Step 2. The form of each weight, chosen on the first constant call site's weight.
    fields = constant[0][1].value.args[1].fields
    packings = make_packings(name, chosen, lambda i: fields[i].value, registry, report)
    if not packings:
        return None
    # Step 3. The PrimFunc with a block parameter per packed weight.
    func = rewrite(before, offloaded, {p.match: p for p, *_ in packings})
    return PackedVariant(gvar, func, packings, constant, sites)


def packable(name, before, after, offloaded, registry: Registry, report: PackReport) -> list:
    """The offloaded GEMMs of one PrimFunc whose weight may be packed: (match, intrinsic, the
    weight's parameter index in ``before``); a line in ``report`` for each other one."""
    chosen, params = [], list(before.params)
    for match, intrinsic in offloaded:
        reason = unpackable(match, intrinsic, registry)
        if reason is None and not any(match.w.same_as(p) for p in params):
            reason = f"{match.w.name} is computed in the function, not passed to it"
        if reason is None:
            others = _readers(after, match.w) - {_call_name(after, match)}
            if others:
                reason = f"{match.w.name} is also read by {', '.join(sorted(others))}"
        if reason is not None:
            report.kept.append(Decline(name, tuple(match.blocks), WEIGHT_PACK, reason))
            continue
        chosen.append(
            (match, intrinsic, next(i for i, p in enumerate(params) if match.w.same_as(p)))
        )
    return chosen


def make_packings(name, chosen, weight, registry: Registry, report: PackReport) -> list:
    """Each weight of ``chosen`` (:func:`packable`) packed in the form its backend chooses.

    ``weight(index)`` is the tensor a weight's form is chosen on and its block made from.
    Returns (Packing, parameter index, pack function, block) per weight packed; a line in
    ``report`` for each weight the backend leaves plain.
    """
    packings = []
    for match, intrinsic, index in chosen:
        conv = isinstance(match, ConvMatch)
        pack = toolchain.entry_point(intrinsic.backend, "conv_pack" if conv else "pack", registry)
        form, block = pack_call(pack, match, weight(index))
        if block is None:
            every = "" if const_value(match.rows) is not None else ", for every M,"
            reason = (
                f"{intrinsic.backend} runs this call{every} as fast with the plain weight as "
                "with a packed one"
            )
            report.kept.append(Decline(name, tuple(match.blocks), WEIGHT_PACK, reason))
            continue
        size = int(block.shape[0])
        gemm = intrinsic if conv else registry[f"{intrinsic.backend}.{GEMM_ENTRY}"]
        param = _block_param(match.w, size)
        packings.append((Packing(match, gemm, param, size, form), index, pack, block))
    return packings


def pack_in_form(packing: Packing, pack, weight: tvm.runtime.Tensor) -> tvm.runtime.Tensor:
    """``weight`` (another weight of ``packing``'s shape) packed in ``packing``'s form by the
    backend's ``pack`` function (:func:`make_packings` returns both)."""
    _, block = pack_call(pack, packing.match, weight, packing.form)
    return block


def without_sites(variant: PackedVariant, bindings) -> PackedVariant | None:
    """``variant`` without the call sites whose binding's var is in ``bindings`` (calls another
    rewrite replaced since the variant was made); None if no constant call site is left.

    The blocks of the first constant site are made anew where that site is gone:
    :func:`install_packed` gives the first one the blocks the forms were chosen on.
    """
    constant = [site for site in variant.constant if site[1].var not in bindings]
    sites = [site for site in variant.sites if site[1].var not in bindings]
    if not constant:
        return None
    packings = variant.packings
    if constant[0] is not variant.constant[0]:
        fields = constant[0][1].value.args[1].fields
        packings = [
            (packing, index, pack, pack_in_form(packing, pack, fields[index].value))
            for packing, index, pack, _ in packings
        ]
    return dataclasses.replace(variant, packings=packings, constant=constant, sites=sites)


def install_packed(mod, variants: list[PackedVariant], report: PackReport) -> tvm.IRModule:
    """``mod`` with ``variants`` added and each constant call site calling its variant.

    Every constant call site gets its weights packed in the variant's forms (the first reuses
    the blocks the forms were chosen on); a plain PrimFunc none of whose sites is left is
    removed.
    """
    if not variants:
        return mod
    # The variants join the module (typed global vars, from a block builder).
    builder = relax.BlockBuilder(mod)
    added = [builder.add_func(v.func, f"{v.gvar.name_hint}_packed") for v in variants]
    mod = builder.get()
    replacements: dict[relax.Var, relax.Expr] = {}
    for packed_gvar, variant in zip(added, variants):
        for site, (fvar, binding) in enumerate(variant.constant):
            fields = list(binding.value.args[1].fields)
            for packing, index, pack, sample_block in variant.packings:
                if site == 0:  # the sample the form was chosen on: its block is made
                    block = sample_block
                else:
                    block = pack_in_form(packing, pack, fields[index].value)
                fields[index] = relax.const(block, "uint8")
            call = relax.op.call_tir(packed_gvar, relax.Tuple(fields), list(binding.value.ty_args))
            replacements[binding.var] = relax.BlockBuilder().normalize(call)
            report.packed.append(
                f"{fvar.name_hint}: {binding.var.name} -> {packed_gvar.name_hint} "
                f"({', '.join(variant.forms)})"
            )
    mod = _replace_calls(mod, replacements)
    for variant in variants:
        if len(variant.constant) == len(variant.sites):
            del mod[variant.gvar.name_hint]  # every call now takes the packed variant
    for line in report.packed:
        logger.info("packed: %s", line)
    return mod


def pack_constant_weights(mod, rewritten, rewrite, registry: Registry):
    """Pack the constant weights of the offloaded PrimFuncs of a Relax module.

    Parameters
    ----------
    mod : tvm.IRModule
        The Relax module, its PrimFuncs already rewritten.
    rewritten : list of (GlobalVar, PrimFunc, list of (Match, Intrinsic))
        Each rewritten PrimFunc as it was before the rewrite, with what was offloaded in it.
    rewrite : callable
        ``rewrite(func, offloaded, packings)``: :func:`tir_byoc.rewrite.rewrite_function`.
    registry : Registry

    Returns
    -------
    (tvm.IRModule, PackReport)
    """
    report = PackReport()
    variants = [
        packed_variant(mod, gvar, before, mod[gvar], offloaded, rewrite, registry, report)
        for gvar, before, offloaded in rewritten
    ]
    return install_packed(mod, [v for v in variants if v is not None], report), report


def _call_name(func: tirx.PrimFunc, match: Match) -> str:
    names = []

    def on_block(block):
        if block.annotations and INTRINSIC_ATTR in block.annotations:
            if any(r.source.same_as(match.w) for r in block.reads):
                names.append(block.name_hint)

    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, on_block))
    return names[0] if len(names) == 1 else ""


def _replace_calls(mod: tvm.IRModule, replacements, removed=frozenset()) -> tvm.IRModule:
    """``mod`` with each binding of a var of ``replacements`` bound to its new value, and the
    bindings of ``removed`` dropped."""
    for fvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        blocks, changed = [], False
        for block in func.body.blocks:
            bindings = []
            for binding in block.bindings:
                if binding.var in removed:
                    changed = True
                    continue
                if binding.var in replacements:
                    binding = relax.VarBinding(binding.var, replacements[binding.var], binding.span)
                    changed = True
                bindings.append(binding)
            blocks.append(type(block)(bindings, block.span))
        if changed:
            body = relax.SeqExpr(blocks, func.body.body, func.body.span)
            new = relax.Function(
                func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span
            )
            mod[fvar] = relax.BlockBuilder().normalize(new)
    return mod


__all__ = [
    "PACK_CHOOSE",
    "PACK_CHOOSE_ANY_M",
    "PACK_FORMS",
    "PackReport",
    "PackedVariant",
    "Packing",
    "install_packed",
    "make_packings",
    "pack_constant_weights",
    "pack_in_form",
    "packable",
    "packed_variant",
    "unpackable",
    "without_sites",
]
