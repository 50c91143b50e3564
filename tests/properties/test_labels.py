"""Property 2, soundness of labels.

Every match carries the pattern, blocks, buffers and dtypes the generator built; every chain
the generator built is found; and a near miss is never reported as the pattern it was
mutated from.
"""

from harness import profile, reported
from hypothesis import event, given

from tir_byoc.match import scan_function
from tir_byoc.testing import strategies


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
    assert (match.pattern, match.blocks, match.buffers, match.dtype) == (
        chain.pattern,
        chain.blocks,
        built,
        chain.dtype,
    )


@profile(1.0)
@given(strategies.programs())
def test_positives_are_reported_exactly_as_built(program):
    with reported(program):
        matches = _by_first_block(program)
        assert set(matches) <= {c.blocks[0] for c in program.chains}, "a match nobody built"
        for chain in program.chains:
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
        for chain in program.chains:
            if chain is not mutated:
                _assert_as_built(matches.get(chain.blocks[0]), chain)
