"""Bad input: clear one-line errors, or functions left exactly as they were."""

import pytest
import tvm
from support.tir_programs import dense_bias_relu_blocks
from tvm.script import tirx as T

import tir_byoc

pytestmark = pytest.mark.usefixtures("reference_backend")


@pytest.mark.parametrize("entry", [tir_byoc.scan, tir_byoc.explain, tir_byoc.offload])
def test_not_a_module(entry):
    expected = r"expected a tvm\.IRModule or a tvm\.tirx\.PrimFunc, got int"
    with pytest.raises(TypeError, match=expected):
        entry(42)


@T.prim_func
def plain_loops_without_a_gemm(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4, 4), "float32")):
    for i in range(4):
        for j in range(4):
            B[i, j] = T.float32(0)
            for k in range(4):
                B[i, j] = B[i, j] + A[i, k] + A[j, k]


def test_a_function_without_sblocks_and_without_a_gemm_is_left_alone():
    assert tir_byoc.scan(plain_loops_without_a_gemm) == []
    assert tir_byoc.explain(plain_loops_without_a_gemm) == []
    assert tir_byoc.offload(plain_loops_without_a_gemm).same_as(plain_loops_without_a_gemm)


@T.prim_func
def uint32_loop(A: T.Buffer((128,), "float32")):  # from TVM's own parser tests
    for i in range(T.uint32(128)):
        A[i] = T.float32(1.0)


def test_a_loop_over_uint32_is_left_alone():
    # The nest was lifted into a block with an IterVar over uint32, which TVM refuses.
    assert tir_byoc.scan(uint32_loop) == []
    assert tir_byoc.explain(uint32_loop) == []
    assert tir_byoc.offload(uint32_loop).same_as(uint32_loop)


@T.prim_func(s_tir=True)
def row_sum(A: T.Buffer((4, 8), "float32"), S: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + A[vi, vk]


def test_a_reduction_that_multiplies_nothing_is_not_a_candidate():
    assert tir_byoc.scan(row_sum) == [] and tir_byoc.explain(row_sum) == []
    assert tir_byoc.offload(row_sum).same_as(row_sum)


@T.prim_func(s_tir=True)
def batched(
    A: T.Buffer((2, 4, 8), "float32"),
    B: T.Buffer((3, 8, 5), "float32"),
    C: T.Buffer((2, 4, 5), "float32"),
):
    for b, i, j, k in T.grid(2, 4, 5, 8):
        with T.sblock("bmm"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, k])
            with T.init():
                C[vb, vi, vj] = T.float32(0)
            C[vb, vi, vj] = C[vb, vi, vj] + A[vb, vi, vk] * B[vb, vk, vj]


def test_a_batched_matmul_over_part_of_its_weights_is_explained_not_matched():
    assert tir_byoc.scan(batched) == []
    (rejection,) = tir_byoc.explain(batched)
    assert rejection.reason == (
        "batch iterator vb runs over 2 of 3 (axis 0 of weight B): a partial batch range"
    )
    assert str(rejection).startswith(
        "batched: block bmm not offloaded (nearest pattern: bmm_matmul)"
    )


def test_an_unknown_backend_is_a_value_error():
    with pytest.raises(
        ValueError, match=r"backends: expected backend names from \[.*'ref'.*\], got \['cublas'\]"
    ):
        tir_byoc.offload(dense_bias_relu_blocks, backends=["cublas"])


def test_a_broken_registration_changes_nothing():
    before = list(tir_byoc.REGISTRY)
    with pytest.raises(ValueError):
        tir_byoc.register_intrinsic("ref.dense", "dense", "tir_byoc_ref_dense", "/nonexistent.c")
    assert list(tir_byoc.REGISTRY) == before
    tvm.ir.assert_structural_equal(
        tir_byoc.offload(dense_bias_relu_blocks), tir_byoc.offload(dense_bias_relu_blocks)
    )
