"""Near misses as data: each mutation is a set of knob values for one chain of a positive.

Entry points: :data:`MUTATIONS` (by name: a :class:`Mutation`, i.e. a description, the
:class:`~.knobs.Knobs` it sets, where it applies, which extents it makes equal and, for some,
the words of the matcher's refusal),
:func:`applicable_mutations` and :func:`mutate`, which turns a positive spec into a near miss
with ``dataclasses.replace``; :func:`mutation_problem`, the check a spec makes of its knobs.
The builder reads the knobs; it never asks which mutation set them.  The specs are read as
they are (``spec.chains[c].ops``...), and nothing of theirs is imported: they check
themselves with this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from .conditions import (
    activation,
    all_of,
    bias_then_relu_in_one_block,
    both,
    can_alias,
    carries,
    float_relu,
    has,
    has_varying_dim,
    in_epilogue,
    not_in_place,
    own_x,
    separate_epilogue,
    static_batch,
    static_m,
    tail,
    writes_constant,
    writes_param,
    x_batch_last_carried,
)
from .knobs import Knobs
from .spellings import ACTIVATION_SPELLINGS, TAIL_SPELLINGS

_KNOB_NAMES = frozenset(f.name for f in fields(Knobs))


#: For each ``square``: the extent it changes, and to what.
_SQUARING = {
    ("m", "k"): lambda spec, chain: {"k": spec.m},
    ("m", "n"): lambda spec, chain: {"n": spec.m},
    ("n", "k"): lambda spec, chain: {"n": chain.k},
}


def _always(spec, c: int) -> bool:
    return True


@dataclass(frozen=True)
class Mutation:
    """A change to one chain that changes what it computes.

    Parameters
    ----------
    description : str
        What the mutant computes instead, for reports.
    overrides : mapping
        Knob name -> value (see :class:`~.knobs.Knobs`); every other knob keeps its default.
    applies : callable
        ``applies(spec, c)``: whether chain ``c`` of ``spec`` can take it.
    square : tuple of two str, optional
        The extents it sets equal (``("m", "k")``, ``("m", "n")`` or ``("n", "k")``), so that
        the mutant still indexes in bounds.
    refusal : str, optional
        Words the matcher's refusal contains: of the chain's reduction block, where the mutant
        is refused whole (see ``tir_byoc/match/reduction.py``), or, with ``stops``, of the
        blocks from the op it breaks on, which stay TVM code.
    stops : bool
        The mutant breaks an op of the epilogue: the matcher takes the chain up to the block
        before that op's (:func:`~.labels.epilogue_stop` says where), and the rest stays TVM
        code.
    wants : mapping
        :class:`~.specs.ChainSpec` field -> the values of it that give a chain what the
        mutation changes (an activation spelled with gelu's 0.5...), so that the strategies
        can give a chain one and draw near misses of rare spellings as often as the others.
    """

    description: str
    overrides: Mapping[str, object] = field(hash=False)
    applies: Callable[[Any, int], bool] = field(default=_always, repr=False)
    square: tuple[str, str] | None = None
    refusal: str | None = None
    stops: bool = False
    wants: Mapping[str, tuple] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))
        object.__setattr__(self, "wants", MappingProxyType(dict(self.wants)))
        unknown = sorted(set(self.overrides) - _KNOB_NAMES)
        if unknown:
            raise ValueError(f"Mutation overrides: expected Knobs fields, got {unknown}")
        if self.knobs == Knobs():
            raise ValueError(f"Mutation overrides {dict(self.overrides)} change nothing")
        if self.square is not None and self.square not in _SQUARING:
            raise ValueError(
                f"Mutation square: expected one of {list(_SQUARING)}, got {self.square}"
            )

    @property
    def knobs(self) -> Knobs:
        """The knobs of a chain that takes this mutation."""
        return replace(Knobs(), **self.overrides)


def _fixed_constant(name, value, what):
    """A gelu spelling with its fixed constant ``name`` written as ``value``."""
    return Mutation(
        f"{what} written as {value}",
        {"fixed_constant": (name, value)},
        writes_constant(name),
        refusal=f": a constant is {value} where",
        stops=True,
        wants={"activation": _spellings(lambda s: name in s.constants)},
    )


def _spellings(keep, table=ACTIVATION_SPELLINGS) -> tuple[str, ...]:
    """The names of the spellings of ``table`` that ``keep`` keeps."""
    return tuple(name for name, spelling in table.items() if keep(spelling))


#: The near misses, by name.
MUTATIONS: dict[str, Mutation] = {
    "init_one": Mutation("the reduction starts from 1, not 0", {"init_value": 1}),
    "k_short": Mutation(
        "the reduction stops one short of K", {"k_short": 1}, lambda s, c: s.chains[c].k >= 2
    ),
    "reduce_max": Mutation("the reduction combines with max, not +", {"combiner": "max"}),
    "reduce_sub": Mutation("the reduction subtracts the products", {"combiner": "sub"}),
    "reduce_sum_not_product": Mutation("the reduction adds X + W, not X * W", {"product": "add"}),
    "swap_x_index": Mutation("X is read as X[k, i]", {"x_index": "ki"}, static_m, ("m", "k")),
    "swap_w_index": Mutation(
        "the weight is read in the other layout", {"w_flipped": True}, square=("n", "k")
    ),
    "swap_epilogue_index": Mutation(
        "the first epilogue reads Y[j, i]",
        {"first_epilogue_index": "ji"},
        both(static_m, separate_epilogue),
        ("m", "n"),
    ),
    "bias_row_axis": Mutation(
        "the bias is indexed by the row, b[i]",
        {"bias_form": "row_axis"},
        both(has("bias"), static_m),
        ("m", "n"),
    ),
    "bias_full": Mutation("the bias is a full (M, N) matrix", {"bias_form": "full"}, has("bias")),
    "bias_second_row": Mutation(
        "the bias is row 1 of a (2, N) array, b[1, j]", {"bias_form": "second_row"}, has("bias")
    ),
    "reduction_short_rows": Mutation(
        "the reduction, writing the output itself, stops one row short of M",
        {"reduction_rows_short": 1},
        lambda s, c: not s.chains[c].ops and writes_param(s, c) and (s.symbolic_m or s.m >= 2),
    ),
    "bias_sub": Mutation("the bias is subtracted", {"bias_combiner": "sub"}, in_epilogue("bias")),
    "bias_mul": Mutation("the bias multiplies", {"bias_combiner": "mul"}, in_epilogue("bias")),
    "relu_threshold": Mutation("relu against 1, not 0", {"relu_threshold": 1}, has("relu")),
    "select_shifted": Mutation("select(z > 1, z, 0)", {"relu_form": "select_shifted"}, has("relu")),
    "leaky_relu": Mutation("a leaky relu (slope 0.01 below 0)", {"relu_form": "leaky"}, float_relu),
    "clipped_relu": Mutation("a relu clipped at 6", {"relu_form": "clipped"}, has("relu")),
    "alias_output_input": Mutation(
        "the chain's last block writes into X",
        {"output_is_x": True},
        both(can_alias, not_in_place),
        ("n", "k"),
    ),
    "intermediate_read_after": Mutation(
        "the reduction's output is also read after the chain",
        {"reduction_read": "after"},
        both(separate_epilogue, not_in_place),
    ),
    "select_on_pre_bias": Mutation(
        "one block computes select(Y > 0, Y + b, 0): the test misses the bias",
        {"relu_form": "pre_bias_select"},
        bias_then_relu_in_one_block,
    ),
    "init_block_short": Mutation(
        "the init block, of a reduction writing the output itself, stops one row short of M",
        {"init_rows_short": 1},
        lambda s, c: (
            s.chains[c].init == "block"
            and (s.chains[c].in_place or not s.chains[c].ops)
            and writes_param(s, c)
            and (s.symbolic_m or s.m >= 2)
        ),
    ),
    "read_between_in_place": Mutation(
        "a block reads the raw product between the reduction and an in-place epilogue",
        {"reduction_read": "between"},
        lambda s, c: s.chains[c].in_place and separate_epilogue(s, c),
    ),
    "epilogue_short": Mutation(
        "the last epilogue block stops one column short of N",
        {"last_epilogue_columns_short": 1},
        lambda s, c: separate_epilogue(s, c) and s.chains[c].n >= 2 and writes_param(s, c),
    ),
    "batch_on_row_axis": Mutation(
        "X's last batch axis and its row axis trade places: X[..., i, b, k]",
        {"x_batch_swapped": True},
        both(own_x, x_batch_last_carried),
        refusal="do not read X[",
    ),
    "input_batch_read_at_zero": Mutation(
        "X is read at 0 on a batch dim it carries, of extent other than 1",
        {"batch_read_at_zero": "x"},
        carries("x", varying=True),
        refusal="is read only at 0 on axis",
    ),
    "weight_batch_read_at_zero": Mutation(
        "the weight is read at 0 on a batch dim it carries, of extent other than 1",
        {"batch_read_at_zero": "w"},
        carries("w", varying=True),
        refusal="is read only at 0 on axis",
    ),
    "input_batch_longer": Mutation(
        "X has one more matrix along a batch dim than the output",
        {"batch_operand_longer": "x"},
        all_of(static_batch, own_x, carries("x", varying=False)),
        refusal="a partial batch range",
    ),
    "weight_batch_longer": Mutation(
        "the weight has one more matrix along a batch dim than the output",
        {"batch_operand_longer": "w"},
        both(static_batch, carries("w", varying=False)),
        refusal="a partial batch range",
    ),
    "batch_loop_short": Mutation(
        "the reduction, writing the output itself, stops one short along a batch dim",
        {"batch_loop_short": 1},
        lambda s, c: not s.chains[c].ops and writes_param(s, c) and has_varying_dim(s, c),
        refusal="the loops do not cover it whole",
    ),
    "batch_unread": Mutation(
        "a batch dim of the output is read by neither operand",
        {"batch_unread": True},
        both(own_x, has_varying_dim),
        refusal="indexes neither operand",
    ),
    "x_non_compact": Mutation(
        "X is a view with explicit strides, its rows one element apart more than K",
        {"x_row_padding": 1},
        # Strided tensors are passed through DLPack, which has no bfloat16 (equivalence._strided).
        lambda s, c: own_x(s, c) and not s.chains[c].x_view and s.chains[c].dtypes[0] != "bfloat16",
        refusal="non-compact strides",
    ),
    # The fixed constants of gelu and tanh-gelu, each changed (one occurrence).
    "fixed_half": _fixed_constant("half", 0.6, "a gelu's (first) 0.5"),
    "fixed_half_second": _fixed_constant("half2", 0.6, "a gelu's second 0.5"),
    "fixed_one": _fixed_constant("one", 1.1, "a gelu's (first) 1"),
    "fixed_one_second": _fixed_constant("one2", 1.1, "tanh-gelu's second 1"),
    "gelu_sqrt_half": _fixed_constant("sqrt_half", 0.7, "gelu's sqrt(1/2)"),
    "gelu_tanh_sqrt_2_over_pi": _fixed_constant("sqrt_2_over_pi", 0.8, "tanh-gelu's sqrt(2/pi)"),
    "gelu_tanh_cubic": _fixed_constant("cubic", 0.05, "tanh-gelu's 0.044715"),
    "gelu_tanh_power": _fixed_constant("three", 2.0, "tanh-gelu's power 3"),
    "gelu_functions_swapped": Mutation(
        "gelu's erf written as tanh, tanh-gelu's tanh as erf",
        {"functions_swapped": True},
        activation("gelu", "gelu_tanh"),
        stops=True,  # no refusal words: which block's refusal explains it depends on the spelling
        wants={"activation": _spellings(lambda s: s.op in ("gelu", "gelu_tanh"))},
    ),
    "clip_swapped": Mutation(
        "the clip's bounds swapped",
        {"clip_swapped": True},
        activation("clip"),
        refusal="clip bounds are swapped",
        stops=True,
        wants={"activation": _spellings(lambda s: s.op == "clip")},
    ),
    "leaky_slope_above_one": Mutation(
        "a leaky relu of slope 1.5",
        {"slope": 1.5},
        activation("leaky_relu"),
        refusal="leaky relu slope 1.5 is outside [0, 1]",
        stops=True,
        wants={"activation": _spellings(lambda s: s.op == "leaky_relu")},
    ),
    "leaky_slope_zero": Mutation(
        "a leaky relu of slope 0",
        {"slope": 0.0},
        activation("leaky_relu"),
        refusal="leaky relu slope 0: TVM folds the z * 0",
        stops=True,
        wants={"activation": _spellings(lambda s: s.op == "leaky_relu")},
    ),
    "leaky_slope_negative": Mutation(
        "a leaky relu of slope -0.5",
        {"slope": -0.5},
        activation("leaky_relu"),
        refusal="leaky relu slope -0.5 is outside [0, 1]",
        stops=True,
        wants={"activation": _spellings(lambda s: s.op == "leaky_relu")},
    ),
    "residual_column_broadcast": Mutation(
        "the residual is an (M, 1) column, R[i, 0]",
        {"tail_form": "column"},
        tail("add"),
        refusal="(N,) or (1, N)",
        stops=True,
        wants={"tail": _spellings(lambda s: s.op == "add", TAIL_SPELLINGS)},
    ),
    "gate_column_broadcast": Mutation(
        "the gate is an (M, 1) column, G[i, 0]",
        {"tail_form": "column"},
        tail("mul"),
        refusal="(N,) or (1, N)",
        stops=True,
        wants={"tail": _spellings(lambda s: s.op == "mul", TAIL_SPELLINGS)},
    ),
}


def mutation_problem(chain) -> str | None:
    """Why the knobs of a :class:`~.specs.ChainSpec` are not those of the mutation it is named
    after (the defaults, for a positive), or None."""
    if chain.mutation is None:
        expected = Knobs()
    elif chain.mutation in MUTATIONS:
        expected = MUTATIONS[chain.mutation].knobs
    else:
        return f"mutation {chain.mutation!r} unknown: expected a key of MUTATIONS or None"
    if chain.knobs != expected:
        return (
            f"knobs of mutation {chain.mutation!r}: expected {expected}, got {chain.knobs} "
            "(use mutate)"
        )
    return None


def applicable_mutations(spec, c: int) -> list[str]:
    """Names of the mutations chain ``c`` of the :class:`~.specs.ProgramSpec` ``spec`` can
    take (none if a block cuts it)."""
    if any(d.inside and d.chain == c for d in spec.distractors):
        return []
    return [name for name, mutation in MUTATIONS.items() if mutation.applies(spec, c)]


def mutate(spec, c: int, name: str):
    """The :class:`~.specs.ProgramSpec` ``spec`` with chain ``c`` mutated by ``name``; extents
    made equal where it needs."""
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; expected one of {sorted(MUTATIONS)}")
    mutation = MUTATIONS[name]
    if not mutation.applies(spec, c):
        raise ValueError(f"mutation {name!r} does not apply to chain {c} of {spec}")
    chains = list(spec.chains)
    chain = replace(chains[c], knobs=mutation.knobs, mutation=name)
    if mutation.square is not None:
        chain = replace(chain, **_SQUARING[mutation.square](spec, chain))
    chains[c] = chain
    return replace(spec, chains=tuple(_relink(chains, c)))


def _relink(chains: list, pinned: int) -> list:
    """Restore k[c + 1] == n[c] along feeding chains, keeping chain ``pinned`` as it is."""
    for c in range(pinned - 1, -1, -1):
        if chains[c].feeds_next:
            chains[c] = replace(chains[c], n=chains[c + 1].k)
    for c in range(pinned, len(chains) - 1):
        if chains[c].feeds_next:
            chains[c + 1] = replace(chains[c + 1], k=chains[c].n)
    return chains


__all__ = [
    "MUTATIONS",
    "Mutation",
    "applicable_mutations",
    "mutate",
    "mutation_problem",
]
