"""The record of an epilogue op (:class:`OpSpec`) and of the ways TIR spells it (:class:`Spelling`).

The table of every op is :mod:`.table`; :mod:`tir_byoc.epilogues` reads it.  A spelling's
blocks are plain functions of the op's input and of :class:`Terms`, the named constants and
the operand, so that one spelling gives TE blocks (:func:`tir_byoc.epilogues.compose`), the
matcher's templates and the test generators' IR alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from tvm import ir, tirx

#: The slots of an epilogue, in the order of the canonical epilogues.
SLOTS = ("scale", "bias", "activation", "tail")

#: The largest epilogue one call carries (``TIR_BYOC_MAX_OPS``), and its constants and tensors.
MAX_OPS, MAX_CONSTANTS, MAX_TENSORS = 8, 6, 4


@dataclass(frozen=True)
class Terms:
    """What the blocks of a spelling are built from besides their input.

    ``values`` gives each named constant (an op's own, such as ``"alpha"``, or a literal of
    :data:`~.table.LITERALS`, such as ``"half"``) as a number of ``dtype``, or
    as an expression standing for it; ``operand`` is the tensor or scalar the op reads, a
    load at the block's indices.
    """

    dtype: str
    values: Mapping[str, object]
    operand: object = None

    def c(self, name: str):
        value = self.values[name]
        return value if isinstance(value, ir.Expr) else tirx.const(value, self.dtype)

    def zero(self):
        return tirx.const(0, self.dtype)

    def erf(self, x):
        return tirx.erf(x)

    def tanh(self, x):
        """A tanh inside a formula (gelu_tanh's), which a test may swap for erf."""
        return tirx.tanh(x)

    def pow(self, x, name: str):
        """``pow(x, c)``, built as the call itself (``tirx.pow`` warns about a power of 3)."""
        return tirx.call_intrin(self.dtype, "tirx.pow", x, self.c(name))


#: A block of a spelling: ``block(z, earlier, terms)`` builds the block's value from ``z``
#: (the op's input), ``earlier`` (the values of the spelling's blocks before it) and
#: :class:`Terms`.
Block = Callable[..., ir.Expr]


@dataclass(frozen=True)
class Spelling:
    """One way TIR writes an op, in one block or several.

    Attributes
    ----------
    name : str
        Its name (``"gelu: relax"``): the test generators name it in a chain's spec.
    blocks : tuple of Block
        The blocks, in order; a later one may read ``z`` again (gelu's last multiply).
    block_names : tuple of str
        The blocks' names as Relax gives them (those of an op's first spelling, which
        :func:`compose` builds).
    nan : str or None
        A clip's: what a NaN becomes, ``"lo"``, ``"hi"`` or ``"nan"``, as TVM lowers the
        spelling (``max(a, b)`` is ``a > b ? a : b``, ``min(a, b)`` is ``a < b ? a : b``).
    reads : str or None
        ``"scalar"`` (a scale by ``s[0]``, a parameter of shape (1,)), ``"vector"`` (``g[j]``
        of shape (N,)) or ``"tensor"`` (a residual or gate of the output's shape).
    """

    name: str
    blocks: tuple[Block, ...]
    block_names: tuple[str, ...] = ()
    nan: str | None = None
    reads: str | None = None

    def inline(self, z, terms: Terms) -> ir.Expr:
        """The spelling as one expression of ``z``: each block's value put where it is read."""
        earlier: list = []
        for block in self.blocks:
            earlier.append(block(z, earlier, terms))
        return earlier[-1]


@dataclass(frozen=True)
class OpSpec:
    """One epilogue operation.

    Attributes
    ----------
    name : str
        The name patterns use (``dense_bias_gelu``).
    code : int
        ``TIR_BYOC_OP_<NAME>`` of ``tir_byoc.h``.
    slot : str
        One of :data:`SLOTS`.
    reference : callable
        ``reference(z, c, tensor)``: the op in fp32 NumPy, the constants ``c`` as np.float32,
        computed the way TVM's lowering of its spellings computes (the same comparisons).
    spellings : tuple of Spelling
        The ways TVM's TIR writes it, first the one Relax's ``LegalizeOps`` writes (for torch's
        own decompositions, what ``from_exported_program`` then ``LegalizeOps`` gives).
    constants : tuple of str
        The constants the C op takes, in order (clip: ``lo``, ``hi`` and what a NaN becomes),
        named as its spellings read them.
    tensor : str or None
        ``"vector"`` for an (n,) vector indexed by the column, ``"full"`` for a tensor of the
        output's shape, None for no tensor.
    example : tuple of float
        The constants :func:`compose` builds the op with.
    pinned : bool
        The constants can only be ``example`` (gelu's sqrt(1/2)): a spelling with another value
        is not this op.  Otherwise a spelling's constants are the op's (swish's alpha).
    template : bool
        The matcher reads the op by its spellings, as templates (the formulas of fixed form);
        else by its rules, which check what the op reads (a bound, a slope, a tensor).
    keep_nan : tuple of (int, callable), optional
        ``(code, reference)`` of the variant that keeps a NaN, where spellings differ in it
        (relu: ``max(0, z)`` keeps it, ``max(z, 0)`` gives 0).
    """

    name: str
    code: int
    slot: str
    reference: Callable[..., np.ndarray]
    spellings: tuple[Spelling, ...]
    constants: tuple[str, ...] = ()
    tensor: str | None = None
    example: tuple[float, ...] = ()
    pinned: bool = False
    template: bool = False
    keep_nan: tuple[int, Callable[..., np.ndarray]] | None = None

    def __post_init__(self):
        problems = (
            (self.slot in SLOTS, f"slot in {SLOTS}, got {self.slot!r}"),
            (self.tensor in (None, "vector", "full"), f"tensor vector or full, got {self.tensor}"),
            (
                len(self.example) == len(self.constants),
                f"an example per constant {self.constants}, got {self.example}",
            ),
            (bool(self.spellings), "at least one spelling"),
            (
                bool(self.spellings)
                and len(self.spellings[0].block_names) == len(self.spellings[0].blocks),
                "a name for each block of the first spelling",
            ),
        )
        for ok, expected in problems:
            if not ok:
                raise ValueError(f"OpSpec {self.name!r}: expected {expected}")

    def values(self, constants=None) -> dict[str, float]:
        """The op's constants by name: ``constants`` (its :attr:`example` if None)."""
        return dict(zip(self.constants, self.example if constants is None else constants))


__all__ = [
    "MAX_CONSTANTS",
    "MAX_OPS",
    "MAX_TENSORS",
    "SLOTS",
    "Block",
    "OpSpec",
    "Spelling",
    "Terms",
]
