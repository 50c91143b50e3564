"""Chain forms TVM itself emits: each matched where it is safe, refused with a reason where not.

Blocks between chain members, epilogues in place on the output, a reduction initialised with
the bias or in a block of its own (``decompose_reduction``), plain loops without SBlocks
(TVM's lowering), relu spelled with ``if_then_else``, and the NaN a relu's spelling keeps or
drops.  Positive cases offload and compare every buffer with TVM's own result; negative cases
check the reason and that nothing changes.
"""

import numpy as np
import pytest
import tvm
from support.byoc_testing import (
    assert_equivalent,
    intrinsic_calls,
    only_match,
    reasons,
    run,
    sample_patterns,
)
from tvm import s_tir, tirx
from tvm.script import tirx as T

import tir_byoc
from tir_byoc.match import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO
from tir_byoc.patterns import describe
from tir_byoc.patterns import pattern as pattern_of
from tir_byoc.registry import Intrinsic, Registry
from tir_byoc.testing.loop_dtypes import retype_loops
from tir_byoc.testing.strategies import lower_to_plain_loops

pytestmark = pytest.mark.usefixtures("reference_backend")

# --------------------------------------------------------------------------------------
# Blocks between chain members.
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def unrelated_block_between(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
    E: T.Buffer((6, 8), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, k in T.grid(6, 8):
        with T.sblock("exp"):
            vi, vk = T.axis.remap("SS", [i, k])
            E[vi, vk] = T.exp(X[vi, vk])
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = Y[vi, vj] + B[vj]


def test_a_block_that_touches_none_of_the_chain_buffers_stays_between():
    match = only_match(unrelated_block_between)
    assert match.pattern == "dense_bias" and match.blocks == ("dense", "T_add")
    assert tir_byoc.explain(unrelated_block_between) == []
    offloaded = assert_equivalent(unrelated_block_between, expect_calls={"ref.dense_bias": 1})
    assert "exp" in offloaded.script()


@T.prim_func(s_tir=True)
def topi_dense_with_bias_copy(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    # TOPI's dense with a bias: the bias is copied into a buffer of its own between the GEMM
    # and the add, so the block between writes what the chain's next block reads.
    Y = T.sblock_alloc_buffer((6, 5))
    Bc = T.sblock_alloc_buffer((5,))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("T_matmul_NT"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for j in range(5):
        with T.sblock("bias_copy"):
            vj = T.axis.remap("S", [j])
            Bc[vj] = B[vj]
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = Y[vi, vj] + Bc[vj]


def test_topi_dense_with_its_bias_copy_between_is_one_chain():
    match = only_match(topi_dense_with_bias_copy)
    assert match.blocks == ("T_matmul_NT", "T_add") and match.bias.name == "Bc"
    assert_equivalent(topi_dense_with_bias_copy, expect_calls={"ref.dense_bias": 1})


@T.prim_func(s_tir=True)
def block_between_overwrites_x(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, k in T.grid(6, 8):
        with T.sblock("scale_x"):
            vi, vk = T.axis.remap("SS", [i, k])
            X[vi, vk] = X[vi, vk] * T.float32(2)
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = Y[vi, vj] + B[vj]


def test_a_block_between_that_writes_a_chain_input_ends_the_chain():
    match = only_match(block_between_overwrites_x)
    assert match.blocks == ("dense",)
    (rejection,) = tir_byoc.explain(block_between_overwrites_x)
    assert rejection.blocks == ("T_add",)
    assert "block scale_x between block dense and the next use of Y touches X" in rejection.reason
    assert_equivalent(block_between_overwrites_x, expect_calls={"ref.dense": 1})


@T.prim_func(s_tir=True)
def opaque_code_between(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i in range(6):
        for j in range(5):
            with T.sblock("poke"):
                vi, vj = T.axis.remap("SS", [i, j])
                W[vj, vi] = T.float32(1)
        for j in range(5):
            with T.sblock("poke2"):
                vi, vj = T.axis.remap("SS", [i, j])
                W[vj, vi + 1] = T.float32(1)
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = Y[vi, vj] + B[vj]


def test_a_loop_between_that_touches_a_chain_buffer_ends_the_chain():
    match = only_match(opaque_code_between)
    assert match.blocks == ("dense",)
    assert any(
        "a loop between block dense" in r and "touches W" in r for r in reasons(opaque_code_between)
    )
    assert_equivalent(opaque_code_between, expect_calls={"ref.dense": 1})


# --------------------------------------------------------------------------------------
# Epilogues in place on the output.
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def in_place_bias_relu(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Y: T.Buffer((6, 5), "float32"),
    R: T.Buffer((6,), "float32"),
):
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = Y[vi, vj] + B[vj]
    for i, j in T.grid(6, 5):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = T.max(Y[vi, vj], T.float32(0))
    for i, j in T.grid(6, 5):
        with T.sblock("row_sum"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                R[vi] = T.float32(0)
            R[vi] = R[vi] + Y[vi, vj]


def test_epilogues_in_place_on_the_output_join_the_chain():
    match = only_match(in_place_bias_relu)
    assert match.pattern == "dense_bias_relu" and match.blocks == ("dense", "bias", "relu")
    assert match.out.name == "Y" and match.intermediates == ()
    # The later reader sees the final value either way; it is not a candidate.
    assert tir_byoc.explain(in_place_bias_relu) == []
    assert_equivalent(in_place_bias_relu, expect_calls={"ref.dense_bias_relu": 1})


@T.prim_func(s_tir=True)
def in_place_after_a_reader(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Y: T.Buffer((6, 5), "float32"),
    Raw: T.Buffer((6, 5), "float32"),
):
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("peek"):
            vi, vj = T.axis.remap("SS", [i, j])
            Raw[vi, vj] = Y[vi, vj]
    for i, j in T.grid(6, 5):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = Y[vi, vj] + B[vj]


def test_an_in_place_epilogue_after_a_reader_of_the_raw_product_is_refused():
    match = only_match(in_place_after_a_reader)
    assert match.blocks == ("dense",)
    assert any("stays materialized" in r for r in reasons(in_place_after_a_reader))
    assert_equivalent(in_place_after_a_reader, expect_calls={"ref.dense": 1})


# --------------------------------------------------------------------------------------
# How the reduction is initialised.
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def init_with_bias(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((8, 5), "float32"),
    B: T.Buffer((1, 5), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = B[0, vj]
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]
    for i, j in T.grid(6, 5):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.max(Y[vi, vj], T.float32(0))


def test_a_reduction_initialised_with_the_bias_is_a_bias_pattern():
    match = only_match(init_with_bias)
    assert match.pattern == "matmul_bias_relu" and match.bias.name == "B"
    assert_equivalent(init_with_bias, expect_calls={"ref.matmul_bias_relu": 1})


@T.prim_func(s_tir=True)
def init_with_row_bias(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((6,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = B[vi]
            Out[vi, vj] = Out[vi, vj] + X[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def init_then_a_second_bias(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = B[vj]
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = Y[vi, vj] + B[vj]


def test_an_init_from_a_row_vector_is_refused_and_a_second_bias_joins_the_chain():
    (rejection,) = tir_byoc.explain(init_with_row_bias)
    assert rejection.nearest == "dense_bias" and "indexed by the row" in rejection.reason
    tvm.ir.assert_structural_equal(tir_byoc.offload(init_with_row_bias), init_with_row_bias)
    match = only_match(init_then_a_second_bias)
    assert match.pattern == "dense_bias_bias" and match.blocks == ("dense", "T_add")
    assert reasons(init_then_a_second_bias) == []
    assert_equivalent(init_then_a_second_bias, expect_calls={"ref.gemm": 1})


def _decomposed(name: str, bias_init: bool = False) -> tirx.PrimFunc:
    """``describe(name)`` after ``decompose_reduction`` at the outermost loop."""
    sch = s_tir.Schedule(describe(name, index_dtype="int32"))
    block = sch.get_sblock(pattern_of(name).layout)
    sch.decompose_reduction(block, sch.get_loops(block)[0])
    return sch.mod["main"]


@pytest.mark.parametrize("name", ["dense", "matmul_bias_relu"])
def test_an_init_in_a_block_of_its_own_joins_the_chain(name):
    func = _decomposed(name)
    match = only_match(func)
    layout = pattern_of(name).layout
    assert match.pattern == name and match.blocks[:2] == (f"{layout}_init", f"{layout}_update")
    offloaded = assert_equivalent(
        func, sizes={"M": 3, "N": 7, "K": 5}, expect_calls={f"ref.{name}": 1}
    )
    assert 'sblock("dense_init")' not in offloaded.script()


@T.prim_func(s_tir=True)
def init_block_too_short(
    X: T.Buffer((6, 8), "float32"), W: T.Buffer((5, 8), "float32"), Y: T.Buffer((6, 5), "float32")
):
    for i, j in T.grid(5, 5):
        with T.sblock("dense_init"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = T.float32(0)
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense_update"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def no_init_anywhere(
    X: T.Buffer((6, 8), "float32"), W: T.Buffer((5, 8), "float32"), Y: T.Buffer((6, 5), "float32")
):
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense_update"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]


@pytest.mark.parametrize(
    "func, reason",
    [
        (init_block_too_short, "block dense_init covers 5 of M = 6"),
        (no_init_anywhere, "the reduction has no init"),
    ],
    ids=["short-init", "no-init"],
)
def test_reductions_without_a_whole_init_are_refused(func, reason):
    (rejection,) = tir_byoc.explain(func)
    assert rejection.blocks == ("dense_update",) and reason in rejection.reason
    assert tir_byoc.scan(func) == []
    tvm.ir.assert_structural_equal(tir_byoc.offload(func), func)


# --------------------------------------------------------------------------------------
# Plain loops (no SBlocks), as TVM's own lowering leaves them.
# --------------------------------------------------------------------------------------


def _lowered(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` through TVM's S-TIR lowering passes: plain loops, no SBlocks."""
    lowered = lower_to_plain_loops(func)
    assert not tir_byoc.match.is_s_tir(lowered)
    return lowered


@pytest.mark.parametrize("name", sample_patterns())
def test_every_pattern_matches_after_tvm_lowers_it_to_plain_loops(name):
    func = _lowered(describe(name, index_dtype="int32"))
    assert only_match(func).pattern == name
    called = f"ref.{pattern_of(name).call_pattern}"
    assert_equivalent(func, sizes={"M": 3, "N": 7, "K": 5, "B": 2}, expect_calls={called: 1})


def test_a_decomposed_reduction_matches_after_lowering():
    func = _lowered(_decomposed("dense_bias_relu"))
    match = only_match(func)
    assert match.pattern == "dense_bias_relu" and match.blocks[:2] == ("dense", "dense_1")
    assert_equivalent(func, sizes={"M": 4, "N": 3, "K": 6}, expect_calls={"ref.dense_bias_relu": 1})


@T.prim_func
def plain_init_between_loops(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4, 4), "float32")):
    for i in range(4):
        for j in range(4):
            B[i, j] = T.float32(0)
            for k in range(4):
                B[i, j] = B[i, j] + A[i, k] * A[j, k]


def test_plain_loops_with_the_init_between_the_loops():
    match = only_match(plain_init_between_loops)
    assert match.pattern == "dense" and match.buffers == {"x": "A", "w": "A", "out": "B"}
    assert_equivalent(plain_init_between_loops, expect_calls={"ref.dense": 1})


@T.prim_func
def plain_with_a_wrong_guard(
    X: T.Buffer((4, 8), "float32"), W: T.Buffer((6, 8), "float32"), Y: T.Buffer((4, 6), "float32")
):
    for i, j, k in T.grid(4, 6, 8):
        if k == 1:
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[j, k]


@T.prim_func
def plain_partial_rows(
    X: T.Buffer((4, 8), "float32"), W: T.Buffer((6, 8), "float32"), Y: T.Buffer((4, 6), "float32")
):
    for i, j, k in T.grid(3, 6, 8):
        if k == 0:
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[j, k]


def test_plain_loops_that_do_not_compute_the_pattern_are_left_alone():
    # An init guarded by k == 1 is not an init: the nest is not read as a block at all.
    assert tir_byoc.scan(plain_with_a_wrong_guard) == []
    assert tir_byoc.explain(plain_with_a_wrong_guard) == []
    (rejection,) = tir_byoc.explain(plain_partial_rows)
    assert rejection.blocks == ("Y",) and "i runs over 0..2 of 4" in rejection.reason
    for func in (plain_with_a_wrong_guard, plain_partial_rows):
        tvm.ir.assert_structural_equal(tir_byoc.offload(func), func)


@T.prim_func
def plain_over_int64_loops(
    X: T.Buffer((4, 8), "float32"), W: T.Buffer((8, 6), "float32"), Y: T.Buffer((4, 6), "float32")
):
    for i, j, k in T.grid(T.int64(4), T.int64(6), T.int64(8)):
        if k == T.int64(0):
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[k, j]


@T.prim_func
def plain_over_uint32_loops(
    X: T.Buffer((4, 8), "float32"), W: T.Buffer((8, 6), "float32"), Y: T.Buffer((4, 6), "float32")
):
    for i, j, k in T.grid(T.uint32(4), T.uint32(6), T.uint32(8)):
        if k == T.uint32(0):
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[k, j]


def test_plain_loops_over_int64_match_buffers_of_int32_shape():
    match = only_match(plain_over_int64_loops)
    assert match.pattern == "matmul" and match.shape == ("4", "6", "8")
    assert_equivalent(plain_over_int64_loops, expect_calls={"ref.matmul": 1})


def test_plain_loops_over_uint32_are_refused_with_a_reason():
    assert tir_byoc.scan(plain_over_uint32_loops) == []
    (rejection,) = tir_byoc.explain(plain_over_uint32_loops)
    assert rejection.blocks == ("Y",)
    assert rejection.reason == (
        "loop i runs over uint32; the matcher reads int32 and int64 loops only"
    )
    assert tir_byoc.offload(plain_over_uint32_loops).same_as(plain_over_uint32_loops)


@pytest.mark.parametrize("dtype", ["int8", "int16", "uint8", "uint16", "uint64"])
def test_plain_loops_over_narrow_or_unsigned_dtypes_are_refused(dtype):
    func = retype_loops(plain_over_int64_loops, dtype, picked=0b001)  # k only (innermost)
    assert tir_byoc.scan(func) == []
    assert reasons(func) == [
        f"loop k runs over {dtype}; the matcher reads int32 and int64 loops only"
    ]


@T.prim_func(s_tir=True)
def blocks_over_int8_loops(
    X: T.Buffer((4, 8), "float32"), W: T.Buffer((6, 8), "float32"), Y: T.Buffer((4, 6), "float32")
):
    for i, j, k in T.grid(T.int8(4), T.int8(6), T.int8(8)):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]


def test_a_block_over_int8_loops_is_refused_with_a_reason():
    assert tir_byoc.scan(blocks_over_int8_loops) == []
    assert reasons(blocks_over_int8_loops) == [
        "loop i runs over int8; the matcher reads int32 and int64 loops only"
    ]


@T.prim_func
def plain_relu_over_uint32_loops(
    X: T.Buffer((4, 8), "float32"), W: T.Buffer((6, 8), "float32"), Z: T.Buffer((4, 6), "float32")
):
    Y = T.alloc_buffer((4, 6))
    for i, j, k in T.grid(4, 6, 8):
        if k == 0:
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[j, k]
    for i, j in T.grid(T.uint32(4), T.uint32(6)):
        Z[i, j] = T.max(Y[i, j], T.float32(0))


def test_an_epilogue_over_uint32_loops_stays_tvm_code_after_the_gemm():
    match = only_match(plain_relu_over_uint32_loops)
    assert match.pattern == "dense" and match.blocks == ("Y",)
    assert_equivalent(plain_relu_over_uint32_loops, expect_calls={"ref.dense": 1})


# --------------------------------------------------------------------------------------
# Relu spellings and NaN.
# --------------------------------------------------------------------------------------


def dense_then_select(name, tested):
    """A dense (5 x 7 by 7 x 3) then ``if_then_else(tested(X, Y, i, j) > 0, Y, 0)``."""

    @T.prim_func(s_tir=True)
    def func(
        X: T.Buffer((5, 7), "float32"),
        W: T.Buffer((3, 7), "float32"),
        Out: T.Buffer((5, 3), "float32"),
    ):
        Y = T.sblock_alloc_buffer((5, 3))
        for i, j, k in T.grid(5, 3, 7):
            with T.sblock("dense"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
        for i, j in T.grid(5, 3):
            with T.sblock("relu"):
                vi, vj = T.axis.remap("SS", [i, j])
                Out[vi, vj] = T.if_then_else(
                    tested(X, Y, vi, vj) > T.float32(0), Y[vi, vj], T.float32(0)
                )

    return func.with_attr("global_symbol", name)


relu_as_if_then_else = dense_then_select("relu_as_if_then_else", lambda x, y, i, j: y[i, j])
#: The condition tests another value than the one it selects: no relu.
if_then_else_on_another_value = dense_then_select(
    "if_then_else_on_another_value", lambda x, y, i, j: x[i, 0]
)


def test_relu_spelled_with_if_then_else():
    match = only_match(relu_as_if_then_else)
    assert match.pattern == "dense_relu" and match.relu_nan == RELU_NAN_TO_ZERO
    assert_equivalent(relu_as_if_then_else, expect_calls={"ref.dense_relu": 1})
    assert only_match(if_then_else_on_another_value).blocks == ("dense",)
    assert any(
        "if_then_else() condition" in r and "does not compare the value with 0" in r
        for r in reasons(if_then_else_on_another_value)
    )


def _relu_program(spelling: str) -> tirx.PrimFunc:
    """Y = X . W^T then Out = relu(Y) with the relu spelled ``spelling``, 2 x 3 x 4."""
    x = tvm.te.placeholder((2, 4), "float32", name="X")
    w = tvm.te.placeholder((3, 4), "float32", name="W")
    k = tvm.te.reduce_axis((0, 4), name="k")
    y = tvm.te.compute((2, 3), lambda i, j: tvm.te.sum(x[i, k] * w[j, k], axis=k), name="dense")
    zero = tirx.const(0, "float32")
    relu = {
        "max(z, 0)": lambda z: tvm.te.max(z, zero),
        "max(0, z)": lambda z: tvm.te.max(zero, z),
        "select(z > 0, z, 0)": lambda z: tirx.Select(z > zero, z, zero),
        "select(z < 0, 0, z)": lambda z: tirx.Select(z < zero, zero, z),
        "if_then_else(z >= 0, z, 0)": lambda z: tirx.if_then_else(z >= zero, z, zero),
        "if_then_else(z <= 0, 0, z)": lambda z: tirx.if_then_else(z <= zero, zero, z),
    }[spelling]
    out = tvm.te.compute((2, 3), lambda i, j: relu(y[i, j]), name="relu")
    return tvm.te.create_prim_func([x, w, out])


RELU_SPELLINGS = {
    "max(z, 0)": RELU_NAN_TO_ZERO,
    "max(0, z)": RELU_KEEPS_NAN,
    "select(z > 0, z, 0)": RELU_NAN_TO_ZERO,
    "select(z < 0, 0, z)": RELU_KEEPS_NAN,
    "if_then_else(z >= 0, z, 0)": RELU_NAN_TO_ZERO,
    "if_then_else(z <= 0, 0, z)": RELU_KEEPS_NAN,
}


def _nan_inputs():
    x = np.array([[np.nan, 1, 2, 3], [1, -1, 1, -1]], "float32")
    w = np.array([[1, 1, 1, 1], [-1, -2, -3, -4], [np.inf, 0, 0, 0]], "float32")
    return [x, w, np.zeros((2, 3), "float32")]


@pytest.mark.parametrize("backend", ["ref", "openblas", "mkl", "onednn"])
@pytest.mark.parametrize("spelling", list(RELU_SPELLINGS))
def test_relu_of_nan_is_what_the_spelling_computes(spelling, backend):
    func = _relu_program(spelling)
    match = only_match(func)
    assert match.pattern == "dense_relu" and match.relu_nan == RELU_SPELLINGS[spelling]
    offloaded = tir_byoc.offload(func, backends=[backend])
    assert intrinsic_calls(offloaded) == {f"{backend}.dense_relu": 1}
    want, got = run(func, _nan_inputs())[-1], run(offloaded, _nan_inputs())[-1]
    # Row 0 is all NaN before the relu; the inf column gives inf or NaN (inf * 0).
    assert np.isnan(want[0]).all() == (RELU_SPELLINGS[spelling] == RELU_KEEPS_NAN)
    np.testing.assert_array_equal(got, want)


def test_an_intrinsic_that_maps_nan_to_zero_never_serves_a_relu_that_keeps_it(tmp_path):
    source = tmp_path / "mine.c"
    source.write_text("/* never built: only chosen */\n")
    registry = Registry()
    registry.register(
        Intrinsic("mine.dense_relu", "dense_relu", "mine_dense_relu", "float32", source)
    )
    keeps = tir_byoc.scan(_relu_program("max(0, z)"), registry=registry)
    assert keeps[0].intrinsic is None and "keeps NaN" in keeps[0].reason
    zeroes = tir_byoc.scan(_relu_program("max(z, 0)"), registry=registry)
    assert zeroes[0].intrinsic == "mine.dense_relu"
    with pytest.raises(ValueError, match="expected relu_nan made of"):
        Intrinsic("mine.dense", "dense", "mine_dense", "float32", source, relu_nan=("maybe",))


# --------------------------------------------------------------------------------------
# What is a candidate at all.
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def layer_norm_variance(A: T.Buffer((4, 8), "float32"), Out: T.Buffer((4, 8), "float32")):
    mean = T.sblock_alloc_buffer((4,))
    var = T.sblock_alloc_buffer((4,))
    for i, k in T.grid(4, 8):
        with T.sblock("mean"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                mean[vi] = T.float32(0)
            mean[vi] = mean[vi] + A[vi, vk] * T.float32(0.125)
    for i, k in T.grid(4, 8):
        with T.sblock("variance"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                var[vi] = T.float32(0)
            var[vi] = var[vi] + (A[vi, vk] - mean[vi]) * (A[vi, vk] - mean[vi])
    for i, k in T.grid(4, 8):
        with T.sblock("normalize"):
            vi, vk = T.axis.remap("SS", [i, k])
            Out[vi, vk] = (A[vi, vk] - mean[vi]) * T.rsqrt(var[vi] + T.float32(1e-5))


@T.prim_func(s_tir=True)
def sum_of_squares(A: T.Buffer((4, 8), "float32"), S: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("sum_sq"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + T.Cast("float32", A[vi, vk]) * A[vi, vk]


def test_only_reductions_of_products_of_buffer_elements_are_candidates():
    # A variance multiplies computed values and a mean multiplies by a constant: no GEMM,
    # nothing to explain, and none of their consumers either.
    assert tir_byoc.explain(layer_norm_variance) == []
    # A product of two buffer elements (through a cast) is a candidate, and is explained.
    (rejection,) = tir_byoc.explain(sum_of_squares)
    assert rejection.blocks == ("sum_sq",) and rejection.nearest == "dense"
