"""Property: a packed weight computes what the plain one does (issue 15).

Each generated fp32 function (positives and near misses, 2-D and batched, scheduled and
lowered ones too) is planned on oneDNN.  The weights ``tir_byoc.packing`` would pack if they
were constants of a model (:func:`~tir_byoc.packing.packable`: the GEMM's weight, read by the
call alone) are packed in the form drawn (``TIR_BYOC_ONEDNN_PACK``, as the offload does), and
the packed rewrite (what the offload installs for constant call sites) runs with each block
made from the random contents of its weight; every other parameter must come out as the
original computes it.  The forms are named because the backend's own choice (by timing) would
leave most of these small weights plain.
"""

import contextlib
import os

import pytest
import tvm
from hypothesis import event, given
from hypothesis import strategies as st
from properties.harness import TARGET, normwise, profile, reported

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.packing import PACK_FORMS, PackReport, make_packings, pack_in_form, packable
from tir_byoc.registry import REGISTRY
from tir_byoc.rewrite import rewrite_function
from tir_byoc.testing import strategies
from tir_byoc.testing.equivalence import assert_equivalent
from tir_byoc.testing.inputs import random_arguments

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="the oneDNN backend is not available"
)

FP32 = ("float32", "float32", "float32")


@contextlib.contextmanager
def named_form(form: str):
    saved = os.environ.get("TIR_BYOC_ONEDNN_PACK")
    os.environ["TIR_BYOC_ONEDNN_PACK"] = form
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TIR_BYOC_ONEDNN_PACK"]
        else:
            os.environ["TIR_BYOC_ONEDNN_PACK"] = saved


def _reason(decline) -> str:
    """A kept weight's reason, for hypothesis' events (one event for any other reader)."""
    reason = decline.reason
    return "also read by another block" if " is also read by " in reason else reason


@profile(0.2, ci_share=0.5)
@given(
    program=strategies.all_programs(signatures=[FP32]),
    seed=st.integers(0, 2**16),
    form=st.sampled_from(("library", "transposed")),
)
def test_a_packed_weight_computes_what_the_plain_one_does(program, seed, form):
    with reported(program), named_form(form):
        planned = tir_byoc.plan(program.func, backends="onednn")
        function = planned.functions[0]
        offloaded = list(planned.offloaded(function))
        if not offloaded:
            event("nothing offloaded")
            return
        func = function.func
        report = PackReport()
        chosen = packable(
            "main", func, rewrite_function(func, offloaded), offloaded, REGISTRY, report
        )
        # The forms, chosen as the offload chooses them, on this example's own weights.
        arrays = random_arguments(func, program.bindings, seed)
        packings = make_packings(
            "main", chosen, lambda i: tvm.runtime.tensor(arrays[i]), REGISTRY, report
        )
        for decline in report.kept:
            event(f"a weight left plain: {_reason(decline)}")
        if not packings:
            event("no weight packed")
            return
        for packing, *_ in packings:
            event(f"packed {PACK_FORMS[packing.form]}")
        packed = rewrite_function(func, offloaded, {p.match: p for p, *_ in packings})
        assert_equivalent(
            func,
            packed,
            bindings=program.bindings,
            seed=seed,
            normwise=normwise(program),
            target=TARGET,
            replaced={
                index: lambda a, p=packing, f=pack: pack_in_form(
                    p, f, tvm.runtime.tensor(a)
                ).numpy()
                for packing, index, pack, _ in packings
            },
        )
