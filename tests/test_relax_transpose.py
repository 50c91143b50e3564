"""relax_transpose: a matmul on a transposed weight served by the dense intrinsic."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from backend_checks import intrinsics_fired
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import tir_byoc
from tir_byoc.demo import lowered_mlp, mlp_reference, mlp_weights
from tir_byoc.relax_transpose import (
    fold_weight_transposes,
    read_weight_untransposed,
    transpose_refusal,
)

# --------------------------------------------------------------------------------------
# Which PrimFuncs are full 2-D transposes
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
def transpose_scaled(A: T.Buffer((5, 6), "float32"), B: T.Buffer((6, 5), "float32")):
    for i, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vj, vi] * T.float32(2)


def test_relax_transpose_is_recognised():
    assert transpose_refusal(transpose) is None
    assert transpose_refusal(lowered_mlp()["transpose"]) is None


@T.prim_func(s_tir=True)
def transpose_with_compact_strides(
    A: T.Buffer((5, 6), "float32", strides=(6, 1)), B: T.Buffer((6, 5), "float32", strides=(5, 1))
):
    for i, j in T.grid(6, 5):
        with T.sblock("T_transpose"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vj, vi]


def test_the_fold_reads_a_transpose_as_the_matcher_reads_buffers():
    # Explicit compact strides are compact to the matcher; the fold agrees (it used to refuse).
    assert transpose_refusal(transpose_with_compact_strides) is None


@pytest.mark.parametrize(
    ("func", "reason"),
    [
        (copy_square, "block copy does not store A[j, i] unchanged"),
        (transpose_half, "iterator vi does not cover the whole axis of B"),
        (transpose_cast, "converts float32 to float16"),
        (transpose_scaled, "block T_transpose does not store A[j, i] unchanged"),
    ],
)
def test_anything_else_is_refused_with_reason(func, reason):
    assert transpose_refusal(func) == reason


# --------------------------------------------------------------------------------------
# Reading the weight untransposed
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def matmul_bias_before(
    X: T.Buffer((4, 6), "float32"),
    W: T.Buffer((6, 5), "float32"),
    b: T.Buffer((5,), "float32"),
    Y: T.Buffer((4, 5), "float32"),
):
    acc = T.sblock_alloc_buffer((4, 5))
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            T.reads(X[vi, vk], W[vk, vj])
            T.writes(acc[vi, vj])
            with T.init():
                acc[vi, vj] = T.float32(0)
            acc[vi, vj] = acc[vi, vj] + X[vi, vk] * W[vk, vj]
    for i, j in T.grid(4, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = acc[vi, vj] + b[vj]


@T.prim_func(s_tir=True)
def matmul_bias_expected(
    X: T.Buffer((4, 6), "float32"),
    W: T.Buffer((5, 6), "float32"),
    b: T.Buffer((5,), "float32"),
    Y: T.Buffer((4, 5), "float32"),
):
    acc = T.sblock_alloc_buffer((4, 5))
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("matmul"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            T.reads(X[vi, vk], W[vj, vk])
            T.writes(acc[vi, vj])
            with T.init():
                acc[vi, vj] = T.float32(0)
            acc[vi, vj] = acc[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = acc[vi, vj] + b[vj]


@T.prim_func(s_tir=True)
def matmul_writes_weight(X: T.Buffer((4, 6), "float32"), W: T.Buffer((6, 5), "float32")):
    for i, j in T.grid(6, 5):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            W[vi, vj] = W[vi, vj] * T.float32(2)


def test_callee_reads_the_weight_untransposed():
    after = read_weight_untransposed(matmul_bias_before, 1)
    renamed = after.with_attr("global_symbol", "matmul_bias_expected")
    tvm.ir.assert_structural_equal(renamed, matmul_bias_expected)
    (match,) = tir_byoc.scan(after)
    assert (match.pattern, match.w.name) == ("dense_bias", "W")


def test_callee_that_writes_the_weight_is_refused():
    with pytest.raises(ValueError, match="writes or takes the address of W, not only reads it"):
        read_weight_untransposed(matmul_writes_weight, 1)


# --------------------------------------------------------------------------------------
# The whole fold, on the demo MLP and on small Relax modules
# --------------------------------------------------------------------------------------


def _transpose_calls(mod) -> int:
    text = mod["forward"].script()
    return text.count("R.call_tir(transpose")


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
    assert _transpose_calls(before) == 2
    assert intrinsics_fired(before["fused_matmul_add_relu"]) == ["onednn.matmul_bias_relu"]
    # After: dense intrinsics on the original weights, the transposes gone.
    after = tir_byoc.offload(mod)
    assert _transpose_calls(after) == 0
    assert intrinsics_fired(after["fused_matmul_add_relu"]) == ["onednn.dense_bias_relu"]
    assert intrinsics_fired(after["fused_matmul1_add1"]) == ["onednn.dense_bias"]
    assert [m.pattern for m in tir_byoc.scan(mod)] == ["dense_bias", "dense_bias_relu"]
    for offloaded in (before, after):
        result, expected = _run_mlp(offloaded)
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_report_names_the_folds():
    def served(name, func, weight):
        return any(m.intrinsic and m.w.same_as(weight) for m in tir_byoc.scan(func))

    _, report = fold_weight_transposes(lowered_mlp(), served)
    assert report.folded == (("fused_matmul1_add1", 1), ("fused_matmul_add_relu", 1))
    assert report.dropped == 2
    assert report.refusals == ()


def test_nothing_changes_when_no_intrinsic_would_serve():
    mod = lowered_mlp()
    folded, report = fold_weight_transposes(mod, lambda *_: False)
    assert folded is mod
    assert [str(r) for r in report.refusals] == [
        "forward: transpose1 -> fused_matmul1_add1 kept the transpose: no intrinsic serves "
        "fused_matmul1_add1 with weight permute_dims1 untransposed",
        "forward: transpose -> fused_matmul_add_relu kept the transpose: no intrinsic serves "
        "fused_matmul_add_relu with weight permute_dims untransposed",
    ]


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


def _run(mod, *arrays):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return [t.numpy() for t in vm["forward"](*[tvm.runtime.tensor(a) for a in arrays])]


def test_transpose_used_elsewhere_is_kept_and_the_matmul_still_folds():
    after = tir_byoc.offload(TransposeAlsoReturned)
    assert _transpose_calls(after) == 1
    assert intrinsics_fired(after["matmul"]) == ["onednn.dense"]
    rng = np.random.default_rng(0)
    x, w = (
        rng.standard_normal((4, 6)).astype("float32"),
        rng.standard_normal((5, 6)).astype("float32"),
    )
    y, wt = _run(after, x, w)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(wt, w.T)


def test_callee_also_called_untransposed_is_left_alone():
    def served(name, func, weight):
        return True

    folded, report = fold_weight_transposes(AlsoCalledUntransposed, served)
    assert folded is AlsoCalledUntransposed
    (refusal,) = report.refusals
    assert refusal.reason == "matmul is also called with an untransposed argument 1"
    after = tir_byoc.offload(AlsoCalledUntransposed)
    assert intrinsics_fired(after["matmul"]) == ["onednn.matmul"]
    rng = np.random.default_rng(0)
    x, w, v = (rng.standard_normal(s).astype("float32") for s in ((4, 6), (5, 6), (6, 5)))
    y, z = _run(after, x, w, v)
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
    folded, report = fold_weight_transposes(mod, lambda *_: True)
    assert folded is mod
    assert [r.reason for r in report.refusals] == [
        "lv is a dataflow variable of another block than the call"
    ]
    rng = np.random.default_rng(0)
    x, w = (rng.standard_normal(s).astype("float32") for s in ((4, 6), (5, 6)))
    vm = relax.VirtualMachine(tvm.compile(tir_byoc.offload(mod), target="llvm"), tvm.cpu())
    y = vm["forward"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(y, x @ (2 * w).T, rtol=1e-5, atol=1e-5)
