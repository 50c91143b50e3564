"""S-TIR facts, read once per function: leaf loop nests, buffers and their uses.

:class:`FunctionIndex` walks a PrimFunc once (plain loops without SBlocks are lifted into the
blocks they denote by :mod:`tir_byoc.plain_loops`); :func:`check_binding`,
:func:`check_covers` and :func:`compact_global` are the checks a loop nest and its buffers
must pass before a kernel may replace it (with :func:`.extents.check_shape`; :class:`Extents`
proving extents equal is :mod:`.extents`'s, imported here for the modules that read it here).

Used by the matcher's analyses (:mod:`.reduction`, :mod:`.epilogue`, :mod:`.chain`) and by
:mod:`tir_byoc.relax.copy_map`, which reads the same facts to prove a weight copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import tvm
from tvm import ir, s_tir, tirx
from tvm.tirx.layout import TileLayout

from ..decline import Declined
from ..plain_loops import Unread, lift_nest, loop_dtype_refusal, perfect_loops
from .exprs import (
    const_value,
    expr_text,
    is_buffer,
    is_zero,
    shape_of,
)
from .extents import Extents, dim_names
from .traversal import elements, walk

_UNDEFINED_VARS = tvm.get_global_func("tirx.analysis.UndefinedVars")

DATA_PAR = 0
_THREAD_BINDING = tirx.ForKind.THREAD_BINDING


COMM_REDUCE = 2


def compact_global(var) -> str | None:
    """Why a buffer cannot be handed to a C kernel as a dense row-major array, or None."""
    ty = var.ty
    # Buffers of functions without SBlocks carry their row-major layout explicitly.
    if ty.layout is not None and not (isinstance(ty.layout, TileLayout) and ty.layout.is_trivial()):
        return f"buffer {var.name} has a custom layout"
    if str(ty.storage_scope) not in ("global", ""):
        return f"buffer {var.name} lives in scope {ty.storage_scope!r}, not global memory"
    strides = elements(ty.strides)
    if strides:
        shape = shape_of(var)
        expected = 1
        for dim in reversed(range(len(shape))):
            value = const_value(strides[dim])
            if value is None or value != expected:
                return f"buffer {var.name} has non-compact strides {list(strides)}"
            extent = const_value(shape[dim])
            if extent is None and dim > 0:
                return f"buffer {var.name} has explicit strides with a symbolic shape"
            expected *= extent if extent is not None else 1
    return None


class fact:
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first
    read, several microseconds): a fact of an immutable record, computed on first read."""

    def __init__(self, compute):
        self.compute = compute
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, record, owner=None):
        if record is None:
            return self
        value = record.__dict__[self.name] = self.compute(record)
        return value


class BufferSet:
    """A set of buffers, by identity, as a ``set`` of buffer Vars is, but asked by handle.

    Two reads of one buffer give two Python objects, which a ``set`` compares with ``==``:
    an expression of TVM's, built and then asked whether both sides are the same node.
    """

    def __init__(self, buffers=()):
        self._by_handle = {}
        self.update(buffers)

    def __contains__(self, buffer) -> bool:
        return isinstance(buffer, ir.Var) and buffer.__chandle__() in self._by_handle

    def __iter__(self):
        return iter(self._by_handle.values())

    def __len__(self) -> int:
        return len(self._by_handle)

    def add(self, buffer) -> None:
        self._by_handle.setdefault(buffer.__chandle__(), buffer)

    def update(self, buffers) -> None:
        for buffer in buffers:
            self.add(buffer)


class Iterator(NamedTuple):
    """A block iterator, its fields read once."""

    var: tirx.Var
    handle: int  # the variable's handle, to find it by
    iter_type: int  # DATA_PAR, COMM_REDUCE, ...
    min: tvm.ir.PrimExpr
    extent: tvm.ir.PrimExpr


def read_iterator(iter_var) -> Iterator:
    var, dom = iter_var.var, iter_var.dom
    return Iterator(var, var.__chandle__(), iter_var.iter_type, dom.min, dom.extent)


@dataclass(frozen=True)
class Nest:
    """A leaf SBlock with the perfectly nested loops directly around it."""

    stmt: tirx.Stmt
    loops: tuple[tirx.For, ...]
    realize: s_tir.SBlockRealize
    block: s_tir.SBlock
    seq: int  # id of the enclosing statement list (-1 when not in a SeqStmt)
    index: int  # position in that list

    # Facts read from the FFI once: every read of a node's field is a call into it.
    @fact
    def name(self) -> str:
        return self.block.name_hint

    @fact
    def iterators(self) -> tuple[Iterator, ...]:
        """The block's iterators."""
        return tuple(map(read_iterator, elements(self.block.iter_vars)))

    @fact
    def out(self) -> ir.Var:
        """The buffer the block stores to."""
        return self.block.body.buffer


def unwrap_nest(stmt):
    """(loops, realize) if ``stmt`` is a perfect loop nest around a leaf SBlock."""
    loops, inner = perfect_loops(stmt)
    if isinstance(inner, s_tir.SBlockRealize) and is_leaf(inner.block):
        return loops, inner
    return None


def is_leaf(block) -> bool:
    return isinstance(block.body, tirx.BufferStore)


def is_s_tir(func: tirx.PrimFunc) -> bool:
    """True if ``func`` is written with SBlocks (S-TIR); otherwise it is read as plain loops."""
    return isinstance(func.body, s_tir.SBlockRealize)


def is_spatial(block) -> bool:
    return all(iv.iter_type == DATA_PAR for iv in elements(block.iter_vars))


class FunctionIndex:
    """One pass over a PrimFunc: its leaf nests, allocations, views and buffer uses.

    In a function without SBlocks (plain loops, as TVM's lowering leaves them), each perfect
    loop nest around one store is read as the SBlock it denotes (:mod:`tir_byoc.plain_loops`);
    one with a loop over another dtype than int32 or int64 is kept in :attr:`unread`, and
    counts as other code.

    The buffer uses (:attr:`owners`, :attr:`uses`) are found on the first question about
    them: a function with no GEMM candidate never asks, and finding them reads the whole
    function.
    """

    def __init__(self, func: tirx.PrimFunc):
        self.params = BufferSet(p for p in elements(func.params) if is_buffer(p))
        self.local = BufferSet()  # buffers allocated inside the function
        self.views = BufferSet()  # buffers declared over another's storage
        self.nests: list[Nest] = []
        self.inner_blocks: list[s_tir.SBlock] = []  # blocks that are not single-store leaves
        self.unread: list[Unread] = []  # plain loop nests over loops the matcher does not read
        self.sequences: dict[int, list[tirx.Stmt]] = {}
        # (node, owner, walked): the uses to count, in program order; a node not walked is
        # a buffer used once.
        self._noted: list[tuple[object, int, bool]] = []
        self._owners: dict[ir.Var, dict[int, int]] | None = None
        self._owners_by_handle: dict[int, dict[int, int]] = {}  # the same, by buffer handle
        self._uses: dict[int, set[ir.Var]] = {}
        self._lifted_names = set() if not is_s_tir(func) else None
        self._visit(func.body, seq=-1, index=0)
        self._positions = {(n.seq, n.index): p for p, n in enumerate(self.nests) if n.seq >= 0}

    # Step 1. Structure: find nests and allocations; note what uses buffers, and who.
    def _visit(self, stmt, seq, index):
        nest = unwrap_nest(stmt)
        if nest is None and self._lifted_names is not None:
            nest = lift_nest(stmt, self._lifted_names)
            if isinstance(nest, Unread):
                self.unread.append(nest)
                self._noted.append((stmt, -1, True))  # other code, read whole
                return
        if nest is not None:
            loops, realize = nest
            position = len(self.nests)
            self.nests.append(Nest(stmt, loops, realize, realize.block, seq, index))
            self._noted.append((stmt, position, True))
            return
        if isinstance(stmt, tirx.SeqStmt):
            key = len(self.sequences)
            self.sequences[key] = list(elements(stmt.seq))
            for i, child in enumerate(self.sequences[key]):
                self._visit(child, key, i)
        elif isinstance(stmt, s_tir.SBlockRealize):
            block = stmt.block
            self.inner_blocks.append(block)
            self.local.update(elements(block.alloc_buffers))
            self.views.update(m.buffer for m in elements(block.match_buffers))
            for region in (*elements(block.reads), *elements(block.writes)):
                self._noted.append((region.source, -1, False))
            self._noted.append((stmt.iter_values, -1, True))
            self._noted.append((stmt.predicate, -1, True))
            if block.init is not None:
                self._visit(block.init, -1, 0)
            self._visit(block.body, -1, 0)
        elif isinstance(stmt, tirx.For):
            self._noted.append(([stmt.min, stmt.extent], -1, True))
            self._visit(stmt.body, -1, 0)
        elif isinstance(stmt, tirx.AllocBuffer):
            self.local.add(stmt.buffer)
        elif isinstance(stmt, tirx.DeclBuffer):
            self.views.add(stmt.buffer)
            self._noted.append((stmt.data, -1, True))
        elif isinstance(stmt, tirx.IfThenElse):
            self._noted.append((stmt.condition, -1, True))
            self._visit(stmt.then_case, -1, 0)
            if stmt.else_case is not None:
                self._visit(stmt.else_case, -1, 0)
        else:
            self._noted.append((stmt, -1, True))

    # Step 2. Find each owner's buffers (an owner is a nest's position, or -1 for other code).
    @property
    def owners(self) -> dict[ir.Var, dict[int, int]]:
        """Buffer -> {position of a nest that uses it, or -1 for other code: how many of that
        owner's statements and expressions use it}."""
        if self._owners is None:
            self._count()
        return self._owners

    def owners_of(self, buffer) -> dict[int, int]:
        """``owners[buffer]``, or {} for a buffer nothing uses.

        Looked up by the buffer's handle: a buffer read from another node is another Python
        object, which a dict keyed by buffers compares through an expression of ``==``.
        """
        if self._owners is None:
            self._count()
        return self._owners_by_handle.get(buffer.__chandle__(), {})

    @property
    def uses(self) -> dict[int, set[ir.Var]]:
        """Position of a nest -> the buffers it uses."""
        if self._owners is None:
            self._count()
        return self._uses

    def _count(self):
        self._owners = {}
        found = {}  # handle -> [the variable (one object per variable), its counts, is a buffer]
        for node, owner, walked in self._noted:
            if not walked:
                variables = (node,)
            elif isinstance(node, tirx.Stmt):
                # The variables it uses but does not define, each once, found in C++: a nest
                # holds five times as many variables (its loops' and iterators'), and none
                # of the buffers it defines can be used outside it.
                variables = elements(_UNDEFINED_VARS(node, []))
            else:  # a walk counts buffers only
                variables = []
                walk(node, ir.Var, variables.append)  # a builtin callback: no Python frame
            for var in variables:
                handle = var.__chandle__()
                entry = found.get(handle)
                if entry is None:
                    entry = found[handle] = [var, None, is_buffer(var)]
                if walked and not entry[2]:
                    continue
                var, counts = entry[0], entry[1]
                if counts is None:
                    counts = entry[1] = self._owners[var] = self._owners_by_handle[handle] = {}
                counts[owner] = counts.get(owner, 0) + 1
                if owner >= 0:
                    self._uses.setdefault(owner, set()).add(var)

    # Step 3. Queries.
    def only_used_by(self, buffer, *positions) -> bool:
        return set(self.owners_of(buffer)) <= set(positions)

    def other_users(self, buffer, *positions) -> list[str]:
        names = []
        for owner in self.owners_of(buffer):
            if owner in positions:
                continue
            names.append(f"block {self.nests[owner].name}" if owner >= 0 else "other code")
        return names

    def siblings_after(self, nest: Nest):
        """(position or None, statement) of each statement after ``nest`` in its list.

        The position is the nest's index in :attr:`nests`, None for a statement that is not a
        leaf nest; allocation statements are left out (they only declare a buffer).
        """
        stmts = self.sequences.get(nest.seq, []) if nest.seq >= 0 else []
        for following in range(nest.index + 1, len(stmts)):
            if not isinstance(stmts[following], tirx.AllocBuffer):
                yield self._positions.get((nest.seq, following)), stmts[following]

    def sibling_before(self, nest: Nest) -> int | None:
        """Position of the nest that directly precedes ``nest`` in its statement list."""
        stmts = self.sequences.get(nest.seq, []) if nest.seq >= 0 else []
        before = nest.index - 1
        while before >= 0 and isinstance(stmts[before], tirx.AllocBuffer):
            before -= 1
        return self._positions.get((nest.seq, before)) if before >= 0 else None


def check_loop_dtype(var, what: str) -> None:
    """The loop (or iterator) over ``var`` runs over int32 or int64."""
    reason = loop_dtype_refusal(var, what)
    if reason is not None:
        raise Declined(reason)


def check_binding(nest: Nest, extents: Extents) -> None:
    """Each block iterator is one loop of the nest, running over the iterator's whole domain."""
    block, realize = nest.block, nest.realize
    if const_value(realize.predicate) != 1:
        raise Declined(f"block {block.name_hint} has a predicate, so it skips part of its domain")
    iterators = nest.iterators
    for loop in nest.loops:
        check_loop_dtype(loop.loop_var, "loop")
    for iterator in iterators:
        check_loop_dtype(iterator.var, "iterator")
    if len(nest.loops) != len(iterators):
        raise Declined(
            f"block {block.name_hint} has {len(iterators)} iterators but "
            f"{len(nest.loops)} loops around it (the loop nest is scheduled or shared)"
        )
    # Variables by handle: the same variable read twice comes back as two Python objects.
    loop_by_var = {loop.loop_var.__chandle__(): loop for loop in nest.loops}
    used = set()
    for iterator, value in zip(iterators, elements(realize.iter_values)):
        handle = value.__chandle__() if isinstance(value, tirx.Var) else None
        loop = loop_by_var.get(handle)
        if loop is None or handle in used:
            raise Declined(
                f"iterator {iterator.var.name} of block {block.name_hint} is bound to "
                f"{value}, not to a loop of its own nest (split, fused or shared loops)"
            )
        used.add(handle)
        if not is_zero(iterator.min) or not is_zero(loop.min):
            raise Declined(f"iterator {iterator.var.name} does not start at 0")
        if not extents.equal(loop.extent, iterator.extent):
            raise Declined(
                f"loop {loop.loop_var.name} runs over {expr_text(loop.extent)} iterations, "
                f"but iterator {iterator.var.name} spans {expr_text(iterator.extent)}"
            )
        if loop.kind == _THREAD_BINDING or (loop.step is not None and const_value(loop.step) != 1):
            raise Declined(f"loop {loop.loop_var.name} is thread-bound or strided")


def check_covers(nest: Nest, indices, dims, extents: Extents) -> None:
    """The block's iterators run over the whole output, as the kernel writes all of it."""
    by_var = {it.handle: it for it in reversed(nest.iterators)}  # the first wins
    for var, dim, name in zip(indices, dims, dim_names(len(dims))):
        extent = by_var[var.__chandle__()].extent
        if not extents.equal(extent, dim):
            raise Declined(
                f"block {nest.name} covers {expr_text(extent)} of "
                f"{name} = {expr_text(dim)} (the kernel would write all of it)"
            )


def buffers_used(stmt) -> set:
    found = set()
    walk(stmt, ir.Var, lambda var: found.add(var) if is_buffer(var) else None)
    return found
