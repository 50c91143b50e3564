"""Property 5, robustness: scan, explain and offload never crash on what the generators build.

A refusal is a value with a reason: a Decline (falsy, with a non-empty reason and a
printable form), or a Match without an intrinsic whose reason says why (a chain cut to the
prefix a backend serves has both: the intrinsic of the prefix, and why not the whole).  A
near miss that is not offloaded whole is explained by a Decline naming one of its blocks,
in the words its mutation names (``Mutation.refusal``) where it names them.  Plain loops are
drawn over every integer dtype a loop can have (``range(T.uint32(M))``), not only the int32
and int64 TVM's lowering gives.
"""

from hypothesis import given
from properties.harness import PROPERTY_REGISTRY, profile, reported

import tir_byoc
from tir_byoc.registry import REGISTRY
from tir_byoc.testing import strategies
from tir_byoc.testing.loop_dtypes import LOOP_DTYPES
from tir_byoc.testing.programs import MUTATIONS

#: Mutations that leave no candidate at all: without a product the reduction is not a GEMM.
_NOT_A_CANDIDATE = {"reduce_sum_not_product"}


@profile(1.0)
@given(strategies.all_programs(loop_dtypes=LOOP_DTYPES))
def test_scan_explain_and_offload_return_values_with_reasons(program):
    with reported(program):
        rejections = tir_byoc.explain(program.func)
        for rejection in rejections:
            assert not rejection
            assert isinstance(rejection.reason, str) and rejection.reason.strip()
            assert rejection.blocks and str(rejection)
        for registry in (REGISTRY, PROPERTY_REGISTRY):
            for match in tir_byoc.scan(program.func, registry=registry):
                if match.cut_from is None:
                    assert (match.intrinsic is None) == bool(match.reason), match
                else:
                    assert match.intrinsic and match.reason, match
            tir_byoc.offload(program.func, registry=registry)
        mutated = program.mutated
        if mutated is None or mutated.mutation in _NOT_A_CANDIDATE:
            return
        whole = [m for m in tir_byoc.scan(program.func) if m.blocks == mutated.blocks]
        if not whole:
            explaining = [r for r in rejections if set(r.blocks) & set(mutated.blocks)]
            assert explaining, (
                f"{mutated.mutation}: no rejection names a block of chain {mutated.index}"
            )
            refusal = MUTATIONS[mutated.mutation].refusal
            assert refusal is None or any(refusal in r.reason for r in explaining), (
                f"{mutated.mutation}: expected a refusal saying {refusal!r}, got "
                f"{[r.reason for r in explaining]}"
            )
