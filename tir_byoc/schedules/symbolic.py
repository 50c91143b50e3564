"""What the default rules do on top of their schedule when extents are symbolic.

On static shapes TVM's simplifier folds the index arithmetic that inlining and ``compute_at``
write; on symbolic ones it cannot (it does not know a dim is positive, nor that an iterator
stays below a symbolic extent), and the code that results divides by ``seq`` per element or
cannot be vectorised.  Two rewrites, both exact (each expression keeps its value wherever it
is evaluated):

- :func:`simplify_indices`: a block's loads simplified over its iterators, after inlining
  (:class:`~.elementwise.Elementwise`, :class:`~.reduction.RowReduction`);
- :func:`simplify_row_body`: the loops and predicates ``compute_at`` writes inside a parallel
  row loop, simplified knowing that each dim multiplying that loop's extent is at least 1
  there (:class:`~.rows.VectorRows`).
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, sym, tirx

from ..relax.symbolic_indices import factors, simplify_block


def simplify_indices(sch: s_tir.Schedule, blocks) -> None:
    """Simplify the indices of ``blocks`` (dlight ``SBlockInfo``) over their iterators, as
    :mod:`tir_byoc.relax.symbolic_indices` does before fusion: inlining a fused function's
    reshape, transpose and reshape into one block composes their indices again.  Blocks of
    static extents are left alone."""
    for info in blocks:
        block = sch.get(info.block_rv)
        if all(isinstance(iv.dom.extent, tirx.IntImm) for iv in block.iter_vars):
            continue
        simplified = simplify_block(block, split_radix=True)
        if simplified is not None:
            sch.state.replace(sch.get_sref(info.block_rv), simplified, {block: simplified})


def simplify_row_body(sch: s_tir.Schedule, row_loop) -> None:
    """Simplify the loop extents, bindings and predicates inside ``row_loop``.

    ``compute_at`` of a row's blocks on symbolic extents writes the region a block must
    cover as ``max(1, (seq + 15) // 16 * 16) - min(0, (seq + 15) // 16 * 16 - 1)`` and a
    predicate of three conditions, because ``seq`` could be 0 as far as it knows; TVM's
    ``LoopPartition`` then cannot split off the whole vectors, and the vectoriser turns the
    loop into scalar code (a dynamic GPT-2's softmax at 4 x 128 took 2.4 times the static
    build's time).  Inside ``row_loop`` every dim that multiplies its extent is at least 1
    (else the loop has no iteration), and each loop's iterator from 0 up is at least 0, so
    these simplify to ``(seq + 15) // 16`` and ``v < seq``; nothing else is assumed."""
    loop = sch.get(row_loop)
    analyzer = sym.Analyzer()
    for var in [f for f in factors(loop.extent) if isinstance(f, tirx.Var)]:
        analyzer.update(var, sym.ConstIntBound(1, sym.ConstIntBound.POS_INF), True)

    def on_for(stmt, mutator):
        if isinstance(stmt.min, tirx.IntImm) and stmt.min.value == 0:  # its iterator is >= 0
            analyzer.update(stmt.loop_var, sym.ConstIntBound(0, sym.ConstIntBound.POS_INF), True)
        stmt = mutator.default_mutate(stmt)
        extent = analyzer.simplify(stmt.extent)
        if extent.same_as(stmt.extent):
            return stmt
        return tirx.For(
            stmt.loop_var,
            stmt.min,
            extent,
            stmt.kind,
            stmt.body,
            stmt.thread_binding,
            stmt.annotations,
        )

    def on_realize(realize, _mutator):
        values = [analyzer.simplify(v) for v in realize.iter_values]
        predicate = analyzer.simplify(realize.predicate)
        return s_tir.SBlockRealize(values, predicate, realize.block)

    body = tvm_ffi.structural_mutate(
        loop.body, [(tirx.For, on_for), (s_tir.SBlockRealize, on_realize)]
    )
    if tvm_ffi.structural_equal(body, loop.body):
        return
    blocks = []
    tvm_ffi.structural_walk(loop.body, (s_tir.SBlock, blocks.append))
    replaced = tirx.For(
        loop.loop_var,
        loop.min,
        loop.extent,
        loop.kind,
        body,
        loop.thread_binding,
        loop.annotations,
    )
    sch.state.replace(sch.get_sref(row_loop), replaced, {b: b for b in blocks})
