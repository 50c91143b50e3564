"""Property 4, non-interference: what is not offloaded stays exactly as it was.

A function with no match an intrinsic serves is returned structurally unchanged, and in a
function that is rewritten every block outside the matches, and the signature, are kept.
"""

import tvm
import tvm_ffi
from hypothesis import event, given
from properties.harness import PROPERTY_REGISTRY, profile, reported
from tvm import s_tir

import tir_byoc
from tir_byoc.registry import REGISTRY, Registry
from tir_byoc.testing import strategies


def _blocks(func) -> dict:
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, found.append))
    return {block.name_hint: block for block in found}


@profile(1.0)
@given(strategies.all_programs())
def test_a_function_nothing_can_serve_is_unchanged(program):
    with reported(program):
        nothing = Registry()
        tvm.ir.assert_structural_equal(
            tir_byoc.offload(program.func, registry=nothing), program.func
        )
        if not any(m.intrinsic for m in tir_byoc.scan(program.func, registry=REGISTRY)):
            event("no match the bundled intrinsics serve")
            tvm.ir.assert_structural_equal(tir_byoc.offload(program.func), program.func)


@profile(1.0)
@given(strategies.all_programs())
def test_blocks_outside_the_matches_are_kept_as_they_were(program):
    with reported(program):
        planned = tir_byoc.scan(program.func, registry=PROPERTY_REGISTRY)
        covered = {name for m in planned if m.intrinsic for name in m.blocks}
        rewritten = tir_byoc.offload(program.func, registry=PROPERTY_REGISTRY)
        assert list(rewritten.params) == list(program.func.params)
        after = _blocks(rewritten)
        for name, block in _blocks(program.func).items():
            if name == "root" or name in covered:
                assert name not in after or name == "root", f"block {name} was not replaced"
                continue
            assert name in after, f"block {name} disappeared"
            tvm.ir.assert_structural_equal(after[name], block, map_free_vars=True)


@profile(0.3)
@given(strategies.any_programs(), strategies.any_programs())
def test_a_module_is_offloaded_function_by_function_and_left_as_it_was(first, second):
    with reported(first), reported(second):
        funcs = {"first": first.func, "second": second.func}
        mod = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
        before = {n: mod[n] for n in funcs}
        result = tir_byoc.offload(mod, registry=PROPERTY_REGISTRY)
        for name in funcs:
            assert mod[name].same_as(before[name]), f"offload modified its input ({name})"
            alone = tir_byoc.offload(before[name], registry=PROPERTY_REGISTRY)
            tvm.ir.assert_structural_equal(result[name], alone)
