"""The family as data: every member's name, form and TIR description."""

import numpy as np
import pytest
from byoc_testing import random_arguments, run

import tir_byoc
from tir_byoc.patterns import FAMILY, PATTERNS, EpilogueOp, Pattern, describe, pattern

SIZES = {"B": 2, "M": 3, "N": 4, "K": 5}


def test_the_eight_names_stay_valid():
    assert sorted(PATTERNS) == [
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
    assert len(FAMILY) == 24 and set(PATTERNS) < set(FAMILY)


def _numpy(member: Pattern, x, w, b=None):
    w = np.swapaxes(w, -1, -2) if member.layout == "dense" else w
    y = x @ w
    if member.has_bias:
        y = y + b
    return np.maximum(y, 0) if member.has_relu else y


@pytest.mark.parametrize("name", list(FAMILY))
def test_describe_builds_every_member_and_it_computes_the_pattern(name):
    func = describe(name, index_dtype="int32")
    arrays = random_arguments(func, SIZES)
    *inputs, result = run(func, arrays)
    np.testing.assert_allclose(result, _numpy(FAMILY[name], *inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, form",
    [
        ("batch_dense_bias", "an N-D activation over the 2-D weight W (an N-D Linear)"),
        ("bmm_matmul_relu", "both operands carry batch dims (a batched matmul"),
    ],
)
def test_members_the_matcher_does_not_recognise_yet_are_refused_with_their_own_reason(name, form):
    func = describe(name)
    assert tir_byoc.scan(func) == []
    (rejection, *_) = tir_byoc.explain(func)
    assert "3 spatial axes" in rejection.reason and form in rejection.reason


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: pattern("dense_gelu"), "unknown pattern 'dense_gelu'; expected one of"),
        (lambda: Pattern("conv"), "expected layout in ['dense', 'matmul'], got 'conv'"),
        (lambda: Pattern("dense", (), "ragged"), "expected batch form in"),
        (lambda: Pattern("dense", ("relu", "bias")), "expected an epilogue ordered as"),
        (lambda: EpilogueOp("gelu"), "expected one of ('bias', 'relu'), got 'gelu'"),
    ],
)
def test_bad_members_are_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=None) as error:
        make()
    assert message in str(error.value) and "\n" not in str(error.value)
