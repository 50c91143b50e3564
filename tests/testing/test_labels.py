"""tir_byoc.testing.labels: the batch form a spec gives a chain, and the matcher agrees with it.

Each case states the form and the number of merged batch dims the rules of
:mod:`tir_byoc.testing.labels` give, then builds the chain and scans it: the label function
never asks the matcher, so the two readings are independent.
"""

import numpy as np
import pytest

from tir_byoc.match import scan_function
from tir_byoc.patterns import pattern
from tir_byoc.testing.equivalence import run
from tir_byoc.testing.labels import Product, batch_label, expected_pattern
from tir_byoc.testing.programs import ChainSpec, ProgramSpec, build_program
from tir_byoc.testing.spellings import ACTIVATION_SPELLINGS, RELU_SPELLINGS


def _chain(batch, x_batch, w_batch, **fields):
    return ChainSpec(batch=batch, x_batch=x_batch, w_batch=w_batch, **fields)


CARRY2, LACK2 = ("carry", "carry"), ("lack", "lack")

#: name -> (chain, ProgramSpec fields, (form, merged dims)).
CASES = {
    "no batch dims": (ChainSpec(), {}, ("none", 0)),
    "an N-D activation over a shared weight folds into M": (
        _chain((2, 3), CARRY2, LACK2, bias="vector", relu="max(z, 0)"),
        {},
        ("leading", 1),
    ),
    "a batch of 1 everywhere is the 2-D product with a leading 1": (
        _chain((1,), ("carry",), ("broadcast",)),
        {},
        ("leading", 1),
    ),
    "a dim of static extent 1 nobody reads is dropped": (
        _chain((1, 3), ("broadcast", "carry"), LACK2),
        {},
        ("leading", 1),
    ),
    "with symbolic M, X's stride is still M x K": (
        _chain((2, 3), CARRY2, LACK2),
        {"symbolic_m": True},
        ("leading", 1),
    ),
    "symbolic dims X carries in order merge and fold": (
        _chain((2, 3), CARRY2, LACK2),
        {"symbolic_batch": True},
        ("leading", 1),
    ),
    "a weight with batch dims makes a batched product": (
        _chain((2,), ("carry",), ("carry",), layout="matmul"),
        {},
        ("batched", 1),
    ),
    "dims both operands step over alike merge into one": (
        _chain((2, 3), CARRY2, CARRY2),
        {},
        ("batched", 1),
    ),
    "a weight varying along the inner dim only keeps two dims": (
        _chain((2, 3), CARRY2, ("lack", "carry")),
        {},
        ("batched", 2),
    ),
    "X lacking the outer dim, the weight broadcasting the inner one": (
        _chain((2, 3), ("lack", "carry"), ("carry", "broadcast")),
        {},
        ("batched", 2),
    ),
    "X broadcast against a batch of weights": (
        _chain((3,), ("broadcast",), ("carry",)),
        {},
        ("batched", 1),
    ),
    "an X axis of extent 1 between carried ones does not stop the fold": (
        _chain((3, 1), ("carry", "broadcast"), LACK2),
        {},
        ("leading", 1),
    ),
    "a static 1 the weight carries is dropped": (
        _chain((1, 3), ("broadcast", "carry"), ("carry", "broadcast")),
        {},
        ("leading", 1),
    ),
    "the same with a symbolic extent is kept, even when it will be 1": (
        _chain((1, 3), ("broadcast", "carry"), ("carry", "broadcast")),
        {"symbolic_batch": True},
        ("batched", 2),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_label_is_the_form_the_matcher_reports(case):
    chain, program, (form, dims) = CASES[case]
    spec = ProgramSpec(chains=(chain,), m=4, **program)
    assert (batch_label(spec, chain).form, batch_label(spec, chain).dims) == (form, dims)
    built = build_program(spec)
    (match,) = scan_function(spec.name, built.func).matches
    assert match.pattern == expected_pattern(spec, 0) == built.chains[0].pattern
    assert pattern(match.pattern).batch == form
    assert (len(match.batch.counts) if match.batch is not None else 0) == dims


def test_a_dim_neither_operand_reads_is_refused_and_is_no_positive():
    chain = _chain((2,), ("broadcast",), ("lack",))
    spec_fields = dict(m=4)
    label = batch_label(ProgramSpec(**spec_fields), chain)
    assert (label.form, label.reason) == ("refused", "batch dim 0 indexes neither operand")
    with pytest.raises(ValueError, match="chain 0 is not a positive: batch dim 0 indexes neither"):
        ProgramSpec(chains=(chain,), **spec_fields)
    unit = _chain((1,), ("broadcast",), ("lack",))
    assert batch_label(ProgramSpec(), unit).form == "leading"
    with pytest.raises(ValueError, match="not a positive"):
        ProgramSpec(chains=(unit,), symbolic_batch=True)


def test_strides_compare_as_products_of_integers_and_symbols():
    m, b = Product.extent(4, "M"), Product.extent(3, "B0")
    assert m * Product(5) * b == b * m * Product(5)
    assert m * Product(5) != Product(20)
    assert (Product(0) * m).is_zero and Product(0) * m == Product(0)


def test_the_nan_result_each_spelling_declares_is_what_tvm_computes():
    # The labels take a clip's NaN result and a relu's NaN behaviour from the spelling tables;
    # TVM's own build of each spelling, run on a NaN, must agree with them.
    clips = [name for name, spelling in ACTIVATION_SPELLINGS.items() if spelling.op == "clip"]
    chains = (
        *(ChainSpec(activation=name, n=1, k=1, bounds=(-1.0, 2.0)) for name in clips),
        *(ChainSpec(relu=name, n=1, k=1) for name in RELU_SPELLINGS),
    )
    program = build_program(ProgramSpec(chains=chains, m=1))
    contents = {"X": np.full((1, 1), np.nan, "float32"), "W": np.ones((1, 1), "float32")}
    arrays = [contents.get(p.name[0], np.zeros((1, 1), "float32")) for p in program.func.params]
    for chain, z in zip(program.chains, run(program.func, arrays)[2::3]):
        op, constants, _ = chain.epilogue[-1]
        declared = constants[2] if op == "clip" else {"keep": "nan", "zero": 0.0}[chain.relu_nan]
        assert ("nan" if np.isnan(z[0, 0]) else float(z[0, 0])) == declared, chain.blocks
