"""The rewrite: before/expected TVMScript, sequential calls, idempotence, status errors."""

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from support.byoc_testing import assert_equivalent, intrinsic_calls, random_arguments, run
from support.tir_programs import dense_bias_relu_blocks, two_layers
from tvm.script import tirx as T

import tir_byoc

pytestmark = pytest.mark.usefixtures("reference_backend")

MESSAGE = (
    "tir_byoc intrinsic {name} (tir_byoc_{symbol}) returned a non-zero status for blocks "
    "{blocks} of main; the codes are listed in intrinsics/include/tir_byoc.h"
)


@T.prim_func(s_tir=True)
def expected_dense_bias_relu(
    X: T.Buffer((8, 16), "float32"),
    W: T.Buffer((12, 16), "float32"),
    B: T.Buffer((12,), "float32"),
    Out: T.Buffer((8, 12), "float32"),
):
    with T.sblock("root"):
        T.reads()
        T.writes()
        with T.sblock("dense_bias_relu_ref"):
            T.reads(X[0:8, 0:16], W[0:12, 0:16], B[0:12])
            T.writes(Out[0:8, 0:12])
            T.sblock_attr(
                {"tir_byoc.blocks": "dense,bias,relu", "tir_byoc.intrinsic": "ref.dense_bias_relu"}
            )
            status: T.let[T.int32] = T.call_extern(
                "int32",
                "tir_byoc_ref_dense_bias_relu",
                X.data,
                W.data,
                B.data,
                Out.data,
                T.int64(8),
                T.int64(12),
                T.int64(16),
                65793,
            )
            assert status == 0, (
                "RuntimeError",
                [
                    "tir_byoc intrinsic ref.dense_bias_relu (tir_byoc_ref_dense_bias_relu) "
                    "returned a non-zero status for blocks dense, bias, relu of main; the codes "
                    "are listed in intrinsics/include/tir_byoc.h"
                ],
            )


def test_chain_becomes_one_call_block():
    func = dense_bias_relu_blocks.with_attr("global_symbol", "main")
    tvm.ir.assert_structural_equal(
        tir_byoc.offload(func), expected_dense_bias_relu.with_attr("global_symbol", "main")
    )


@T.prim_func(s_tir=True)
def expected_two_layers(
    X: T.Buffer((4, 6), "float32"),
    W1: T.Buffer((5, 6), "float32"),
    B1: T.Buffer((5,), "float32"),
    W2: T.Buffer((3, 5), "float32"),
    Out: T.Buffer((4, 3), "float32"),
):
    H = T.sblock_alloc_buffer((4, 5))
    with T.sblock("dense_bias_relu_ref"):
        T.reads(X[0:4, 0:6], W1[0:5, 0:6], B1[0:5])
        T.writes(H[0:4, 0:5])
        T.sblock_attr(
            {"tir_byoc.blocks": "dense1,bias_relu1", "tir_byoc.intrinsic": "ref.dense_bias_relu"}
        )
        status: T.let[T.int32] = T.call_extern(
            "int32",
            "tir_byoc_ref_dense_bias_relu",
            X.data,
            W1.data,
            B1.data,
            H.data,
            T.int64(4),
            T.int64(5),
            T.int64(6),
            65793,
        )
        assert status == 0, (
            "RuntimeError",
            [
                "tir_byoc intrinsic ref.dense_bias_relu (tir_byoc_ref_dense_bias_relu) returned "
                "a non-zero status for blocks dense1, bias_relu1 of main; the codes are listed "
                "in intrinsics/include/tir_byoc.h"
            ],
        )
    with T.sblock("dense_ref"):
        T.reads(H[0:4, 0:5], W2[0:3, 0:5])
        T.writes(Out[0:4, 0:3])
        T.sblock_attr({"tir_byoc.blocks": "dense2", "tir_byoc.intrinsic": "ref.dense"})
        status: T.let[T.int32] = T.call_extern(
            "int32",
            "tir_byoc_ref_dense",
            H.data,
            W2.data,
            Out.data,
            T.int64(4),
            T.int64(3),
            T.int64(5),
            65793,
        )
        assert status == 0, (
            "RuntimeError",
            [
                "tir_byoc intrinsic ref.dense (tir_byoc_ref_dense) returned a non-zero status "
                "for blocks dense2 of main; the codes are listed in intrinsics/include/tir_byoc.h"
            ],
        )


def test_two_chains_become_sequential_calls_through_an_allocated_intermediate():
    func = two_layers.with_attr("global_symbol", "main")
    offloaded = tir_byoc.offload(func)
    tvm.ir.assert_structural_equal(
        offloaded, expected_two_layers.with_attr("global_symbol", "main")
    )
    assert_equivalent(func, expect_calls={"ref.dense_bias_relu": 1, "ref.dense": 1})


def test_offload_is_idempotent():
    once = tir_byoc.offload(two_layers)
    tvm.ir.assert_structural_equal(tir_byoc.offload(once), once)
    assert tir_byoc.scan(once) == []


def test_offload_does_not_modify_its_input():
    mod = tvm.IRModule({"main": two_layers})
    before = mod["main"]
    tir_byoc.offload(mod)
    assert mod["main"].same_as(before)


def test_module_pass_in_a_sequential():
    mod = tvm.IRModule({"main": two_layers})
    seq = tvm.transform.Sequential([tir_byoc.Offload(backends="ref")])
    tvm.ir.assert_structural_equal(seq(mod), tir_byoc.offload(mod))


def test_unmatched_functions_are_kept_as_they_are():
    @T.prim_func(s_tir=True)
    def transpose(A: T.Buffer((4, 6), "float32"), B: T.Buffer((6, 4), "float32")):
        for i, j in T.grid(6, 4):
            with T.sblock("T"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vj, vi]

    mod = tvm.IRModule({"transpose": transpose, "layers": two_layers})
    offloaded = tir_byoc.offload(mod)
    assert offloaded["transpose"].same_as(transpose)
    assert intrinsic_calls(offloaded["layers"]) == {"ref.dense_bias_relu": 1, "ref.dense": 1}


FAILING_C = textwrap.dedent(
    """
    #include "tir_byoc.h"
    TIR_BYOC_EXPORT int32_t failing_dense(const float *x, const float *w, float *y, int64_t m,
                                          int64_t n, int64_t k, int32_t dtypes) {
      (void)x; (void)w; (void)y; (void)n; (void)k; (void)dtypes;
      return m == 4 ? TIR_BYOC_EBACKEND : TIR_BYOC_OK;
    }
    """
)


def test_a_failing_intrinsic_raises_an_error_naming_it(tmp_path: Path):
    source = tmp_path / "failing.c"
    source.write_text(FAILING_C)
    registry = tir_byoc.Registry()
    tir_byoc.register_intrinsic(
        "failing.dense", "dense", "failing_dense", source, registry=registry
    )
    func = two_layers.with_attr("global_symbol", "main")
    offloaded = tir_byoc.offload(func, registry=registry)
    # dense2, and dense1 as the prefix of its dense_bias_relu chain (bias_relu1 stays TVM code).
    assert intrinsic_calls(offloaded) == {"failing.dense": 2}
    with pytest.raises(RuntimeError, match=r"failing\.dense \(failing_dense\) returned a non-zero"):
        run(offloaded, random_arguments(func))


@T.prim_func(s_tir=True)
def offset_views(x: T.handle, w: T.handle, out: T.handle):
    X = T.match_buffer(x, (3, 4), "float32", elem_offset=T.int32(), offset_factor=1)
    W = T.match_buffer(w, (5, 4), "float32")
    Out = T.match_buffer(out, (3, 5), "float32", elem_offset=T.int32(), offset_factor=1)
    for i, j, k in T.grid(3, 5, 4):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = T.float32(0)
            Out[vi, vj] = Out[vi, vj] + X[vi, vk] * W[vj, vk]


def test_element_offsets_are_honoured():
    offloaded = tir_byoc.offload(offset_views)
    assert intrinsic_calls(offloaded) == {"ref.dense": 1}
    rng = np.random.default_rng(1)
    x_storage = rng.standard_normal((5, 4)).astype("float32")  # rows 2..4 are X
    w = rng.standard_normal((5, 4)).astype("float32")
    built = tvm.compile(
        tvm.IRModule({"main": offloaded.with_attr("global_symbol", "main")}), "llvm"
    )
    x_base = tvm.runtime.tensor(x_storage)
    out_base = tvm.runtime.tensor(np.zeros((4, 5), "float32"))  # rows 1..3 are Out
    x_view = x_base._create_view((3, 4), "float32", 2 * 4 * 4)
    out_view = out_base._create_view((3, 5), "float32", 1 * 5 * 4)
    built["main"](x_view, tvm.runtime.tensor(w), out_view)
    result = out_base.numpy()
    np.testing.assert_allclose(result[1:], x_storage[2:] @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(result[0], 0)


def test_the_blocks_left_to_tvm_can_still_be_scheduled():
    from support.tir_programs import intermediate_read_after_chain

    func = intermediate_read_after_chain.with_attr("global_symbol", "main")
    offloaded = tir_byoc.offload(func)
    sch = tvm.s_tir.Schedule(offloaded)
    for name in ("T_add", "exp"):
        outer, inner = sch.get_loops(sch.get_sblock(name))
        sch.parallel(outer)
        sch.vectorize(inner)
    assert intrinsic_calls(sch.mod["main"]) == {"ref.dense": 1}
    arrays = random_arguments(func)
    for want, got in zip(run(func, arrays), run(sch.mod["main"], arrays)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
