"""Property 2, soundness of labels.

Every match carries the pattern (batch form included: ``batch_`` or ``bmm_``), blocks,
buffers, dtypes and number of batch dims the generator built; every chain the generator
built is found; a near miss is never reported as the pattern it was mutated from, and one
whose mutation names the matcher's refusal is not matched at all.  The labels come from
:mod:`tir_byoc.testing.labels`, which reads the specs, not from the matcher.
"""

from harness import profile, reported
from hypothesis import event, given

from tir_byoc.match import scan_function
from tir_byoc.patterns import pattern
from tir_byoc.testing import strategies
from tir_byoc.testing.programs import MUTATIONS


def _by_first_block(program):
    found = scan_function(program.spec.name, program.func).matches
    by_block = {m.blocks[0]: m for m in found}
    assert len(by_block) == len(found), f"two matches start at one block: {found}"
    return by_block


def _assert_as_built(match, chain):
    built = {"x": chain.x, "w": chain.w, "out": chain.out}
    if chain.bias is not None:
        built["bias"] = chain.bias
    assert match is not None, f"chain {chain.index} ({chain.pattern}) was not found"
    batch_dims = len(match.batch.counts) if match.batch is not None else 0
    assert (match.pattern, match.blocks, match.buffers, match.dtype, batch_dims) == (
        chain.pattern,
        chain.blocks,
        built,
        chain.dtype,
        chain.batch_dims,
    )


@profile(1.0)
@given(strategies.programs())
def test_positives_are_reported_exactly_as_built(program):
    with reported(program):
        matches = _by_first_block(program)
        assert set(matches) <= {c.blocks[0] for c in program.chains}, "a match nobody built"
        for chain in program.chains:
            event(f"batch form {pattern(chain.pattern).batch}")
            _assert_as_built(matches.get(chain.blocks[0]), chain)


@profile(1.0)
@given(strategies.mutants())
def test_a_mutant_is_never_reported_as_the_pattern_it_was_mutated_from(program):
    with reported(program):
        matches = _by_first_block(program)
        assert set(matches) <= {c.blocks[0] for c in program.chains}, "a match nobody built"
        mutated = program.mutated
        event(f"mutation {mutated.mutation}")
        match = matches.get(mutated.blocks[0])
        assert match is None or match.pattern != mutated.pattern, (
            f"{mutated.mutation} of chain {mutated.index} still reported as {mutated.pattern}"
        )
        if MUTATIONS[mutated.mutation].refusal is not None:
            assert match is None, f"{mutated.mutation} is refused, yet matched as {match}"
        for chain in program.chains:
            if chain is not mutated:
                _assert_as_built(matches.get(chain.blocks[0]), chain)
