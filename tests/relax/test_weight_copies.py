"""relax.weight_copies: GEMMs on transposed or broadcast weight copies read the weight itself."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tvm
from support.backend_checks import intrinsics_fired
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import tir_byoc
from tir_byoc import cli
from tir_byoc.decline import WEIGHT_COPY, Decline
from tir_byoc.demo import lowered_mlp, mlp_reference, mlp_weights
from tir_byoc.registry import Registry
from tir_byoc.relax import weight_copies
from tir_byoc.relax.copy_map import CopyMap, copy_map, read_through_copy

pytestmark = pytest.mark.usefixtures("reference_backend")


def planner(registry=tir_byoc.registry.REGISTRY):
    """A ``plan_function`` for :func:`weight_copies.find`: each PrimFunc planned alone."""

    def plan_function(name, func):
        (function,) = tir_byoc.plan(func, registry=registry).functions
        return function

    return plan_function


def fold(mod, plan_function):
    """The fold's two steps: the module :func:`weight_copies.rewrite` returns, the folds
    :func:`weight_copies.find` found, and its refusals."""
    folds, refusals = weight_copies.find(mod, plan_function)
    return weight_copies.rewrite(mod, folds), folds, refusals


def why(decline: Decline) -> str:
    """The condition a weight copy's decline names, after what the GEMM reads and who makes it."""
    _, said, condition = decline.reason.partition("; not folded: ")
    assert said, decline.reason
    return condition


def maker(decline: Decline) -> str:
    """The PrimFunc a weight copy's decline says makes the copy."""
    return re.search(r"a copy that (\S+) makes", decline.reason).group(1)


def _folded(folds) -> tuple[tuple[str, int], ...]:
    """(callee, parameter) of each fold."""
    return tuple((f.callee, arg) for f in folds for arg in f.args)


# --------------------------------------------------------------------------------------
# Which PrimFuncs are copies, and through which map
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def transpose(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
    for i, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vj, vi]


@T.prim_func(s_tir=True)
def copy_square(A: T.Buffer((5, 5), "float32"), B: T.Buffer((5, 5), "float32")):
    for i, j in T.grid(5, 5):
        with T.sblock("copy"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj]


@T.prim_func(s_tir=True)
def transpose_with_compact_strides(
    A: T.Buffer((5, 6), "float32", strides=(6, 1)), B: T.Buffer((6, 5), "float32", strides=(5, 1))
):
    for i, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vj, vi]


@T.prim_func(s_tir=True)
def transpose_broadcast(W: T.Buffer((5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    # What Relax emits for torch's expand + bmm: a transpose, then a broadcast_to.
    Wt = T.sblock_alloc_buffer((6, 5))
    for k, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vk, vj = T.axis.remap("SS", [k, j])
            Wt[vk, vj] = W[vj, vk]
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = Wt[vk, vj]


@T.prim_func(s_tir=True)
def transpose_broadcast_alloc(W: T.Buffer((5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    # The same with the intermediate allocated by a statement in the body.
    Wt = T.alloc_buffer((6, 5))
    for k, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vk, vj = T.axis.remap("SS", [k, j])
            Wt[vk, vj] = W[vj, vk]
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = Wt[vk, vj]


@T.prim_func(s_tir=True)
def broadcast_transposed(W: T.Buffer((5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    # Both in one block, as FuseTIR can leave them.
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = W[vj, vk]


@T.prim_func(s_tir=True)
def broadcast_unit_axis(W: T.Buffer((1, 5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    # The weight's axis of extent 1 read at 0, broadcast over the batch.
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = W[0, vj, vk]


@T.prim_func(s_tir=True)
def batched_transpose(W: T.Buffer((2, 5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    # A permutation of a weight per batch, no broadcast.
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_transpose"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = W[vb, vj, vk]


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (transpose, CopyMap("float32", (5, 6), (6, 5), (1, 0))),
        (copy_square, CopyMap("float32", (5, 5), (5, 5), (0, 1))),
        (transpose_with_compact_strides, CopyMap("float32", (5, 6), (6, 5), (1, 0))),
        (transpose_broadcast, CopyMap("float32", (5, 6), (2, 6, 5), (2, 1))),
        (transpose_broadcast_alloc, CopyMap("float32", (5, 6), (2, 6, 5), (2, 1))),
        (broadcast_transposed, CopyMap("float32", (5, 6), (2, 6, 5), (2, 1))),
        (broadcast_unit_axis, CopyMap("float32", (1, 5, 6), (2, 6, 5), (None, 2, 1))),
        (batched_transpose, CopyMap("float32", (2, 5, 6), (2, 6, 5), (0, 2, 1))),
    ],
)
def test_copies_are_proven_with_their_map(func, expected):
    assert copy_map(func) == expected


def test_the_relax_lowered_transposes_are_copies():
    mod = lowered_mlp()
    assert copy_map(mod["transpose"]).text == "T[e0, e1] = W[e1, e0]"
    assert copy_map(broadcast_unit_axis).text == "T[e0, e1, e2] = W[0, e2, e1]"


@T.prim_func(s_tir=True)
def transpose_half(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
    for i, j in T.grid(3, 5):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vj, vi]


@T.prim_func(s_tir=True)
def transpose_cast(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float16")):
    for i, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.Cast("float16", A[vj, vi])


@T.prim_func(s_tir=True)
def broadcast_scaled(W: T.Buffer((5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    Wt = T.sblock_alloc_buffer((6, 5))
    for k, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vk, vj = T.axis.remap("SS", [k, j])
            Wt[vk, vj] = W[vj, vk] * T.float32(2)
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = Wt[vk, vj]


@T.prim_func(s_tir=True)
def broadcast_slice(W: T.Buffer((5, 8), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = W[vj, vk]


@T.prim_func(s_tir=True)
def broadcast_shifted(W: T.Buffer((5, 7), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = W[vj, vk + 1]


@T.prim_func(s_tir=True)
def broadcast_row_zero(W: T.Buffer((5, 6), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = W[0, vk]


@T.prim_func(s_tir=True)
def diagonal(W: T.Buffer((5, 5), "float32"), B: T.Buffer((5, 5), "float32")):
    for i, j in T.grid(5, 5):
        with T.sblock("diagonal"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = W[vi, vi]


@T.prim_func(s_tir=True)
def reduce_by_overwrite(W: T.Buffer((5, 6), "float32"), B: T.Buffer((5,), "float32")):
    for i, j in T.grid(5, 6):
        with T.sblock("last"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi] = W[vi, vj]


@T.prim_func(s_tir=True)
def written_twice(W: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
    for k, j in T.grid(6, 5):
        with T.sblock("first"):
            vk, vj = T.axis.remap("SS", [k, j])
            B[vk, vj] = W[vj, vk]
    for k, j in T.grid(6, 5):
        with T.sblock("second"):
            vk, vj = T.axis.remap("SS", [k, j])
            B[vk, vj] = W[vj, vk]


@T.prim_func(s_tir=True)
def reads_before_written(W: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
    Wt = T.sblock_alloc_buffer((6, 5))
    for k, j in T.grid(6, 5):
        with T.sblock("early"):
            vk, vj = T.axis.remap("SS", [k, j])
            B[vk, vj] = Wt[vk, vj]
    for k, j in T.grid(6, 5):
        with T.sblock("late"):
            vk, vj = T.axis.remap("SS", [k, j])
            Wt[vk, vj] = W[vj, vk]


@T.prim_func(s_tir=True)
def symbolic_transpose(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, 6), "float32")
    B = T.match_buffer(b, (6, n), "float32")
    for i, j in T.grid(6, n):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vj, vi]


@pytest.mark.parametrize(
    ("func", "reason"),
    [
        (transpose_half, "block T_transpose writes part of axis 0 of B"),
        (transpose_cast, "converts float32 to float16"),
        (broadcast_scaled, "block T_transpose stores a product (*), not an element it copies"),
        (broadcast_slice, "block T_broadcast_to reads a slice of W: vk runs over 6 of 8 on axis 1"),
        (
            broadcast_shifted,
            "block T_broadcast_to reads W indexed by vk + 1 on axis 1, not by an iterator of "
            "its own or by 0 on an axis of 1",
        ),
        (
            broadcast_row_zero,
            "block T_broadcast_to reads W indexed by 0 on axis 0, not by an iterator of its "
            "own or by 0 on an axis of 1",
        ),
        (
            diagonal,
            "block diagonal reads W indexed by vi on axis 1, not by an iterator of its own or "
            "by 0 on an axis of 1",
        ),
        (reduce_by_overwrite, "block last writes elements of B more than once"),
        (written_twice, "block second writes B, which an earlier block wrote"),
        (reads_before_written, "block early reads Wt, which no earlier block wrote"),
        (symbolic_transpose, "buffer A has a symbolic shape (n, 6); only static shapes are proven"),
    ],
)
def test_anything_else_is_refused_with_reason(func, reason):
    refused = copy_map(func)
    assert not refused
    assert refused.reason == reason


# --------------------------------------------------------------------------------------
# Reading through a copy
# --------------------------------------------------------------------------------------


def matmul_bias(name, weight_shape, read):
    """``Y = X @ W + b`` (4 x 6 by 6 x 5), W of ``weight_shape`` read as ``read(W, j, k)``:
    the callee before its fold (W, the transposed copy, read at ``[k, j]``) or after (the
    weight itself, read at ``[j, k]``)."""

    @T.prim_func(s_tir=True)
    def func(
        X: T.Buffer((4, 6), "float32"),
        W: T.Buffer(weight_shape, "float32"),
        b: T.Buffer((5,), "float32"),
        Y: T.Buffer((4, 5), "float32"),
    ):
        acc = T.sblock_alloc_buffer((4, 5))
        for i, j, k in T.grid(4, 5, 6):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                T.reads(X[vi, vk], read(W, vj, vk))
                T.writes(acc[vi, vj])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + X[vi, vk] * read(W, vj, vk)
        for i, j in T.grid(4, 5):
            with T.sblock("T_add"):
                vi, vj = T.axis.remap("SS", [i, j])
                Y[vi, vj] = acc[vi, vj] + b[vj]

    return func.with_attr("global_symbol", name)


def bmm_bias(name, weight_shape, read):
    """The batched :func:`matmul_bias` (2 x 3 x 6 by 6 x 5), W read as ``read(W, n, j, k)``."""

    @T.prim_func(s_tir=True)
    def func(
        X: T.Buffer((2, 3, 6), "float32"),
        W: T.Buffer(weight_shape, "float32"),
        b: T.Buffer((5,), "float32"),
        Y: T.Buffer((2, 3, 5), "float32"),
    ):
        acc = T.sblock_alloc_buffer((2, 3, 5))
        for n, i, j, k in T.grid(2, 3, 5, 6):
            with T.sblock("matmul"):
                vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
                T.reads(X[vn, vi, vk], read(W, vn, vj, vk))
                T.writes(acc[vn, vi, vj])
                with T.init():
                    acc[vn, vi, vj] = T.float32(0)
                acc[vn, vi, vj] = acc[vn, vi, vj] + X[vn, vi, vk] * read(W, vn, vj, vk)
        for n, i, j in T.grid(2, 3, 5):
            with T.sblock("T_add"):
                vn, vi, vj = T.axis.remap("SSS", [n, i, j])
                Y[vn, vi, vj] = acc[vn, vi, vj] + b[vj]

    return func.with_attr("global_symbol", name)


matmul_bias_before = matmul_bias("matmul_bias_before", (6, 5), lambda w, j, k: w[k, j])
matmul_bias_expected = matmul_bias("matmul_bias_expected", (5, 6), lambda w, j, k: w[j, k])
bmm_bias_before = bmm_bias("bmm_bias_before", (2, 6, 5), lambda w, n, j, k: w[n, k, j])
bmm_bias_expected = bmm_bias("bmm_bias_expected", (5, 6), lambda w, n, j, k: w[j, k])


@T.prim_func(s_tir=True)
def matmul_writes_weight(X: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32")):
    for i, j in T.grid(6, 5):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            W[vi, vj] = W[vi, vj] * T.float32(2)


@pytest.mark.parametrize(
    ("before", "copy", "expected", "pattern"),
    [
        (matmul_bias_before, transpose, matmul_bias_expected, "dense_bias"),
        (bmm_bias_before, transpose_broadcast, bmm_bias_expected, "batch_dense_bias"),
    ],
)
def test_callee_reads_through_the_copy(before, copy, expected, pattern):
    after = read_through_copy(before, 1, copy_map(copy))
    renamed = after.with_attr("global_symbol", expected.attrs["global_symbol"])
    tvm.ir.assert_structural_equal(renamed, expected)
    (match,) = tir_byoc.scan(after)
    assert (match.pattern, match.w.name, match.intrinsic) == (pattern, "W", "ref.dense_bias")


def test_callee_that_writes_the_weight_is_refused():
    with pytest.raises(ValueError, match="the callee writes W or takes its address, not only"):
        read_through_copy(matmul_writes_weight, 1, copy_map(transpose))


def test_callee_parameter_of_another_shape_is_refused():
    with pytest.raises(ValueError, match=r"parameter W is float32 \[6, 5\], the copy makes"):
        read_through_copy(matmul_bias_before, 1, copy_map(transpose_broadcast))


# --------------------------------------------------------------------------------------
# The whole fold, on the demo MLP
# --------------------------------------------------------------------------------------


def _calls_of(mod, producer: str) -> int:
    return mod["forward"].script().count(f"R.call_tir(cls.{producer},") + mod[
        "forward"
    ].script().count(f"R.call_tir({producer},")


def _run_mlp(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 800)).astype("float32")
    params = mlp_weights(rng)
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, *params)]).numpy()
    return result, mlp_reference(x, *params)


def test_demo_mlp_before_and_after():
    mod = lowered_mlp()
    # Before: matmul intrinsics on the transposed weights, the transposes run on every call.
    before = tir_byoc.offload(mod, fold_transposes=False)
    assert _calls_of(before, "transpose") == 1 and _calls_of(before, "transpose1") == 1
    assert intrinsics_fired(before["fused_matmul_add_relu"]) == ["ref.matmul_bias_relu"]
    # After: dense intrinsics on the original weights, the transposes gone.
    after = tir_byoc.offload(mod)
    assert _calls_of(after, "transpose") == 0 and _calls_of(after, "transpose1") == 0
    assert intrinsics_fired(after["fused_matmul_add_relu"]) == ["ref.dense_bias_relu"]
    assert intrinsics_fired(after["fused_matmul1_add1"]) == ["ref.dense_bias"]
    assert [m.pattern for m in tir_byoc.scan(mod)] == ["dense_bias", "dense_bias_relu"]
    for offloaded in (before, after):
        result, expected = _run_mlp(offloaded)
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_report_names_the_folds():
    mod = lowered_mlp()
    after, folds, refusals = fold(mod, planner())
    assert _folded(folds) == (("fused_matmul1_add1", 1), ("fused_matmul_add_relu", 1))
    # Both copies dropped.
    assert (_calls_of(mod, "transpose"), _calls_of(mod, "transpose1")) == (1, 1)
    assert (_calls_of(after, "transpose"), _calls_of(after, "transpose1")) == (0, 0)
    assert refusals == ()


def test_nothing_changes_when_no_intrinsic_would_serve():
    mod = lowered_mlp()
    folded, _, refusals = fold(mod, planner(Registry()))
    assert folded is mod
    assert [str(r) for r in refusals] == [
        "fused_matmul1_add1: block matmul reads permute_dims1, a copy that transpose1 makes on "
        "every call of forward; not folded: reading the tensor copied, fused_matmul1_add1 "
        "matches dense_bias, but no intrinsic serves it: no intrinsic registered for dense_bias",
        "fused_matmul_add_relu: block matmul reads permute_dims, a copy that transpose makes on "
        "every call of forward; not folded: reading the tensor copied, fused_matmul_add_relu "
        "matches dense_bias_relu, but no intrinsic serves it: no intrinsic registered for "
        "dense_bias_relu",
    ]
    assert [r.nearest for r in refusals] == ["dense_bias", "dense_bias_relu"]


# --------------------------------------------------------------------------------------
# The whole fold, on Relax modules with a weight copied by transpose + broadcast_to
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def bmm_scales_weight(
    X: T.Buffer((2, 3, 6), "float32"),
    W: T.Buffer((2, 6, 5), "float32"),
    b: T.Buffer((5,), "float32"),
    Y: T.Buffer((2, 3, 5), "float32"),
):
    acc = T.sblock_alloc_buffer((2, 3, 5))
    for n, k, j in T.grid(2, 6, 5):
        with T.sblock("scale"):
            vn, vk, vj = T.axis.remap("SSS", [n, k, j])
            W[vn, vk, vj] = W[vn, vk, vj] * T.float32(2)
    for n, i, j, k in T.grid(2, 3, 5, 6):
        with T.sblock("matmul"):
            vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
            with T.init():
                acc[vn, vi, vj] = T.float32(0)
            acc[vn, vi, vj] = acc[vn, vi, vj] + X[vn, vi, vk] * W[vn, vk, vj]
    for n, i, j in T.grid(2, 3, 5):
        with T.sblock("T_add"):
            vn, vi, vj = T.axis.remap("SSS", [n, i, j])
            Y[vn, vi, vj] = acc[vn, vi, vj] + b[vj]


@T.prim_func(s_tir=True)
def bmm_reads_weight_in_epilogue(
    X: T.Buffer((2, 3, 6), "float32"),
    W: T.Buffer((2, 6, 5), "float32"),
    b: T.Buffer((5,), "float32"),
    Y: T.Buffer((2, 3, 5), "float32"),
):
    acc = T.sblock_alloc_buffer((2, 3, 5))
    for n, i, j, k in T.grid(2, 3, 5, 6):
        with T.sblock("matmul"):
            vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
            with T.init():
                acc[vn, vi, vj] = T.float32(0)
            acc[vn, vi, vj] = acc[vn, vi, vj] + X[vn, vi, vk] * W[vn, vk, vj]
    for n, i, j in T.grid(2, 3, 5):
        with T.sblock("T_add"):
            vn, vi, vj = T.axis.remap("SSS", [n, i, j])
            Y[vn, vi, vj] = acc[vn, vi, vj] + b[vj] + W[vn, 0, vj]


@T.prim_func(s_tir=True)
def broadcast_only(V: T.Buffer((6, 5), "float32"), B: T.Buffer((2, 6, 5), "float32")):
    for b, k, j in T.grid(2, 6, 5):
        with T.sblock("T_broadcast_to"):
            vb, vk, vj = T.axis.remap("SSS", [b, k, j])
            B[vb, vk, vj] = V[vk, vj]


def _tensor_type(param) -> relax.TensorType:
    return relax.TensorType([int(d) for d in param.ty.shape], str(param.ty.dtype))


def _linear(producers, callee=bmm_bias_before, *, return_copy=False) -> tvm.IRModule:
    """``forward(x, b, w0, w1, ...)``: ``y_i = callee(x, producer_i(w_i), b)``, each product
    returned (and the first copy too with ``return_copy``)."""
    builder = relax.BlockBuilder()
    x_param, _, b_param, y_param = callee.params
    x, b = relax.Var("x", _tensor_type(x_param)), relax.Var("b", _tensor_type(b_param))
    weights = [relax.Var(f"w{i}", _tensor_type(p.params[0])) for i, p in enumerate(producers)]
    gemm = builder.add_func(callee.without_attr("global_symbol"), "gemm")
    with builder.function("forward", [x, b, *weights]):
        with builder.dataflow():
            outputs = []
            for i, (producer, w) in enumerate(zip(producers, weights)):
                copy_func = builder.add_func(producer.without_attr("global_symbol"), f"copy{i}")
                out_type = _tensor_type(producer.params[1])
                copied = builder.emit(relax.op.call_tir(copy_func, relax.Tuple([w]), out_type))
                call = relax.op.call_tir(gemm, relax.Tuple([x, copied, b]), _tensor_type(y_param))
                outputs.append(builder.emit(call))
                if return_copy and i == 0:
                    outputs.append(copied)
            result = builder.emit_output(relax.Tuple(outputs))
        builder.emit_func_output(result)
    return builder.get()


def _inputs(mod, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [[int(d) for d in p.ty.shape] for p in mod["forward"].params]
    return [rng.standard_normal(s).astype("float32") for s in shapes]


def _run(mod, arrays) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in arrays])
    return [result.numpy()] if hasattr(result, "numpy") else [t.numpy() for t in result]


def _copy_numpy(w: np.ndarray, copy: CopyMap) -> np.ndarray:
    index = np.indices(copy.shape)
    return w[tuple(0 if d is None else index[d] for d in copy.dims)]


@pytest.mark.parametrize(
    ("producer", "pattern", "intrinsic"),
    [
        (transpose_broadcast, "batch_dense_bias", "ref.dense_bias"),
        (transpose_broadcast_alloc, "batch_dense_bias", "ref.dense_bias"),
        (broadcast_transposed, "batch_dense_bias", "ref.dense_bias"),
        (broadcast_unit_axis, "batch_dense_bias", "ref.dense_bias"),
        (batched_transpose, "bmm_dense_bias", "ref.bmm_dense_bias"),
    ],
)
def test_weight_copies_fold_into_the_gemm(producer, pattern, intrinsic):
    mod = _linear([producer])
    # Before: a batched matmul on the copy, which runs on every call.
    assert [c.pattern for c in tir_byoc.scan(mod, fold_transposes=False)] == ["bmm_matmul_bias"]
    after = tir_byoc.offload(mod)
    assert _calls_of(after, "copy0") == 0
    assert [c.pattern for c in tir_byoc.scan(mod)] == [pattern]
    assert intrinsics_fired(after["gemm"]) == [intrinsic]
    assert tir_byoc.explain(mod) == []
    # The original module, built by TVM alone, and the folded one agree, and with NumPy.
    arrays = _inputs(mod)
    (expected,) = _run(mod, arrays)
    (result,) = _run(after, arrays)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    x, b, w = arrays
    np.testing.assert_allclose(
        result, x @ _copy_numpy(w, copy_map(producer)) + b, rtol=1e-5, atol=1e-5
    )


def test_copy_used_elsewhere_is_kept_and_the_gemm_still_folds():
    mod = _linear([transpose_broadcast], return_copy=True)
    after, folds, refusals = fold(mod, planner())
    assert (_folded(folds), refusals) == ((("gemm", 1),), ())
    assert _calls_of(after, "copy0") == 1
    assert intrinsics_fired(tir_byoc.offload(mod)["gemm"]) == ["ref.dense_bias"]
    arrays = _inputs(mod)
    for expected, result in zip(_run(mod, arrays), _run(tir_byoc.offload(mod), arrays)):
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("producer", [broadcast_scaled, broadcast_slice])
def test_producer_that_is_not_a_copy_is_left_alone(producer):
    mod = _linear([producer])
    folded, folds, refusals = fold(mod, planner())
    assert folded is mod and (folds, refusals) == ((), ())
    after = tir_byoc.offload(mod)
    assert _calls_of(after, "copy0") == 1
    assert intrinsics_fired(after["gemm"]) == ["ref.bmm_matmul_bias"]
    arrays = _inputs(mod)
    np.testing.assert_allclose(_run(after, arrays)[0], _run(mod, arrays)[0], rtol=1e-5, atol=1e-5)


def test_callee_that_writes_the_copy_is_left_alone():
    mod = _linear([transpose_broadcast], bmm_scales_weight)
    folded, _, refusals = fold(mod, planner())
    assert folded is mod
    (refusal,) = refusals
    assert refusal == Decline(
        "gemm",
        ("matmul",),
        WEIGHT_COPY,
        "reads W, a copy that copy0 makes on every call of forward; not folded: the callee "
        "writes W or takes its address, not only reads it",
    )
    # explain lists it beside the matcher's refusals, read the same way.
    assert tir_byoc.explain(mod) == [refusal]
    assert not refusal
    assert str(refusal) == (
        "gemm: block matmul reads W, a copy that copy0 makes on every call of forward; not "
        "folded: the callee writes W or takes its address, not only reads it"
    )
    arrays = _inputs(mod)
    np.testing.assert_allclose(
        _run(tir_byoc.offload(mod), arrays)[0], _run(mod, arrays)[0], rtol=1e-5, atol=1e-5
    )


def test_copy_also_read_outside_the_gemm_is_left_alone():
    mod = _linear([transpose_broadcast], bmm_reads_weight_in_epilogue)
    folded, _, refusals = fold(mod, planner())
    assert folded is mod
    assert [why(r) for r in refusals] == ["W is also used by block T_add, not only read by GEMMs"]
    arrays = _inputs(mod)
    np.testing.assert_allclose(
        _run(tir_byoc.offload(mod), arrays)[0], _run(mod, arrays)[0], rtol=1e-5, atol=1e-5
    )


def test_copies_made_by_different_maps_are_refused():
    mod = _linear([transpose_broadcast, broadcast_only])
    folded, _, refusals = fold(mod, planner())
    assert folded is mod
    assert [(maker(r), why(r)) for r in refusals] == [
        (
            producer,
            "the calls of gemm pass copies made by different maps (T[e0, e1, e2] = W[e1, e2]; "
            "T[e0, e1, e2] = W[e2, e1])",
        )
        for producer in ("copy0", "copy1")
    ]


def test_no_intrinsic_leaves_the_broadcast_with_the_pattern_it_would_have_been():
    mod = _linear([transpose_broadcast])
    folded, _, refusals = fold(mod, planner(Registry()))
    assert folded is mod
    (refusal,) = refusals
    assert refusal.nearest == "batch_dense_bias"
    assert why(refusal).startswith("reading the tensor copied, gemm matches batch_dense_bias, but")


# --------------------------------------------------------------------------------------
# Relax modules written as TVMScript: a copy used elsewhere, a callee also called without a
# copy, a copy's source out of scope, a permuted input, and what explain says
# --------------------------------------------------------------------------------------


@I.ir_module
class TransposeAlsoReturned:
    @T.prim_func(private=True, s_tir=True)
    def transpose(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
        for i, j in T.grid(6, 5):
            with T.sblock("T_transpose"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vj, vi]

    @T.prim_func(private=True, s_tir=True)
    def matmul(
        X: T.Buffer((4, 6), "float32"),
        W: T.Buffer((6, 5), "float32"),
        Y: T.Buffer((4, 5), "float32"),
    ):
        for i, j, k in T.grid(4, 5, 6):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]

    @R.function
    def forward(x: R.Tensor((4, 6), "float32"), w: R.Tensor((5, 6), "float32")):
        cls = TransposeAlsoReturned
        with R.dataflow():
            wt = R.call_tir(cls.transpose, (w,), out_ty=R.Tensor((6, 5), "float32"))
            y = R.call_tir(cls.matmul, (x, wt), out_ty=R.Tensor((4, 5), "float32"))
            out = (y, wt)
            R.output(out)
        return out


@I.ir_module
class AlsoCalledUntransposed:
    @T.prim_func(private=True, s_tir=True)
    def transpose(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
        for i, j in T.grid(6, 5):
            with T.sblock("T_transpose"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vj, vi]

    @T.prim_func(private=True, s_tir=True)
    def matmul(
        X: T.Buffer((4, 6), "float32"),
        W: T.Buffer((6, 5), "float32"),
        Y: T.Buffer((4, 5), "float32"),
    ):
        for i, j, k in T.grid(4, 5, 6):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]

    @R.function
    def forward(
        x: R.Tensor((4, 6), "float32"),
        w: R.Tensor((5, 6), "float32"),
        v: R.Tensor((6, 5), "float32"),
    ):
        cls = AlsoCalledUntransposed
        with R.dataflow():
            wt = R.call_tir(cls.transpose, (w,), out_ty=R.Tensor((6, 5), "float32"))
            y = R.call_tir(cls.matmul, (x, wt), out_ty=R.Tensor((4, 5), "float32"))
            z = R.call_tir(cls.matmul, (x, v), out_ty=R.Tensor((4, 5), "float32"))
            out = (y, z)
            R.output(out)
        return out


def test_transpose_used_elsewhere_is_kept_and_the_matmul_still_folds():
    after = tir_byoc.offload(TransposeAlsoReturned)
    assert _calls_of(after, "transpose") == 1
    assert intrinsics_fired(after["matmul"]) == ["ref.dense"]
    x, w = _inputs(TransposeAlsoReturned)
    y, wt = _run(after, [x, w])
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(wt, w.T)


def test_callee_also_called_untransposed_is_left_alone():
    folded, _, refusals = fold(AlsoCalledUntransposed, planner())
    assert folded is AlsoCalledUntransposed
    (refusal,) = refusals
    assert why(refusal) == "matmul is also called with an argument 1 that is not such a copy"
    after = tir_byoc.offload(AlsoCalledUntransposed)
    assert intrinsics_fired(after["matmul"]) == ["ref.matmul"]
    x, w, v = _inputs(AlsoCalledUntransposed)
    y, z = _run(after, [x, w, v])
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, x @ v, rtol=1e-5, atol=1e-5)


@I.ir_module
class SourceHiddenInAnotherBlock:
    @T.prim_func(private=True, s_tir=True)
    def scale(A: T.Buffer((5, 6), "float32"), B: T.Buffer((5, 6), "float32")):
        for i, j in T.grid(5, 6):
            with T.sblock("scale"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vi, vj] * T.float32(2)

    @T.prim_func(private=True, s_tir=True)
    def transpose(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
        for i, j in T.grid(6, 5):
            with T.sblock("T_transpose"):
                vi, vj = T.axis.remap("SS", [i, j])
                B[vi, vj] = A[vj, vi]

    @T.prim_func(private=True, s_tir=True)
    def matmul(
        X: T.Buffer((4, 6), "float32"),
        W: T.Buffer((6, 5), "float32"),
        Y: T.Buffer((4, 5), "float32"),
    ):
        for i, j, k in T.grid(4, 5, 6):
            with T.sblock("matmul"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vk, vj]


def _two_blocks() -> tvm.IRModule:
    """``scale`` and ``transpose`` in one dataflow block, the matmul in a later one."""
    prims = SourceHiddenInAnotherBlock
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6), "float32"))
    w = relax.Var("w", relax.TensorType((5, 6), "float32"))
    gvars = {name: builder.add_func(prims[name], name) for name in ("scale", "transpose", "matmul")}
    with builder.function("forward", [x, w]):
        with builder.dataflow():
            w2 = builder.emit(
                relax.op.call_tir(
                    gvars["scale"], relax.Tuple([w]), relax.TensorType((5, 6), "float32")
                )
            )
            wt = builder.emit_output(
                relax.op.call_tir(
                    gvars["transpose"], relax.Tuple([w2]), relax.TensorType((6, 5), "float32")
                )
            )
        builder.emit(relax.op.add(x, x))  # a binding outside dataflow keeps the blocks apart
        with builder.dataflow():
            y = builder.emit_output(
                relax.op.call_tir(
                    gvars["matmul"], relax.Tuple([x, wt]), relax.TensorType((4, 5), "float32")
                )
            )
        builder.emit_func_output(y)
    return builder.get()


def test_source_out_of_scope_at_the_call_is_refused():
    mod = _two_blocks()
    assert len(mod["forward"].body.blocks) == 3
    folded, _, refusals = fold(mod, planner())
    assert folded is mod
    assert [why(r) for r in refusals] == [
        "lv is a dataflow variable of another block than the call"
    ]
    x, w = _inputs(mod)
    (y,) = _run(tir_byoc.offload(mod), [x, w])
    np.testing.assert_allclose(y, x @ (2 * w).T, rtol=1e-5, atol=1e-5)


PERMUTED_INPUT = '''
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T


@I.ir_module
class PermutedInput:
    """An activation transposed before a Linear (as nn.TransformerEncoderLayer's input is):
    the copy is proven, but the GEMM reading the activation directly is not a pattern."""

    @T.prim_func(private=True, s_tir=True)
    def swap(A: T.Buffer((3, 2, 6), "float32"), B: T.Buffer((2, 3, 6), "float32")):
        for n, i, k in T.grid(2, 3, 6):
            with T.sblock("T_transpose"):
                vn, vi, vk = T.axis.remap("SSS", [n, i, k])
                B[vn, vi, vk] = A[vi, vn, vk]

    @T.prim_func(private=True, s_tir=True)
    def linear(
        X: T.Buffer((2, 3, 6), "float32"),
        W: T.Buffer((5, 6), "float32"),
        Y: T.Buffer((2, 3, 5), "float32"),
    ):
        for n, i, j, k in T.grid(2, 3, 5, 6):
            with T.sblock("matmul"):
                vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
                with T.init():
                    Y[vn, vi, vj] = T.float32(0)
                Y[vn, vi, vj] = Y[vn, vi, vj] + X[vn, vi, vk] * W[vj, vk]

    @R.function
    def forward(x: R.Tensor((3, 2, 6), "float32"), w: R.Tensor((5, 6), "float32")):
        cls = PermutedInput
        with R.dataflow():
            xt = R.call_tir(cls.swap, (x,), out_ty=R.Tensor((2, 3, 6), "float32"))
            y = R.call_tir(cls.linear, (xt, w), out_ty=R.Tensor((2, 3, 5), "float32"))
            R.output(y)
        return y
'''


@pytest.fixture
def permuted_input(tmp_path):
    path = tmp_path / "permuted_input.py"
    path.write_text(PERMUTED_INPUT)
    return path


def test_explain_and_the_command_line_list_a_copy_kept(permuted_input, capsys):
    (definition,) = tir_byoc.tvmscript.load(permuted_input)
    mod = definition.module
    (refusal,) = tir_byoc.explain(mod)
    assert (refusal.func, refusal.blocks, refusal.what) == ("linear", ("matmul",), WEIGHT_COPY)
    assert refusal.reason.startswith("reads X, a copy that swap makes on every call of forward")
    assert why(refusal).startswith("reading the tensor copied, linear is not matched: operands ")
    assert intrinsics_fired(tir_byoc.offload(mod)["linear"]) == ["ref.dense"]
    # The command line shows it as a row of the explain table, and in --json.
    assert cli.main(["explain", str(permuted_input)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["FUNCTION", "BLOCKS", "NEAREST", "WHY", "NOT"]
    assert row.split()[:2] == ["linear", "matmul"]
    assert "reads X, a copy that swap makes on every call of forward; not folded" in row
    assert cli.main(["explain", str(permuted_input), "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert (record["function"], record["blocks"], record["reason"]) == (
        "linear",
        ["matmul"],
        refusal.reason,
    )
