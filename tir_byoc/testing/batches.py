"""The batch dims of a chain: how its operands treat them, and the batch form they give it.

Entry points: :func:`batch_label`, the batch form the matcher gives a chain, read from spec
fields alone, and :func:`batch_problem`, what is wrong with a chain's batch fields.  Both take
the specs (:class:`~.specs.ProgramSpec`, :class:`~.specs.ChainSpec`) as they are and import
nothing of theirs: the specs check themselves with them.

The rules restate :func:`tir_byoc.match.reduction.batch_of` in terms of a spec:

1. Along each batch dim of the output, each operand has a stride: 0 where it lacks or
   broadcasts the dim, else the elements between its consecutive matrices along that axis
   (the product of the extents of its later axes: its matrix, M x K for X, N x K or K x N
   for W, and its later batch axes, of extent 1 where it broadcasts them).
2. Dims of static extent 1 are dropped.  A symbolic extent is kept whatever its run-time
   value: the matcher cannot prove it is 1.
3. A dim that is kept and that neither operand carries is refused ("indexes neither
   operand"): a positive never has one.
4. A kept dim merges into the kept dim before it when each operand steps over the two as
   over one dim: the outer stride is the inner stride times the inner extent, for X and for W.
5. The form is ``leading`` when no dim is kept, or when one merged dim remains along which W
   does not move (stride 0) and X moves by M x K: X and Y are then (B x M, K) and (B x M, N)
   matrices, and the 2-D kernel serves the chain.  Otherwise it is ``batched`` (a ``bmm_``
   call), which takes at most two merged dims; three would be refused, but a spec has at
   most two batch dims, so that rule never applies here.

Strides are compared as the matcher's arithmetic analyzer compares them: as a product of an
integer and symbolic extents (M, the batch dims), equal when the integers are equal and the
same symbols appear.  A product with integer 0 is 0.
"""

from __future__ import annotations

from dataclasses import dataclass

#: How an operand treats one batch dim of the output: it ``"carry"``-s it (an axis of the
#: same extent, indexed by the batch iterator), ``"broadcast"``-s it (an axis of extent 1,
#: indexed by 0) or ``"lack"``-s it (no axis at all: the operand has a lower rank and is
#: aligned to the output from the right, as NumPy broadcasts, so only leading dims can lack).
BATCH_MODES = ("carry", "broadcast", "lack")

#: A chain has at most this many batch dims (the batched call takes two).
MAX_BATCH_DIMS = 2

#: The names of the batch axes in loop and iterator orders, outermost first (then i, j, k).
BATCH_AXES = "ab"


@dataclass(frozen=True)
class Product:
    """An extent or a stride: ``factor`` times the symbolic extents ``symbols`` (sorted)."""

    factor: int
    symbols: tuple[str, ...] = ()

    @staticmethod
    def extent(value: int, symbol: str | None = None) -> Product:
        """A static extent ``value``, or the symbol that stands for it."""
        return Product(1, (symbol,)) if symbol else Product(value)

    def __mul__(self, other: Product) -> Product:
        factor = self.factor * other.factor
        if factor == 0:
            return Product(0)
        return Product(factor, tuple(sorted(self.symbols + other.symbols)))

    @property
    def is_zero(self) -> bool:
        return self.factor == 0


_ONE, _ZERO = Product(1), Product(0)


@dataclass(frozen=True)
class BatchLabel:
    """The batch form of a chain, as :func:`batch_label` reads it.

    Attributes
    ----------
    form : str
        ``"none"`` (no batch dims), ``"leading"`` or ``"batched"``: a key of
        :data:`tir_byoc.patterns.BATCH_FORMS`; ``"refused"`` when the matcher refuses it.
    dims : int
        How many merged batch dims the match reports (``len(match.batch.counts)``): 0 for
        ``"none"``, 1 for ``"leading"``, 1 or 2 for ``"batched"``.
    reason : str or None
        Why a ``"refused"`` chain is refused.
    """

    form: str
    dims: int = 0
    reason: str | None = None


def _operand_strides(modes, dims, matrix: Product) -> list[Product]:
    """Per batch dim, the stride of an operand that treats the dims as ``modes`` say."""
    strides, below = [], matrix
    for mode, dim in reversed(list(zip(modes, dims))):
        strides.append(below if mode == "carry" else _ZERO)
        if mode != "lack":
            below = below * (dim if mode == "carry" else _ONE)
    return strides[::-1]


def batch_label(spec, chain) -> BatchLabel:
    """The batch form the matcher gives ``chain``, a :class:`~.specs.ChainSpec` of the
    :class:`~.specs.ProgramSpec` ``spec``, from spec fields.

    Knobs are not read: for a near miss this is the label of the positive it was made from.
    """
    if not chain.batch:
        return BatchLabel("none")
    symbol = "B{}".format if spec.symbolic_batch else lambda d: None
    dims = [Product.extent(e, symbol(d)) for d, e in enumerate(chain.batch)]
    m = Product.extent(spec.m, "M" if spec.symbolic_m else None)
    n, k = Product(chain.n), Product(chain.k)
    # Rule 1. Each operand's stride along each dim.
    x_strides = _operand_strides(chain.x_batch, dims, m * k)
    w_strides = _operand_strides(chain.w_batch, dims, n * k)
    merged: list[tuple[Product, Product]] = []  # (x, w) stride of each merged dim
    for d, (count, x, w) in enumerate(zip(dims, x_strides, w_strides)):
        # Rule 2. Static 1s are dropped.
        if count == _ONE:
            continue
        # Rule 3. A dim neither operand reads.
        if x.is_zero and w.is_zero:
            return BatchLabel("refused", reason=f"batch dim {d} indexes neither operand")
        # Rule 4. Merge into the dim before where both operands step over the pair as one.
        if merged and merged[-1] == (x * count, w * count):
            merged[-1] = (x, w)
            continue
        merged.append((x, w))
    # Rule 5. One merged dim over a shared weight, X's matrices one after another: leading.
    if not merged or (len(merged) == 1 and merged[0][1].is_zero and merged[0][0] == m * k):
        return BatchLabel("leading", 1)
    return BatchLabel("batched", len(merged))


def batch_problem(chain) -> str | None:
    """What is wrong with the batch fields of a :class:`~.specs.ChainSpec` (its dims and each
    operand's modes), or None."""
    rank = len(chain.batch)
    if rank > MAX_BATCH_DIMS or any(e < 1 for e in chain.batch):
        return f"expected at most {MAX_BATCH_DIMS} batch dims, each >= 1, got {chain.batch}"
    for name, modes in (("x_batch", chain.x_batch), ("w_batch", chain.w_batch)):
        if len(modes) != rank or not set(modes) <= set(BATCH_MODES):
            return f"expected {name} to give one of {BATCH_MODES} per batch dim, got {modes}"
        lacking = modes.count("lack")
        if modes[:lacking] != ("lack",) * lacking:
            return f"{name} {modes}: only leading batch dims can be lacking (NumPy alignment)"
    return None


__all__ = [
    "BATCH_AXES",
    "BATCH_MODES",
    "MAX_BATCH_DIMS",
    "BatchLabel",
    "Product",
    "batch_label",
    "batch_problem",
]
