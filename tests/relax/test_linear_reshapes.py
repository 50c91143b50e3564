"""relax.linear_reshapes: the reshapes around a Linear on an N-D activation fold away, exactly.

Each positive case states ``before`` and ``expected`` Relax and compares them structurally,
checks that the fold computes bitwise the same values on the Relax VM, and that after the
standard lowering the epilogue is fused into the matmul's PrimFunc.  Each negative case is left
as it was, with the reason :func:`tir_byoc.relax.linear_reshapes.find` gives.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

from tir_byoc.decline import RESHAPE_FOLD, Decline
from tir_byoc.relax import linear_reshapes, pipeline
from tir_byoc.relax.linear_reshapes import FoldLinearReshapes, LinearReshape

# fmt: off
# ---------------------------------------------------------------------------------------------
# Folded
# ---------------------------------------------------------------------------------------------


@I.ir_module
class LinearGelu:
    """What torch.export + from_exported_program make of Linear(64, 128) + GELU on (2, 16, 64)."""

    @R.function
    def main(
        x: R.Tensor((2, 16, 64), "float32"),
        w: R.Tensor((128, 64), "float32"),
        b: R.Tensor((128,), "float32"),
    ) -> R.Tensor((2, 16, 128), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([32, 64]))
            wt = R.permute_dims(w, axes=[1, 0])
            m = R.matmul(a, wt, out_dtype="float32")
            e = R.add(b, m)
            y = R.reshape(e, R.shape([2, 16, 128]))
            g = R.nn.gelu(y)
            R.output(g)
        return g


@I.ir_module
class LinearGeluFolded:
    @R.function
    def main(
        x: R.Tensor((2, 16, 64), "float32"),
        w: R.Tensor((128, 64), "float32"),
        b: R.Tensor((128,), "float32"),
    ) -> R.Tensor((2, 16, 128), "float32"):
        with R.dataflow():
            wt = R.permute_dims(w, axes=[1, 0])
            m = R.matmul(x, wt, out_dtype="float32")
            y = R.add(b, m)
            g = R.nn.gelu(y)
            R.output(g)
        return g


@I.ir_module
class Residual:
    """A projection whose bias is (1, N), a relu on the 2-D value, then a residual add."""

    @R.function
    def main(
        x: R.Tensor((2, 8, 32), "float32"),
        w: R.Tensor((32, 32), "float32"),
        b: R.Tensor((1, 32), "float32"),
    ) -> R.Tensor((2, 8, 32), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([16, 32]))
            m = R.matmul(a, w, out_dtype="float32")
            e = R.add(m, b)
            r = R.nn.relu(e)
            y = R.reshape(r, R.shape([2, 8, 32]))
            out = R.add(y, x)
            R.output(out)
        return out


@I.ir_module
class ResidualFolded:
    @R.function
    def main(
        x: R.Tensor((2, 8, 32), "float32"),
        w: R.Tensor((32, 32), "float32"),
        b: R.Tensor((1, 32), "float32"),
    ) -> R.Tensor((2, 8, 32), "float32"):
        with R.dataflow():
            m = R.matmul(x, w, out_dtype="float32")
            e = R.add(m, b)
            y = R.nn.relu(e)
            out = R.add(y, x)
            R.output(out)
        return out


@I.ir_module
class GatedSymbolic:
    """LLaMA's MLP gate on a symbolic batch: silu(x W1) * (x W2), the reshape read twice."""

    @R.function
    def main(
        x: R.Tensor(("n", 16, 64), "float32"),
        w1: R.Tensor((64, 128), "float32"),
        w2: R.Tensor((64, 128), "float32"),
    ) -> R.Tensor(("n", 16, 128), "float32"):
        n = T.int64()
        with R.dataflow():
            a = R.reshape(x, R.shape([n * 16, 64]))
            m1 = R.matmul(a, w1, out_dtype="float32")
            y1 = R.reshape(m1, R.shape([n, 16, 128]))
            s = R.nn.silu(y1)
            m2 = R.matmul(a, w2, out_dtype="float32")
            y2 = R.reshape(m2, R.shape([n, 16, 128]))
            out = R.multiply(s, y2)
            R.output(out)
        return out


@I.ir_module
class GatedSymbolicFolded:
    @R.function
    def main(
        x: R.Tensor(("n", 16, 64), "float32"),
        w1: R.Tensor((64, 128), "float32"),
        w2: R.Tensor((64, 128), "float32"),
    ) -> R.Tensor(("n", 16, 128), "float32"):
        with R.dataflow():
            y1 = R.matmul(x, w1, out_dtype="float32")
            s = R.nn.silu(y1)
            y2 = R.matmul(x, w2, out_dtype="float32")
            out = R.multiply(s, y2)
            R.output(out)
        return out


@I.ir_module
class HeadsMerged:
    """nn.MultiheadAttention's output projection: the input reshape merges the heads' dims."""

    @R.function
    def main(
        x: R.Tensor((8, 2, 4, 16), "float32"),
        w: R.Tensor((64, 64), "float32"),
        b: R.Tensor((64,), "float32"),
    ) -> R.Tensor((8, 2, 64), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([16, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            e = R.add(b, m)
            y = R.reshape(e, R.shape([8, 2, 64]))
            out = R.nn.relu(y)
            R.output(out)
        return out


@I.ir_module
class HeadsMergedFolded:
    @R.function
    def main(
        x: R.Tensor((8, 2, 4, 16), "float32"),
        w: R.Tensor((64, 64), "float32"),
        b: R.Tensor((64,), "float32"),
    ) -> R.Tensor((8, 2, 64), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([8, 2, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.add(b, m)
            out = R.nn.relu(y)
            R.output(out)
        return out


@I.ir_module
class InputReadTwice:
    """The input reshape has another user: it stays for that one."""

    @R.function
    def main(
        x: R.Tensor((2, 4, 8), "float32"), w: R.Tensor((8, 8), "float32")
    ) -> R.Tuple(R.Tensor((2, 4, 8), "float32"), R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([8, 8]))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.reshape(m, R.shape([2, 4, 8]))
            other = R.exp(a)
            R.output(y, other)
        return (y, other)


@I.ir_module
class InputReadTwiceFolded:
    @R.function
    def main(
        x: R.Tensor((2, 4, 8), "float32"), w: R.Tensor((8, 8), "float32")
    ) -> R.Tuple(R.Tensor((2, 4, 8), "float32"), R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([8, 8]))
            y = R.matmul(x, w, out_dtype="float32")
            other = R.exp(a)
            R.output(y, other)
        return (y, other)


@I.ir_module
class DimWrittenDifferently:
    """y's leading dim is n, written as (n * 2) // 2: proven equal, but not the same struct info."""

    @R.function
    def main(
        x: R.Tensor(("n", 16, 64), "float32"), w: R.Tensor((64, 128), "float32")
    ) -> R.Tensor(("n * 2 // 2", 16, 128), "float32"):
        n = T.int64()
        with R.dataflow():
            a = R.reshape(x, R.shape([n * 16, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.reshape(m, R.shape([(n * 2) // 2, 16, 128]))
            R.output(y)
        return y


@I.ir_module
class DimWrittenDifferentlyFolded:
    """The matmul reads x; y stays, as an identity reshape to the shape it declares."""

    @R.function
    def main(
        x: R.Tensor(("n", 16, 64), "float32"), w: R.Tensor((64, 128), "float32")
    ) -> R.Tensor(("n * 2 // 2", 16, 128), "float32"):
        n = T.int64()
        with R.dataflow():
            m = R.matmul(x, w, out_dtype="float32")
            y = R.reshape(m, R.shape([(n * 2) // 2, 16, 128]))
            R.output(y)
        return y


# ---------------------------------------------------------------------------------------------
# Left alone
# ---------------------------------------------------------------------------------------------


@I.ir_module
class DimDefinedLater:
    """Case two of condition 5 would put a reshape using c before c's match_cast."""

    @R.function
    def main(
        x: R.Tensor((16, 2, 4, 16), "float32"),
        w: R.Tensor((64, 64), "float32"),
        z: R.Tensor("float32", ndim=1),
    ) -> R.Tensor("float32", ndim=3):
        c = T.int64()
        with R.dataflow():
            a = R.reshape(x, R.shape([32, 64]))
            _ = R.match_cast(z, R.Tensor((c,), "float32"))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.reshape(m, R.shape([16 + c - c, 2, 64]))
            R.output(y)
        return y


@I.ir_module
class LastDimChanged:
    @R.function
    def main(
        x: R.Tensor((2, 16, 64), "float32"), w: R.Tensor((64, 128), "float32")
    ) -> R.Tensor((2, 16, 4, 32), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([32, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.reshape(m, R.shape([2, 16, 4, 32]))
            R.output(y)
        return y


def linear_with_bias(bias_shape, add):
    """Linear(64, 128) on (2, 16, 64) as reshapes around a matmul, then ``add(m, b)`` with a
    bias of ``bias_shape``: one that is not a broadcast along the last dim keeps the reshapes."""

    @I.ir_module
    class Module:
        @R.function
        def main(
            x: R.Tensor((2, 16, 64), "float32"),
            w: R.Tensor((64, 128), "float32"),
            b: R.Tensor(bias_shape, "float32"),
        ) -> R.Tensor((2, 16, 128), "float32"):
            with R.dataflow():
                a = R.reshape(x, R.shape([32, 64]))
                m = R.matmul(a, w, out_dtype="float32")
                e = add(m, b)
                y = R.reshape(e, R.shape([2, 16, 128]))
                R.output(y)
            return y

    return Module


FullBias = linear_with_bias((32, 128), lambda m, b: R.add(m, b))
ColumnBias = linear_with_bias((32, 1), lambda m, b: R.add(b, m))


@I.ir_module
class ProductReadTwice:
    @R.function
    def main(
        x: R.Tensor((2, 16, 64), "float32"), w: R.Tensor((64, 128), "float32")
    ) -> R.Tuple(R.Tensor((2, 16, 128), "float32"), R.Tensor((32, 128), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([32, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.reshape(m, R.shape([2, 16, 128]))
            z = R.nn.relu(m)
            R.output(y, z)
        return (y, z)


@I.ir_module
class InputNotAReshape:
    @R.function
    def main(
        x: R.Tensor((32, 64), "float32"), w: R.Tensor((64, 128), "float32")
    ) -> R.Tensor((2, 16, 128), "float32"):
        with R.dataflow():
            m = R.matmul(x, w, out_dtype="float32")
            y = R.reshape(m, R.shape([2, 16, 128]))
            R.output(y)
        return y


@I.ir_module
class InputReshapedElsewhereAndShared:
    @R.function
    def main(
        x: R.Tensor((16, 2, 4, 16), "float32"), w: R.Tensor((64, 64), "float32")
    ) -> R.Tuple(R.Tensor((16, 2, 64), "float32"), R.Tensor((32, 64), "float32")):
        with R.dataflow():
            a = R.reshape(x, R.shape([32, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            y = R.reshape(m, R.shape([16, 2, 64]))
            other = R.exp(a)
            R.output(y, other)
        return (y, other)


@I.ir_module
class Batched:
    @R.function
    def main(
        q: R.Tensor((2, 4, 16, 16), "float32"), k: R.Tensor((2, 4, 16, 16), "float32")
    ) -> R.Tensor((2, 4, 16, 16), "float32"):
        with R.dataflow():
            a = R.reshape(q, R.shape([8, 16, 16]))
            b = R.reshape(k, R.shape([8, 16, 16]))
            m = R.matmul(a, b, out_dtype="float32")
            y = R.reshape(m, R.shape([2, 4, 16, 16]))
            R.output(y)
        return y


@I.ir_module
class SoftmaxBetween:
    @R.function
    def main(
        x: R.Tensor((2, 16, 64), "float32"), w: R.Tensor((64, 128), "float32")
    ) -> R.Tensor((2, 16, 128), "float32"):
        with R.dataflow():
            a = R.reshape(x, R.shape([32, 64]))
            m = R.matmul(a, w, out_dtype="float32")
            s = R.nn.softmax(m, axis=-1)
            y = R.reshape(s, R.shape([2, 16, 128]))
            R.output(y)
        return y
# fmt: on


FOLDED = {
    "linear_gelu": (LinearGelu, LinearGeluFolded, {"x": (2, 16, 64), "w": (128, 64), "b": (128,)}),
    "residual": (Residual, ResidualFolded, {"x": (2, 8, 32), "w": (32, 32), "b": (1, 32)}),
    "gated_symbolic": (
        GatedSymbolic,
        GatedSymbolicFolded,
        {"x": (3, 16, 64), "w1": (64, 128), "w2": (64, 128)},
    ),
    "heads_merged": (
        HeadsMerged,
        HeadsMergedFolded,
        {"x": (8, 2, 4, 16), "w": (64, 64), "b": (64,)},
    ),
    "input_read_twice": (InputReadTwice, InputReadTwiceFolded, {"x": (2, 4, 8), "w": (8, 8)}),
    "dim_written_differently": (
        DimWrittenDifferently,
        DimWrittenDifferentlyFolded,
        {"x": (3, 16, 64), "w": (64, 128)},
    ),
}

#: name -> (module, the reason its reshape stays, or None if it is no candidate at all)
LEFT_ALONE = {
    "last_dim_changed": (LastDimChanged, "does not keep the last dim N = 128"),
    "full_bias": (FullBias, "b of (32, 128): expected a broadcast along the last dim only"),
    "column_bias": (ColumnBias, "b of (32, 1): expected a broadcast along the last dim only"),
    "product_read_twice": (ProductReadTwice, "m is used 2 times"),
    "input_not_a_reshape": (InputNotAReshape, "the matmul's input x is not a reshape"),
    "input_reshaped_elsewhere_and_shared": (
        InputReshapedElsewhereAndShared,
        "a reshapes x of (16, 2, 4, 16), not (16, 2, 64), and has other users",
    ),
    "batched": (Batched, "m is a batched matmul (input of 3 dims, weight of 3)"),
    "dim_defined_later": (DimDefinedLater, "would need c, not defined by the function's param"),
    "softmax_between": (SoftmaxBetween, None),
}


def _inputs(shapes: dict) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype("float32") for shape in shapes.values()]


def _run(mod: tvm.IRModule, inputs) -> list[np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    outputs = list(result) if isinstance(result, tvm.ir.Array | tuple | list) else [result]
    return [o.numpy() for o in outputs]


#: The lowering without the fold.
UNFOLDED = tuple(p for p in pipeline.lowering_passes() if p is not FoldLinearReshapes)


def _lowered_functions(mod: tvm.IRModule) -> set[str]:
    lowered = tvm.transform.Sequential([make_pass() for make_pass in UNFOLDED])(mod)
    return {g.name_hint for g, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}


@pytest.mark.parametrize("name", list(FOLDED))
def test_a_fold_gives_the_expected_relax(name):
    before, expected, _ = FOLDED[name]
    after = FoldLinearReshapes()(before)
    sites, declines = linear_reshapes.find(before)
    assert sites and declines == ()
    tvm.ir.assert_structural_equal(after, linear_reshapes.rewrite(before, sites))
    relax.analysis.well_formed(after)
    tvm.ir.assert_structural_equal(after, expected)


@pytest.mark.parametrize("name", ["linear_gelu", "gated_symbolic", "heads_merged"])
def test_a_fold_computes_bitwise_the_same_values(name):
    before, _, shapes = FOLDED[name]
    inputs = _inputs(shapes)
    for got, want in zip(_run(FoldLinearReshapes()(before), inputs), _run(before, inputs)):
        np.testing.assert_array_equal(got, want)


#: name -> the PrimFuncs of the standard lowering, before and after the fold.
FUSED = {
    "linear_gelu": (
        {"reshape", "transpose", "fused_matmul_add", "fused_reshape1_gelu"},
        {"transpose", "fused_matmul_add_gelu"},
    ),
    "residual": (
        {"reshape", "fused_matmul_add_relu", "fused_reshape1_add1"},
        {"fused_matmul_add_relu_add1"},
    ),
    # Symbolic reshapes are injective, as static ones (relax.symbolic_indices): the reshape back
    # fuses with the gate, as linear_gelu's does.
    "gated_symbolic": (
        {"reshape", "matmul", "fused_reshape1_silu_reshape1_multiply"},
        {"matmul", "fused_matmul_silu_multiply"},
    ),
    # The reshape merging the heads' dims stays (as one to (8, 2, 64)); the relu joins the GEMM.
    "heads_merged": (
        {"reshape", "fused_matmul_add", "fused_reshape1_relu"},
        {"reshape", "fused_matmul_add_relu"},
    ),
}


@pytest.mark.parametrize("name", list(FUSED))
def test_the_epilogue_fuses_with_the_matmul_once_folded(name):
    before, _, _ = FOLDED[name]
    expected_before, expected_after = FUSED[name]
    assert _lowered_functions(before) == expected_before
    assert _lowered_functions(FoldLinearReshapes()(before)) == expected_after


def test_the_records_name_the_chain():
    (fold,), _ = linear_reshapes.find(LinearGelu)
    assert isinstance(fold, LinearReshape)
    assert fold.operations == ("relax.add",)
    assert fold.reads_activation
    assert [v.name for v in fold.chain] == ["m", "e"]
    assert str(fold) == "main: y = reshape(add(matmul(a, wt))): folded (reads x)"
    (merged,), _ = linear_reshapes.find(HeadsMerged)
    assert not merged.reads_activation


@pytest.mark.parametrize("name", list(LEFT_ALONE))
def test_what_is_not_provably_exact_is_left_alone(name):
    mod, reason = LEFT_ALONE[name]
    assert FoldLinearReshapes()(mod).same_as(mod)
    sites, declines = linear_reshapes.find(mod)
    assert sites == ()
    if reason is None:
        assert declines == ()
        return
    (refusal,) = declines
    assert isinstance(refusal, Decline) and refusal.what == RESHAPE_FOLD
    assert not refusal
    assert reason in refusal.reason


def test_the_pass_is_idempotent_and_leaves_lowered_modules_alone():
    once = FoldLinearReshapes()(LinearGelu)
    assert FoldLinearReshapes()(once).same_as(once)
    lowered = tvm.transform.Sequential([make_pass() for make_pass in UNFOLDED])(LinearGelu)
    assert FoldLinearReshapes()(lowered).same_as(lowered)
    passes = pipeline.lowering_passes()
    assert passes.index(FoldLinearReshapes) < passes.index(relax.transform.LegalizeOps)
