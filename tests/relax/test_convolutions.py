"""relax.convolutions: convolutions computed as im2col and a GEMM (a batched one with groups).

Torch's own convolutions (the way ``build_model`` gets them) are checked against torch eager:
each becomes a library call, with its bias and activation in the call, and the rest of the
model is unchanged.  Relax modules check what torch never writes (a weight given as a
parameter, asymmetric padding) and every refusal, which leaves the module as it was and says
why.  ``tests/properties/test_convolutions.py`` draws the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.byoc_testing import relax_inputs
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import tir_byoc
from tir_byoc.match import scan_function
from tir_byoc.match.exprs import expr_text
from tir_byoc.relax import conv_choice, convolutions, pipeline
from tir_byoc.relax.convolutions import ConvolutionsAsGemms

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True, scope="module")
def _im2col():
    """These tests are im2col's: with oneDNN installed, tir_byoc.relax.conv_choice would keep
    the convolutions whole for its convolution primitive."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(conv_choice.MODE_ENV, "im2col")
        yield


WITHOUT_REWRITE = tuple(p for p in pipeline.BEFORE_LEGALIZE if p is not ConvolutionsAsGemms)


class _Convs(torch.nn.Module):
    """``layers`` applied one after the other, each optionally followed by ``activation``."""

    def __init__(self, *layers, activation=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)
        self.activation = activation

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            if self.activation is not None:
                x = self.activation(x)
        return x


def _build_and_compare(module, x):
    torch.manual_seed(0)
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter)
    module = module.eval()
    built = tir_byoc.build_model(module, (x,))
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(built(x).numpy(), expected, rtol=1e-4, atol=1e-4)
    return built


@pytest.mark.parametrize(
    ("layers", "activation", "shape"),
    [
        # Whisper's two: padded, the second of stride 2, each with a GELU.
        (
            (torch.nn.Conv1d(6, 8, 3, padding=1), torch.nn.Conv1d(8, 8, 3, stride=2, padding=1)),
            torch.nn.GELU(),
            (2, 6, 20),
        ),
        # ViT's patch embedding: an 8 x 8 kernel of stride 8, no bias here.
        ((torch.nn.Conv2d(3, 16, 8, stride=8, bias=False),), None, (2, 3, 32, 24)),
        # A ResNet-like 3 x 3, padded, with a ReLU; a 1 x 1 (a per-pixel Linear).
        (
            (torch.nn.Conv2d(3, 5, 3, padding=1), torch.nn.Conv2d(5, 4, 1)),
            torch.nn.ReLU(),
            (1, 3, 7, 9),
        ),
        # Strides and padding that differ per axis, a kernel that does not tile the input.
        (
            (torch.nn.Conv2d(2, 3, (2, 3), stride=(2, 1), padding=(0, 2)),),
            torch.nn.SiLU(),
            (1, 2, 9, 5),
        ),
        # Dilated (a window with holes), as in WaveNet-like stacks and DeepLab.
        (
            (torch.nn.Conv1d(3, 4, 3, dilation=2, padding=2), torch.nn.Conv1d(4, 4, 2, dilation=4)),
            torch.nn.ReLU(),
            (2, 3, 19),
        ),
        # A video model's tubelet embedding (VideoMAE): 2 frames x 4 x 4 patches.
        ((torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)),), None, (1, 3, 4, 8, 12)),
    ],
    ids=[
        "whisper-like conv1d",
        "vit patch embedding",
        "3x3 then 1x1",
        "mixed strides",
        "dilated conv1d",
        "conv3d tubelets",
    ],
)
def test_each_convolution_is_a_library_call_with_its_bias_and_activation(layers, activation, shape):
    module = _Convs(*layers, activation=activation)
    built = _build_and_compare(module, torch.randn(*shape))
    assert len(built.intrinsics) == len(layers)
    assert not [name for name in built.rules if "conv" in name], built.rules
    # Bias and activation run in the call: what TVM's code is left with is data movement.
    left = " ".join(built.rules)
    for op in ("gelu", "relu", "silu", "add"):
        assert op not in left, left


class _SummedConvs(torch.nn.Module):
    """relu(a(x) + b(x)): at batch 1 on a 1 x 1 map each result is (1, O, 1, 1), a bias's shape."""

    def __init__(self):
        super().__init__()
        self.a, self.b = (torch.nn.Conv2d(4, 8, 2, stride=2) for _ in range(2))

    def forward(self, x):
        return torch.relu(self.a(x) + self.b(x))


def test_another_convolutions_result_is_a_residual_not_a_bias():
    # Both convolutions took the add as their bias, and the build failed: "Var ... not defined".
    built = _build_and_compare(_SummedConvs(), torch.randn(1, 4, 2, 2))
    # Served (as one GEMM: the two read the same columns, so relax.fuse_rows joins them).
    assert built.intrinsics
    assert not [name for name in built.rules if "conv" in name], built.rules


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_a_grouped_convolution_is_one_batched_call(bias):
    # Wav2Vec2's positional convolution, smaller: 16 channels in 4 groups, a kernel of 8
    # padded by half of it, then a GELU.
    module = _Convs(
        torch.nn.Conv1d(16, 16, 8, padding=4, groups=4, bias=bias), activation=torch.nn.GELU()
    )
    built = _build_and_compare(module, torch.randn(2, 16, 24))
    (calls,) = built.intrinsics.values()
    assert len(calls) == 1, calls
    assert not [name for name in built.rules if "conv" in name], built.rules
    left = " ".join(built.rules)
    # A group's bias would be a (G, O/G) tensor no call takes: it and the GELU after it stay
    # TVM code, after the transpose back; without a bias the GELU runs in the call.
    assert ("gelu" in left) == bias and ("add" in left) == bias, left
    mod, _ = tir_byoc.frontend.import_torch(module, (torch.randn(2, 16, 24),))
    lowered = pipeline.lower(mod)
    functions = lowered.functions_items()
    (match,) = [m for g, f in functions if isinstance(f, tirx.PrimFunc) for m in _matches(g, f)]
    assert match.pattern == ("bmm_matmul" if bias else "bmm_matmul_gelu"), match.pattern
    # One product per (batch, group); the weight is the left operand, its matrices the
    # groups' (4 by 4 x 8), shared by the batch; the columns are the right one.
    assert [expr_text(c) for c in match.batch.counts] == ["2", "4"], match.batch
    assert [expr_text(s) for s in match.batch.x_strides] == ["0", "128"], match.batch
    # The product is in the convolution's layout: nothing is transposed back.
    assert "transpose" not in left, left


class _TransposedInput(torch.nn.Module):
    """Wav2Vec2's positional convolution, smaller: (B, T, C) hidden states transposed, a
    grouped convolution padded by half its kernel, a GELU, and back to (B, T, C)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(16, 16, 8, padding=4, groups=4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x.transpose(1, 2))).transpose(1, 2)


def test_a_transposed_input_is_copied_once_and_the_gather_reads_along_its_rows():
    module = _TransposedInput()
    x = torch.randn(2, 24, 16)
    built = _build_and_compare(module, x)
    assert len(built.intrinsics) == 1, built.intrinsics
    mod, _ = tir_byoc.frontend.import_torch(module.eval(), (x,))
    rewritten = ConvolutionsAsGemms()(mod)
    functions = dict((g.name_hint, f) for g, f in rewritten.functions_items())
    # The transposed input is a function of its own that FuseOps leaves alone; the
    # permute_dims it replaces, used by the convolution alone, is gone.
    assert int(functions["gather_input"].attrs["op_pattern"]) == 8
    assert "permute_dims(x" not in functions["main"].script()
    lowered = pipeline.lower(mod)
    names = [g.name_hint for g, f in lowered.functions_items() if isinstance(f, tirx.PrimFunc)]
    gathers = [name for name in names if "im2col" in name]
    assert gathers and not [name for name in gathers if "transpose" in name], names


def test_a_weight_computed_from_constants_is_computed_once_at_build_time():
    # Wav2Vec2's positional convolution has a weight norm: g * v / ||v||, from constants.
    conv = torch.nn.Conv1d(16, 16, 8, padding=4, groups=4)
    module = _Convs(torch.nn.utils.parametrizations.weight_norm(conv, dim=2))
    built = _build_and_compare(module, torch.randn(2, 16, 24))
    assert sum(len(calls) for calls in built.intrinsics.values()) == 1, built.intrinsics
    norm = [name for name in built.rules if any(op in name for op in ("power", "sum", "divide"))]
    assert not norm, built.rules


# fmt: off
@I.ir_module
class ComputedWeights:
    """Two weights computed at run time: from a constant, but also an output of the function
    (so its computation stays), and from a parameter (so it cannot be computed before)."""

    @R.function
    def main(x: R.Tensor((1, 2, 9), "float32"), w: R.Tensor((4, 2, 3), "float32")):
        with R.dataflow():
            shared = R.multiply(R.const(np.full((4, 2, 3), 0.5, "float32")), R.const(3.0))
            y = R.nn.conv1d(x, shared, padding=[1, 1])
            doubled = R.multiply(w, R.const(2.0))
            z = R.nn.conv1d(x, doubled, strides=[2])
            out = (y, z, shared)
            R.output(out)
        return out
# fmt: on


def test_a_weight_used_elsewhere_or_computed_from_parameters_is_left_in_place(monkeypatch):
    sites, declines = convolutions.find(ComputedWeights)
    assert [site.var.name for site in sites] == ["y", "z"] and declines == ()
    rewritten = convolutions.rewrite(ComputedWeights, sites)
    relax.analysis.well_formed(rewritten)
    text = rewritten.script()
    assert "R.nn.conv" not in text and text.count("R.multiply") == 2, text
    inputs = relax_inputs(ComputedWeights)
    got = tir_byoc.build_model(ComputedWeights)(*inputs)
    monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", WITHOUT_REWRITE)
    before = tir_byoc.build_model(ComputedWeights)(*inputs)
    for new, old in zip(got, before, strict=True):
        np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)


def _matches(gvar, func):
    return scan_function(gvar.name_hint, func).matches


def test_a_convolution_that_is_not_served_keeps_tvms_code_and_says_why():
    module = _Convs(torch.nn.Conv2d(4, 4, 3, groups=4), torch.nn.ConvTranspose2d(4, 2, 2))
    built = _build_and_compare(module, torch.randn(1, 4, 12, 12))
    mod, _ = tir_byoc.frontend.import_torch(module, (torch.randn(1, 4, 12, 12),))
    sites, declines = convolutions.find(mod)
    assert sites == ()
    reasons = [c.reason for c in declines]
    assert reasons == [
        "depthwise (groups = 4, one input channel each): a batched GEMM of one window per "
        "product is slower than TVM's loop",
        "a transposed convolution; im2col serves conv1d, conv2d and conv3d",
    ]
    # The depthwise convolution reaches TIR whole, where the convolution matcher finds it and
    # the conv intrinsics leave it to TVM's sliding-window schedule, saying why.
    assert not built.intrinsics
    lowered = pipeline.lower(mod)
    (depthwise,) = [c for c in tir_byoc.scan(lowered) if c.pattern.startswith("conv2d")]
    assert depthwise.intrinsic is None and "sliding-window" in depthwise.reason, depthwise.reason


# fmt: off
@I.ir_module
class ParameterWeight:
    """Weight and bias as parameters, asymmetric padding, the bias added on the left; the
    tanh binds an output of the block, so it stays after the transpose back."""

    @R.function
    def main(
        x: R.Tensor((2, 3, 10), "float32"), w: R.Tensor((4, 3, 3), "float32"),
        b: R.Tensor((1, 4, 1), "float32"),
    ):
        with R.dataflow():
            y = R.nn.conv1d(x, w, strides=[2], padding=[2, 1])
            z = R.add(b, y)
            t = R.tanh(z)
            R.output(t)
        return t


@I.ir_module
class ConvAlsoAnOutput:
    """The convolution's result is an output too: its relu stays after the transpose back."""

    @R.function
    def main(x: R.Tensor((1, 2, 6, 6), "float32"), w: R.Tensor((3, 2, 2, 2), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=[1, 0, 0, 1])
            z = R.nn.relu(y)
            out = (y, z)
            R.output(out)
        return out


@I.ir_module
class ChannelsLast:
    @R.function
    def main(x: R.Tensor((1, 6, 6, 2), "float32"), w: R.Tensor((3, 2, 2, 2), "float32")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, data_layout="NHWC", out_layout="NHWC")
            R.output(y)
        return y


@I.ir_module
class Half:
    @R.function
    def main(x: R.Tensor((1, 2, 8), "float16"), w: R.Tensor((3, 2, 3), "float16")):
        with R.dataflow():
            y = R.nn.conv1d(x, w)
            R.output(y)
        return y
# fmt: on


@pytest.mark.parametrize(
    ("mod", "in_the_call", "left"),
    [(ParameterWeight, "add", "tanh"), (ConvAlsoAnOutput, "", "relu")],
    ids=["weight and bias as parameters, asymmetric padding", "the conv is also an output"],
)
def test_the_rewrite_computes_what_tvms_convolution_computes(mod, in_the_call, left, monkeypatch):
    rewritten = ConvolutionsAsGemms()(mod)
    relax.analysis.well_formed(rewritten)
    text = rewritten.script()
    assert "R.nn.conv" not in text and "im2col" in text
    inputs = relax_inputs(mod)
    built = tir_byoc.build_model(mod)
    (call,) = built.intrinsics
    assert call.removesuffix("_packed").endswith(in_the_call or "matmul"), call
    assert any(left in name for name in built.rules)  # a second use keeps its op out
    got = built(*inputs)
    monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", WITHOUT_REWRITE)
    before = tir_byoc.build_model(mod)(*inputs)
    got, before = (v if isinstance(v, list | tuple) else [v] for v in (got, before))
    for new, old in zip(got, before, strict=True):
        np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("mod", "reason"),
    [
        (ChannelsLast, "layouts NHWC/OIHW/NHWC; im2col serves NCHW/OIHW/NCHW"),
        (Half, "dtypes float16, float16, float16; im2col serves float32"),
    ],
    ids=["channels last", "float16"],
)
def test_anything_else_comes_back_as_it_was_with_its_reason(mod, reason):
    assert ConvolutionsAsGemms()(mod).same_as(mod)
    sites, (found,) = convolutions.find(mod)
    assert sites == ()
    assert found.reason == reason
    assert str(found).endswith(f"not as im2col + GEMM ({reason})")


def test_columns_larger_than_the_limit_are_left_to_tvm(monkeypatch):
    mod = ParameterWeight
    monkeypatch.setattr(convolutions, "MAX_COLUMNS", 2 * 6 * 3 * 3 - 1)  # one element short
    assert ConvolutionsAsGemms()(mod).same_as(mod)
    sites, (found,) = convolutions.find(mod)
    assert sites == ()
    assert found.reason == "its im2col columns would hold 108 elements, more than 107"


def test_anything_but_a_module_is_refused_in_one_line():
    with pytest.raises(
        TypeError, match=r"^tir_byoc.relax.convolutions: expected a tvm.IRModule, got Function$"
    ):
        convolutions.find(ParameterWeight["main"])
    with pytest.raises(TypeError, match=r"Expected `RValueRef<ir.IRModule>`"):
        ConvolutionsAsGemms()(ParameterWeight["main"])
