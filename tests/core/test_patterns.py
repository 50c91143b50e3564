"""The family as data: every member's name, form and TIR description."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.byoc_testing import numpy_pattern, random_arguments, representatives, run

import tir_byoc
from tir_byoc.epilogues import epilogue_error
from tir_byoc.patterns import (
    BATCH_FORMS,
    CALL_PATTERNS,
    EPILOGUE_OPS,
    FAMILY,
    FIXED_EPILOGUES,
    GEMM_ENTRY,
    PATTERNS,
    REORDERED_EPILOGUES,
    EpilogueOp,
    Pattern,
    describe,
    pattern,
    pattern_for,
)

SIZES = {"B": 2, "M": 3, "N": 4, "K": 5}


def test_the_eight_2d_names_stay_valid():
    fixed = {n: p for n, p in PATTERNS.items() if p.ops in FIXED_EPILOGUES}
    assert sorted(n for n, p in fixed.items() if p.batch == "none") == [
        "dense",
        "dense_bias",
        "dense_bias_relu",
        "dense_relu",
        "matmul",
        "matmul_bias",
        "matmul_bias_relu",
        "matmul_relu",
    ]
    member = PATTERNS["matmul_bias_relu"]
    assert (member.layout, member.batch, member.ops) == ("matmul", "none", ("bias", "relu"))
    assert member.epilogue == (EpilogueOp("bias"), EpilogueOp("relu"))


def test_names_say_the_batch_form():
    assert pattern("batch_dense_bias") == Pattern("dense", ("bias",), "leading")
    assert pattern("bmm_matmul") == Pattern("matmul", (), "batched")
    assert PATTERNS == FAMILY
    # 3 scale x 2 bias x 11 activation x 4 tail epilogues, 2 layouts, 3 batch forms.
    assert len(FAMILY) == 264 * 6
    assert pattern("bmm_matmul_div_bias_gelu_tanh_mul").ops == ("div", "bias", "gelu_tanh", "mul")


def test_an_epilogue_beyond_bias_and_relu_is_called_through_the_gemm_entry_point():
    assert pattern("batch_dense_bias_gelu").call_pattern == GEMM_ENTRY
    assert pattern("dense_scale").call_pattern == GEMM_ENTRY
    assert pattern("batch_dense_bias_relu").call_pattern == "dense_bias_relu"


def test_leading_members_are_called_through_their_2d_entry_point():
    assert pattern("batch_dense_bias").call_pattern == "dense_bias"
    assert pattern("bmm_matmul").call_pattern == "bmm_matmul"
    assert pattern("matmul_relu").call_pattern == "matmul_relu"
    assert sorted(CALL_PATTERNS) == sorted(
        n for n, p in FAMILY.items() if not n.startswith("batch_") and p.ops in FIXED_EPILOGUES
    )


@pytest.mark.parametrize("name", representatives())
def test_describe_builds_every_member_and_it_computes_the_pattern(name):
    func = describe(name, index_dtype="int32")
    arrays = random_arguments(func, SIZES)
    *inputs, result = run(func, arrays)
    np.testing.assert_allclose(result, numpy_pattern(name, *inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", representatives())
def test_the_matcher_recognises_every_member_from_its_description(name):
    (match,) = tir_byoc.scan(describe(name))
    assert match.pattern == name
    assert (match.batch is None) == (pattern(name).batch == "none")
    if match.batch is not None:
        assert match.batch.form == pattern(name).batch


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: pattern("dense_mish"),
            "unknown pattern 'dense_mish' ('mish' is not a layout or an op); expected",
        ),
        (lambda: Pattern("conv"), "expected layout in ['dense', 'matmul'], got 'conv'"),
        (lambda: Pattern("dense", (), "ragged"), "expected batch form in"),
        (
            lambda: Pattern("dense", ("add",) * 5),
            "is more than one call carries (5 ops, 5 tensors, 0 constants; at most 8, 4 and 6)",
        ),
        (lambda: Pattern("dense", ("clip", "clip", "gelu_tanh")), "(3 ops, 0 tensors, 8 const"),
        (
            lambda: Pattern("dense", ("gelu", "tanh")),
            "gelu then tanh would be named as the one op gelu_tanh",
        ),
        (lambda: EpilogueOp("mish"), "expected one of ('scale', 'div', 'bias', 'relu', "),
    ],
)
def test_bad_members_are_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=None) as error:
        make()
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("ops", [*REORDERED_EPILOGUES, ("relu", "relu")])
@pytest.mark.parametrize("batch", list(BATCH_FORMS))
def test_a_member_out_of_slot_order_is_named_and_read_back_from_its_name(ops, batch):
    member = Pattern("matmul", ops, batch)
    assert pattern(member.name) == member
    assert pattern_for("matmul", ops, batch) == member
    assert member.call_pattern == GEMM_ENTRY


@given(
    ops=st.lists(st.sampled_from(EPILOGUE_OPS), max_size=5).map(tuple),
    layout=st.sampled_from(("dense", "matmul")),
    batch=st.sampled_from(tuple(BATCH_FORMS)),
)
def test_every_member_is_read_back_from_its_name_and_the_rest_are_refused(ops, layout, batch):
    if epilogue_error(ops) is not None:
        assert pattern_for(layout, ops, batch) is None
        return
    member = Pattern(layout, ops, batch)
    assert pattern(member.name) == member == pattern_for(layout, ops, batch)
