"""hypothesis strategies over programs of the pattern family, and over their near misses.

Entry points: :func:`programs` (positives: functions whose chains all compute a pattern),
:func:`mutants` (a positive with one chain changed so that it no longer computes its
pattern), and the spec-level strategies they are built from (:func:`chain_specs`,
:func:`program_specs`, :func:`mutant_specs`).  Each program is a
:class:`~tir_byoc.testing.programs.Program`: a real S-TIR PrimFunc plus what the matcher
should report for it.

This module needs ``hypothesis`` (a development dependency: ``pip install tir-byoc[dev]``).
Use it to test your own intrinsics the way tir_byoc tests its own::

    from hypothesis import given
    from tir_byoc.testing import strategies
    from tir_byoc.testing.equivalence import assert_equivalent

    @given(strategies.programs(signatures=[("float32", "float32", "float32")]))
    def test_my_backend(program):
        rewritten = tir_byoc.offload(program.func, backends=["mine"])
        assert_equivalent(program.func, rewritten, bindings=program.bindings)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

try:
    from hypothesis import strategies as st
except ImportError as missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tir_byoc.testing.strategies needs hypothesis: pip install 'tir-byoc[dev]' "
        "(or pip install hypothesis)"
    ) from missing

from tvm import s_tir

from ..epilogues import SLOTS
from .loop_dtypes import retype_loops
from .programs import (
    BATCH_AXES,
    DISTRACTORS,
    INITS,
    INSIDE_KINDS,
    MUTATIONS,
    RELU_SPELLINGS,
    SIGNATURES,
    ChainSpec,
    DistractorSpec,
    Program,
    ProgramSpec,
    applicable_mutations,
    build_program,
    mutate,
)
from .schedule_steps import SCHEDULE_STEPS, apply_step, leaf_blocks, lower_to_plain_loops
from .spellings import ACTIVATION_SPELLINGS, SCALE_SPELLINGS, TAIL_SPELLINGS

#: Extents drawn by default: 1, small primes and powers of two (shrinking goes to the left).
EXTENTS = (1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 31, 32)

#: Numbers of batch dims drawn by default: half the chains are 2-D (which compile faster).
BATCH_RANKS = (0, 0, 1, 2)

#: Batch extents drawn by default: small, since every batch index is a whole product.
BATCH_EXTENTS = (1, 2, 3)

#: Scale factors and divisors drawn: attention's 1/sqrt(d) and others of either sign, some
#: far from 1 (a gain that large widens the equivalence tolerance, see ChainSpec.gain).
FACTORS = (0.125, 1 / 32**0.5, -0.5, 2.0, 3.0, -1.0, 1e-3, 1e3)

#: Clip bounds drawn: a lower bound, and how far above it the upper one is.
CLIP_LOWER = (0.0, -1.0, -6.0, -0.5, 0.25, 2.0)
CLIP_WIDTH = (6.0, 1.0, 0.5, 100.0)

#: Leaky relu slopes drawn, the top of (0, 1] included (slope 0 is a refusal: see mutations).
SLOPES = (0.01, 0.1, 0.2, 0.5, 1.0)

#: Swish alphas drawn: CLIP's quick_gelu, silu's 1 (written as a multiply), a negative one.
ALPHAS = (1.702, 1.0, 0.5, -1.0)

#: The activation ops other than relu, in the order of their first spelling.
_ACTIVATION_OPS = tuple(dict.fromkeys(spelling.op for spelling in ACTIVATION_SPELLINGS.values()))

#: What kind of activation a chain draws: often a relu (each of its spellings), as often one
#: of the others (floats only), sometimes none.
ACTIVATION_KINDS = (None, "relu", "other", "relu", "other")


@st.composite
def batch_modes(draw, extents: Sequence[int], symbolic_batch: bool = False):
    """(x_batch, w_batch) for batch dims of ``extents``: each operand carries, broadcasts or
    lacks each dim (only leading dims lack), and every dim whose extent is not a static 1
    is carried by X, by W or by both, as in a positive."""
    readers = []
    for extent in extents:
        choices = ("x", "w", "both") + (("neither",) if extent == 1 and not symbolic_batch else ())
        readers.append(draw(st.sampled_from(choices)))

    def modes(operand):
        carried = [r in (operand, "both") for r in readers]
        first = carried.index(True) if True in carried else len(carried)
        lacking = draw(st.integers(0, first))
        return tuple(
            "lack" if d < lacking else "carry" if carry else "broadcast"
            for d, carry in enumerate(carried)
        )

    return modes("x"), modes("w")


def _order(draw, required: str, batch_axes: str) -> str:
    return "".join(draw(st.permutations(tuple(batch_axes + required))))


@st.composite
def chain_specs(
    draw,
    *,
    layouts: Sequence[str] = ("dense", "matmul"),
    signatures: Sequence[tuple[str, str, str]] = SIGNATURES,
    extents: Sequence[int] = EXTENTS,
    batch_ranks: Sequence[int] = BATCH_RANKS,
    batch_extents: Sequence[int] = BATCH_EXTENTS,
    symbolic_batch: bool = False,
) -> ChainSpec:
    """One chain: layout, epilogue, spelling, dtypes and extents drawn independently.

    ``batch_ranks`` are the numbers of batch dims to draw from (repeat one to draw it more
    often), ``batch_extents`` their
    extents; ``symbolic_batch`` says the program makes them variables (then a dim of extent
    1 must be read too).
    """
    dtypes = draw(st.sampled_from(tuple(tuple(s) for s in signatures)))
    bias = draw(st.sampled_from((None, "vector", "row")))
    init = draw(st.sampled_from(INITS if bias else tuple(i for i in INITS if i != "bias")))
    epilogue = draw(epilogue_fields(dtypes[2].startswith("float"), scale=init != "bias"))
    count = sum(1 for f in ("scale", "relu", "activation", "tail") if epilogue.get(f))
    count += bool(bias) and init != "bias"
    rank = draw(st.sampled_from(tuple(batch_ranks)))
    batch = tuple(draw(st.sampled_from(tuple(batch_extents))) for _ in range(rank))
    x_batch, w_batch = draw(batch_modes(batch, symbolic_batch))
    axes = BATCH_AXES[:rank]
    return ChainSpec(
        layout=draw(st.sampled_from(tuple(layouts))),
        n=draw(st.sampled_from(tuple(extents))),
        k=draw(st.sampled_from(tuple(extents))),
        batch=batch,
        x_batch=x_batch,
        w_batch=w_batch,
        bias=bias,
        bias_first=draw(st.booleans()),
        **epilogue,
        fused=tuple(draw(st.booleans()) for _ in range(count - 1)),
        dtypes=dtypes,
        loop_order=_order(draw, "ijk", axes),
        iter_order=_order(draw, "ijk", axes),
        epilogue_order=_order(draw, "ij", axes),
        commuted=draw(st.booleans()),
        accumulate_last=draw(st.booleans()),
        alloc=draw(st.sampled_from(("sblock", "stmt"))),
        x_view=draw(st.booleans()),
        init=init,
        in_place=draw(st.booleans()),
        swapped_slots=draw(st.sampled_from((None, None, *SLOT_PAIRS))),
    )


#: Every pair of slots, for epilogues out of slot order (:attr:`ChainSpec.swapped_slots`).
SLOT_PAIRS = tuple(itertools.combinations(SLOTS, 2))


@st.composite
def epilogue_fields(draw, floating: bool, scale: bool = True) -> dict:
    """The :class:`ChainSpec` fields of an epilogue beyond the bias: a scale (``scale`` allows
    one; floats only), an activation (a relu spelling, or one of the others for floats) and a
    residual add or gating mul, each spelled one way or another, with valid constants."""
    fields = {}
    if floating and scale:
        fields["scale"] = draw(st.sampled_from((None, None, *SCALE_SPELLINGS)))
        fields["factor"] = draw(st.sampled_from(FACTORS))
    kinds = ACTIVATION_KINDS if floating else tuple(k for k in ACTIVATION_KINDS if k != "other")
    kind = draw(st.sampled_from(kinds))
    if kind == "relu":
        fields["relu"] = draw(st.sampled_from(tuple(RELU_SPELLINGS)))
    elif kind == "other":  # the op first, then its spelling: each op as likely
        op = draw(st.sampled_from(_ACTIVATION_OPS))
        names = [name for name, spelling in ACTIVATION_SPELLINGS.items() if spelling.op == op]
        fields["activation"] = draw(st.sampled_from(names))
        lower = draw(st.sampled_from(CLIP_LOWER))
        fields["bounds"] = (lower, lower + draw(st.sampled_from(CLIP_WIDTH)))
        fields["slope"] = draw(st.sampled_from(SLOPES))
        fields["alpha"] = draw(st.sampled_from(ALPHAS))
    fields["tail"] = draw(st.sampled_from((None, None, *TAIL_SPELLINGS)))
    return fields


def _link(chains: list[ChainSpec], feeds: list[bool]) -> list[ChainSpec]:
    """Make chain c + 1 read chain c's output where ``feeds[c]`` and both can be float32.

    The fed chain takes the feeding chain's batch dims, all carried by X; its weight keeps
    its own batch modes if it has as many dims, else it lacks every one.
    """
    fp32 = ("float32",) * 3
    for c in range(len(chains) - 1):
        if feeds[c] and chains[c].dtypes[2] == "float32":
            chains[c] = replace(chains[c], feeds_next=True)
            batch, following = chains[c].batch, chains[c + 1]
            same_rank = len(following.batch) == len(batch)
            chains[c + 1] = replace(
                following,
                dtypes=fp32,
                k=chains[c].n,
                batch=batch,
                x_batch=("carry",) * len(batch),
                w_batch=following.w_batch if same_rank else ("lack",) * len(batch),
                **_orders_for(following, batch),
            )
    return chains


def _orders_for(chain: ChainSpec, batch) -> dict:
    """Loop and iterator orders of ``chain`` without the batch axes ``batch`` has not."""
    kept = set(BATCH_AXES[: len(batch)] + "ijk")
    return {
        name: "".join(a for a in getattr(chain, name) if a in kept)
        for name in ("loop_order", "iter_order", "epilogue_order")
    }


@st.composite
def distractor_specs(draw, chains: Sequence[ChainSpec], max_size: int = 3):
    """Unrelated blocks next to the chains (a bias producer only where there is a bias)."""
    found = []
    for _ in range(draw(st.integers(0, max_size))):
        c = draw(st.integers(0, len(chains) - 1))
        kinds = [k for k in DISTRACTORS if k != "bias_in" or chains[c].bias is not None]
        kind = draw(st.sampled_from(kinds))
        can_cut = kind in INSIDE_KINDS and chains[c].epilogue_blocks > 0
        if kind == "bias_in" and chains[c].init == "bias":
            can_cut = False  # the init would read the bias before it is made
        inside = can_cut and draw(st.integers(0, 3)) == 0
        found.append(DistractorSpec(kind, c, draw(st.booleans()), inside))
    return tuple(found)


@st.composite
def program_specs(
    draw,
    *,
    max_chains: int = 3,
    max_distractors: int = 3,
    symbolic: bool = True,
    index_dtypes: Sequence[str] = ("int32", "int64"),
    extents: Sequence[int] = EXTENTS,
    **chain_options,
) -> ProgramSpec:
    """A function of 1..max_chains chains (maybe feeding one another) and distractors.

    With ``symbolic``, M and the batch dims may each be variables.
    """
    count = draw(st.integers(1, max_chains))
    symbolic_batch = symbolic and draw(st.booleans())
    chains = [
        draw(chain_specs(extents=extents, symbolic_batch=symbolic_batch, **chain_options))
        for _ in range(count)
    ]
    feeds = [draw(st.booleans()) for _ in range(count - 1)]
    chains = _link(chains, feeds)
    return ProgramSpec(
        chains=tuple(chains),
        distractors=draw(distractor_specs(chains, max_distractors)),
        m=draw(st.sampled_from(tuple(extents))),
        symbolic_m=symbolic and draw(st.booleans()),
        symbolic_batch=symbolic_batch and any(chain.batch for chain in chains),
        index_dtype=draw(st.sampled_from(tuple(index_dtypes))),
    )


@st.composite
def mutant_specs(draw, **options) -> ProgramSpec:
    """A positive spec with exactly one chain mutated (see ``programs.MUTATIONS``)."""
    spec = draw(program_specs(**options))
    # A cut chain takes no mutation; chain 0 is left whole so that some chain can.
    uncut = tuple(replace(d, inside=False) if d.chain == 0 else d for d in spec.distractors)
    spec = replace(spec, distractors=uncut)
    # A third of the mutants: a mutation of the epilogue first, then chain 0 given the ops it
    # needs (Mutation.wants), so that near misses of rare spellings are drawn too.
    if draw(st.integers(0, 2)) == 0:
        name = draw(st.sampled_from(_WANTING))
        given = _given(draw, spec, MUTATIONS[name].wants)
        if given is not None and MUTATIONS[name].applies(given, 0):
            return mutate(given, 0, name)
    # Mutation first, then a chain that can take it: rare mutations are drawn as often.
    takers = {}
    for c in range(len(spec.chains)):
        for name in applicable_mutations(spec, c):
            takers.setdefault(name, []).append(c)
    name = draw(st.sampled_from(sorted(takers)))
    c = draw(st.sampled_from(takers[name]))
    return mutate(spec, c, name)


#: The mutations a chain can be given the ops of (Mutation.wants).
_WANTING = tuple(sorted(name for name, mutation in MUTATIONS.items() if mutation.wants))


def _given(draw, spec: ProgramSpec, wants) -> ProgramSpec | None:
    """``spec`` with chain 0 given a drawn value of each field of ``wants``; None if that
    makes no positive (an activation or a scale on an integer accumulator...)."""
    chain = spec.chains[0]
    fields = {name: draw(st.sampled_from(values)) for name, values in wants.items()}
    if ("activation" in fields or "scale" in fields) and not chain.dtypes[2].startswith("float"):
        return None
    if "activation" in fields:
        fields["relu"] = None
    if ("scale" in fields or "bias" in fields) and chain.init == "bias":
        fields["init"] = "zero"
    chain = replace(chain, **fields)
    chain = replace(chain, fused=chain.fused[: max(len(chain.epilogue_ops) - 1, 0)])
    try:
        return replace(spec, chains=(chain, *spec.chains[1:]))
    except ValueError:
        return None


def programs(**options) -> st.SearchStrategy[Program]:
    """Built positives; keyword options are those of :func:`program_specs`."""
    return program_specs(**options).map(build_program)


def mutants(**options) -> st.SearchStrategy[Program]:
    """Built near misses; keyword options are those of :func:`program_specs`."""
    return mutant_specs(**options).map(build_program)


def any_programs(**options) -> st.SearchStrategy[Program]:
    """Positives and near misses."""
    return st.one_of(programs(**options), mutants(**options))


@st.composite
def scheduled_programs(draw, max_steps: int = 3, **options) -> Program:
    """A positive after a few semantics-preserving schedule primitives (split, inline...).

    The result's ``chains`` is empty: after scheduling, what the matcher should find is no
    longer known (it may refuse a split loop nest, or find a folded epilogue).  Use these for
    the properties that need no labels: equivalence, idempotence, non-interference, robustness.
    """
    program = draw(programs(**options))
    schedule = s_tir.Schedule(program.func, error_render_level="none")
    names = [block.name_hint for block in leaf_blocks(program.func)]
    for _ in range(draw(st.integers(1, max_steps))):
        step = draw(st.sampled_from(SCHEDULE_STEPS))
        apply_step(schedule, step, draw(st.sampled_from(names)), draw(st.sampled_from((2, 3))))
    func = schedule.mod["main"].with_attr("global_symbol", program.spec.name)
    return Program(program.spec, func, (), program.bindings)


@st.composite
def lowered_programs(draw, loop_dtypes: Sequence[str] = (), **options) -> Program:
    """A positive, near miss or scheduled positive after TVM's lowering: plain loops.

    With ``loop_dtypes`` (a subset of :data:`~.loop_dtypes.LOOP_DTYPES`), half the functions
    have some or all of their loops turned into loops over one of them
    (:func:`~.loop_dtypes.retype_loops`), as TVMScript writes ``range(T.uint32(128))``.
    The result's ``chains`` is empty (the lowered nests have no block names to expect); use
    these for the properties that need no labels, as :func:`scheduled_programs`.
    """
    sources = (programs(**options), mutants(**options), scheduled_programs(**options))
    program = draw(st.one_of(*sources))
    func = lower_to_plain_loops(program.func).with_attr("global_symbol", program.spec.name)
    if loop_dtypes and draw(st.booleans()):
        dtype = draw(st.sampled_from(tuple(loop_dtypes)))
        picked = draw(st.one_of(st.just(-1), st.integers(1, 2**16 - 1)))  # -1: every loop
        func = retype_loops(func, dtype, picked)
    return Program(program.spec, func, (), program.bindings)


def all_programs(loop_dtypes: Sequence[str] = (), **options) -> st.SearchStrategy[Program]:
    """Positives, near misses, scheduled positives, and all of them lowered to plain loops
    (over ``loop_dtypes`` too: see :func:`lowered_programs`)."""
    return st.one_of(
        programs(**options),
        mutants(**options),
        scheduled_programs(**options),
        lowered_programs(loop_dtypes, **options),
    )


__all__ = [
    "ACTIVATION_KINDS",
    "BATCH_EXTENTS",
    "BATCH_RANKS",
    "CLIP_LOWER",
    "CLIP_WIDTH",
    "EXTENTS",
    "FACTORS",
    "SCHEDULE_STEPS",
    "SLOPES",
    "all_programs",
    "any_programs",
    "batch_modes",
    "chain_specs",
    "distractor_specs",
    "epilogue_fields",
    "lower_to_plain_loops",
    "lowered_programs",
    "mutant_specs",
    "mutants",
    "program_specs",
    "programs",
    "scheduled_programs",
]
