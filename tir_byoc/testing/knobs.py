"""How a chain departs from the pattern it is built as: :class:`Knobs`, one value per knob.

A positive leaves every knob at its default; each near miss of
:data:`~tir_byoc.testing.mutations.MUTATIONS` turns one.  The builder
(:mod:`tir_byoc.testing.builder`) reads the knobs and looks each one up in the tables of
:mod:`.spellings`; nothing asks which mutation turned it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from .spellings import (
    BIAS_COMBINERS,
    BIAS_FORMS,
    COMBINERS,
    FIXED_CONSTANTS,
    PRODUCTS,
    RELU_FORMS,
    TAIL_FORMS,
)

#: The values each non-integer knob may take.
_KNOB_CHOICES = {
    "product": tuple(PRODUCTS),
    "combiner": tuple(COMBINERS),
    "x_index": ("ik", "ki"),
    "w_flipped": (False, True),
    "first_epilogue_index": ("ij", "ji"),
    "bias_form": (None, *BIAS_FORMS),
    "bias_combiner": tuple(BIAS_COMBINERS),
    "relu_form": tuple(RELU_FORMS),
    "functions_swapped": (False, True),
    "clip_swapped": (False, True),
    "tail_form": tuple(TAIL_FORMS),
    "output_is_x": (False, True),
    "reduction_read": (None, "between", "after"),
    "x_batch_swapped": (False, True),
    "batch_read_at_zero": (None, "x", "w"),
    "batch_operand_longer": (None, "x", "w"),
    "batch_unread": (False, True),
}
#: The knobs that count rows, columns or steps left out (or padding put in).
_COUNTS = (
    "k_short",
    "reduction_rows_short",
    "init_rows_short",
    "last_epilogue_columns_short",
    "batch_loop_short",
    "x_row_padding",
)


@dataclass(frozen=True)
class Knobs:
    """How a chain departs from the pattern it is built as.  A positive leaves every knob at
    its default; each of :data:`~tir_byoc.testing.mutations.MUTATIONS` turns one.

    Parameters
    ----------
    init_value : int or None
        The reduction starts from this constant instead of 0 or the bias.
    k_short : int
        The reduction stops this many short of K.
    product : str
        How X and W combine, a key of :data:`~.spellings.PRODUCTS` (``"mul"``).
    combiner : str
        How the reduction folds a product in, a key of :data:`~.spellings.COMBINERS`
        (``"add"``).
    x_index : str
        ``"ik"`` (``X[i, k]``) or ``"ki"``.
    w_flipped : bool
        The weight is indexed as the other layout would (``W[k, j]`` in a dense chain).
    first_epilogue_index : str
        ``"ij"`` or ``"ji"``: how the first epilogue block reads its input.
    bias_form : str or None
        A key of :data:`~.spellings.BIAS_FORMS` replacing the one the chain's ``bias`` says.
    bias_combiner : str
        How the bias epilogue combines, a key of :data:`~.spellings.BIAS_COMBINERS`.
    relu_threshold : int
        The constant the relu spelling compares and clamps against (0).
    relu_form : str
        A key of :data:`~.spellings.RELU_FORMS` (``"spelled"``: the chain's relu spelling).
    fixed_constant : tuple of (str, float) or None
        ``(name, value)``: the activation's spelling writes the fixed constant ``name`` (a key
        of :data:`~.spellings.FIXED_CONSTANTS`, such as gelu's ``"half"``) as ``value``.
    functions_swapped : bool
        gelu's erf is written as tanh, tanh-gelu's tanh as erf.
    clip_swapped : bool
        The clip's spelling takes its lower bound where the upper one goes and back.
    slope : float or None
        The leaky relu's spelling multiplies by this instead of the chain's slope.
    tail_form : str
        A key of :data:`~.spellings.TAIL_FORMS`: the residual or gate tensor's shape and
        read (``"full"``).
    output_is_x : bool
        The chain's last block writes into X instead of an output of its own.
    reduction_rows_short, init_rows_short : int
        The reduction, or its init block, stops this many rows short of M.
    last_epilogue_columns_short : int
        The last epilogue block stops this many columns short of N.
    reduction_read : str or None
        A block also reads the reduction's output: ``"between"`` the reduction and the
        epilogue blocks, or ``"after"`` the chain.
    x_batch_swapped : bool
        X's last batch axis (one the chain's X carries) trades places with its row axis, in
        its shape and in the read: ``X[..., i, b, k]`` of shape (..., M, B, K).
    batch_read_at_zero : str or None
        ``"x"`` or ``"w"``: that operand reads its first carried batch dim whose extent is not
        a static 1 at 0 instead of at the batch iterator (its shape is unchanged).
    batch_operand_longer : str or None
        ``"x"`` or ``"w"``: that operand's first carried batch dim is one longer than the
        output's (static extents only).
    batch_unread : bool
        The first batch dim whose extent is not a static 1 is read by neither operand: each
        that carries it broadcasts it instead.
    batch_loop_short : int
        The reduction's loop over the first batch dim whose extent is not a static 1 stops
        this many short of the output's dim.
    x_row_padding : int
        X is declared with explicit strides whose rows are ``K + x_row_padding`` elements
        apart, and is then not bound at an offset (ignored when X is the previous chain's
        output).
    """

    init_value: int | None = None
    k_short: int = 0
    product: str = "mul"
    combiner: str = "add"
    x_index: str = "ik"
    w_flipped: bool = False
    first_epilogue_index: str = "ij"
    bias_form: str | None = None
    bias_combiner: str = "add"
    relu_threshold: int = 0
    relu_form: str = "spelled"
    fixed_constant: tuple[str, float] | None = None
    functions_swapped: bool = False
    clip_swapped: bool = False
    slope: float | None = None
    tail_form: str = "full"
    output_is_x: bool = False
    reduction_rows_short: int = 0
    init_rows_short: int = 0
    last_epilogue_columns_short: int = 0
    reduction_read: str | None = None
    x_batch_swapped: bool = False
    batch_read_at_zero: str | None = None
    batch_operand_longer: str | None = None
    batch_unread: bool = False
    batch_loop_short: int = 0
    x_row_padding: int = 0

    def __post_init__(self):
        for name, choices in _KNOB_CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"Knobs.{name}: expected one of {choices}, got {getattr(self, name)!r}"
                )
        for name in _COUNTS:
            if getattr(self, name) < 0:
                raise ValueError(f"Knobs.{name}: expected >= 0, got {getattr(self, name)}")
        constant = self.fixed_constant
        if constant is not None and (len(constant) != 2 or constant[0] not in FIXED_CONSTANTS):
            raise ValueError(
                f"Knobs.fixed_constant: expected (a key of FIXED_CONSTANTS, value), got {constant}"
            )

    def __repr__(self):
        turned = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != f.default
        ]
        return f"Knobs({', '.join(turned)})"


#: The knobs of a positive: every one at its default.
POSITIVE = Knobs()

__all__ = ["POSITIVE", "Knobs"]
