"""tir_byoc.testing.loop_dtypes: plain loops retyped to other integer dtypes, same results."""

import pytest
import tvm
from tvm.script import tirx as T

from tir_byoc.testing.equivalence import differences
from tir_byoc.testing.loop_dtypes import LOOP_DTYPES, retype_loops


@T.prim_func
def before(X: T.Buffer((4, 3), "float32"), Y: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 3):
        if k == 0:
            Y[i] = T.float32(0)
        Y[i] = Y[i] + X[i, k] * T.Cast("float32", i + k)


@T.prim_func
def every_loop_uint32(X: T.Buffer((4, 3), "float32"), Y: T.Buffer((4,), "float32")):
    for i, k in T.grid(T.uint32(4), T.uint32(3)):
        if k == T.uint32(0):
            Y[i] = T.float32(0)
        Y[i] = Y[i] + X[i, k] * T.Cast("float32", T.Cast("int32", i) + T.Cast("int32", k))


@T.prim_func
def inner_loop_int8(X: T.Buffer((4, 3), "float32"), Y: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, T.int8(3)):
        if k == T.int8(0):
            Y[i] = T.float32(0)
        Y[i] = Y[i] + X[i, k] * T.Cast("float32", i + T.Cast("int32", k))


@T.prim_func
def long_loop(X: T.Buffer((200,), "float32")):
    for i in range(200):
        X[i] = T.float32(1)


def test_every_loop_retyped_indexes_with_the_variable_and_casts_it_elsewhere():
    expected = every_loop_uint32.with_attr("global_symbol", "before")
    tvm.ir.assert_structural_equal(retype_loops(before, "uint32"), expected)


def test_picked_loops_only():
    expected = inner_loop_int8.with_attr("global_symbol", "before")
    tvm.ir.assert_structural_equal(retype_loops(before, "int8", picked=0b01), expected)


def test_a_loop_whose_extent_does_not_fit_keeps_its_dtype():
    assert retype_loops(long_loop, "int8").same_as(long_loop)
    assert str(retype_loops(long_loop, "uint8").body.loop_var.ty.dtype) == "uint8"


# Signed only: TVM 0.27's own build of an unsigned loop with an ``if`` on its variable fails
# ("Literal value -2 is negative for unsigned integer type uint32").
@pytest.mark.parametrize("dtype", ["int8", "int16", "int64"])
def test_a_retyped_function_computes_what_the_original_does(dtype):
    assert differences(before, retype_loops(before, dtype)) == []


def test_an_unknown_dtype_is_a_value_error():
    with pytest.raises(ValueError, match=r"expected a dtype of .*uint64.*, got 'float32'"):
        retype_loops(before, "float32")
    assert "uint32" in LOOP_DTYPES
