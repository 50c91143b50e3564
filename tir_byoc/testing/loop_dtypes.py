"""Plain loops over other integer dtypes than the int32 and int64 that TVM's lowering gives.

Entry point: :func:`retype_loops`.  TVMScript takes a loop over any integer type
(``for i in range(T.uint32(128))``, from TVM's own parser tests), and a matcher that builds
block iterators from loops must not stumble on one: TVM's ``IterVar`` takes no unsigned type.
:func:`retype_loops` turns some loops of a function without SBlocks into loops over another
dtype, the variable used as it is where TVM takes any integer (a buffer index, a ``k == 0``
guard) and cast back elsewhere, so that the function stays well typed.  What it computes is
the same as long as each retyped loop's values fit the new dtype.
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

from ..match.traversal import elements, walk

#: The integer dtypes a loop variable can have (TVM's ``For`` takes each).
LOOP_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _fits(value: int, dtype: str) -> bool:
    bits = int(dtype.removeprefix("u").removeprefix("int"))
    if dtype.startswith("u"):
        return 0 <= value < 2**bits
    return -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)


def _bound(expr, dtype: str):
    """A loop's start or extent in ``dtype``: a constant converted, anything else cast."""
    if isinstance(expr, tirx.IntImm):
        return tirx.IntImm(dtype, expr.value) if _fits(expr.value, dtype) else None
    return expr if str(expr.ty.dtype) == dtype else tirx.Cast(dtype, expr)


def retype_loops(func: tirx.PrimFunc, dtype: str, picked: int = -1) -> tirx.PrimFunc:
    """``func`` with the loops ``picked`` selects running over ``dtype``.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A function without SBlocks (plain loops).
    dtype : str
        One of :data:`LOOP_DTYPES`.
    picked : int
        A bit mask over the loops in the order a walk meets them (innermost first): bit
        ``p % 16`` picks loop ``p``; -1 picks every loop.  A loop whose constant start or
        extent does not fit ``dtype`` keeps its own.

    Returns
    -------
    tvm.tirx.PrimFunc
    """
    if dtype not in LOOP_DTYPES:
        raise ValueError(f"retype_loops: expected a dtype of {LOOP_DTYPES}, got {dtype!r}")
    # Step 1. The loops to retype, and each one's new variable and bounds.
    loops = []
    walk(func.body, tirx.For, loops.append)
    retyped = {}  # old variable's handle -> (new variable, old dtype, start, extent)
    for position, loop in enumerate(loops):
        old = loop.loop_var
        start, extent = _bound(loop.min, dtype), _bound(loop.extent, dtype)
        if not (picked >> (position % 16)) & 1 or start is None or extent is None:
            continue
        retyped[old.__chandle__()] = (tirx.Var(old.name, dtype), str(old.ty.dtype), start, extent)
    if not retyped:
        return func

    # Step 2. Rewrite: the new variable itself as an index and in a k == 0 guard, else a cast.
    def new_var(expr):
        entry = retyped.get(expr.__chandle__()) if isinstance(expr, tirx.Var) else None
        return entry[0] if entry is not None else None

    def index(expr, mutator):
        replaced = new_var(expr)
        return replaced if replaced is not None else mutator.mutate(expr)

    def indices(node, mutator):
        return [index(i, mutator) for i in elements(node.indices)]

    def on_loop(loop, mutator):
        entry = retyped.get(loop.loop_var.__chandle__())
        if entry is None:
            return mutator.default_mutate(loop)
        var, _, start, extent = entry
        body = mutator.mutate(loop.body)
        return tirx.For(var, start, extent, loop.kind, body, None, loop.annotations)

    def on_store(store, mutator):
        return tirx.BufferStore(store.buffer, mutator.mutate(store.value), indices(store, mutator))

    def on_load(load, mutator):
        return tirx.BufferLoad(load.source, indices(load, mutator))

    def on_eq(eq, mutator):
        sides = [eq.a, eq.b]
        for this, other in ((0, 1), (1, 0)):
            replaced, constant = new_var(sides[this]), sides[other]
            if replaced is not None and isinstance(constant, tirx.IntImm):
                if _fits(constant.value, dtype):
                    sides[this], sides[other] = replaced, tirx.IntImm(dtype, constant.value)
                    return tirx.EQ(*sides)
        return mutator.default_mutate(eq)

    def on_var(var, _mutator):
        entry = retyped.get(var.__chandle__())
        return var if entry is None else tirx.Cast(entry[1], entry[0])

    body = tvm_ffi.structural_mutate(
        func.body,
        [
            (tirx.For, on_loop),
            (tirx.BufferStore, on_store),
            (ir.TensorLoad, on_load),
            (tirx.EQ, on_eq),
            (tirx.Var, on_var),
        ],
    )
    return func.with_body(body)


__all__ = ["LOOP_DTYPES", "retype_loops"]
