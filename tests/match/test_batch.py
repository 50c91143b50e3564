"""Batch forms: N-D activations over a 2-D weight, batched matmuls, broadcast batch dims.

Each positive case is matched with the expected name, batch counts and strides, and gives the
same results offloaded to every bundled backend as TVM's own code; each near miss is refused
with its own reason.  The functions are built with TE, the way Relax's legalization builds
them.
"""

import pytest
from support.byoc_testing import assert_equivalent, only_match, reasons
from tvm import te, tirx
from tvm.script import tirx as T

import tir_byoc
from tir_byoc.match.exprs import expr_text
from tir_byoc.registry import Intrinsic, Registry
from tir_byoc.toolchain import intrinsics_dir

BACKENDS = ("ref", "openblas", "mkl", "onednn")


def product(x_shape, w_shape, out_batch, x_at, w_at, layout="matmul", ops=()):
    """``Y[*out_batch, M, N] = sum_k X[x_at(b), i, k] * W[w_at(b), k, j]`` (or ``[.., j, k]``),
    then the epilogue ``ops`` ("bias", "relu") as blocks of their own."""
    x = te.placeholder(x_shape, "float32", name="X")
    w = te.placeholder(w_shape, "float32", name="W")
    m, k_extent = x_shape[-2:]
    n = w_shape[-1] if layout == "matmul" else w_shape[-2]
    k = te.reduce_axis((0, k_extent), name="k")

    def body(*index):
        *b, i, j = index
        w_index = (k, j) if layout == "matmul" else (j, k)
        return te.sum(x[(*x_at(b), i, k)] * w[(*w_at(b), *w_index)], axis=k)

    y = te.compute((*out_batch, m, n), body, name="matmul")
    args = [x, w]
    if "bias" in ops:
        bias = te.placeholder((n,), "float32", name="bias")
        args.append(bias)
        y = te.compute(y.shape, lambda *i: y[i] + bias[i[-1]], name="T_add")
    if "relu" in ops:
        y = te.compute(y.shape, lambda *i: te.max(y[i], tirx.const(0, "float32")), name="relu")
    return te.create_prim_func([*args, y])


def texts(exprs):
    return tuple(expr_text(e) for e in exprs)


# Q . K^T of a 4-D attention: both operands carry (batch, heads), which merge into one dim.
attention_scores = product(
    (2, 3, 4, 5), (2, 3, 6, 5), (2, 3), lambda b: b, lambda b: b, layout="dense"
)
# The weight's first batch dim is 1 and read at 0 (Relax's broadcast), its second is real.
broadcast_weight = product((2, 3, 4, 5), (1, 3, 5, 6), (2, 3), lambda b: b, lambda b: (0, b[1]))
# The weight has no batch dim, and X's batch dims are read in swapped order: not foldable
# into M, so a batched call with a broadcast weight (stride 0) and X's own strides.
swapped_input = product((3, 2, 4, 5), (5, 6), (2, 3), lambda b: (b[1], b[0]), lambda b: ())
# The input has no batch dim: broadcast X against a batch of weights.
broadcast_input = product((4, 5), (3, 5, 6), (3,), lambda b: (), lambda b: b)
# An N-D Linear with bias and relu: folded into a 2-D call with 2 x 3 x 4 rows.
nd_linear = product(
    (2, 3, 4, 5), (6, 5), (2, 3), lambda b: b, lambda b: (), layout="dense", ops=("bias", "relu")
)
# A batch dim of 1 everywhere: the 2-D product with a leading 1.
unit_batch = product((1, 4, 5), (5, 6), (1,), lambda b: b, lambda b: ())

POSITIVES = {
    "attention_scores": (attention_scores, "bmm_dense", "bmm_dense", ("6",), ("20",), ("30",)),
    "broadcast_weight": (
        broadcast_weight,
        "bmm_matmul",
        "bmm_matmul",
        ("2", "3"),
        ("60", "20"),
        ("0", "30"),
    ),
    "swapped_input": (
        swapped_input,
        "bmm_matmul",
        "bmm_matmul",
        ("2", "3"),
        ("20", "40"),
        ("0", "0"),
    ),
    "broadcast_input": (broadcast_input, "bmm_matmul", "bmm_matmul", ("3",), ("0",), ("30",)),
    "nd_linear": (nd_linear, "batch_dense_bias_relu", "dense_bias_relu", ("6",), ("20",), ("0",)),
    "unit_batch": (unit_batch, "batch_matmul", "matmul", ("1",), ("20",), ("0",)),
}


@pytest.mark.parametrize("case", list(POSITIVES))
def test_batch_forms_are_matched_with_their_counts_and_strides(case):
    func, name, _, counts, x_strides, w_strides = POSITIVES[case]
    match = only_match(func)
    assert match.pattern == name
    assert texts(match.batch.counts) == counts
    assert texts(match.batch.x_strides) == x_strides
    assert texts(match.batch.w_strides) == w_strides


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(POSITIVES))
def test_batch_forms_compute_what_tvm_computes_on_every_backend(case, backend):
    func, _, called, *_ = POSITIVES[case]
    assert_equivalent(func, expect_calls={f"{backend}.{called}": 1}, backends=[backend])


def test_symbolic_batch_dims_merge_when_the_analyzer_proves_the_strides_agree():
    b, h, m, n, k = (tirx.Var(v, "int64") for v in ("B", "H", "M", "N", "K"))
    func = product((b, h, m, k), (b, h, k, n), (b, h), lambda i: i, lambda i: i)
    match = only_match(func)
    assert match.pattern == "bmm_matmul" and len(match.batch.counts) == 1
    sizes = {"B": 2, "H": 3, "M": 4, "N": 3, "K": 5}
    for backend in BACKENDS:
        assert_equivalent(
            func, sizes, expect_calls={f"{backend}.bmm_matmul": 1}, backends=[backend]
        )


# --------------------------------------------------------------------------------------
# Near misses, each refused with its own reason.
# --------------------------------------------------------------------------------------

REFUSALS = {
    "the input covers more batches than the output": (
        product((3, 4, 5), (2, 5, 6), (2,), lambda b: b, lambda b: b),
        "batch iterator v_i0 runs over 2 of 3 (axis 0 of input X): a partial batch range",
    ),
    "the weight's first slice only, where it has two": (
        product((2, 4, 5), (2, 5, 6), (2,), lambda b: b, lambda b: (0,)),
        "weight W is read only at 0 on axis 0 of extent 2: a partial batch range, not a broadcast",
    ),
    "a batch dim neither operand reads": (
        product((4, 5), (5, 6), (3,), lambda b: (), lambda b: ()),
        "batch iterator v_i0 of the output indexes neither operand: every batch would hold the "
        "same product",
    ),
    "three batch dims that do not merge": (
        product((2, 2, 4, 5), (3, 5, 6), (2, 3, 2), lambda b: (b[0], b[2]), lambda b: (b[1],)),
        "the batch dims 2x3x2 index the operands in 3 different ways; the batched call takes "
        "at most two",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_batch_near_misses_are_refused_with_their_own_reason(case):
    func, reason = REFUSALS[case]
    assert tir_byoc.scan(func) == []
    assert reasons(func) == [reason]


@T.prim_func(s_tir=True)
def batch_on_the_row_axis(
    X: T.Buffer((4, 2, 5), "float32"),
    W: T.Buffer((5, 6), "float32"),
    Y: T.Buffer((2, 4, 6), "float32"),
):
    for b, i, j, k in T.grid(2, 4, 6, 5):
        with T.sblock("matmul"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, k])
            with T.init():
                Y[vb, vi, vj] = T.float32(0)
            Y[vb, vi, vj] = Y[vb, vi, vj] + X[vi, vb, vk] * W[vk, vj]


@T.prim_func(s_tir=True)
def strided_input(
    X: T.Buffer((2, 4, 5), "float32", strides=(40, 5, 1)),
    W: T.Buffer((5, 6), "float32"),
    Y: T.Buffer((2, 4, 6), "float32"),
):
    for b, i, j, k in T.grid(2, 4, 6, 5):
        with T.sblock("matmul"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, k])
            with T.init():
                Y[vb, vi, vj] = T.float32(0)
            Y[vb, vi, vj] = Y[vb, vi, vj] + X[vb, vi, vk] * W[vk, vj]


def test_a_batch_iterator_on_the_row_axis_is_refused():
    assert tir_byoc.scan(batch_on_the_row_axis) == []
    assert reasons(batch_on_the_row_axis) == [
        "operands X[vi, vb, vk], W[vk, vj] do not read X[..., i, k] and W[..., j, k] or "
        "W[..., k, j] (i = vi, j = vj, k = vk)"
    ]


def test_a_non_compact_batched_input_is_refused():
    assert tir_byoc.scan(strided_input) == []
    assert reasons(strided_input) == ["buffer X has non-compact strides [40, 5, 1]"]


# --------------------------------------------------------------------------------------
# A user's 2-D intrinsic serves the N-D Linear (a 2-D call), never a batched call.
# --------------------------------------------------------------------------------------


def test_a_2d_intrinsic_serves_the_leading_form_and_is_never_given_a_batched_call():
    registry = Registry()
    registry.register(
        Intrinsic(
            "user.dense_bias_relu",
            "dense_bias_relu",
            "tir_byoc_ref_dense_bias_relu",
            "float32",
            intrinsics_dir() / "ref" / "gemm.c",
        )
    )
    assert_equivalent(nd_linear, expect_calls={"user.dense_bias_relu": 1}, registry=registry)
    batched = product(
        (2, 4, 5), (2, 6, 5), (2,), lambda b: b, lambda b: b, layout="dense", ops=("bias", "relu")
    )
    (match,) = tir_byoc.scan(batched, registry=registry)
    assert match.pattern == "bmm_dense_bias_relu" and match.intrinsic is None
    assert match.reason == "no intrinsic registered for bmm_dense_bias_relu"


def test_a_residual_add_after_an_nd_linear_joins_the_chain():
    x = te.placeholder((2, 4, 5), "float32", name="X")
    w = te.placeholder((6, 5), "float32", name="W")
    residual = te.placeholder((2, 4, 6), "float32", name="R")
    k = te.reduce_axis((0, 5), name="k")
    y = te.compute((2, 4, 6), lambda b, i, j: te.sum(x[b, i, k] * w[j, k], axis=k), name="dense")
    z = te.compute(y.shape, lambda *i: y[i] + residual[i], name="T_add")
    func = te.create_prim_func([x, w, residual, z])
    match = only_match(func)
    assert match.pattern == "batch_dense_add" and [t.name for t in match.tensors] == ["R"]
    assert reasons(func) == []
    assert_equivalent(func, expect_calls={"ref.gemm": 1}, backends="ref")
    assert_equivalent(func, expect_calls={"mkl.gemm": 1}, backends="mkl")
    assert_equivalent(func, expect_calls={"onednn.gemm": 1}, backends="onednn")
