"""A parallel loop nest with little work runs on one thread, decided when the extents are known.

Entry point: :func:`serial_when_small`, run on each function a rule has scheduled.

Starting TVM's thread pool costs a few microseconds, about what :data:`~.loops.MIN_PARALLEL_WORK`
iterations of elementwise work take.  A rule that sees a block's extents decides when it
schedules it (:func:`~.loops._parallel`), but some rules run every row in parallel whatever the
count (dlight's, :class:`~.rows.VectorRows`), and on a symbolic extent no rule can tell: a
dynamic BERT at batch 1 x sequence 32 started the pool for 12 blocks a static build of that
size runs on one thread, and at two threads each start woke the second core between two library
calls, which then waited for it.

Each parallel loop of a scheduled function is therefore weighed by the iterations of its whole
nest (every loop and block under it, reductions and their inits included):

- static and below the threshold: the loop runs serially;
- symbolic: the nest is written twice behind a test of its iteration count, serial below the
  threshold and parallel from it.  The serial copy gets buffers of its own for the
  intermediates only this nest uses (so that TVM still allocates each where the nest uses it,
  one row per iteration, not one for every row), both copies sit in an opaque block that
  allocates them, and everything else the copy defines (its loops, block iterators and
  bindings) is a fresh variable too, so that the function stays well formed.
- symbolic but at the threshold or above whenever every symbolic extent is at least 1: it
  stays parallel, with no serial copy.

A nest whose inner extents depend on an iterator of its own (a triangular loop) is not weighed:
it stays parallel.  Neither copy changes what is computed, only on how many threads.
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import s_tir, sym, tirx
from tvm.tirx import _ffi_api as _tirx_ffi

from ..match.exprs import as_int64, const_value
from .loops import MIN_PARALLEL_WORK


def nest_work(stmt: tirx.Stmt) -> tirx.PrimExpr | None:
    """The iterations of every statement under ``stmt`` (loops multiply, sequences add), as an
    int64 expression over what is defined outside it; None if an extent reads a variable the
    nest defines."""
    defined: list = []

    def work(node) -> tirx.PrimExpr | None:
        if isinstance(node, tirx.For):
            defined.append(node.loop_var)
            body = work(node.body)
            if body is None or _reads_any(node.extent, defined):
                return None
            return as_int64(node.extent) * body
        if isinstance(node, tirx.SeqStmt):
            parts = [work(s) for s in node.seq]
            return None if any(p is None for p in parts) else sum(parts[1:], parts[0])
        if isinstance(node, s_tir.SBlockRealize):
            block = node.block
            defined.extend(iv.var for iv in block.iter_vars)
            parts = [work(block.body)] + ([work(block.init)] if block.init is not None else [])
            return None if any(p is None for p in parts) else sum(parts[1:], parts[0])
        if isinstance(node, tirx.IfThenElse):
            parts = [work(node.then_case)]
            if node.else_case is not None:
                parts.append(work(node.else_case))
            return None if any(p is None for p in parts) else sum(parts[1:], parts[0])
        if isinstance(node, tirx.While):
            return None
        if isinstance(node, tirx.LetStmt):
            defined.append(node.var)
        body = getattr(node, "body", None)
        return work(body) if isinstance(body, tirx.Stmt) else tirx.IntImm("int64", 1)

    found = work(stmt)
    return None if found is None else sym.Analyzer().simplify(found)


def _reads_any(expr: tirx.PrimExpr, variables: list) -> bool:
    if not variables:
        return False
    read = []
    tvm_ffi.structural_walk(expr, (tirx.Var, read.append))
    return any(r.same_as(v) for r in read for v in variables)


def _block_names(stmt: tirx.Stmt) -> list[str]:
    names: list[str] = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, lambda b: names.append(b.name_hint)))
    return list(dict.fromkeys(names))


def _opaque(body: tirx.Stmt, buffers: list, name: str) -> s_tir.SBlockRealize:
    """``body`` in an opaque block allocating ``buffers``."""
    block = s_tir.SBlock([], [], [], name, body, alloc_buffers=buffers)
    return s_tir.SBlockRealize([], tirx.const(True, "bool"), block)


_DEFINITIONS = (tirx.For, s_tir.SBlock, tirx.LetStmt, tirx.Let, tirx.AllocBuffer, tirx.DeclBuffer)


def fresh_copy(stmt: tirx.Stmt, buffers: list = ()) -> tuple[tirx.Stmt, list]:
    """A copy of ``stmt`` that defines fresh variables, and the fresh ``buffers``: each of
    ``buffers`` (defined outside ``stmt``) and everything ``stmt`` itself defines (loop
    variables, block iterators, allocated and matched buffers, bindings, ``AllocBuffer`` and
    ``DeclBuffer``) replaced by a new variable of the same name and type, so that ``stmt`` and
    its copy can sit side by side in one well-formed function.  TVM's ``ConvertSSA`` renames
    loops and bindings, not block iterators nor buffers."""
    defined: list = list(buffers)

    def on_node(node):
        if isinstance(node, tirx.For):
            defined.append(node.loop_var)
        elif isinstance(node, s_tir.SBlock):
            defined.extend(iv.var for iv in node.iter_vars)
            defined.extend(node.alloc_buffers)
            defined.extend(m.buffer for m in node.match_buffers)
        elif isinstance(node, tirx.LetStmt | tirx.Let):
            defined.append(node.var)
        else:  # AllocBuffer, DeclBuffer
            defined.append(node.buffer)

    tvm_ffi.structural_walk(stmt, [(kind, on_node) for kind in _DEFINITIONS])
    fresh: dict = {}
    for var in defined:
        if var not in fresh:
            is_buffer = isinstance(var.ty, tirx.BufferType)
            fresh[var] = (
                _tirx_ffi.BufferVar(var.name, var.ty, None)
                if is_buffer
                else tirx.Var(var.name, var.ty)
            )

    def on_var(var, _mutator):
        return fresh.get(var, var)

    copy = tvm_ffi.structural_mutate(stmt, [(tirx.Var, on_var)])
    return copy, [fresh[b] for b in buffers]


def _never_small(work: tirx.PrimExpr) -> bool:
    """Whether ``work`` is at least ``MIN_PARALLEL_WORK`` whenever each of its variables (the
    function's symbolic extents) is at least 1."""
    analyzer = sym.Analyzer()
    for var in tirx.analysis.undefined_vars(work):
        analyzer.bind(var, tvm.ir.Range(1, 2**31))
    return analyzer.can_prove(work >= MIN_PARALLEL_WORK)


def serial_when_small(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, dict[str, str]]:
    """``func`` with each parallel loop nest of fewer than ``MIN_PARALLEL_WORK`` iterations on
    one thread: statically where its extents are static, by a test of its iteration count
    where they are symbolic (see the module docstring).

    Returns
    -------
    (tvm.tirx.PrimFunc, dict)
        The function (``func`` itself if nothing changed) and, per block of a changed nest, what
        now decides its threads.
    """
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize):
        return func, {}
    root = realize.block
    everywhere = _uses(root.body, root.alloc_buffers)
    notes: dict[str, str] = {}
    moved: list = []  # the intermediates only one symbolic nest uses, now allocated in it

    def on_for(loop, mutator):
        if loop.kind != tirx.ForKind.PARALLEL:
            return mutator.default_mutate(loop)
        work = nest_work(loop)
        if work is None:
            return loop
        serial = tirx.For(
            loop.loop_var,
            loop.min,
            loop.extent,
            tirx.ForKind.SERIAL,
            loop.body,
            loop.thread_binding,
            loop.annotations,
        )
        static = const_value(work)
        if static is not None:
            if static >= MIN_PARALLEL_WORK:
                return loop
            for name in _block_names(loop):
                notes[name] = f"{static} iterations, below {MIN_PARALLEL_WORK}: runs on one thread"
            return serial
        if _never_small(work):
            # No size of at least one in every dimension makes it small; its serial copy
            # could only run at a size of 0, where TVM's simplifier divides by that 0 (a fused
            # loop over 3 x b, split by `// b` and `% b`, failed to build so).
            return loop
        inside = _uses(loop, root.alloc_buffers)
        local = [b for b, count in inside.items() if count == everywhere[b]]
        moved.extend(local)
        for name in _block_names(loop):
            notes[name] = (
                f"runs on one thread below {MIN_PARALLEL_WORK} iterations of its loop nest "
                f"({_readable(work)} here), in parallel from there"
            )
        serial, serial_buffers = fresh_copy(serial, local)
        small = as_int64(work) < tirx.IntImm("int64", MIN_PARALLEL_WORK)
        return tirx.IfThenElse(
            small, _opaque(serial, serial_buffers, "serial_nest"), _opaque(loop, local, "nest")
        )

    body = tvm_ffi.structural_mutate(root.body, [(tirx.For, on_for)])
    if not notes:
        return func, {}
    root = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        body,
        root.init,
        [b for b in root.alloc_buffers if not any(b.same_as(m) for m in moved)],
        root.match_buffers,
        root.annotations,
    )
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, root)), notes


def _readable(expr: tirx.PrimExpr) -> str:
    """``expr`` as TVMScript prints it, less the ``T.int64(...)`` around each constant."""
    return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", str(expr))


def _uses(stmt: tirx.Stmt, buffers) -> dict:
    """How often each of ``buffers`` occurs in ``stmt`` (those that do)."""
    counts: dict = {}

    def on_var(var):
        for buffer in buffers:
            if var.same_as(buffer):
                counts[buffer] = counts.get(buffer, 0) + 1

    tvm_ffi.structural_walk(stmt, (tirx.Var, on_var))
    return counts
