"""Property 3, idempotence: offloading an offloaded function changes nothing."""

import tvm
from hypothesis import given
from properties.harness import PROPERTY_REGISTRY, profile, reported

import tir_byoc
from tir_byoc.registry import REGISTRY
from tir_byoc.testing import strategies


@profile(1.0)
@given(strategies.all_programs())
def test_offloading_twice_equals_offloading_once(program):
    with reported(program):
        for registry in (PROPERTY_REGISTRY, REGISTRY):
            once = tir_byoc.offload(program.func, registry=registry)
            twice = tir_byoc.offload(once, registry=registry)
            tvm.ir.assert_structural_equal(twice, once)
            assert not any(m.intrinsic for m in tir_byoc.scan(once, registry=registry))
