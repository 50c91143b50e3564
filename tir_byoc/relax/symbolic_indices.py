"""Index expressions of symbolic shapes simplified, so that a reshape stays injective.

``LegalizeOps`` writes a reshape of ``(batch * seq, 64)`` to ``(batch, seq, 64)`` as a read of
``x[(v0 * seq + v1) % (batch * seq), v2]``.  On static shapes TVM's simplifier drops the
modulo; on symbolic ones it cannot, and ``AnnotateTIROpPattern`` then calls the function
opaque, so ``FuseOps`` fuses nothing with it: a dynamic BERT ran every reshape as a function
of its own, twice as many calls as the static build.

Entry point: :class:`SimplifyIndices`, a module pass between ``LegalizeOps`` and
``AnnotateTIROpPattern`` (:mod:`tir_byoc.relax.pipeline`).  In each PrimFunc whose buffers have
symbolic dims, every block's loads and read regions have their indices simplified by TVM's
iterator-map analysis over the block's iterator domains (``tvm.sym.iter_map_simplify``), which
rewrites ``(v0 * seq + v1) % (batch * seq)`` to ``v0 * seq + v1`` because that sum never
reaches ``batch * seq``.  The rewrite is exact: each index has the same value at every point
of the domains; where the analysis proves nothing, the index is kept.  PrimFuncs of static
shapes are left as they are.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, s_tir, sym, tirx


def _symbolic(func: tirx.PrimFunc) -> bool:
    """Whether a buffer parameter of ``func`` has a dim that is not an integer."""
    return any(
        not isinstance(dim, tirx.IntImm)
        for param in func.params
        if isinstance(param.ty, tirx.BufferType)
        for dim in param.ty.shape
    )


def _simplified(indices, domains, split_radix: bool = False) -> list | None:
    """``indices`` simplified over ``domains`` (and by :func:`_split_radix` if asked), or None
    where nothing changes."""
    if not indices:
        return None
    new = list(
        sym.iter_map_simplify(list(indices), domains, True, simplify_trivial_iterators=False)
    )
    if len(new) != len(indices):
        return None
    if split_radix:
        analyzer = sym.Analyzer()
        for var, dom in domains.items():
            analyzer.bind(var, dom)
        new = [_split_radix(index, analyzer) for index in new]
    if all(tvm_ffi.structural_equal(a, b) for a, b in zip(new, indices, strict=True)):
        return None
    return new


def factors(expr) -> list:
    """The factors ``expr`` is a product of (``batch * seq * 4``: batch, seq and 4)."""
    if isinstance(expr, tirx.Mul):
        return factors(expr.a) + factors(expr.b)
    return [expr]


def _terms(expr) -> list:
    """The terms ``expr`` sums, products of sums distributed (``(a * s + b) * s``: ``a * s * s``
    and ``b * s``)."""
    if isinstance(expr, tirx.Add):
        return _terms(expr.a) + _terms(expr.b)
    if isinstance(expr, tirx.Mul):
        left, right = _terms(expr.a), _terms(expr.b)
        if len(left) > 1 or len(right) > 1:
            return [a * b for a in left for b in right]
    return [expr]


def _product(factors, dtype):
    if not factors:
        return tirx.const(1, dtype)
    result = factors[0]
    for factor in factors[1:]:
        result = result * factor
    return result


def _without(factors: list, removed: list) -> list | None:
    """``factors`` less each of ``removed`` (structurally), or None if one is missing."""
    left = list(factors)
    for factor in removed:
        at = next((i for i, f in enumerate(left) if tvm_ffi.structural_equal(f, factor)), None)
        if at is None:
            return None
        del left[at]
    return left


def _below(r, bound: list, analyzer: sym.Analyzer) -> bool:
    """Whether ``0 <= r < product(bound)`` is provable: directly, or ``r = q * f + r'`` with
    ``f`` the last factor, ``0 <= r' < f`` and ``0 <= q < product(the others)`` (then
    ``r <= (P - 1) * f + f - 1``): ``v1 * seq + v2`` is below ``seq * seq``."""
    dtype = r.ty.dtype
    if analyzer.can_prove(r >= 0) and analyzer.can_prove(r < _product(bound, dtype)):
        return True
    if len(bound) < 2:
        return False
    quotients, rest = [], []
    for term in _terms(r):
        left = _without(factors(term), bound[-1:])
        (quotients if left is not None else rest).append(left or term)
    if not quotients:
        return False
    q = sum((_product(f, dtype) for f in quotients[1:]), _product(quotients[0], dtype))
    rest_sum = sum(rest[1:], rest[0]) if rest else tirx.const(0, dtype)
    return _below(rest_sum, bound[-1:], analyzer) and _below(q, bound[:-1], analyzer)


def _split_radix(expr, analyzer: sym.Analyzer):
    """``expr`` with each ``(p * s + r) // (s * k)`` written ``p // k`` and each
    ``(p * s + r) % (s * k)`` written ``p % k * s + r``, where ``s`` is a product of symbolic
    dims, ``k`` a constant and ``0 <= r < s`` provable over the iterators: a reshape's
    linear index taken apart again (iterator-map analysis does not split by a symbolic
    extent).  Exact: ``p * s + r`` lies in ``[p * s, p * s + s)``, so its quotient by
    ``s * k`` is ``p``'s by ``k``."""

    def rewrite(node, mutator):
        node = mutator.default_mutate(node)
        divisor = factors(node.b)
        constants = [f for f in divisor if isinstance(f, tirx.IntImm)]
        symbolic = [f for f in divisor if not isinstance(f, tirx.IntImm)]
        if not symbolic:
            return node
        dtype = node.a.ty.dtype
        quotients, rest = [], []
        for term in _terms(node.a):
            left = _without(factors(term), symbolic)
            (quotients if left is not None else rest).append(left or term)
        if not quotients:
            return node
        s, k = _product(symbolic, dtype), _product(constants, dtype)
        r = sum(rest[1:], rest[0]) if rest else tirx.const(0, dtype)
        if not _below(r, symbolic, analyzer):
            return node
        p = sum((_product(q, dtype) for q in quotients[1:]), _product(quotients[0], dtype))
        if isinstance(node, tirx.FloorDiv):
            return analyzer.simplify(tirx.floordiv(p, k))
        return analyzer.simplify(tirx.floormod(p, k) * s + r)

    return tvm_ffi.structural_mutate(expr, [(tirx.FloorDiv, rewrite), (tirx.FloorMod, rewrite)])


def simplify_block(block: s_tir.SBlock, split_radix: bool = False) -> s_tir.SBlock | None:
    """``block`` with its loads and read regions simplified, or None if nothing changes.  The
    default CPU rules call it again once inlining has composed a fused function's indices,
    with ``split_radix`` (:func:`_split_radix`; the pass before fusion leaves it off, so that
    what fuses is decided on the indices as ``LegalizeOps`` wrote them)."""
    domains = {iv.var: iv.dom for iv in block.iter_vars}
    if not domains:
        return None
    changed = []

    def on_load(load, mutator):
        load = mutator.default_mutate(load)  # loads inside its indices first (a gather)
        new = _simplified(load.indices, domains, split_radix)
        if new is None:
            return load
        changed.append(load)
        return load.source[tuple(new)]

    body = tvm_ffi.structural_mutate(block.body, [(ir.TensorLoad, on_load)])
    if not changed:
        return None
    reads = []
    for region in block.reads:
        ranges = list(region.region)
        new = None
        if all(isinstance(r.extent, tirx.IntImm) and r.extent.value == 1 for r in ranges):
            new = _simplified([r.min for r in ranges], domains, split_radix)
        if new is not None:
            ranges = [tvm.ir.Range.from_min_extent(m, r.extent) for m, r in zip(new, ranges)]
            region = ir.TensorRegion(region.source, ranges, region.ty)
        reads.append(region)
    return s_tir.SBlock(
        block.iter_vars,
        reads,
        block.writes,
        block.name_hint,
        body,
        block.init,
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )


def simplify(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the indices of its blocks simplified (see the module docstring)."""
    if not _symbolic(func):
        return func

    def on_block(block, mutator):
        block = mutator.default_mutate(block)  # the blocks inside it first
        return simplify_block(block) or block

    body = tvm_ffi.structural_mutate(func.body, [(s_tir.SBlock, on_block)])
    return func if body.same_as(func.body) else func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.SimplifyIndices")
class SimplifyIndices:
    """Every PrimFunc of symbolic shapes with its index expressions simplified."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gvar, func in mod.functions_items():
            if isinstance(func, tirx.PrimFunc):
                new = simplify(func)
                if not new.same_as(func):
                    updates[gvar] = new
        if not updates:
            return mod
        mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod


#: ``AnnotateTIROpPattern``'s kinds: injective, and opaque.
INJECTIVE, OPAQUE = 2, 8


def _pure_copy(func: tirx.PrimFunc) -> bool:
    """One spatial block that stores ``out[v...] = x[f(v)]``: its iterators as the store's
    indices, one load whose indices read no tensor (a reshape, not a gather)."""
    blocks = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
    blocks = [b for b in blocks if b.iter_vars]
    if len(blocks) != 1 or blocks[0].init is not None:
        return False
    block = blocks[0]
    if any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
        return False
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, ir.TensorLoad):
        return False
    if [str(i) for i in store.indices] != [str(iv.var) for iv in block.iter_vars]:
        return False
    nested = []
    for index in store.value.indices:
        tvm_ffi.structural_walk(index, (ir.TensorLoad, nested.append))
    return not nested


@tvm.transform.module_pass(opt_level=0, name="tir_byoc.MarkSymbolicCopies")
class MarkSymbolicCopies:
    """After ``AnnotateTIROpPattern``: a PrimFunc of symbolic shapes that it calls opaque but
    that only copies (a reshape of ``(batch * seq, 64)`` to ``(batch, seq, 64)``) marked
    injective, as the same reshape of static shapes is, so that ``FuseOps`` fuses it with its
    neighbours.  The pattern decides fusion only; nothing computed changes."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or not _symbolic(func):
                continue
            if int((func.attrs or {}).get("op_pattern", -1)) == OPAQUE and _pure_copy(func):
                updates[gvar] = func.with_attr("op_pattern", INJECTIVE)
        if not updates:
            return mod
        mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod


__all__ = [
    "INJECTIVE",
    "OPAQUE",
    "MarkSymbolicCopies",
    "SimplifyIndices",
    "factors",
    "simplify",
    "simplify_block",
]
