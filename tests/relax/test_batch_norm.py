"""relax.batch_norm: eval-mode batch norms folded into the convolution or Linear before them,
or else computed as a scale and a shift.

torch's own layers (the way ``build_model`` gets them) are checked against torch eager, with
the batch-norm statistics calibrated by a few batches in training mode (fresh ones are 0 and
1, which would hide a statistic read at the wrong channel).  Relax modules check what torch
never writes (statistics given as parameters, a batch norm in training mode) and every fold
declined, which says why.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import ir, relax
from tvm.script import ir as I
from tvm.script import relax as R

import tir_byoc
from tir_byoc.match import scan_function
from tir_byoc.relax import batch_norm, pipeline
from tir_byoc.relax.batch_norm import FoldBatchNorms

torch = pytest.importorskip("torch")

_BATCH_NORM = ir.Op.get("relax.nn.batch_norm")


def _calibrated(module, shape, seed=0):
    """``module`` in eval mode, its weights and batch-norm statistics drawn: three random
    batches of ``shape`` run in training mode first."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.normal_()
        module.train()
        for _ in range(3):
            module(torch.randn(*shape) * 2 + 1)
    return module.eval()


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _batch_norms(mod: tvm.IRModule) -> int:
    """How many batch norms the Relax functions of ``mod`` call."""
    return sum(
        isinstance(b.value, relax.Call) and b.value.op.same_as(_BATCH_NORM)
        for func in mod.functions.values()
        if isinstance(func, relax.Function)
        for block in func.body.blocks
        for b in block.bindings
    )


class _Seq(torch.nn.Sequential):
    pass


@pytest.mark.parametrize(
    ("layers", "shape"),
    [
        ((torch.nn.Conv1d(3, 6, 3, padding=1), torch.nn.BatchNorm1d(6)), (2, 3, 10)),
        # ResNet's: no bias, a ReLU after.
        (
            (torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)),
            (2, 3, 9, 7),
        ),
        # MobileNetV2's depthwise convolution, which stays TVM code.
        (
            (torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False), torch.nn.BatchNorm2d(4)),
            (1, 4, 6, 6),
        ),
        ((torch.nn.Conv3d(2, 4, 2), torch.nn.BatchNorm3d(4)), (1, 2, 3, 4, 5)),
        ((torch.nn.Linear(12, 5), torch.nn.BatchNorm1d(5)), (4, 12)),
        ((torch.nn.Linear(12, 5, bias=False), torch.nn.BatchNorm1d(5)), (4, 12)),
    ],
    ids=["conv1d", "conv2d no bias", "depthwise", "conv3d", "linear", "linear no bias"],
)
def test_a_batch_norm_after_a_constant_gemm_is_folded_and_agrees_with_torch(
    layers, shape, monkeypatch
):
    # A convolution of one group without a bias is folded into only on request (below).
    monkeypatch.setattr(batch_norm, "FOLD_INTO_UNBIASED_CONVOLUTIONS", True)
    module = _calibrated(_Seq(*layers), shape)
    x = torch.randn(*shape)
    mod, _ = tir_byoc.frontend.import_torch(module, (x,))
    sites, declines = batch_norm.find(mod)
    assert [type(s) for s in sites] == [batch_norm.Fold] and declines == ()
    folded = batch_norm.rewrite(mod, sites)
    assert _batch_norms(mod) == 1 and _batch_norms(folded) == 0
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(_run(folded, x.numpy()), expected, rtol=1e-5, atol=1e-5)


def test_the_folded_weight_and_bias_are_computed_in_float64_and_rounded_once():
    conv, norm = torch.nn.Conv2d(3, 4, 2), torch.nn.BatchNorm2d(4, eps=1e-3)
    module = _calibrated(_Seq(conv, norm), (2, 3, 5, 5))
    mod, _ = tir_byoc.frontend.import_torch(module, (torch.randn(2, 3, 5, 5),))
    ((fold,), _) = batch_norm.find(mod)

    def f64(t):
        return t.detach().numpy().astype(np.float64)

    scale = f64(norm.weight) / np.sqrt(f64(norm.running_var) + 1e-3)
    shift = f64(norm.bias) - f64(norm.running_mean) * scale
    weight = (f64(conv.weight) * scale[:, None, None, None]).astype(np.float32)
    bias = (f64(conv.bias) * scale + shift).astype(np.float32).reshape(1, 4, 1, 1)
    assert np.array_equal(fold.weight.value.numpy(), weight)
    assert np.array_equal(fold.bias.value.numpy(), bias)
    assert fold.weight.value.numpy().dtype == np.float32


class _ConvBnRelu(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=bias)
        self.norm = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


@pytest.mark.parametrize(
    ("bias", "fold", "in_the_call", "left"),
    [
        # VGG's: the bias, the folded shift and the ReLU all run in the call.
        (True, True, True, ()),
        (True, False, False, ("batch_norm", "relu")),
        # ResNet's: a scale and a shift and the ReLU in one pass after the weight-first GEMM,
        # as the batch norm and the ReLU were without the rewrite.
        (False, True, False, ("multiply_add_relu",)),
        (False, False, False, ("batch_norm_relu",)),
    ],
    ids=["bias folded", "bias without the rewrite", "no bias", "no bias without the rewrite"],
)
def test_conv_batch_norm_relu_runs_its_bias_and_relu_in_the_call_when_it_has_a_bias(
    bias, fold, in_the_call, left, monkeypatch
):
    if not fold:
        without = tuple(p for p in pipeline.BEFORE_LEGALIZE if p is not FoldBatchNorms)
        monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", without)
    # The GEMM of im2col's call (with oneDNN, conv_choice could keep the convolution whole),
    # its weight plain: a packed weight is chosen by timing, and its call is the gemm entry
    # point, whose name does not say which epilogue it runs.
    monkeypatch.setenv("TIR_BYOC_CONVOLUTIONS", "im2col")
    for setting in ("TIR_BYOC_ONEDNN_PACK", "TIR_BYOC_MKL_PACK"):
        monkeypatch.setenv(setting, "plain")
    module = _calibrated(_ConvBnRelu(bias), (2, 3, 8, 8))
    x = torch.randn(2, 3, 8, 8)
    built = tir_byoc.build_model(module, (x,))
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(built(x).numpy(), expected, rtol=1e-4, atol=1e-4)
    ((call,),) = built.intrinsics.values()
    assert call.endswith("_bias_relu") == bool(in_the_call), call
    names = " ".join(built.rules)
    assert all(part in names for part in left), names
    assert ("relu" in names) == bool(left), names


# fmt: off
@I.ir_module
class LinearNormByParameters:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 6), "float32"),
             g: R.Tensor((6,), "float32"), b: R.Tensor((6,), "float32"),
             m: R.Tensor((6,), "float32"), v: R.Tensor((6,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            t = R.nn.batch_norm(y, g, b, m, v, axis=1, epsilon=1e-5, training=False)
            z = t[0]
            R.output(z)
        return z


@I.ir_module
class LinearScaleShift:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 6), "float32"),
             g: R.Tensor((6,), "float32"), b: R.Tensor((6,), "float32"),
             m: R.Tensor((6,), "float32"), v: R.Tensor((6,), "float32")):
        with R.dataflow():
            y = R.matmul(x, w)
            lv = R.add(v, R.const(1e-5, "float32"))
            lv1 = R.rsqrt(lv)
            lv2 = R.multiply(g, lv1)
            lv3 = R.multiply(m, lv2)
            lv4 = R.subtract(b, lv3)
            lv5 = R.expand_dims(lv2, axis=[0])
            lv6 = R.expand_dims(lv4, axis=[0])
            lv7 = R.multiply(y, lv5)
            z = R.add(lv7, lv6)
            R.output(z)
        return z
# fmt: on


def test_statistics_given_as_parameters_are_a_scale_and_a_shift_in_the_gemms_epilogue():
    sites, declines = batch_norm.find(LinearNormByParameters)
    assert [type(s) for s in sites] == [batch_norm.ScaleShift]
    (decline,) = declines
    assert not decline and decline.what == batch_norm.BATCH_NORM_FOLD
    assert "gamma, beta, mean or var is not a constant" in str(decline)
    rewritten = FoldBatchNorms()(LinearNormByParameters)
    tvm.ir.assert_structural_equal(rewritten, LinearScaleShift)
    # After lowering, the scale and the shift are the matmul's epilogue: channel_scale, bias.
    lowered = pipeline.lower(LinearNormByParameters)
    patterns = [
        m.pattern
        for g, f in lowered.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
        for m in scan_function(g.name_hint, f).matches
    ]
    assert patterns == ["matmul_channel_scale_bias"]
    rng = np.random.default_rng(0)
    x, w, g, b, m = (rng.standard_normal(s, dtype=np.float32) for s in [(4, 8), (8, 6), 6, 6, 6])
    v = rng.uniform(0.5, 2, 6).astype(np.float32)
    expected = (x @ w - m) / np.sqrt(v + 1e-5) * g + b
    got = _run(rewritten, x, w, g, b, m, v)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(LinearNormByParameters, x, w, g, b, m, v), got, atol=1e-5)


# fmt: off
@I.ir_module
class Training:
    @R.function
    def main(x: R.Tensor((4, 6), "float32"), g: R.Tensor((6,), "float32"),
             b: R.Tensor((6,), "float32"), m: R.Tensor((6,), "float32"),
             v: R.Tensor((6,), "float32")):
        with R.dataflow():
            t = R.nn.batch_norm(x, g, b, m, v, axis=1, training=True)
            z = t[0]
            R.output(z)
        return z


@I.ir_module
class StatisticsUsed:
    @R.function
    def main(x: R.Tensor((4, 6), "float32"), g: R.Tensor((6,), "float32"),
             b: R.Tensor((6,), "float32"), m: R.Tensor((6,), "float32"),
             v: R.Tensor((6,), "float32")):
        with R.dataflow():
            t = R.nn.batch_norm(x, g, b, m, v, axis=1, training=False)
            z = t[0]
            mean = t[1]
            R.output(z, mean)
        return (z, mean)
# fmt: on


@pytest.mark.parametrize(
    ("mod", "reason"),
    [
        (Training, "in training mode"),
        (StatisticsUsed, "its mean or variance output is used"),
    ],
    ids=["training", "statistics used"],
)
def test_a_batch_norm_that_is_not_a_scale_and_shift_stays_and_says_why(mod, reason):
    sites, (decline,) = batch_norm.find(mod)
    assert sites == ()
    assert reason in decline.reason and decline.blocks == ("t",)
    assert batch_norm.rewrite(mod, sites) is mod


class _Twice(torch.nn.Module):
    """A convolution whose output the batch norm and a residual both read."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)
        self.norm = torch.nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(x)
        return self.norm(y) + y


class _AfterRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(3)

    def forward(self, x):
        return self.norm(torch.relu(x))


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        (_Twice(), "has another use besides the batch norm"),
        (_AfterRelu(), "it follows relax.nn.relu, not a convolution or a matmul"),
    ],
    ids=["output used twice", "after a relu"],
)
def test_a_batch_norm_not_foldable_is_a_constant_scale_and_shift_and_says_why(module, reason):
    module = _calibrated(module, (2, 3, 6, 6))
    x = torch.randn(2, 3, 6, 6)
    mod, _ = tir_byoc.frontend.import_torch(module, (x,))
    sites, (decline,) = batch_norm.find(mod)
    assert [type(s) for s in sites] == [batch_norm.ScaleShift]
    assert decline.reason.endswith(reason), decline.reason
    rewritten = batch_norm.rewrite(mod, sites)
    assert _batch_norms(rewritten) == 0
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(_run(rewritten, x.numpy()), expected, rtol=1e-5, atol=1e-5)


def test_anything_but_a_module_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"^tir_byoc.relax.batch_norm: expected a tvm.IRModule"):
        batch_norm.find(LinearNormByParameters["main"])


def test_a_convolution_without_a_bias_gets_a_scale_and_shift_unless_asked_to_fold(monkeypatch):
    module = _calibrated(_ConvBnRelu(bias=False), (2, 3, 8, 8))
    x = torch.randn(2, 3, 8, 8)
    mod, _ = tir_byoc.frontend.import_torch(module, (x,))
    sites, (decline,) = batch_norm.find(mod)
    assert [type(s) for s in sites] == [batch_norm.ScaleShift]
    assert "its convolution has no bias" in decline.reason
    with torch.no_grad():
        expected = module(x).numpy()
    got = _run(batch_norm.rewrite(mod, sites), x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(batch_norm, "FOLD_INTO_UNBIASED_CONVOLUTIONS", True)
    sites, declines = batch_norm.find(mod)
    assert [type(s) for s in sites] == [batch_norm.Fold] and declines == ()
