"""relax.fuse_rows: an elementwise producer is fused into the row reduction that alone reads it.

Each merged case checks the PrimFuncs the standard lowering leaves, that the default schedule
takes the merged function with its row rule, and that the built model computes what the build
without the merge computes, to the last bit or one rounding (LLVM may fuse a multiply into the
add after it once both are in one loop).  Each refused case keeps its two PrimFuncs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from support.byoc_testing import relax_inputs
from support.ms_workers import one_worker_builder
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import tir_byoc
from tir_byoc.meta_schedule import load_report
from tir_byoc.relax import fuse_rows, pipeline
from tir_byoc.relax.fuse_rows import FuseIntoRows

# fmt: off


@I.ir_module
class RmsNorm:
    """LLaMA's RMS norm as torch.export + from_exported_program write it."""

    @R.function
    def main(x: R.Tensor((4, 16, 64), "float32"), w: R.Tensor((64,), "float32")):
        with R.dataflow():
            s = R.power(x, R.const(2.0, "float32"))
            v = R.mean(s, axis=[-1], keepdims=True)
            e = R.add(v, R.const(1e-6, "float32"))
            r = R.rsqrt(e)
            n = R.multiply(x, r)
            y = R.multiply(w, n)
            R.output(y)
        return y


@I.ir_module
class ScaledMaskedSoftmax:
    """Attention scores: the batched product's output reshaped, scaled, masked, softmaxed."""

    @R.function
    def main(a: R.Tensor((8, 16, 32), "float32"), mask: R.Tensor((2, 1, 16, 32), "float32")):
        with R.dataflow():
            r = R.reshape(a, R.shape([2, 4, 16, 32]))
            s = R.multiply(r, R.const(0.125, "float32"))
            m = R.add(s, mask)
            y = R.nn.softmax(m, axis=-1)
            R.output(y)
        return y


@I.ir_module
class ResidualLayerNorm:
    """BERT's post-norm: the residual sum feeds only the layer norm."""

    @R.function
    def main(
        x: R.Tensor((32, 64), "float32"),
        h: R.Tensor((32, 64), "float32"),
        g: R.Tensor((64,), "float32"),
        b: R.Tensor((64,), "float32"),
    ):
        with R.dataflow():
            s = R.add(x, h)
            y = R.nn.layer_norm(s, g, b, axes=[-1])
            R.output(y)
        return y


@I.ir_module
class SumUsedTwice:
    """The residual sum is also the block's output: it must be written out, no merge."""

    @R.function
    def main(x: R.Tensor((32, 64), "float32"), h: R.Tensor((32, 64), "float32"),
             g: R.Tensor((64,), "float32"), b: R.Tensor((64,), "float32")):
        with R.dataflow():
            s = R.add(x, h)
            y = R.nn.layer_norm(s, g, b, axes=[-1])
            out = (y, s)
            R.output(out)
        return out


@I.ir_module
class ReluIntoMatmul:
    """A GEMM reduces too, but it is the offload's: its producer stays apart."""

    @R.function
    def main(x: R.Tensor((32, 64), "float32"), w: R.Tensor((64, 48), "float32")):
        with R.dataflow():
            a = R.nn.relu(x)
            y = R.matmul(a, w)
            R.output(y)
        return y


@I.ir_module
class RowMeans:
    """The reduction's output is one value per row, not the producer's shape: no merge (the
    row rules take a reduction followed by a spatial block over the rows)."""

    @R.function
    def main(x: R.Tensor((32, 64), "float32"), h: R.Tensor((32, 64), "float32")):
        with R.dataflow():
            s = R.add(x, h)
            y = R.mean(s, axis=[-1], keepdims=True)
            R.output(y)
        return y


# fmt: on

PASSES = pipeline.lowering_passes()
WITHOUT_MERGE = tuple(p for p in PASSES if p is not FuseIntoRows)


def _prim_funcs(mod: tvm.IRModule, passes=PASSES) -> list[str]:
    lowered = tvm.transform.Sequential([p() for p in passes])(mod)
    return sorted(g.name_hint for g, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc))


def _flat(result) -> list[np.ndarray]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


@pytest.mark.parametrize(
    ("module", "merged"),
    [
        (RmsNorm, "fused_power_mean_add_tir_rsqrt_multiply_multiply1"),
        (ScaledMaskedSoftmax, "fused_reshape_multiply_add_softmax"),
        (ResidualLayerNorm, "fused_add_layer_norm"),
    ],
    ids=["rms norm", "scaled masked softmax", "residual layer norm"],
)
def test_a_producer_fuses_into_its_row_reduction_and_computes_the_same(module, merged, monkeypatch):
    assert _prim_funcs(module) == [merged]
    assert len(_prim_funcs(module, WITHOUT_MERGE)) == 2

    built = tir_byoc.build_model(module)
    assert dict(built.schedules)[merged] == "dlight"
    assert built.rules[merged] == "VectorRows"
    inputs = relax_inputs(module)
    got = _flat(built(*inputs))
    monkeypatch.setattr(
        pipeline, "LOWERING", tuple(p for p in pipeline.LOWERING if p is not FuseIntoRows)
    )
    apart = tir_byoc.build_model(module)
    assert merged not in apart.schedules
    for a, b in zip(got, _flat(apart(*inputs))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "module",
    [SumUsedTwice, ReluIntoMatmul, RowMeans],
    ids=["producer used twice", "gemm consumer", "output of another shape"],
)
def test_a_producer_that_does_not_qualify_stays_apart(module):
    assert _prim_funcs(module) == _prim_funcs(module, WITHOUT_MERGE)


def test_a_module_without_a_merge_comes_back_as_it_was():
    passes = [p() for p in PASSES[: PASSES.index(FuseIntoRows)]]
    grouped = tvm.transform.Sequential(passes)(ReluIntoMatmul)
    assert fuse_rows.find(grouped) == ((), ())
    assert FuseIntoRows()(grouped).same_as(grouped)
    grouped = tvm.transform.Sequential(passes)(RmsNorm)
    (site,), declines = fuse_rows.find(grouped)
    assert (len(site.producers), declines) == (1, ())  # the power, into the mean and rsqrt
    merged = FuseIntoRows()(grouped)
    tvm.ir.assert_structural_equal(merged, fuse_rows.rewrite(grouped, (site,)))
    relax.analysis.well_formed(merged)  # raises on an ill-formed module
    assert len([f for _, f in merged.functions_items() if isinstance(f, relax.Function)]) == 2


def test_tuning_a_merged_function_metaschedule_cannot_space_leaves_it_to_the_rules(tmp_path):
    # TVM 0.27's MetaSchedule raises in its design-space generation on the merged softmax
    # (reverse-compute-at), which ended the whole tuning run. Its task is dropped now: the
    # function is reported as not tuned, with why, and the default rules schedule it.
    merged = "fused_reshape_multiply_add_softmax"
    built = tir_byoc.build_model(
        ScaledMaskedSoftmax,
        tune_trials=8,
        work_dir=tmp_path,
        tune_options={"builder": one_worker_builder()},
    )
    assert built.rules[merged] == "VectorRows"
    (report,) = [f for f in load_report(tmp_path).functions if f.name == merged]
    assert report.choice == "unchanged" and report.trials == 0
    assert report.note == (
        "not tuned: MetaSchedule's design space raised: ScheduleError: An error occurred in "
        "the schedule primitive 'reverse-compute-at'."
    )
    a, mask = relax_inputs(ScaledMaskedSoftmax)
    z = a.reshape(2, 4, 16, 32) * np.float32(0.125) + mask
    e = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(built(a, mask), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_producers_of_a_symbolic_shape_merge_and_the_rows_stay_vectorised():
    @I.ir_module
    class Symbolic:
        @R.function
        def main(x: R.Tensor(("b", 16, 32), "float32"), y: R.Tensor(("b", 16, 32), "float32")):
            with R.dataflow():
                s = R.multiply(x, R.const(0.5, "float32"))
                t = R.add(s, y)
                z = R.nn.softmax(t, axis=-1)
                R.output(z)
            return z

    assert not [d for d in tir_byoc.explain(Symbolic) if d.what == "row fusion"]
    built = tir_byoc.build_model(Symbolic)
    # The scale and the mask run in the softmax's rows: one function, scheduled by rows.
    assert list(built.rules.values()) == ["VectorRows"]
    rng = np.random.default_rng(0)
    for b in (1, 3):
        a, m = (rng.standard_normal((b, 16, 32)).astype("float32") for _ in range(2))
        z = a * np.float32(0.5) + m
        e = np.exp(z - z.max(-1, keepdims=True))
        np.testing.assert_allclose(built(a, m), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
