"""The matcher: every invariance the family promises, and every refusal beside it.

Positive cases check the reported match and that offloading keeps every buffer's result;
negative cases check that nothing is offloaded, why, and that the function is unchanged.
"""

import numpy as np
import pytest
import tvm
from support.byoc_testing import (
    assert_equivalent,
    called_intrinsic,
    numpy_pattern,
    only_match,
    random_arguments,
    reasons,
    representatives,
    run,
    sample_patterns,
)
from support.tir_programs import (
    dense_bias_relu_blocks,
    dense_then_exp,
    intermediate_read_after_chain,
    reordered_loops_and_operands,
)
from tvm.script import tirx as T

import tir_byoc
from tir_byoc.patterns import PATTERNS, describe

pytestmark = pytest.mark.usefixtures("reference_backend")

# --------------------------------------------------------------------------------------
# The baseline: Relax-style dense + bias + relu in three blocks.
# --------------------------------------------------------------------------------------


def test_relax_style_chain_is_one_match():
    match = only_match(dense_bias_relu_blocks)
    assert match.pattern == "dense_bias_relu"
    assert match.blocks == ("dense", "bias", "relu")
    assert str(match.dtype) == "float32"
    assert match.shape == ("8", "12", "16")
    assert match.buffers == {"x": "X", "w": "W", "bias": "B", "out": "Out"}
    assert [v.name for v in match.intermediates] == ["Y", "Z"]
    assert match.intrinsic == "ref.dense_bias_relu"
    assert_equivalent(dense_bias_relu_blocks, expect_calls={"ref.dense_bias_relu": 1})


def test_every_pattern_matches_its_own_description():
    for name in PATTERNS:
        match = only_match(describe(name))
        assert match.pattern == name
        assert match.shape == ("M", "N", "K")
    for name in representatives():
        match = only_match(describe(name, x_dtype="float16", out_dtype="float32"))
        assert match.pattern == name


def test_pattern_descriptions_agree_with_the_reference_intrinsics_and_numpy():
    sizes = {"M": 3, "N": 7, "K": 5, "B": 2}
    for name in sample_patterns():
        func = describe(name, index_dtype="int32")
        # A leading-batch member is served by its 2-D member's intrinsic, with B x M rows.
        offloaded = assert_equivalent(func, sizes=sizes, expect_calls={called_intrinsic(name): 1})
        arrays = random_arguments(func, sizes)
        *inputs, result = run(offloaded, arrays)
        expected = numpy_pattern(name, *inputs)
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5, err_msg=name)


# --------------------------------------------------------------------------------------
# Invariances: spelling does not matter.
# --------------------------------------------------------------------------------------


def test_loop_order_operand_order_names_and_folded_epilogue():
    match = only_match(reordered_loops_and_operands)
    assert match.pattern == "matmul_bias_relu"
    assert match.blocks == ("mm", "epilogue")
    assert match.buffers == {"x": "A", "w": "Wt", "bias": "bias", "out": "C"}
    assert_equivalent(reordered_loops_and_operands, expect_calls={"ref.matmul_bias_relu": 1})


@T.prim_func(s_tir=True)
def relu_as_select(
    X: T.Buffer((5, 7), "float32"),
    W: T.Buffer((3, 7), "float32"),
    Out: T.Buffer((5, 3), "float32"),
):
    Y = T.sblock_alloc_buffer((5, 3))
    for i, j, k in T.grid(5, 3, 7):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(-0.0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(5, 3):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.Select(T.float32(0) < Y[vi, vj], Y[vi, vj], T.float32(0))


def test_relu_spelled_as_select_and_negative_zero_init():
    assert only_match(relu_as_select).pattern == "dense_relu"
    assert_equivalent(relu_as_select, expect_calls={"ref.dense_relu": 1})


@T.prim_func(s_tir=True)
def int64_indices_with_alloc_buffer(
    X: T.Buffer((T.int64(4), T.int64(9)), "float32"),
    W: T.Buffer((T.int64(9), T.int64(6)), "float32"),
    Out: T.Buffer((T.int64(4), T.int64(6)), "float32"),
):
    Y = T.alloc_buffer((T.int64(4), T.int64(6)))
    for i, j, k in T.grid(T.int64(4), T.int64(6), T.int64(9)):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]
    for i, j in T.grid(T.int64(4), T.int64(6)):
        with T.sblock("compute"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.max(Y[vi, vj], T.float32(0))


def test_int64_indices_and_alloc_buffer_intermediate():
    match = only_match(int64_indices_with_alloc_buffer)
    assert match.pattern == "matmul_relu"
    offloaded = assert_equivalent(
        int64_indices_with_alloc_buffer, expect_calls={"ref.matmul_relu": 1}
    )
    assert "T.alloc_buffer(" not in offloaded.script(), "the dead intermediate must be removed"


@T.prim_func(s_tir=True)
def dynamic_batch(x: T.handle, w: T.handle, b: T.handle, out: T.handle):
    n = T.int64()
    X = T.match_buffer(x, (n, T.int64(16)), "float32")
    W = T.match_buffer(w, (T.int64(8), T.int64(16)), "float32")
    B = T.match_buffer(b, (T.int64(8),), "float32")
    Out = T.match_buffer(out, (n, T.int64(8)), "float32")
    Y = T.sblock_alloc_buffer((n, T.int64(8)))
    for i, j, k in T.grid(n, T.int64(8), T.int64(16)):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(n, T.int64(8)):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = B[vj] + Y[vi, vj]


def test_symbolic_batch():
    match = only_match(dynamic_batch)
    assert match.pattern == "dense_bias"
    assert match.shape == ("n", "8", "16")
    assert_equivalent(dynamic_batch, sizes={"n": 3}, expect_calls={"ref.dense_bias": 1})


@T.prim_func(s_tir=True)
def fp16_inputs_fp32_accumulation(
    X: T.Buffer((4, 8), "float16"),
    W: T.Buffer((6, 8), "float16"),
    Out: T.Buffer((4, 6), "float32"),
):
    for i, j, k in T.grid(4, 6, 8):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = T.float32(0)
            Out[vi, vj] = Out[vi, vj] + T.Cast("float32", X[vi, vk]) * T.Cast("float32", W[vj, vk])


@T.prim_func(s_tir=True)
def int8_inputs_int32_accumulation(
    X: T.Buffer((4, 8), "uint8"),
    W: T.Buffer((8, 6), "int8"),
    Out: T.Buffer((4, 6), "int32"),
):
    for i, j, k in T.grid(4, 6, 8):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = 0
            Out[vi, vj] = Out[vi, vj] + T.Cast("int32", X[vi, vk]) * T.Cast("int32", W[vk, vj])


def test_widening_casts_are_part_of_the_dtype_signature():
    fp16 = only_match(fp16_inputs_fp32_accumulation)
    assert (fp16.pattern, str(fp16.dtype)) == ("dense", "float16,float16->float32")
    int8 = only_match(int8_inputs_int32_accumulation)
    assert (int8.pattern, str(int8.dtype)) == ("matmul", "uint8,int8->int32")


def test_a_dtype_no_intrinsic_implements_is_reported_and_left_alone():
    match = tir_byoc.scan(fp16_inputs_fp32_accumulation, backends=["ref"])[0]
    assert match.intrinsic is None
    assert "dtype float16,float16->float32 not supported" in match.reason
    offloaded = tir_byoc.offload(fp16_inputs_fp32_accumulation, backends=["ref"])
    tvm.ir.assert_structural_equal(offloaded, fp16_inputs_fp32_accumulation)
    with pytest.raises(ValueError, match="no intrinsic"):
        tir_byoc.offload(fp16_inputs_fp32_accumulation, backends=["ref"], strict=True)


# --------------------------------------------------------------------------------------
# Refusals: a different meaning is never matched.
# --------------------------------------------------------------------------------------


def dense(name, *, init=0.0, rows=4, depth=8, combine=lambda total, product: total + product):
    """``Out = X @ W.T`` (4 x 8 by 8 x 6) with one setting changed: the reduction's initial
    value, the rows or the depth its loops cover, or how it combines a product with the sum."""

    @T.prim_func(s_tir=True)
    def func(
        X: T.Buffer((4, 8), "float32"),
        W: T.Buffer((6, 8), "float32"),
        Out: T.Buffer((4, 6), "float32"),
    ):
        for i, j, k in T.grid(rows, 6, depth):
            with T.sblock("dense"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Out[vi, vj] = T.float32(init)
                Out[vi, vj] = combine(Out[vi, vj], X[vi, vk] * W[vj, vk])

    return func.with_attr("global_symbol", name)


init_to_one = dense("init_to_one", init=1.0)
partial_k = dense("partial_k", depth=5)
partial_rows = dense("partial_rows", rows=3)
product_accumulation = dense("product_accumulation", combine=T.max)


@T.prim_func(s_tir=True)
def mixed_up_indices(
    X: T.Buffer((8, 8), "float32"), W: T.Buffer((8, 8), "float32"), Out: T.Buffer((8, 8), "float32")
):
    for i, j, k in T.grid(8, 8, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = T.float32(0)
            Out[vi, vj] = Out[vi, vj] + X[vk, vi] * W[vj, vk]


@T.prim_func(s_tir=True)
def output_aliases_input(W: T.Buffer((8, 8), "float32"), Out: T.Buffer((8, 8), "float32")):
    for i, j, k in T.grid(8, 8, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = T.float32(0)
            Out[vi, vj] = Out[vi, vj] + Out[vi, vk] * W[vj, vk]


@pytest.mark.parametrize(
    "func, reason",
    [
        (init_to_one, "the reduction is initialised to 1.0, not 0 or a bias b[j]"),
        (partial_k, "k runs over 0..4 of 8 (axis 1 of input X)"),
        (partial_rows, "i runs over 0..2 of 4 (axis 0 of output Out)"),
        (product_accumulation, "combines with max(), not +"),
        (mixed_up_indices, "do not read X[i, k]"),
        (output_aliases_input, "also read as an operand"),
    ],
    ids=["init", "partial-k", "partial-rows", "combine-op", "indices", "alias"],
)
def test_reduction_refusals(func, reason):
    assert tir_byoc.scan(func) == []
    (found,) = tir_byoc.explain(func)
    assert reason in found.reason
    assert found.blocks == ("dense",) and found.nearest == "dense"
    tvm.ir.assert_structural_equal(tir_byoc.offload(func), func)


def dense_then(name, block, epilogue):
    """``Out = epilogue(X @ W.T)`` (6 x 8 by 8 x 5), the epilogue a block of its own."""

    @T.prim_func(s_tir=True)
    def func(
        X: T.Buffer((6, 8), "float32"),
        W: T.Buffer((5, 8), "float32"),
        Out: T.Buffer((6, 5), "float32"),
    ):
        Y = T.sblock_alloc_buffer((6, 5))
        for i, j, k in T.grid(6, 5, 8):
            with T.sblock("dense"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
        for i, j in T.grid(6, 5):
            with T.sblock(block):
                vi, vj = T.axis.remap("SS", [i, j])
                Out[vi, vj] = epilogue(Y[vi, vj])

    return func.with_attr("global_symbol", name)


def dense_then_bias(name, block, bias_shape, epilogue, columns=5):
    """``Out = epilogue(X @ W.T, B, i, j)`` (6 x 8 by 8 x ``columns``) with a bias ``B`` of
    ``bias_shape``, the epilogue a block of its own."""

    @T.prim_func(s_tir=True)
    def func(
        X: T.Buffer((6, 8), "float32"),
        W: T.Buffer((columns, 8), "float32"),
        B: T.Buffer(bias_shape, "float32"),
        Out: T.Buffer((6, columns), "float32"),
    ):
        Y = T.sblock_alloc_buffer((6, columns))
        for i, j, k in T.grid(6, columns, 8):
            with T.sblock("dense"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
        for i, j in T.grid(6, columns):
            with T.sblock(block):
                vi, vj = T.axis.remap("SS", [i, j])
                Out[vi, vj] = epilogue(Y[vi, vj], B, vi, vj)

    return func.with_attr("global_symbol", name)


bias_by_row = dense_then_bias("bias_by_row", "T_add", (6,), lambda y, b, i, j: y + b[i], columns=6)
bias_full_matrix = dense_then_bias(
    "bias_full_matrix", "T_add", (6, 5), lambda y, b, i, j: y + b[i, j]
)
bias_subtracted = dense_then_bias("bias_subtracted", "T_sub", (5,), lambda y, b, i, j: y - b[j])
relu_threshold = dense_then("relu_threshold", "compute", lambda y: T.max(y, T.float32(0.5)))
leaky_relu = dense_then("leaky_relu", "compute", lambda y: T.max(y, y * T.float32(0.1)))
clipped_relu = dense_then(
    "clipped_relu", "compute", lambda y: T.min(T.max(y, T.float32(0)), T.float32(6))
)


@pytest.mark.parametrize(
    "func, reason",
    [
        (bias_by_row, "indexed by the row"),
        (relu_threshold, "max() against 0.5 alone: a relu needs 0, a clip needs both bounds"),
        (bias_subtracted, "combines with -"),
    ],
    ids=["bias-row", "threshold", "subtract"],
)
def test_epilogue_refusals_end_the_chain_before_the_epilogue(func, reason):
    match = only_match(func)
    assert match.pattern == "dense" and match.blocks == ("dense",)
    (rejection,) = tir_byoc.explain(func)
    assert rejection.blocks != ("dense",) and reason in rejection.reason
    assert_equivalent(func, expect_calls={"ref.dense": 1})


@pytest.mark.parametrize(
    "func, pattern, constants",
    [
        (bias_full_matrix, "dense_add", ()),
        (leaky_relu, "dense_leaky_relu", (np.float32(0.1),)),
        (clipped_relu, "dense_clip", (0.0, 6.0, 0.0)),
    ],
    ids=["residual-add", "leaky", "clipped"],
)
def test_what_the_2d_family_refused_is_now_an_epilogue(func, pattern, constants):
    """A full (M, N) addend is a residual add; max(z, 0.1 z) a leaky relu; min(max(z, 0), 6)
    a clip whose NaN (max(NaN, 0) = 0, then min(0, 6)) becomes 0."""
    match = only_match(func)
    assert match.pattern == pattern
    assert match.epilogue[-1].constants == pytest.approx(constants)
    assert_equivalent(func, expect_calls={"ref.gemm": 1})


def test_a_shared_intermediate_stays_materialized():
    match = only_match(intermediate_read_after_chain)
    assert match.blocks == ("dense",) and match.out.name == "Y"
    assert any("stays materialized" in r for r in reasons(intermediate_read_after_chain))
    offloaded = assert_equivalent(intermediate_read_after_chain, expect_calls={"ref.dense": 1})
    assert "sblock_alloc_buffer" in offloaded.script()


@T.prim_func(s_tir=True)
def epilogue_writes_its_input(
    X: T.Buffer((6, 5), "float32"), W: T.Buffer((5, 5), "float32"), B: T.Buffer((5,), "float32")
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 5):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            X[vi, vj] = Y[vi, vj] + B[vj]


def test_an_epilogue_that_overwrites_a_chain_input_is_not_fused():
    match = only_match(epilogue_writes_its_input)
    assert match.blocks == ("dense",)
    assert any("aliasing" in r for r in reasons(epilogue_writes_its_input))
    assert_equivalent(epilogue_writes_its_input, expect_calls={"ref.dense": 1})


def test_an_epilogue_refusal_names_the_pattern_it_would_have_made():
    nearest = {
        "bias-row": tir_byoc.explain(bias_by_row)[0].nearest,
        "threshold": tir_byoc.explain(relu_threshold)[0].nearest,
        "subtract": tir_byoc.explain(bias_subtracted)[0].nearest,
    }
    assert nearest == {"bias-row": "dense_bias", "threshold": "dense_relu", "subtract": "dense"}


# --------------------------------------------------------------------------------------
# Candidates the chain search never reaches still get a reason.
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def epilogues_after_a_refused_reduction(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    Z = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(1)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Z[vi, vj] = Y[vi, vj] + B[vj]
    for i, j in T.grid(6, 5):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.max(Z[vi, vj], T.float32(0))


def test_epilogues_of_a_refused_reduction_are_explained_with_it():
    rejections = tir_byoc.explain(epilogues_after_a_refused_reduction)
    assert [(r.blocks, r.nearest) for r in rejections] == [
        (("dense",), "dense"),
        (("T_add",), None),
        (("relu",), None),
    ]
    assert rejections[1].reason == ("it reads Y, the output of block dense, which is not offloaded")
    assert rejections[2].reason == ("it reads Z, the output of block T_add, which is not offloaded")
    assert tir_byoc.scan(epilogues_after_a_refused_reduction) == []


@T.prim_func(s_tir=True)
def guarded_update(
    X: T.Buffer((6, 8), "float32"), W: T.Buffer((5, 8), "float32"), Out: T.Buffer((6, 5), "float32")
):
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = T.float32(0)
            if vk < 4:
                Out[vi, vj] = Out[vi, vj] + X[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def guarded_sum(A: T.Buffer((4, 8), "float32"), S: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            if vk < 4:
                S[vi] = S[vi] + A[vi, vk]


def test_a_multiply_reduce_block_with_an_if_body_is_explained():
    (rejection,) = tir_byoc.explain(guarded_update)
    assert rejection.blocks == ("dense",) and rejection.nearest == "dense"
    assert rejection.reason.startswith("the body of block dense is an if statement")
    assert tir_byoc.scan(guarded_update) == []
    tvm.ir.assert_structural_equal(tir_byoc.offload(guarded_update), guarded_update)


def test_a_guarded_reduction_that_multiplies_nothing_is_not_a_candidate():
    assert tir_byoc.explain(guarded_sum) == []


def test_a_call_in_an_epilogue_is_explained():
    (rejection,) = [r for r in tir_byoc.explain(intermediate_read_after_chain) if "exp" in r.blocks]
    assert "stays materialized" in rejection.reason


def test_an_elementwise_call_after_a_chain_is_named_in_the_reason():
    assert only_match(dense_then_exp).blocks == ("dense",)
    (rejection,) = tir_byoc.explain(dense_then_exp)
    assert rejection.blocks == ("exp",) and "a call to tirx.exp" in rejection.reason
    assert_equivalent(dense_then_exp, expect_calls={"ref.dense": 1})
