"""Programs of the pattern family as data, built into real S-TIR PrimFuncs.

Entry points: :class:`ChainSpec` and :class:`ProgramSpec` describe a function (one or more
dense / matmul chains with their spellings, dtypes and extents, plus unrelated blocks next to
them); :func:`build_program` builds it into a :class:`Program`, a ``tvm.tirx.PrimFunc`` with
what the matcher should report for each chain; :func:`mutate` turns a positive into a near
miss that changes one thing the meaning depends on (:data:`MUTATIONS`).

Functions are built with the IR constructors (``s_tir.SBlock``, ``tirx.For``,
``tirx.BufferStore``...), not parsed from TVMScript, so every spelling can be reached: loop
orders, commuted operands, each relu spelling, int32 or int64 indices, a symbolic batch,
intermediates as root-block allocations or ``AllocBuffer`` statements.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tvm import ir, s_tir, tirx
from tvm.s_tir import analysis

from ..patterns import pattern_for
from ..signature import DtypeSignature

#: Relu spellings, by name: each builds ``relu(z)`` from ``z`` and a zero of z's dtype.
RELU_SPELLINGS: dict[str, Callable] = {
    "max(z, 0)": lambda z, c: tirx.Max(z, c),
    "max(0, z)": lambda z, c: tirx.Max(c, z),
    "select(z > 0, z, 0)": lambda z, c: tirx.Select(z > c, z, c),
    "select(0 < z, z, 0)": lambda z, c: tirx.Select(c < z, z, c),
    "select(z >= 0, z, 0)": lambda z, c: tirx.Select(z >= c, z, c),
    "select(z < 0, 0, z)": lambda z, c: tirx.Select(z < c, c, z),
    "select(z <= 0, 0, z)": lambda z, c: tirx.Select(z <= c, c, z),
    "select(0 > z, 0, z)": lambda z, c: tirx.Select(c > z, c, z),
    "if_then_else(z > 0, z, 0)": lambda z, c: tirx.if_then_else(z > c, z, c),
    "if_then_else(z < 0, 0, z)": lambda z, c: tirx.if_then_else(z < c, c, z),
}

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

#: Unrelated blocks placed next to a chain, touching its buffers.
DISTRACTORS = (
    "exp_x",  # E[i, k] = exp(X[i, k]) (min(X, 100) for integers): reads the chain's input
    "transpose_w_in",  # the weight is a local buffer, transposed from a parameter first
    "bias_in",  # the bias is a local buffer, computed elementwise from a parameter first
    "row_sum_out",  # R[i] = sum_j Z[i, j]: a row reduction of the chain's output
    "transpose_out",  # Zt[j, i] = Z[i, j]
    "inplace_out",  # Z[i, j] = tanh(Z[i, j]) after the chain (min(Z, 100) for integers)
    "unrelated",  # a block on buffers of its own
    "overwrite_x",  # X[i, k] = tanh(X[i, k]) in place (min(X, 100) for integers)
)

#: Distractors that must come before their chain (they produce one of its inputs).
_PRODUCERS = ("transpose_w_in", "bias_in")
#: Distractors that must come after their chain (they read its output).
_CONSUMERS = ("row_sum_out", "transpose_out", "inplace_out")
#: Distractors that may sit between a reduction and its epilogue.  The call that replaces a
#: chain runs where its last block was, so a block between that leaves the chain's buffers
#: alone stays there (TOPI's dense copies its bias right there); one that writes a buffer
#: the chain reads cuts it after the reduction.
INSIDE_KINDS = ("exp_x", "bias_in", "unrelated", "overwrite_x")
#: Inside kinds that cut the chain.
CUTTING_KINDS = ("overwrite_x",)


@dataclass(frozen=True)
class ChainSpec:
    """One dense / matmul chain and how it is spelled.

    Parameters
    ----------
    layout : str
        ``"dense"`` (weight N x K) or ``"matmul"`` (weight K x N).
    n, k : int
        Static extents (M belongs to the program).
    bias : str or None
        ``"vector"`` (shape (N,), read ``b[j]``), ``"row"`` (shape (1, N), read ``b[0, j]``)
        or None.
    bias_first : bool
        Spell the add ``b[j] + Y[i, j]`` instead of ``Y[i, j] + b[j]``.
    relu : str or None
        A key of :data:`RELU_SPELLINGS`, or None.
    folded : bool
        Bias and relu in one epilogue block (only with both).
    dtypes : tuple of str
        ``(x, w, accumulator)``, one of :data:`SIGNATURES`.
    loop_order : str
        Order of the reduction block's loops, a permutation of ``"ijk"``.
    iter_order : str
        Order of the reduction block's iterators, a permutation of ``"ijk"``.
    epilogue_order : str
        ``"ij"`` or ``"ji"``: loop order of the epilogue blocks.
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
    mutation : str or None
        A key of :data:`MUTATIONS`; set by :func:`mutate`.
    """

    layout: str = "dense"
    n: int = 4
    k: int = 3
    bias: str | None = None
    bias_first: bool = False
    relu: str | None = None
    folded: bool = False
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
    mutation: str | None = None

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for op, on in (("bias", self.bias), ("relu", self.relu)) if on)

    @property
    def epilogue_ops(self) -> tuple[str, ...]:
        """The ops of the epilogue blocks (a bias read by the init is not one of them)."""
        return tuple(op for op in self.ops if not (op == "bias" and self.init == "bias"))

    @property
    def pattern(self) -> str:
        """The pattern this chain computes when it is not mutated."""
        return pattern_for(self.layout, self.ops).name

    @property
    def epilogue_blocks(self) -> int:
        ops = self.epilogue_ops
        return 1 if self.folded and len(ops) == 2 else len(ops)


@dataclass(frozen=True)
class DistractorSpec:
    """An unrelated block: ``kind`` from :data:`DISTRACTORS`, next to chain ``chain``.

    It goes before the chain (``before``; producers always do), after it, or ``inside`` it:
    between the reduction and the first epilogue block, which cuts the chain there (the
    matcher only joins blocks that follow one another).
    """

    kind: str
    chain: int = 0
    before: bool = False
    inside: bool = False

    @property
    def placement(self) -> str:
        if self.inside:
            return "inside"
        if self.kind in _PRODUCERS or (self.before and self.kind not in _CONSUMERS):
            return "before"
        return "after"


@dataclass(frozen=True)
class ProgramSpec:
    """A whole PrimFunc: chains in order, with distractors around them.

    Parameters
    ----------
    chains : tuple of ChainSpec
    distractors : tuple of DistractorSpec
    m : int
        The batch extent, or its run-time value when ``symbolic_m``.
    symbolic_m : bool
        M is a variable shared by every chain.
    index_dtype : str
        ``"int32"`` or ``"int64"``: loop variables, iterators and shapes.
    name : str
        The function's global symbol.
    """

    chains: tuple[ChainSpec, ...] = (ChainSpec(),)
    distractors: tuple[DistractorSpec, ...] = ()
    m: int = 2
    symbolic_m: bool = False
    index_dtype: str = "int64"
    name: str = "main"

    def __post_init__(self):
        problem = _spec_problem(self)
        if problem:
            raise ValueError(f"ProgramSpec: {problem}")


@dataclass(frozen=True)
class ExpectedChain:
    """What the generator built for one chain, for checking the matcher's report.

    ``pattern`` is the pattern the chain was built as; when ``mutation`` is set the chain is a
    near miss of that pattern and must not be reported as it.
    """

    index: int
    pattern: str
    blocks: tuple[str, ...]
    x: str
    w: str
    bias: str | None
    out: str
    dtype: DtypeSignature
    mutation: str | None = None


@dataclass(frozen=True)
class Program:
    """A built function and what it should scan as."""

    spec: ProgramSpec
    func: tirx.PrimFunc = field(repr=False)
    chains: tuple[ExpectedChain, ...]
    bindings: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def mutated(self) -> ExpectedChain | None:
        return next((c for c in self.chains if c.mutation), None)

    def script(self) -> str:
        """The function as TVMScript that parses back (see :func:`to_tvmscript`)."""
        from .script import to_tvmscript

        return to_tvmscript(self.func)


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
            sorted(chain.loop_order) == list("ijk"),
            f"expected loop_order a permutation of 'ijk', got {chain.loop_order!r}",
        ),
        (
            sorted(chain.iter_order) == list("ijk"),
            f"expected iter_order a permutation of 'ijk', got {chain.iter_order!r}",
        ),
        (
            chain.epilogue_order in ("ij", "ji"),
            f"expected epilogue_order 'ij' or 'ji', got {chain.epilogue_order!r}",
        ),
        (chain.alloc in ("sblock", "stmt"), f"expected alloc sblock or stmt, got {chain.alloc!r}"),
        (chain.init in INITS, f"expected init in {INITS}, got {chain.init!r}"),
        (chain.init != "bias" or chain.bias, "init 'bias' needs a chain with a bias"),
        (
            chain.mutation is None or chain.mutation in MUTATIONS,
            f"mutation {chain.mutation!r} unknown: expected a key of MUTATIONS or None",
        ),
    )
    return next((message for ok, message in checks if not ok), None)


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
        if chain.feeds_next:
            following = spec.chains[c + 1] if c + 1 < len(spec.chains) else None
            if following is None:
                return f"chain {c} feeds the next chain, but it is the last"
            if chain.dtypes[2] != "float32" or following.dtypes != ("float32",) * 3:
                return f"chain {c} feeds chain {c + 1}: both must be float32"
            if following.k != chain.n:
                return f"chain {c} feeds chain {c + 1}: expected k={chain.n}, got {following.k}"
    if sum(chain.mutation is not None for chain in spec.chains) > 1:
        return "at most one chain may be mutated"
    for d in spec.distractors:
        if d.kind not in DISTRACTORS or not 0 <= d.chain < len(spec.chains):
            return f"distractor {d} names an unknown kind or chain"
        if d.kind == "bias_in" and spec.chains[d.chain].bias is None:
            return f"distractor {d}: chain {d.chain} has no bias"
        if d.inside and (d.kind not in INSIDE_KINDS or not spec.chains[d.chain].epilogue_blocks):
            return (
                f"distractor {d}: expected a kind in {INSIDE_KINDS} and a chain with an "
                "epilogue block to sit inside"
            )
        if d.inside and d.kind == "bias_in" and spec.chains[d.chain].init == "bias":
            return f"distractor {d}: the init of chain {d.chain} reads the bias before it is made"
    return None


# --------------------------------------------------------------------------------------
# Near misses
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """A change to one chain that changes what it computes.

    ``applies(spec, c)`` says whether chain ``c`` of ``spec`` can take it; ``square`` names
    the extents it sets equal (so that the mutant still indexes in bounds).
    """

    description: str
    applies: Callable[[ProgramSpec, int], bool] = lambda spec, c: True
    square: tuple[str, str] | None = None


def _has(op):
    return lambda spec, c: op in spec.chains[c].ops


def _in_epilogue(op):
    return lambda spec, c: op in spec.chains[c].epilogue_ops


def _not_in_place(spec, c):
    return not spec.chains[c].in_place


def _float_relu(spec, c):
    return spec.chains[c].relu is not None and spec.chains[c].dtypes[2].startswith("float")


def _static(spec, c):
    return not spec.symbolic_m


def _separate_epilogue(spec, c):
    return spec.chains[c].epilogue_blocks > 0


def _can_alias(spec, c):
    chain = spec.chains[c]
    linked_in = c > 0 and spec.chains[c - 1].feeds_next
    return chain.dtypes[0] == chain.dtypes[2] and not chain.feeds_next and not linked_in


def _writes_param(spec, c):
    """The chain's output is a parameter, so a part left unwritten is still defined."""
    return not spec.chains[c].feeds_next


def _both(a, b):
    return lambda spec, c: a(spec, c) and b(spec, c)


#: The near misses, by name.
MUTATIONS: dict[str, Mutation] = {
    "init_one": Mutation("the reduction starts from 1, not 0"),
    "k_short": Mutation("the reduction stops one short of K", lambda s, c: s.chains[c].k >= 2),
    "reduce_max": Mutation("the reduction combines with max, not +"),
    "reduce_sub": Mutation("the reduction subtracts the products"),
    "reduce_sum_not_product": Mutation("the reduction adds X + W, not X * W"),
    "swap_x_index": Mutation("X is read as X[k, i]", _static, square=("m", "k")),
    "swap_w_index": Mutation("the weight is read in the other layout", square=("n", "k")),
    "swap_epilogue_index": Mutation(
        "the first epilogue reads Y[j, i]", _both(_static, _separate_epilogue), square=("m", "n")
    ),
    "bias_row_axis": Mutation(
        "the bias is indexed by the row, b[i]", _both(_has("bias"), _static), square=("m", "n")
    ),
    "bias_full": Mutation("the bias is a full (M, N) matrix", _has("bias")),
    "bias_second_row": Mutation("the bias is row 1 of a (2, N) array, b[1, j]", _has("bias")),
    "reduction_short_rows": Mutation(
        "the reduction, writing the output itself, stops one row short of M",
        lambda s, c: not s.chains[c].ops and _writes_param(s, c) and (s.symbolic_m or s.m >= 2),
    ),
    "bias_sub": Mutation("the bias is subtracted", _in_epilogue("bias")),
    "bias_mul": Mutation("the bias multiplies", _in_epilogue("bias")),
    "relu_threshold": Mutation("relu against 1, not 0", _has("relu")),
    "select_shifted": Mutation("select(z > 1, z, 0)", _has("relu")),
    "leaky_relu": Mutation("a leaky relu (slope 0.01 below 0)", _float_relu),
    "clipped_relu": Mutation("a relu clipped at 6", _has("relu")),
    "epilogue_swapped": Mutation(
        "relu before the bias add", lambda s, c: s.chains[c].epilogue_ops == ("bias", "relu")
    ),
    "alias_output_input": Mutation(
        "the chain's last block writes into X", _both(_can_alias, _not_in_place), square=("n", "k")
    ),
    "intermediate_read_after": Mutation(
        "the reduction's output is also read after the chain",
        _both(_separate_epilogue, _not_in_place),
    ),
    "select_on_pre_bias": Mutation(
        "one block computes select(Y > 0, Y + b, 0): the test misses the bias",
        lambda s, c: s.chains[c].folded and s.chains[c].epilogue_ops == ("bias", "relu"),
    ),
    "init_block_short": Mutation(
        "the init block, of a reduction writing the output itself, stops one row short of M",
        lambda s, c: (
            s.chains[c].init == "block"
            and (s.chains[c].in_place or not s.chains[c].ops)
            and _writes_param(s, c)
            and (s.symbolic_m or s.m >= 2)
        ),
    ),
    "read_between_in_place": Mutation(
        "a block reads the raw product between the reduction and an in-place epilogue",
        lambda s, c: s.chains[c].in_place and _separate_epilogue(s, c),
    ),
    "epilogue_short": Mutation(
        "the last epilogue block stops one column short of N",
        lambda s, c: _separate_epilogue(s, c) and s.chains[c].n >= 2 and _writes_param(s, c),
    ),
}


def applicable_mutations(spec: ProgramSpec, c: int) -> list[str]:
    """Names of the mutations chain ``c`` of ``spec`` can take (none if a block cuts it)."""
    if any(d.inside and d.chain == c for d in spec.distractors):
        return []
    return [name for name, mutation in MUTATIONS.items() if mutation.applies(spec, c)]


def mutate(spec: ProgramSpec, c: int, name: str) -> ProgramSpec:
    """``spec`` with chain ``c`` mutated by ``name``; extents made equal where it needs."""
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; expected one of {sorted(MUTATIONS)}")
    mutation = MUTATIONS[name]
    if not mutation.applies(spec, c):
        raise ValueError(f"mutation {name!r} does not apply to chain {c} of {spec}")
    chains = list(spec.chains)
    chain = replace(chains[c], mutation=name)
    m = spec.m
    if mutation.square == ("m", "k"):
        chain = replace(chain, k=m)
    elif mutation.square == ("m", "n"):
        chain = replace(chain, n=m)
    elif mutation.square == ("n", "k"):
        chain = replace(chain, n=chain.k)
    chains[c] = chain
    return replace(spec, chains=tuple(_relink(chains, c)))


def _relink(chains: list[ChainSpec], pinned: int) -> list[ChainSpec]:
    """Restore k[c + 1] == n[c] along feeding chains, keeping chain ``pinned`` as it is."""
    for c in range(pinned - 1, -1, -1):
        if chains[c].feeds_next:
            chains[c] = replace(chains[c], n=chains[c + 1].k)
    for c in range(pinned, len(chains) - 1):
        if chains[c].feeds_next:
            chains[c + 1] = replace(chains[c + 1], k=chains[c].n)
    return chains


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


class _Builder:
    """Accumulates buffers and root-level statements of one PrimFunc."""

    def __init__(self, spec: ProgramSpec):
        self.spec = spec
        self.index_dtype = spec.index_dtype
        if spec.symbolic_m:
            self.m = tirx.Var("m", spec.index_dtype)
            self.bindings = {self.m: spec.m}
        else:
            self.m = self.const(spec.m)
            self.bindings = {}
        self.params: list = []
        self.buffers: dict = {}
        self.root_allocs: list = []
        self.body: list = []
        self.pending: dict = {}  # buffer -> AllocBuffer to emit before its first writer

    def const(self, value: int):
        return tirx.IntImm(self.index_dtype, value)

    # Step 1. Buffers.
    def buffer(self, name, shape, dtype, *, param=True, alloc="sblock", offset=False):
        shape = [self.const(s) if isinstance(s, int) else s for s in shape]
        elem_offset = tirx.Var(f"{name}_offset", self.index_dtype) if offset else None
        var = tirx.decl_buffer(
            shape,
            dtype,
            name=name,
            layout=None,
            elem_offset=elem_offset,
            offset_factor=1 if offset else 0,
        )
        self.buffers[var] = var
        if param:
            self.params.append(var)
        elif alloc == "sblock":
            self.root_allocs.append(var)
        else:
            self.pending[var] = tirx.AllocBuffer(var)
        return var

    # Step 2. Blocks in perfect loop nests.
    def nest(self, name, axes, store, *, init=None, loop_order=None, iter_order=None):
        """Emit ``for ...: with sblock(name)`` over ``axes`` = [(axis, extent, reduce)].

        ``store(iters)`` and ``init(iters)`` build the BufferStores from the block's
        iterators, given by axis name.
        """
        names = [axis for axis, _, _ in axes]
        iter_names = list(iter_order or names)
        loop_names = list(loop_order or names)
        extent = {axis: ext for axis, ext, _ in axes}
        reduce = {axis: red for axis, _, red in axes}
        iters = {axis: tirx.Var(f"v{axis}", self.index_dtype) for axis in names}
        loops = {axis: tirx.Var(axis, self.index_dtype) for axis in names}
        iter_vars = [
            tirx.IterVar(
                ir.Range.from_min_extent(self.const(0), extent[a]),
                iters[a],
                tirx.IterVar.CommReduce if reduce[a] else tirx.IterVar.DataPar,
            )
            for a in iter_names
        ]
        body = store(iters)
        init_stmt = init(iters) if init is not None else None
        draft = s_tir.SBlock(iter_vars, [], [], name, body, init_stmt)
        reads, writes = analysis.get_sblock_read_write_region(draft, self.buffers)
        block = s_tir.SBlock(iter_vars, reads, writes, name, body, init_stmt)
        stmt = s_tir.SBlockRealize([loops[a] for a in iter_names], True, block)
        for axis in reversed(loop_names):
            stmt = tirx.For(loops[axis], self.const(0), extent[axis], tirx.ForKind.SERIAL, stmt)
        self.emit(stmt, body.buffer)
        return stmt

    def emit(self, stmt, written):
        if written in self.pending:
            self.body.append(self.pending.pop(written))
        self.body.append(stmt)

    # Step 3. The function.
    def finish(self) -> tirx.PrimFunc:
        self.body.extend(self.pending.values())  # allocated but never written (none today)
        body = self.body[0] if len(self.body) == 1 else tirx.SeqStmt(self.body)
        root = s_tir.SBlock([], [], [], "root", body, None, self.root_allocs)
        func = tirx.PrimFunc(self.params, s_tir.SBlockRealize([], True, root))
        return func.with_attr("global_symbol", self.spec.name).with_attr("s_tir", True)


def _zero(dtype):
    return tirx.const(0, dtype)


def _elementwise_op(value, dtype, bounded=False):
    """exp for floats (tanh where ``bounded``), min(., 100) for integers: nothing overflows.

    None of them is an epilogue of the family, so a distractor that updates a chain's output
    in place never joins the chain.

    ``bounded`` is for values that flow on into another chain: exp of a chain's output can
    reach inf, and inf - inf in the next reduction gives NaN, on which relu spellings
    disagree (see the README of tests/properties).
    """
    if not _is_float(dtype):
        return tirx.Min(value, tirx.const(100, dtype))
    return tirx.tanh(value) if bounded else tirx.exp(value)


class _ChainBuilder:
    """Builds the blocks of one chain into a :class:`_Builder`."""

    def __init__(self, b: _Builder, c: int, chain: ChainSpec, x=None):
        self.b, self.c, self.chain = b, c, chain
        self.mutation = chain.mutation
        x_dtype, w_dtype, self.acc = chain.dtypes
        n, k = b.const(chain.n), b.const(chain.k)
        self.n, self.k = n, k
        alloc = chain.alloc
        # Step 1. Inputs (X may come from the previous chain; W and b may be made locally).
        self.x = x if x is not None else b.buffer(f"X{c}", (b.m, k), x_dtype, offset=chain.x_view)
        w_shape = (n, k) if chain.layout == "dense" else (k, n)
        produced = {d.kind for d in b.spec.distractors if d.chain == c}
        local_w = "transpose_w_in" in produced
        self.w = b.buffer(f"W{c}", w_shape, w_dtype, param=not local_w, alloc=alloc)
        self.bias = None
        if chain.bias:
            local_b = "bias_in" in produced
            self.bias = b.buffer(
                f"b{c}", self._bias_shape(), self.acc, param=not local_b, alloc=alloc
            )
        # Step 2. Outputs and intermediates (one buffer for all when updated in place).
        steps = chain.epilogue_blocks
        names = [*["Y", "T"][:steps], "Z"]
        if chain.in_place:
            names = names[-1:]
        self.stages = []
        for s, stem in enumerate(names):
            last = s == len(names) - 1
            if last and self.mutation == "alias_output_input":
                self.stages.append(self.x)
                continue
            param = last and not chain.feeds_next
            self.stages.append(b.buffer(f"{stem}{c}", (b.m, n), self.acc, param=param, alloc=alloc))
        if chain.in_place:
            self.stages *= steps + 1

    @property
    def out(self):
        return self.stages[-1]

    def _bias_shape(self):
        m, n = self.b.m, self.n
        if self.mutation == "bias_row_axis":
            return (m,)
        if self.mutation == "bias_full":
            return (m, n)
        if self.mutation == "bias_second_row":
            return (2, n)
        return (n,) if self.chain.bias == "vector" else (1, n)

    def _bias_load(self, vi, vj):
        if self.mutation == "bias_row_axis":
            return tirx.BufferLoad(self.bias, [vi])
        if self.mutation == "bias_full":
            return tirx.BufferLoad(self.bias, [vi, vj])
        if self.mutation == "bias_second_row":
            return tirx.BufferLoad(self.bias, [self.b.const(1), vj])
        if self.chain.bias == "vector":
            return tirx.BufferLoad(self.bias, [vj])
        return tirx.BufferLoad(self.bias, [self.b.const(0), vj])

    # Step 3. The reduction.
    def reduction(self):
        chain, b = self.chain, self.b
        out = self.stages[0]
        k_extent = b.const(chain.k - 1) if self.mutation == "k_short" else self.k

        def operand(buffer, indices):
            load = tirx.BufferLoad(buffer, indices)
            return load if buffer.dtype == self.acc else tirx.Cast(self.acc, load)

        def store(v):
            vi, vj, vk = v["i"], v["j"], v["k"]
            x_index = [vk, vi] if self.mutation == "swap_x_index" else [vi, vk]
            dense = (chain.layout == "dense") != (self.mutation == "swap_w_index")
            x, w = operand(self.x, x_index), operand(self.w, [vj, vk] if dense else [vk, vj])
            if self.mutation == "reduce_sum_not_product":
                update = x + w
            else:
                update = w * x if chain.commuted else x * w
            acc = tirx.BufferLoad(out, [vi, vj])
            if self.mutation == "reduce_max":
                value = tirx.Max(acc, update)
            elif self.mutation == "reduce_sub":
                value = acc - update
            else:
                value = update + acc if chain.accumulate_last else acc + update
            return tirx.BufferStore(out, value, [vi, vj])

        def init(v):
            if self.mutation == "init_one":
                start = tirx.const(1, self.acc)
            elif chain.init == "bias":
                start = self._bias_load(v["i"], v["j"])
            else:
                start = _zero(self.acc)
            return tirx.BufferStore(out, start, [v["i"], v["j"]])

        names = []
        if chain.init == "block":
            short = self.mutation == "init_block_short"
            rows = b.m - b.const(1) if short else b.m
            names.append(f"{chain.layout}{self.c}_init")
            b.nest(names[-1], [("i", rows, False), ("j", self.n, False)], init)
        m_extent = b.m - b.const(1) if self.mutation == "reduction_short_rows" else b.m
        axes = [("i", m_extent, False), ("j", self.n, False), ("k", k_extent, True)]
        names.append(f"{chain.layout}{self.c}")
        b.nest(
            names[-1],
            axes,
            store,
            init=init if chain.init != "block" else None,
            loop_order=chain.loop_order,
            iter_order=chain.iter_order,
        )
        return tuple(names)

    # Step 4. The epilogue blocks.
    def epilogues(self):
        ops = self.chain.epilogue_ops
        if self.mutation == "epilogue_swapped":
            ops = tuple(reversed(ops))
        groups = [ops] if self.chain.epilogue_blocks == 1 else [(op,) for op in ops]
        names = []
        for s, group in enumerate(groups):
            source, target = self.stages[s], self.stages[s + 1]
            names.append(self._epilogue(s, group, source, target, s == len(groups) - 1))
        return names

    def _epilogue(self, s, group, source, target, last):
        swap = s == 0 and self.mutation == "swap_epilogue_index"

        def store(v):
            vi, vj = v["i"], v["j"]
            value = tirx.BufferLoad(source, [vj, vi] if swap else [vi, vj])
            loaded = value
            for op in group:
                if op == "bias":
                    value = self._bias(value, vi, vj)
                elif self.mutation == "select_on_pre_bias":
                    value = tirx.Select(loaded > _zero(self.acc), value, _zero(self.acc))
                else:
                    value = self._relu(value)
            return tirx.BufferStore(target, value, [vi, vj])

        n = self.b.const(self.chain.n - 1) if last and self.mutation == "epilogue_short" else self.n
        axes = [("i", self.b.m, False), ("j", n, False)]
        name = f"{'_'.join(group)}{self.c}"
        self.b.nest(name, axes, store, loop_order=self.chain.epilogue_order)
        return name

    def _bias(self, value, vi, vj):
        bias = self._bias_load(vi, vj)
        left, right = (bias, value) if self.chain.bias_first else (value, bias)
        if self.mutation == "bias_sub":
            return left - right
        if self.mutation == "bias_mul":
            return left * right
        return left + right

    def _relu(self, z):
        zero = _zero(self.acc)
        spelling = RELU_SPELLINGS[self.chain.relu]
        if self.mutation == "relu_threshold":
            return spelling(z, tirx.const(1, self.acc))
        if self.mutation == "select_shifted":
            return tirx.Select(z > tirx.const(1, self.acc), z, zero)
        if self.mutation == "leaky_relu":
            slope = z * tirx.const(0.01, self.acc)
            if self.chain.relu.startswith("max"):
                return tirx.Max(z, slope)
            return tirx.Select(z > zero, z, slope)
        if self.mutation == "clipped_relu":
            return tirx.Min(spelling(z, zero), tirx.const(6, self.acc))
        return spelling(z, zero)


def _distractor(b: _Builder, d: DistractorSpec, chain: _ChainBuilder, tag: str):
    """Emit the blocks of distractor ``d`` next to ``chain``."""
    c = chain.c
    if d.kind == "exp_x":
        _map(b, f"exp_x{tag}", chain.x, b.buffer(f"E{tag}", chain.x.shape, chain.x.dtype))
    elif d.kind == "transpose_w_in":
        rows, cols = chain.w.shape
        source = b.buffer(f"Wt{c}", (cols, rows), chain.w.dtype)
        _transpose(b, f"transpose_w{tag}", source, chain.w)
    elif d.kind == "bias_in":
        _map(
            b, f"make_b{tag}", b.buffer(f"bsrc{c}", chain.bias.shape, chain.bias.dtype), chain.bias
        )
    elif d.kind == "row_sum_out":
        _row_sum(b, f"row_sum{tag}", chain.out, b.buffer(f"R{tag}", (b.m,), chain.out.dtype))
    elif d.kind == "transpose_out":
        rows, cols = chain.out.shape
        _transpose(
            b, f"transpose_out{tag}", chain.out, b.buffer(f"Zt{tag}", (cols, rows), chain.out.dtype)
        )
    elif d.kind == "inplace_out":
        _map(b, f"inplace{tag}", chain.out, chain.out, bounded=True)
    elif d.kind == "overwrite_x":
        _map(b, f"overwrite_x{tag}", chain.x, chain.x, bounded=True)
    else:
        source = b.buffer(f"U{tag}", (b.m, b.const(3)), "float32")
        _map(b, f"unrelated{tag}", source, b.buffer(f"V{tag}", (b.m, b.const(3)), "float32"))


def _axes(shape):
    return [(a, e, False) for a, e in zip("ij", shape)]


def _map(b: _Builder, name, source, target, bounded=False):
    def store(v):
        idx = [v[a] for a in "ij"[: len(target.shape)]]
        value = _elementwise_op(tirx.BufferLoad(source, idx), target.dtype, bounded)
        return tirx.BufferStore(target, value, idx)

    b.nest(name, _axes(target.shape), store)


def _transpose(b: _Builder, name, source, target):
    def store(v):
        return tirx.BufferStore(target, tirx.BufferLoad(source, [v["j"], v["i"]]), [v["i"], v["j"]])

    b.nest(name, _axes(target.shape), store)


def _row_sum(b: _Builder, name, source, target):
    def store(v):
        acc = tirx.BufferLoad(target, [v["i"]])
        return tirx.BufferStore(target, acc + tirx.BufferLoad(source, [v["i"], v["j"]]), [v["i"]])

    def init(v):
        return tirx.BufferStore(target, _zero(target.dtype), [v["i"]])

    axes = [("i", source.shape[0], False), ("j", source.shape[1], True)]
    b.nest(name, axes, store, init=init)


def _cut_after_reduction(c, chain, built, reduction) -> ExpectedChain:
    """What a chain cut by a block between its reduction and its epilogue scans as."""
    bias = built.bias if chain.init == "bias" else None
    return ExpectedChain(
        index=c,
        pattern=pattern_for(chain.layout, ("bias",) if bias is not None else ()).name,
        blocks=reduction,
        x=built.x.name,
        w=built.w.name,
        bias=bias.name if bias is not None else None,
        out=built.stages[0].name,
        dtype=DtypeSignature(*chain.dtypes),
    )


def build_program(spec: ProgramSpec) -> Program:
    """Build ``spec`` into a PrimFunc and the report expected for each of its chains."""
    b = _Builder(spec)
    expected = []
    x = None
    for c, chain in enumerate(spec.chains):
        around = [(n, d) for n, d in enumerate(spec.distractors) if d.chain == c]
        built = _ChainBuilder(b, c, chain, x)
        # Step 1. Producers and distractors placed before the chain.
        for n, d in around:
            if d.placement == "before":
                _distractor(b, d, built, f"{c}_{n}")
        # Step 2. The chain, maybe cut after its reduction by blocks placed inside it.
        reduction = built.reduction()
        inside = [(n, d) for n, d in around if d.placement == "inside"]
        for n, d in inside:
            _distractor(b, d, built, f"{c}_{n}")
        if chain.mutation == "read_between_in_place":
            peek = b.buffer(f"P{c}", (b.m, built.n), built.acc)
            _map(b, f"peek{c}", built.stages[0], peek)
        blocks = (*reduction, *built.epilogues())
        if chain.mutation == "intermediate_read_after":
            peek = b.buffer(f"P{c}", (b.m, built.n), built.acc)
            _map(b, f"peek{c}", built.stages[0], peek)
        # Step 3. Distractors after it.
        for n, d in around:
            if d.placement == "after":
                _distractor(b, d, built, f"{c}_{n}")
        if any(d.kind in CUTTING_KINDS for _, d in inside):
            expected.append(_cut_after_reduction(c, chain, built, reduction))
            x = built.out if chain.feeds_next else None
            continue
        expected.append(
            ExpectedChain(
                index=c,
                pattern=chain.pattern,
                blocks=blocks,
                x=built.x.name,
                w=built.w.name,
                bias=built.bias.name if built.bias is not None else None,
                out=built.out.name,
                dtype=DtypeSignature(*chain.dtypes),
                mutation=chain.mutation,
            )
        )
        x = built.out if chain.feeds_next else None
    return Program(spec, b.finish(), tuple(expected), b.bindings)


__all__ = [
    "CUTTING_KINDS",
    "DISTRACTORS",
    "INITS",
    "INSIDE_KINDS",
    "MUTATIONS",
    "RELU_SPELLINGS",
    "SIGNATURES",
    "ChainSpec",
    "DistractorSpec",
    "ExpectedChain",
    "Mutation",
    "Program",
    "ProgramSpec",
    "applicable_mutations",
    "build_program",
    "mutate",
]
