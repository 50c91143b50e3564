"""Where a proven weight copy feeds a GEMM: the Relax half of finding the fold of weight copies
(:mod:`tir_byoc.relax.weight_copies`).

Entry point: :func:`copy_sites`.  It lists every argument ``t`` of an
``R.call_tir(callee, (..., t, ...))`` that is bound to ``R.call_tir(copy, (w,))``, where
``copy`` is a proven copy (:func:`tir_byoc.relax.copy_map.copy_map`) and a GEMM-like block of
``callee`` (a reduction of a product of two buffer elements) reads ``t``, as a
:class:`CopySite`; and every ``call_tir`` by callee, since a callee is folded at all its call
sites or not at all.  Each PrimFunc is analysed once, and only when a call passes it what might
be a copy: most producers are not worth proving.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from ..decline import COPY_PROOF, Decline
from ..match.reduction import looks_like_gemm
from ..match.stir import FunctionIndex, is_s_tir
from .copy_map import CopyMap, copy_map

_CALL_TIR = ir.Op.get("relax.call_tir")


@dataclass(frozen=True)
class CopySource:
    """A binding ``t = call_tir(producer, (source,))`` whose producer is a proven copy."""

    source: relax.Expr
    producer: str
    block: int  # index of the binding block holding it
    copy: CopyMap


@dataclass(frozen=True)
class CopySite:
    """One call_tir argument bound to a copy, read by GEMM-like blocks of the callee."""

    caller: str
    binding: relax.VarBinding
    arg: int
    made: CopySource
    copied: relax.Var
    blocks: tuple[str, ...]  # the callee's GEMM-like blocks that read the copy
    others: tuple[str, ...]  # what else in the callee uses it ("block X", "other code")
    out_of_scope: bool  # the source is a dataflow variable of another block

    @property
    def callee(self) -> str:
        return self.binding.value.args[0].name_hint


def is_call_tir(value) -> bool:
    """A ``call_tir(gvar, (args...))`` without symbolic-shape arguments."""
    return (
        isinstance(value, ir.Call)
        and value.op.same_as(_CALL_TIR)
        and len(value.args) == 2
        and isinstance(value.args[1], relax.Tuple)
    )


def indexed_bindings(func: relax.Function):
    """(block index, binding) for every binding of ``func``'s body."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [(i, b) for i, block in enumerate(body.blocks) for b in block.bindings]


class _Finder:
    """The copies and the GEMM readers of a module, each PrimFunc analysed once, and only
    when a call passes it what might be a copy: most producers are not worth proving."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self._maps: dict[str, CopyMap | Decline] = {}
        self._readers: dict[str, dict[int, tuple[str, ...]]] = {}
        self._indexes: dict[str, FunctionIndex] = {}

    def copy_of(self, gvar) -> CopyMap | Decline:
        name = gvar.name_hint
        if name not in self._maps:
            func = self.mod[gvar]
            is_prim = isinstance(func, tirx.PrimFunc)
            if is_prim:
                self._maps[name] = copy_map(func, name)
            else:
                self._maps[name] = Decline(name, (), COPY_PROOF, "not a PrimFunc")
        return self._maps[name]

    def gemm_readers(self, gvar) -> dict[int, tuple[str, ...]]:
        """Parameter index -> the GEMM-like blocks of the PrimFunc ``gvar`` that read it."""
        name = gvar.name_hint
        if name not in self._readers:
            func = self.mod[gvar]
            self._readers[name] = _gemm_readers(func) if isinstance(func, tirx.PrimFunc) else {}
        return self._readers[name]

    def other_users(self, gvar, arg: int, blocks) -> tuple[str, ...]:
        """What uses parameter ``arg`` of ``gvar`` besides ``blocks``."""
        name = gvar.name_hint
        if name not in self._indexes:
            self._indexes[name] = FunctionIndex(self.mod[gvar])
        index = self._indexes[name]
        positions = [p for p, nest in enumerate(index.nests) if nest.name in blocks]
        return tuple(sorted(set(index.other_users(self.mod[gvar].params[arg], *positions))))

    @staticmethod
    def producers(func: relax.Function) -> dict[relax.Var, tuple]:
        """Vars of ``func`` bound to a call_tir of one tensor: ``(callee, input, block)``."""
        found = {}
        for block, binding in indexed_bindings(func):
            value = binding.value
            if isinstance(binding, relax.VarBinding) and is_call_tir(value):
                if len(value.args[1].fields) == 1:
                    found[binding.var] = (value.args[0], value.args[1].fields[0], block)
        return found


def _gemm_readers(func: tirx.PrimFunc) -> dict[int, tuple[str, ...]]:
    if is_s_tir(func):
        blocks = []
        tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
    else:
        blocks = [nest.block for nest in FunctionIndex(func).nests]
    readers: dict[int, list[str]] = {}
    for block in blocks:
        if not looks_like_gemm(block):
            continue
        loaded = []
        tvm_ffi.structural_walk(block.body, (ir.TensorLoad, lambda ld: loaded.append(ld.source)))
        for i, param in enumerate(func.params):
            if any(param.same_as(source) for source in loaded):
                readers.setdefault(i, []).append(block.name_hint)
    return {i: tuple(names) for i, names in readers.items()}


def copy_sites(mod: tvm.IRModule) -> tuple[list[CopySite], dict[str, list[relax.VarBinding]]]:
    """Every call_tir argument bound to a copy that a GEMM reads, in module and binding order;
    every call_tir binding, by callee."""
    finder = _Finder(mod)
    sites, calls = [], {}
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        producers = finder.producers(func)
        for block, binding in indexed_bindings(func):
            value = binding.value
            if not is_call_tir(value):
                continue
            callee = value.args[0]
            calls.setdefault(callee.name_hint, []).append(binding)
            for i, arg in enumerate(value.args[1].fields):
                if not (isinstance(arg, relax.Var) and arg in producers):
                    continue
                blocks = finder.gemm_readers(callee).get(i)
                producer, source, defined_in = producers[arg]
                made = finder.copy_of(producer) if blocks else None
                if not made:
                    continue
                copy = CopySource(source, producer.name_hint, defined_in, made)
                others = finder.other_users(callee, i, blocks)
                hidden = isinstance(source, relax.DataflowVar) and defined_in != block
                site = CopySite(gvar.name_hint, binding, i, copy, arg, blocks, others, hidden)
                sites.append(site)
    return sites, calls


def references(mod: tvm.IRModule) -> Counter:
    """How often each global function is named in the module's Relax functions."""
    counts = Counter()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, (ir.GlobalVar, lambda g: counts.update([g.name_hint])))
    return counts


__all__ = ["CopySite", "CopySource", "copy_sites", "indexed_bindings", "is_call_tir", "references"]
