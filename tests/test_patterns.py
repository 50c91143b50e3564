"""The family as data: every member's name, form and TIR description."""

import numpy as np
import pytest
from byoc_testing import random_arguments, run

import tir_byoc
from tir_byoc.patterns import (
    CALL_PATTERNS,
    FAMILY,
    PATTERNS,
    EpilogueOp,
    Pattern,
    describe,
    pattern,
)

SIZES = {"B": 2, "M": 3, "N": 4, "K": 5}


def test_the_eight_2d_names_stay_valid():
    assert sorted(n for n, p in PATTERNS.items() if p.batch == "none") == [
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
    assert len(FAMILY) == 24 and PATTERNS == FAMILY


def test_leading_members_are_called_through_their_2d_entry_point():
    assert pattern("batch_dense_bias").call_pattern == "dense_bias"
    assert pattern("bmm_matmul").call_pattern == "bmm_matmul"
    assert pattern("matmul_relu").call_pattern == "matmul_relu"
    assert sorted(CALL_PATTERNS) == sorted(n for n in FAMILY if not n.startswith("batch_"))


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


@pytest.mark.parametrize("name", list(FAMILY))
def test_the_matcher_recognises_every_member_from_its_description(name):
    (match,) = tir_byoc.scan(describe(name))
    assert match.pattern == name
    assert (match.batch is None) == (FAMILY[name].batch == "none")
    if match.batch is not None:
        assert match.batch.form == FAMILY[name].batch


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
