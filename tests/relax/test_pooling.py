"""relax.pooling: pooling windows that reach past their input clipped to it.

torch's own pools (as ``build_model`` gets them) are checked against torch eager, average and
max, 1-D to 3-D, with ``ceil_mode``, padding and ``count_include_pad``; the lowered TIR of the
EfficientNet-like pool is checked to loop over the input's positions only.  Relax modules
check what torch never writes, and each declined pool says why.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R

import tir_byoc
from tir_byoc.relax import pipeline, pooling
from tir_byoc.relax.pooling import ClipPoolWindows

torch = pytest.importorskip("torch")


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


nn = torch.nn


@pytest.mark.parametrize(
    ("pool", "shape", "form"),
    [
        # EfficientNet's final pooling: one window of 1280 x 1280 over a 7 x 7 map.
        (nn.AvgPool2d(1280, ceil_mode=True), (2, 5, 7, 7), "whole input"),
        (nn.AvgPool2d(1280, ceil_mode=True, padding=3), (1, 3, 7, 6), "whole input"),
        (
            nn.AvgPool2d(1280, ceil_mode=True, padding=3, count_include_pad=False),
            (1, 3, 7, 6),
            "whole input",
        ),
        # A window just past the input, within its padding: the divisor counts the padding.
        (nn.AvgPool2d(9, 4, 1, ceil_mode=True), (1, 2, 7, 7), "whole input"),
        (nn.MaxPool2d(1280, ceil_mode=True), (1, 4, 7, 7), "whole input"),
        (nn.MaxPool2d(9, 4, 1, ceil_mode=True), (1, 2, 7, 7), "whole input"),
        (nn.AvgPool1d(100, ceil_mode=True), (2, 3, 7), "whole input"),
        (nn.MaxPool1d(100, ceil_mode=True), (2, 3, 7), "whole input"),
        (nn.MaxPool3d(4, 4, padding=1, ceil_mode=True), (1, 2, 2, 2, 2), "whole input"),
        (nn.MaxPool3d(5, 5, ceil_mode=True), (1, 2, 3, 4, 5), "whole input"),
        # One axis past its input, the other windowed: that axis clipped.
        (nn.AvgPool2d((40, 3), (40, 2), ceil_mode=True), (1, 2, 7, 9), "clipped"),
        (nn.MaxPool2d((40, 3), (40, 2), ceil_mode=True), (1, 2, 7, 9), "clipped"),
        (nn.AvgPool2d((40, 3), (40, 2), (1, 1), ceil_mode=True), (1, 2, 7, 9), "clipped"),
    ],
    ids=[
        "efficientnet",
        "avg padded",
        "avg padded excluded",
        "avg within padding",
        "max",
        "max within padding",
        "avg1d",
        "max1d",
        "max3d padded",
        "max3d",
        "avg one axis",
        "max one axis",
        "avg one axis padded",
    ],
)
def test_a_window_past_the_input_reads_it_as_torch_does(pool, shape, form):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    mod, _ = tir_byoc.frontend.import_torch(pool.eval(), (x,))
    sites, declines = pooling.find(mod)
    assert [s.form for s in sites] == [form] and declines == ()
    with torch.no_grad():
        expected = pool(x).numpy()
    got = _run(pooling.rewrite(mod, sites), x.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def _loop_extents(mod: tvm.IRModule) -> list[int]:
    extents = []
    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc):
            tvm_ffi.structural_walk(func, (tirx.For, lambda loop: extents.append(loop.extent)))
    return [int(e) for e in extents]


def test_the_efficientnet_pool_loops_over_the_input_only(monkeypatch):
    pool = nn.AvgPool2d(1280, ceil_mode=True).eval()
    x = torch.randn(1, 3, 7, 7)
    mod, _ = tir_byoc.frontend.import_torch(pool, (x,))
    # Each loop runs over an axis of the input, the window's included.
    assert max(_loop_extents(pipeline.lower(mod))) == 7
    without = tuple(p for p in pipeline.BEFORE_LEGALIZE if p is not ClipPoolWindows)
    monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", without)
    # Without the clip: the input padded to 1286 x 1286, and a window of 1280 x 1280.
    assert max(_loop_extents(pipeline.lower(mod))) >= 1280


def test_a_model_built_with_the_pool_agrees_with_torch():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AvgPool2d(1280, ceil_mode=True))
    model = model.eval()
    x = torch.randn(2, 3, 9, 9)
    built = tir_byoc.build_model(model, (x,))
    with torch.no_grad():
        expected = model(x).numpy()
    np.testing.assert_allclose(built(x).numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "pool",
    [nn.AvgPool2d(3, 2, ceil_mode=True), nn.MaxPool2d(3, 2, 1), nn.AvgPool2d(7)],
    ids=["ceil mode", "padded", "exactly the input"],
)
def test_windows_inside_the_padded_input_are_no_candidate(pool):
    mod, _ = tir_byoc.frontend.import_torch(pool.eval(), (torch.randn(1, 2, 7, 7),))
    assert pooling.find(mod) == ((), ())
    assert pooling.rewrite(mod, ()) is mod


# fmt: off
@I.ir_module
class Dilated:
    @R.function
    def main(x: R.Tensor((1, 2, 7, 7), "float32")):
        with R.dataflow():
            y = R.nn.max_pool2d(x, pool_size=[5, 5], strides=[5, 5], dilation=[2, 2],
                                ceil_mode=True)
            R.output(y)
        return y


@I.ir_module
class Asymmetric:
    @R.function
    def main(x: R.Tensor((1, 2, 7, 7), "float32")):
        with R.dataflow():
            y = R.nn.avg_pool2d(x, pool_size=[40, 40], strides=[40, 40], padding=[1, 1, 0, 0],
                                ceil_mode=True, count_include_pad=True)
            R.output(y)
        return y


@I.ir_module
class ChannelsLast:
    @R.function
    def main(x: R.Tensor((1, 7, 7, 2), "float32")):
        with R.dataflow():
            y = R.nn.avg_pool2d(x, pool_size=[40, 40], strides=[40, 40], ceil_mode=True,
                                layout="NHWC")
            R.output(y)
        return y
# fmt: on


@pytest.mark.parametrize(
    ("mod", "reason"),
    [
        (Dilated, "dilation [2, 2]; the clip reads windows of dilation 1"),
        (Asymmetric, "padding [1, 1, 0, 0] differs before and after"),
        (ChannelsLast, "layouts NHWC/NHWC; the clip reads NCHW"),
    ],
    ids=["dilated", "asymmetric padding", "channels last"],
)
def test_a_pool_past_its_input_that_cannot_be_clipped_stays_and_says_why(mod, reason):
    sites, (decline,) = pooling.find(mod)
    assert sites == () and not decline
    assert decline.what == pooling.POOL_CLIP and decline.blocks == ("y",)
    assert decline.reason.startswith(reason), decline.reason
    tvm.ir.assert_structural_equal(ClipPoolWindows()(mod), mod)


def test_anything_but_a_module_is_refused_in_one_line():
    with pytest.raises(TypeError, match=r"^tir_byoc.relax.pooling: expected a tvm.IRModule"):
        pooling.find(Dilated["main"])
