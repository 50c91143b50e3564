"""The op table as data (tir_byoc.epilogues): each record checks itself, the C header agrees.

The ops' numerics are tested in test_epilogue_c.py (the C epilogue against the NumPy oracle)
and match/test_epilogues.py (each op as TVM lowers it, offloaded, against TVM's own build).
"""

import math
import re
from pathlib import Path

import numpy as np
import pytest
from tvm import tirx

from tir_byoc.epilogues import OPS, RELU_KEEP_NAN_CODE, OpSpec, Spelling, compose, reference
from tir_byoc.match.templates import template
from tir_byoc.testing.spellings import ACTIVATION_SPELLINGS

HEADER = Path(__file__).resolve().parents[2] / "intrinsics" / "include" / "tir_byoc.h"


def test_every_op_has_the_code_the_c_header_gives_it():
    defines = {
        name: int(code)
        for name, code in re.findall(r"#define TIR_BYOC_OP_(\w+) +(\d+)", HEADER.read_text())
    }
    assert {name: defines[name.upper()] for name in OPS} == {n: s.code for n, s in OPS.items()}
    assert defines["RELU_KEEP_NAN"] == RELU_KEEP_NAN_CODE
    codes = [spec.code for spec in OPS.values()] + [RELU_KEEP_NAN_CODE]
    assert len(set(codes)) == len(codes)
    assert defines["COUNT"] == max(codes) + 1


def _scale(z, c, t):
    return z * c[0]


_SPELLING = Spelling("z * c", (lambda z, e, k: tirx.Mul(z, k.c("factor")),), ("T_multiply",))


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({}, None),
        ({"slot": "epilogue"}, "expected slot in ('scale', 'bias', 'activation', 'tail')"),
        ({"tensor": "row"}, "expected tensor vector or full, got row"),
        ({"example": ()}, "expected an example per constant ('factor',), got ()"),
        ({"spellings": ()}, "expected at least one spelling"),
        (
            {"spellings": (Spelling("z * c", _SPELLING.blocks),)},
            "expected a name for each block of the first spelling",
        ),
    ],
)
def test_a_record_says_what_it_expected(fields, expected):
    record = {
        "name": "scale",
        "code": 1,
        "slot": "scale",
        "reference": _scale,
        "spellings": (_SPELLING,),
        "constants": ("factor",),
        "example": (0.125,),
        **fields,
    }
    if expected is None:
        assert OpSpec(**record).values() == {"factor": 0.125}
        return
    with pytest.raises(ValueError, match=re.escape(f"OpSpec 'scale': {expected}")):
        OpSpec(**record)


def test_a_template_holds_the_input_and_each_constant_of_its_op():
    swish = OPS["swish"]
    assert str(template(swish, swish.spellings[0])) == "z * T.sigmoid(z * c0)"
    forgetful = Spelling("swish: no alpha", (lambda z, e, k: z * tirx.sigmoid(z),), ("T",))
    with pytest.raises(ValueError, match=r"expected z and each constant of swish, got \['z'\]"):
        template(swish, forgetful)


def test_the_tests_build_each_fixed_form_op_in_one_block_and_commuted_too():
    for name, spec in OPS.items():
        if spec.template and len(spec.spellings[0].blocks) > 1:
            assert f"{name}: one block" in ACTIVATION_SPELLINGS
            assert f"{name}: commuted" in ACTIVATION_SPELLINGS
    # One call has nothing to commute.
    assert "sigmoid: commuted" not in ACTIVATION_SPELLINGS
    # The ops a chain spells with fields of its own are not among them.
    assert not {s.op for s in ACTIVATION_SPELLINGS.values()} & {"relu", "bias"}


def test_the_oracle_keeps_a_nan_only_for_an_op_with_such_a_variant():
    z = np.array([np.nan, -1.0, 2.0], "float32")
    np.testing.assert_array_equal(reference("relu", z), [0, 0, 2])
    np.testing.assert_array_equal(reference("relu", z, keep_nan=True), [np.nan, 0, 2])
    with pytest.raises(ValueError, match="reference: gelu has no variant that keeps NaN"):
        reference("gelu", z, (math.sqrt(0.5),), keep_nan=True)
    with pytest.raises(ValueError, match=r"compose: expected an op of \['scale', "):
        compose("mish", None)


def test_hardswish_as_the_tir_computes_it_in_numpy():
    z = np.array([np.nan, np.inf, -np.inf, -4.0, -3.0, -1.5, 0.0, 1.0, 3.0, 3e38], "float32")
    with np.errstate(all="ignore"):
        expected = [np.nan, np.inf, np.nan, -0.0, -0.0, -0.375, 0.0, 2 / 3, 3.0, np.inf]
    np.testing.assert_allclose(reference("hardswish", z), np.float32(expected), rtol=1e-7)
