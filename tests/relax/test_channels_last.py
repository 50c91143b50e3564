"""relax.channels_last: CNNs converted to NHWC activations and HWIO weights.

A small MobileNet-like torch network (explicit "TF" pads, ReLU6, depthwise and pointwise
convolutions, batch norm, a residual add, a max pool and a classifier) is converted, and the
result checked op by op (every convolution NHWC, no clip, no pad, no transposed constant left,
transposes only where the layout meets the input and the flatten) and end to end against torch,
converted and not.  TVM's build of the converted module is checked against its build of the
unconverted one on inputs holding NaN and infinities: bit for bit where no reduction has more
than one term, else within float rounding.  Each decline says why.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import ir, relax

import tir_byoc
from tir_byoc import frontend
from tir_byoc.relax import channels_last, conv_choice, pipeline
from tir_byoc.relax.channels_last import ChannelsLast

torch = pytest.importorskip("torch")
nn = torch.nn


class _Block(nn.Module):
    """MobileNetV2's inverted residual, padded the way transformers' TF-style models pad."""

    def __init__(self, channels: int, stride: int):
        super().__init__()
        wide = channels * 4
        self.stride = stride
        self.expand = nn.Sequential(nn.Conv2d(channels, wide, 1, bias=False), nn.BatchNorm2d(wide))
        self.depthwise = nn.Conv2d(wide, wide, 3, stride, groups=wide, bias=False)
        self.norm = nn.BatchNorm2d(wide)
        self.project = nn.Sequential(nn.Conv2d(wide, channels, 1), nn.BatchNorm2d(channels))

    def forward(self, x):
        y = nn.functional.relu6(self.expand(x))
        pad = (0, 1, 0, 1) if self.stride == 2 else (1, 1, 1, 1)
        y = nn.functional.relu6(self.norm(self.depthwise(nn.functional.pad(y, pad))))
        y = self.project(y)
        return y + x if self.stride == 1 else y


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU6())
        self.blocks = nn.Sequential(_Block(8, 1), _Block(8, 2), nn.MaxPool2d(2))
        self.head = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.blocks(self.stem(x)), 1))


def _net():
    torch.manual_seed(0)
    net = _Net()
    net.train()
    with torch.no_grad():
        for _ in range(3):  # batch-norm statistics that are not the identity
            net(torch.randn(4, 3, 32, 32))
    return net.eval(), torch.randn(2, 3, 32, 32)


def _ops(mod: tvm.IRModule) -> list[relax.Call]:
    calls = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, ir.Op):
            calls.append(expr)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return calls


def _named(calls, name: str) -> list[relax.Call]:
    return [c for c in calls if c.op.name == name]


@pytest.fixture(scope="module")
def imported():
    net, x = _net()
    mod, _ = frontend.import_torch(net, (x,))
    return net, x, mod


def test_every_convolution_is_nhwc_and_only_the_input_and_the_flatten_are_transposed(imported):
    _, _, mod = imported
    sites, declines = channels_last.find(mod)
    assert [s.function for s in sites] == ["main"] and declines == ()
    assert len(sites[0].convolutions) == 7 and len(sites[0].pads) == 2
    calls = _ops(ChannelsLast()(mod))
    convs = _named(calls, "relax.nn.conv2d")
    assert len(convs) == 7
    for conv in convs:
        layouts = (conv.attrs.data_layout, conv.attrs.kernel_layout, conv.attrs.out_layout)
        assert tuple(map(str, layouts)) == ("NHWC", "HWIO", "NHWC")
    assert not _named(calls, "relax.clip") and not _named(calls, "relax.nn.pad")
    # The stride-2 block's pad (0, 1, 0, 1) is now its convolution's (top, left, bottom, right).
    assert [int(p) for p in convs[5].attrs.padding] == [0, 0, 1, 1]
    transposes = _named(calls, "relax.permute_dims")
    assert all(not isinstance(t.args[0], ir.Constant) for t in transposes)
    assert len(transposes) == 2, [str(t) for t in transposes]  # the input, and before flatten
    pool = _named(calls, "relax.nn.max_pool2d")[0]
    assert str(pool.attrs.layout) == "NHWC"


@pytest.mark.parametrize("setting", ["1", "0"], ids=["channels_last", "as_given"])
def test_the_converted_build_agrees_with_torch(imported, setting, monkeypatch):
    net, x, _ = imported
    monkeypatch.setenv(channels_last.ENV, setting)
    built = tir_byoc.build_model(net, (x,))
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(built(x).numpy(), expected, rtol=1e-4, atol=1e-5)
    declines = [d for d in built.declines if d.what == channels_last.CHANNELS_LAST]
    assert bool(declines) == (setting == "0")


def _built(mod: tvm.IRModule):
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


def test_the_converted_module_computes_what_tvm_computes_on_nan_and_infinities(imported):
    """TVM's own build (no library) of the module before and after conversion, on an input
    holding NaN, infinities and huge values: the same special values in the same places, the
    rest within float rounding (TVM's NHWC convolution sums its window in another order)."""
    _, x, mod = imported
    data = x.numpy().copy()
    data[0, 0, 3, 4], data[0, 1, 7, 7], data[1, 2, 0, 0] = np.nan, np.inf, -np.inf
    data[1, 0, 10:12, 5] = 3e38
    unconverted, converted = _built(mod)["main"], _built(ChannelsLast()(mod))["main"]
    before = unconverted(tvm.runtime.tensor(data))[0].numpy()
    after = converted(tvm.runtime.tensor(data))[0].numpy()
    # The special values reach the output (TVM's clip turns a NaN into 6, torch's keeps it).
    assert not np.array_equal(before, unconverted(tvm.runtime.tensor(x.numpy()))[0].numpy())
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


class _OneTermNet(nn.Module):
    """Every reduction of one term (1 x 1 convolutions of one input channel per output), so
    that no summation order can differ: ReLU6, a pad moved into a convolution, a bias, a max
    pool and a residual add, all of whose values must come out the same bits."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(1, 4, 1)
        self.depthwise = nn.Conv2d(4, 4, 1, groups=4)

    def forward(self, x):
        y = nn.functional.relu6(self.first(x))
        z = nn.functional.relu6(self.depthwise(nn.functional.pad(y, (0, 1, 0, 1))))
        return nn.functional.max_pool2d(z, 2) + 1.5


def test_each_step_keeps_the_bits_where_no_sum_is_reordered():
    torch.manual_seed(3)
    x = torch.randn(2, 1, 8, 8)
    mod, _ = frontend.import_torch(_OneTermNet().eval(), (x,))
    (site,), _ = channels_last.find(mod)
    assert len(site.pads) == 1
    data = x.numpy().copy()
    data[0, 0, 1, 1], data[0, 0, 2, 5], data[1, 0, 3, 3], data[1, 0, 6, 0] = (
        np.nan,
        np.inf,
        -np.inf,
        3e38,
    )
    before = _built(mod)["main"](tvm.runtime.tensor(data))[0].numpy()
    after = _built(ChannelsLast()(mod))["main"](tvm.runtime.tensor(data))[0].numpy()
    assert not np.isfinite(data).all() and np.isfinite(before).any()
    np.testing.assert_array_equal(after.view(np.uint32), before.view(np.uint32))


def _pad_then_conv(value: float = 0.0, conv_padding: int = 0):
    class PadConv(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3, padding=conv_padding)

        def forward(self, x):
            return self.conv(nn.functional.pad(x, (1, 1, 1, 1), value=value))

    torch.manual_seed(1)
    x = torch.randn(1, 4, 8, 8)
    return frontend.import_torch(PadConv().eval(), (x,))[0]


@pytest.mark.parametrize(
    ("value", "conv_padding", "reason"),
    [
        (1.0, 0, "it pads with constant 1.0, not zeros"),
        (-0.0, 0, "it pads with constant -0.0, not zeros"),
        (0.0, 1, "the convolution that reads it has a padding of its own"),
    ],
    ids=["pad_value", "negative_zero", "conv_padding"],
)
def test_a_pad_that_cannot_move_stays_and_says_why(value, conv_padding, reason):
    mod = _pad_then_conv(value, conv_padding)
    sites, declines = channels_last.find(mod)
    assert len(sites) == 1 and sites[0].pads == ()
    (decline,) = declines
    assert decline.what == channels_last.CHANNELS_LAST and decline.reason.endswith(reason)
    assert "transposed to and from NHWC" in str(decline)
    converted = ChannelsLast()(mod)
    assert _named(_ops(converted), "relax.nn.pad")
    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype("float32")
    want = _built(mod)["main"](tvm.runtime.tensor(x))[0].numpy()
    got = _built(converted)["main"](tvm.runtime.tensor(x))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_without_a_library_convolution_the_layout_stays_and_says_why(imported):
    _, _, mod = imported
    with conv_choice.backends_in_scope(["ref"]):
        sites, declines = channels_last.find(mod)
    assert sites == ()
    (decline,) = declines
    assert "im2col + GEMM serves NCHW only" in decline.reason
    assert decline.nearest == "relax.nn.conv2d" and len(decline.blocks) == 7


def test_the_setting_keeps_nchw_and_says_why(imported, monkeypatch):
    _, _, mod = imported
    monkeypatch.setenv(channels_last.ENV, "0")
    sites, declines = channels_last.find(mod)
    assert sites == () and "TIR_BYOC_CHANNELS_LAST=0" in declines[0].reason
    assert ChannelsLast()(mod).same_as(mod)


def test_it_runs_in_the_pipeline_before_batch_norms_are_folded():
    order = [p.__name__ for p in pipeline.BEFORE_LEGALIZE]
    assert order.index("ClipPoolWindows") < order.index("ChannelsLast")
    assert order.index("ChannelsLast") < order.index("FoldBatchNorms")


def test_a_module_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"expected a tvm\.IRModule, got str"):
        channels_last.find("main")


def test_a_symbolic_batch_converts_and_a_symbolic_image_size_keeps_nchw_and_says_why():
    net, x = _net()
    batch = torch.export.Dim("batch", min=1, max=8)
    mod, _ = frontend.import_torch(net, (x,), dynamic_shapes={"x": {0: batch}})
    sites, declines = channels_last.find(mod)
    assert len(sites) == 1 and declines == ()
    conv = nn.Conv2d(3, 4, 3).eval()
    size = torch.export.Dim("size", min=8, max=64)
    mod, _ = frontend.import_torch(conv, (torch.randn(1, 3, 16, 16),), {"input": {2: size}})
    sites, declines = channels_last.find(mod)
    assert sites == ()
    (decline,) = declines
    assert "symbolic beyond its batch" in decline.reason


def test_a_build_that_offloads_nothing_keeps_nchw_and_says_why(imported, monkeypatch):
    net, x, mod = imported
    with channels_last.kept_as_given(pipeline.NO_LIBRARY):
        sites, (decline,) = channels_last.find(mod)
    assert sites == () and decline.reason == pipeline.NO_LIBRARY
    kept = []
    monkeypatch.setattr(channels_last, "rewrite", lambda m, s: kept.append(s) or m)
    built = tir_byoc.build_model(net, (x,), offload=False)
    assert kept == [()]  # the build's lowering converted nothing
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(built(x).numpy(), expected, rtol=1e-4, atol=1e-5)
