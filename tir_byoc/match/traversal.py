"""Structural walks and mutations of TVM IR, without the per-call setup of the public API.

Entry points: :func:`walk`, :func:`contains` and :func:`mutate`, the matcher's only ways into
``tvm_ffi.structural_walk`` / ``tvm_ffi.structural_mutate``, and :func:`elements`, which
reads an FFI array.  They call the same FFI
functions (``ffi.StructuralWalk``, ``ffi.StructuralMutate``) with the same callback tables,
but build a table from type indices looked up once per node type, where the public wrappers
re-derive every type's index and, for a mutation, read each callback's signature with
:func:`inspect.signature` on every call: most of the time of a small expression's mutation,
which the matcher makes once per block of a chain.  Mutation callbacks here
always take ``(value, mutator)``.

Used by every other module of the matcher that walks IR; imports none of them.
"""

from __future__ import annotations

from itertools import repeat

import tvm_ffi

_STRUCTURAL_WALK = tvm_ffi.get_global_func("ffi.StructuralWalk")
_STRUCTURAL_MUTATE = tvm_ffi.get_global_func("ffi.StructuralMutate")
_ARRAY_SIZE = tvm_ffi.get_global_func("ffi.ArraySize")
_ARRAY_GET_ITEM = tvm_ffi.get_global_func("ffi.ArrayGetItem")
_POSTORDER = int(tvm_ffi.WalkOrder.POSTORDER)
_PREORDER = int(tvm_ffi.WalkOrder.PREORDER)

#: FFI object class -> its type index, filled on first use of each class.
_TYPE_INDEX: dict[type, int] = {}


def type_index(node_type: type) -> int:
    """The FFI type index a callback entry for ``node_type`` (an FFI object class) carries."""
    index = _TYPE_INDEX.get(node_type)
    if index is None:
        index = _TYPE_INDEX[node_type] = node_type.__tvm_ffi_type_info__.type_index
    return index


def walk(node, node_type: type, callback) -> None:
    """``tvm_ffi.structural_walk(node, (node_type, callback))``: ``callback(value)`` on every
    node of ``node_type`` (or a subclass) under ``node``, children first."""
    _STRUCTURAL_WALK(node, [(type_index(node_type), callback)], [], _POSTORDER)


def contains(node, node_type: type) -> bool:
    """Whether a node of ``node_type`` (or a subclass) is under ``node``: a walk parents first
    that stops at the first one."""
    found = _STRUCTURAL_WALK(node, [(type_index(node_type), _interrupt)], [], _PREORDER)
    return found is not None


def _interrupt(_node):
    return tvm_ffi.VisitInterrupt()


def mutate(node, callbacks):
    """``tvm_ffi.structural_mutate(node, callbacks)`` for ``(node_type, callback)`` pairs whose
    callbacks take ``(value, mutator)``; returns the mutated node."""
    entries = [(type_index(node_type), callback, False) for node_type, callback in callbacks]
    return _STRUCTURAL_MUTATE(node, entries)


def elements(array) -> tuple:
    """``tuple(array)`` for an FFI array, a third of the cost: iterating one from Python checks
    and normalises every index on its way to ``ffi.ArrayGetItem``."""
    size = _ARRAY_SIZE(array)
    return tuple(map(_ARRAY_GET_ITEM, repeat(array, size), range(size)))
