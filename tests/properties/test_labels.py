"""Property 2, soundness of labels.

Every match carries the pattern (batch form included: ``batch_`` or ``bmm_``; the epilogue's
ops in order), blocks, buffers, dtypes, number of batch dims, each op's constants and tensor
(a clip's with what its spelling makes of a NaN) and what its relu makes of a NaN, as the
generator built them; every chain the generator built is found; a near miss is never reported
as the pattern it was mutated from; one whose mutation breaks an op of the epilogue is
matched exactly up to the block before that op (or, for an op out of slot order, before the
first such op); one whose mutation names the matcher's refusal at its reduction is not
matched at all.  The labels come from :mod:`tir_byoc.testing.labels`, which reads the specs,
not from the matcher.
"""

from hypothesis import event, given
from properties.harness import profile, reported

from tir_byoc.match import scan_function
from tir_byoc.patterns import pattern
from tir_byoc.testing import strategies
from tir_byoc.testing.labels import epilogue_of
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
    assert (epilogue_of(match), match.relu_nan) == (chain.epilogue, chain.relu_nan)


@profile(1.0)
@given(strategies.programs())
def test_positives_are_reported_exactly_as_built(program):
    with reported(program):
        matches = _by_first_block(program)
        assert set(matches) <= {c.blocks[0] for c in program.chains}, "a match nobody built"
        for chain in program.chains:
            event(f"batch form {pattern(chain.pattern).batch}")
            for op in pattern(chain.pattern).ops:
                event(f"op {op}")
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
        if mutated.stop is not None:
            found = (match.pattern, match.blocks) if match is not None else None
            assert found == mutated.stop, (
                f"{mutated.mutation}: expected the chain to stop as {mutated.stop}, got {found}"
            )
        elif MUTATIONS[mutated.mutation].refusal is not None:
            assert match is None, f"{mutated.mutation} is refused, yet matched as {match}"
        for chain in program.chains:
            if chain is not mutated:
                _assert_as_built(matches.get(chain.blocks[0]), chain)
