"""Programs of the pattern family described as data: what :mod:`.builder` builds.

Entry points: :class:`ChainSpec` (one dense / matmul chain and how it is spelled, with the
:class:`~.knobs.Knobs` a near miss turns) and :class:`ProgramSpec` (a whole function, with
:class:`~.distractors.DistractorSpec` blocks around its chains).  Specs validate themselves:
a spec that cannot be built raises ``ValueError`` naming the problem, with the checks of
:mod:`.batches`, :mod:`.distractors` and :mod:`.mutations` for their parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..epilogues import OPS, SLOTS
from .batches import BATCH_AXES, batch_label, batch_problem
from .distractors import DistractorSpec, distractor_problem
from .knobs import POSITIVE, Knobs
from .mutations import mutation_problem
from .spellings import (
    ACTIVATION_SPELLINGS,
    RELU_SPELLINGS,
    SCALE_SPELLINGS,
    TAIL_SPELLINGS,
    OpSpelling,
)

#: How a chain's reduction output is initialised: ``"zero"`` (the block's init), ``"bias"``
#: (the block's init reads the bias, which then has no epilogue block) or ``"block"`` (0 in
#: a block of its own before the reduction, as ``decompose_reduction`` leaves it).
INITS = ("zero", "bias", "block")

#: Dtype signatures the generators draw: (x, w, accumulator).
SIGNATURES = (
    ("float32", "float32", "float32"),
    ("float16", "float16", "float32"),
    ("bfloat16", "bfloat16", "float32"),
    ("int8", "int8", "int32"),
    ("uint8", "uint8", "int32"),
    ("uint8", "int8", "int32"),
)


@dataclass(frozen=True)
class ChainSpec:
    """One dense / matmul chain and how it is spelled.

    Parameters
    ----------
    layout : str
        ``"dense"`` (weight N x K) or ``"matmul"`` (weight K x N).
    n, k : int
        Static extents (M belongs to the program).
    batch : tuple of int
        The output's batch dims, outermost first (none to :data:`MAX_BATCH_DIMS`): their
        extents, or their run-time values when the program's batch is symbolic.
    x_batch, w_batch : tuple of str
        Per batch dim, a key of :data:`BATCH_MODES`: whether X (W) carries it, broadcasts it
        or lacks it.  A positive has every dim whose extent is not a static 1 carried by X
        or W (see :func:`~tir_byoc.testing.labels.batch_label`).
    bias : str or None
        ``"vector"`` (shape (N,), read ``b[j]``), ``"row"`` (shape (1, N), read ``b[0, j]``)
        or None.
    bias_first : bool
        Spell the add ``b[j] + Y[i, j]`` instead of ``Y[i, j] + b[j]``.
    relu : str or None
        A key of :data:`RELU_SPELLINGS`, or None.
    scale : str or None
        A key of :data:`~.spellings.SCALE_SPELLINGS` (a scale or a div, the epilogue's first
        op), or None.
    factor : float
        The scale's constant (the divisor of a div); unused for a scale by ``s[0]``.
    activation : str or None
        A key of :data:`~.spellings.ACTIVATION_SPELLINGS` (gelu, silu, clip...: every
        activation but relu, which ``relu`` spells), or None.
    bounds : tuple of float
        The clip's (lower, upper) bound.
    slope : float
        The leaky relu's slope, in (0, 1] (TVM folds a slope of 0 away).
    alpha : float
        The swish's alpha (``z * sigmoid(alpha * z)``), finite.
    tail : str or None
        A key of :data:`~.spellings.TAIL_SPELLINGS` (a residual add or a gating mul by a
        tensor of the output's shape, the epilogue's last op), or None.
    fused : tuple of bool
        ``fused[n]``: epilogue op ``n + 1`` is computed in the block of op ``n`` (missing
        entries are False).  A spelling of several blocks is never fused with its neighbours.
    dtypes : tuple of str
        ``(x, w, accumulator)``, one of :data:`SIGNATURES`.
    loop_order : str
        Order of the reduction block's loops: a permutation of ``"ijk"`` and any of the
        batch axes (:data:`BATCH_AXES`); batch axes it leaves out go outermost, in order.
    iter_order : str
        Order of the reduction block's iterators, read the same way.
    epilogue_order : str
        Loop order of the epilogue blocks: ``"ij"`` or ``"ji"`` and any of the batch axes,
        read the same way.
    commuted : bool
        ``W * X`` instead of ``X * W``.
    accumulate_last : bool
        ``X * W + Y`` instead of ``Y + X * W``.
    alloc : str
        ``"sblock"`` (root-block ``alloc_buffers``) or ``"stmt"`` (an ``AllocBuffer``
        statement right before the block that first writes the buffer).
    feeds_next : bool
        The output is a local buffer read as X by the next chain (an MLP).
    x_view : bool
        X is a parameter with a symbolic element offset: it may be a view into a larger
        tensor (ignored when X is the previous chain's output).
    init : str
        A key of :data:`INITS`.
    in_place : bool
        The epilogue blocks update the reduction's output in place (``Z[i, j] = Z[i, j] +
        b[j]``) instead of writing new buffers.
    swapped_slots : tuple of two str, or None
        Slots of :data:`tir_byoc.epilogues.SLOTS` whose ops trade places in the order the
        blocks compute them (``("bias", "activation")``: the activation before the bias add),
        an epilogue out of slot order; ignored unless both slots hold an op of the epilogue
        blocks.
    knobs : Knobs
        How the chain departs from its pattern: all defaults in a positive.
    mutation : str or None
        The name of the near miss the knobs make, a key of
        :data:`~tir_byoc.testing.mutations.MUTATIONS`; set, with ``knobs``, by
        :func:`~tir_byoc.testing.mutations.mutate`.
    """

    layout: str = "dense"
    n: int = 4
    k: int = 3
    batch: tuple[int, ...] = ()
    x_batch: tuple[str, ...] = ()
    w_batch: tuple[str, ...] = ()
    bias: str | None = None
    bias_first: bool = False
    relu: str | None = None
    scale: str | None = None
    factor: float = 0.125
    activation: str | None = None
    bounds: tuple[float, float] = (0.0, 6.0)
    slope: float = 0.01
    alpha: float = 1.702
    tail: str | None = None
    fused: tuple[bool, ...] = ()
    dtypes: tuple[str, str, str] = ("float32", "float32", "float32")
    loop_order: str = "ijk"
    iter_order: str = "ijk"
    epilogue_order: str = "ij"
    commuted: bool = False
    accumulate_last: bool = False
    alloc: str = "sblock"
    feeds_next: bool = False
    x_view: bool = False
    init: str = "zero"
    in_place: bool = False
    swapped_slots: tuple[str, str] | None = None
    knobs: Knobs = POSITIVE
    mutation: str | None = None

    @property
    def ops(self) -> tuple[str, ...]:
        """The epilogue's ops (:data:`tir_byoc.epilogues.OPS`), in slot order (the order the
        chain applies them: :attr:`applied_ops`)."""
        scale = SCALE_SPELLINGS[self.scale].op if self.scale else None
        activation = "relu" if self.relu else None
        if self.activation:
            activation = ACTIVATION_SPELLINGS[self.activation].op
        tail = TAIL_SPELLINGS[self.tail].op if self.tail else None
        return tuple(op for op in (scale, "bias" if self.bias else None, activation, tail) if op)

    @property
    def epilogue_ops(self) -> tuple[str, ...]:
        """The ops of the epilogue blocks (a bias read by the init is not one of them)."""
        return tuple(op for op in self.ops if not (op == "bias" and self.init == "bias"))

    @property
    def built_ops(self) -> tuple[str, ...]:
        """The epilogue blocks' ops in the order they compute them (``swapped_slots`` trades
        two)."""
        ops = list(self.epilogue_ops)
        swapped = self.swapped_slots
        if swapped is not None:
            at = [n for n, op in enumerate(ops) if OPS[op].slot in swapped]
            if len(at) == 2:
                ops[at[0]], ops[at[1]] = ops[at[1]], ops[at[0]]
        return tuple(ops)

    @property
    def applied_ops(self) -> tuple[str, ...]:
        """The epilogue's ops in the order the chain applies them: a bias read by the init
        first, then :attr:`built_ops` (:attr:`ops` itself unless ``swapped_slots`` trades)."""
        return ("bias",) * (self.bias is not None and self.init == "bias") + self.built_ops

    def spelling(self, op: str) -> OpSpelling | None:
        """The :class:`~.spellings.OpSpelling` of ``op`` (None for a bias or a relu, which
        have spellings of their own)."""
        for name, table in (
            (self.scale, SCALE_SPELLINGS),
            (self.activation, ACTIVATION_SPELLINGS),
            (self.tail, TAIL_SPELLINGS),
        ):
            if name and table[name].op == op:
                return table[name]
        return None

    def block_count(self, op: str) -> int:
        """How many blocks ``op``'s spelling takes (more than 1: it is never fused)."""
        spelling = self.spelling(op)
        return len(spelling.blocks) if spelling is not None else 1

    @property
    def epilogue_groups(self) -> tuple[tuple[str, ...], ...]:
        """The ops of :attr:`built_ops` grouped as the blocks compute them: ops fused
        (``fused``) into one block are one group; a spelling of several blocks is one group
        of its own."""
        groups: list[tuple[str, ...]] = []
        for n, op in enumerate(self.built_ops):
            fuse = 0 < n <= len(self.fused) and self.fused[n - 1]
            if fuse and self.block_count(op) == 1 and self.block_count(groups[-1][-1]) == 1:
                groups[-1] = (*groups[-1], op)
            else:
                groups.append((op,))
        return tuple(groups)

    @property
    def epilogue_blocks(self) -> int:
        """How many epilogue blocks the chain has."""
        return sum(self.block_count(group[0]) for group in self.epilogue_groups)

    @property
    def constant_values(self) -> dict[str, float]:
        """The constants of the epilogue's ops the chain's fields give, by the names the
        spellings read (a scale's ``factor`` is a div's ``divisor``)."""
        lo, hi = self.bounds
        return {
            "factor": self.factor,
            "divisor": self.factor,
            "lo": lo,
            "hi": hi,
            "slope": self.slope,
            "alpha": self.alpha,
        }

    @property
    def gain(self) -> float:
        """How much the scale slot multiplies the product (and its rounding errors) by: the
        factor of a constant scale, one over a divisor, else 1."""
        op = SCALE_SPELLINGS[self.scale] if self.scale else None
        if op is None or op.reads:
            return 1.0
        return abs(self.factor) if op.op == "scale" else 1 / abs(self.factor)

    @property
    def batch_axes(self) -> str:
        """The names of the batch axes, outermost first (a prefix of :data:`BATCH_AXES`)."""
        return BATCH_AXES[: len(self.batch)]

    def varying_dims(self, symbolic_batch: bool) -> tuple[int, ...]:
        """The batch dims whose extent is not a static 1 (all of them when symbolic)."""
        return tuple(d for d, e in enumerate(self.batch) if symbolic_batch or e != 1)


@dataclass(frozen=True)
class ProgramSpec:
    """A whole PrimFunc: chains in order, with distractors around them.

    Parameters
    ----------
    chains : tuple of ChainSpec
    distractors : tuple of DistractorSpec
    m : int
        The row extent M, or its run-time value when ``symbolic_m``.
    symbolic_m : bool
        M is a variable shared by every chain.
    symbolic_batch : bool
        Every batch dim is a variable (one per chain and dim; a chain fed by another shares
        its variables), bound to the chain's ``batch`` at run time.
    index_dtype : str
        ``"int32"`` or ``"int64"``: loop variables, iterators and shapes.
    name : str
        The function's global symbol.
    """

    chains: tuple[ChainSpec, ...] = (ChainSpec(),)
    distractors: tuple[DistractorSpec, ...] = ()
    m: int = 2
    symbolic_m: bool = False
    symbolic_batch: bool = False
    index_dtype: str = "int64"
    name: str = "main"

    def __post_init__(self):
        problem = _spec_problem(self)
        if problem:
            raise ValueError(f"ProgramSpec: {problem}")


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


def _chain_problem(chain: ChainSpec) -> str | None:
    checks = (
        (
            chain.layout in ("dense", "matmul"),
            f"expected layout dense or matmul, got {chain.layout!r}",
        ),
        (chain.n >= 1 and chain.k >= 1, f"expected n, k >= 1, got n={chain.n}, k={chain.k}"),
        (
            chain.bias in (None, "vector", "row"),
            f"expected bias vector, row or None, got {chain.bias!r}",
        ),
        (
            chain.relu is None or chain.relu in RELU_SPELLINGS,
            f"relu {chain.relu!r} unknown: expected a key of RELU_SPELLINGS or None",
        ),
        (
            tuple(chain.dtypes) in SIGNATURES,
            f"expected dtypes from SIGNATURES, got {chain.dtypes!r}",
        ),
        (
            _is_order(chain.loop_order, "ijk", chain.batch_axes),
            f"expected loop_order a permutation of 'ijk' and any of {chain.batch_axes!r}, "
            f"got {chain.loop_order!r}",
        ),
        (
            _is_order(chain.iter_order, "ijk", chain.batch_axes),
            f"expected iter_order a permutation of 'ijk' and any of {chain.batch_axes!r}, "
            f"got {chain.iter_order!r}",
        ),
        (
            _is_order(chain.epilogue_order, "ij", chain.batch_axes),
            f"expected epilogue_order a permutation of 'ij' and any of {chain.batch_axes!r}, "
            f"got {chain.epilogue_order!r}",
        ),
        (chain.alloc in ("sblock", "stmt"), f"expected alloc sblock or stmt, got {chain.alloc!r}"),
        (chain.init in INITS, f"expected init in {INITS}, got {chain.init!r}"),
        (chain.init != "bias" or chain.bias, "init 'bias' needs a chain with a bias"),
        (
            chain.swapped_slots is None
            or (
                len(chain.swapped_slots) == 2
                and chain.swapped_slots[0] != chain.swapped_slots[1]
                and set(chain.swapped_slots) <= set(SLOTS)
            ),
            f"expected swapped_slots of two of {SLOTS}, got {chain.swapped_slots}",
        ),
    )
    return (
        next((message for ok, message in checks if not ok), None)
        or _epilogue_problem(chain)
        or batch_problem(chain)
        or mutation_problem(chain)
    )


def _epilogue_problem(chain: ChainSpec) -> str | None:
    """What is wrong with the ops of a chain's epilogue (beyond bias and relu), or None."""
    tables = {
        "scale": ("SCALE_SPELLINGS", SCALE_SPELLINGS),
        "activation": ("ACTIVATION_SPELLINGS", ACTIVATION_SPELLINGS),
        "tail": ("TAIL_SPELLINGS", TAIL_SPELLINGS),
    }
    for field_name, (table_name, table) in tables.items():
        value = getattr(chain, field_name)
        if value is not None and value not in table:
            return f"{field_name} {value!r} unknown: expected a key of {table_name} or None"
    lo, hi = chain.bounds
    checks = (
        (not (chain.relu and chain.activation), "expected at most one of relu and activation"),
        (
            not (chain.scale or chain.activation) or chain.dtypes[2].startswith("float"),
            f"a scale or an activation other than relu needs a float accumulator, got "
            f"{chain.dtypes[2]}",
        ),
        (
            math.isfinite(chain.factor) and chain.factor != 0,
            f"expected a nonzero finite factor, got {chain.factor}",
        ),
        (
            math.isfinite(lo) and math.isfinite(hi) and lo < hi,
            f"expected clip bounds lo < hi, got {chain.bounds}",
        ),
        (0 < chain.slope <= 1, f"expected a leaky relu slope in (0, 1], got {chain.slope}"),
        (math.isfinite(chain.alpha), f"expected a finite swish alpha, got {chain.alpha}"),
        (
            not (chain.scale and chain.init == "bias"),
            "init 'bias' adds the bias before the scale, out of slot order",
        ),
        (
            len(chain.fused) <= max(len(chain.epilogue_ops) - 1, 0),
            f"expected at most one fused flag per pair of epilogue ops "
            f"{chain.epilogue_ops}, got {chain.fused}",
        ),
    )
    return next((message for ok, message in checks if not ok), None)


def _is_order(order: str, required: str, batch_axes: str) -> bool:
    """``order`` names each of ``required`` once and otherwise only batch axes, once each."""
    return len(set(order)) == len(order) and set(required) <= set(order) <= set(
        required + batch_axes
    )


def full_order(order: str, batch_axes: str) -> str:
    """``order`` with the batch axes it leaves out put first, in order."""
    return "".join(a for a in batch_axes if a not in order) + order


def _spec_problem(spec: ProgramSpec) -> str | None:
    if not spec.chains:
        return "expected at least one chain"
    if spec.index_dtype not in ("int32", "int64"):
        return f"expected index_dtype int32 or int64, got {spec.index_dtype!r}"
    if spec.m < 1:
        return f"expected m >= 1, got {spec.m}"
    for c, chain in enumerate(spec.chains):
        problem = _chain_problem(chain)
        if problem:
            return f"chain {c}: {problem}"
        label = batch_label(spec, chain)
        if chain.mutation is None and label.reason:
            return f"chain {c} is not a positive: {label.reason}"
        if chain.feeds_next:
            following = spec.chains[c + 1] if c + 1 < len(spec.chains) else None
            if following is None:
                return f"chain {c} feeds the next chain, but it is the last"
            if chain.dtypes[2] != "float32" or following.dtypes != ("float32",) * 3:
                return f"chain {c} feeds chain {c + 1}: both must be float32"
            if following.k != chain.n:
                return f"chain {c} feeds chain {c + 1}: expected k={chain.n}, got {following.k}"
            if following.batch != chain.batch or set(following.x_batch) - {"carry"}:
                return (
                    f"chain {c} feeds chain {c + 1}: expected batch {chain.batch} with X "
                    f"carrying every dim, got batch {following.batch}, x_batch "
                    f"{following.x_batch}"
                )
    if sum(chain.mutation is not None for chain in spec.chains) > 1:
        return "at most one chain may be mutated"
    for d in spec.distractors:
        problem = distractor_problem(spec, d)
        if problem:
            return problem
    return None
