"""Torch operators that TVM 0.27 imports or builds wrongly, built by tir_byoc with torch's
values or refused in one line.

Each test builds a tiny module with :func:`tir_byoc.build_model` and compares it with torch
eager.
"""

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import tir_byoc

GENERATOR = torch.Generator().manual_seed(5)


class Lambda(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *inputs):
        return self.function(*inputs)


def _assert_as_torch(module, *inputs, rtol=1e-5, atol=1e-6):
    built = tir_byoc.build_model(module.eval(), inputs)
    got, expected = built(*inputs), module(*inputs)
    if isinstance(expected, torch.Tensor):
        got, expected = (got,), (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=rtol, atol=atol)
    return built


@pytest.mark.parametrize(
    "median",
    [torch.median, lambda x: torch.median(x, dim=1), lambda x: torch.median(x, 0, keepdim=True)],
    ids=["whole", "dim=1", "dim=0, keepdim"],
)
def test_a_median_is_built_and_gives_torch_values(median):
    """TVM sorts through a packed call, whose handles have no dtype: the default schedule's
    exp/erf expansion raised on them (``'PointerType' object has no attribute 'dtype'``)."""
    x = torch.randn(5, 7, generator=GENERATOR)
    _assert_as_torch(Lambda(median), x)


@pytest.mark.parametrize(
    "activation",
    [
        torch.nn.SELU(),
        Lambda(torch.nn.functional.selu),
        torch.nn.ELU(alpha=0.5),
        torch.nn.CELU(alpha=0.7),
        Lambda(lambda x: torch.ops.aten.elu(x, 1.2, 0.8, 1.5)),
    ],
    ids=["nn.SELU", "F.selu", "ELU(0.5)", "CELU(0.7)", "aten.elu with both scales"],
)
def test_elu_and_its_scaled_forms_give_torch_values(activation):
    """SELU reaches TVM as ``aten.elu(x, alpha, scale)``; TVM 0.27 dropped the scale."""
    x = torch.randn(4, 33, generator=GENERATOR) * 3
    _assert_as_torch(activation, x)


def _grid_sample(mode, padding_mode, align_corners):
    return Lambda(
        lambda x, grid: torch.nn.functional.grid_sample(
            x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
        )
    )


def _grid():
    """A lattice of quarter steps over [-2, 2] (pixel centres, edges and the ties of
    ``nearest``) whose first rows are random points in [-4, 4] (padded, and reflected more
    than once)."""
    steps = torch.arange(-8, 9, dtype=torch.float32) / 4
    y, x = torch.meshgrid(steps, steps, indexing="ij")
    grid = torch.stack([x, y], -1).expand(2, -1, -1, -1).clone()
    grid[:, :4] = torch.rand(2, 4, 17, 2, generator=GENERATOR) * 8 - 4
    return grid


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_gives_torch_values_in_every_mode(mode, padding_mode, align_corners):
    """TVM 0.27 read torch's (N, H, W, 2) grid as (N, 2, H, W)."""
    x = torch.randn(2, 3, 5, 7, generator=GENERATOR)
    _assert_as_torch(_grid_sample(mode, padding_mode, align_corners), x, _grid(), atol=1e-5)


def test_grid_sample_reflecting_an_axis_of_one_with_aligned_corners_is_refused():
    x = torch.randn(1, 2, 1, 6, generator=GENERATOR)
    grid = torch.rand(1, 3, 4, 2, generator=GENERATOR) * 2 - 1
    with pytest.raises(tir_byoc.UnsupportedModel) as refused:
        tir_byoc.build_model(_grid_sample("bilinear", "reflection", True).eval(), (x, grid))
    message = str(refused.value)
    assert "\n" not in message
    assert "padding_mode='reflection' and align_corners=True" in message
    assert "use align_corners=False or padding_mode='border'" in message
    # On the other side of the same input, the same reflection builds.
    _assert_as_torch(_grid_sample("bilinear", "reflection", False), x, grid, atol=1e-5)


@pytest.mark.parametrize(
    "arithmetic",
    [
        lambda a, b: a + b,
        lambda a, b: a * b,
        torch.maximum,
        torch.minimum,
        lambda a, b: a[:1] + b[:, :1],
        lambda a, b: (a + True, False * b),
        lambda a, b: torch.add(a, b, alpha=True),
        lambda a, b: (a + b).sum() + a * b.float(),
    ],
    ids=["a + b", "a * b", "maximum", "minimum", "broadcast", "scalars", "alpha", "mixed"],
)
def test_arithmetic_on_booleans_gives_torch_logic(arithmetic):
    """TVM 0.27 compiles ``+`` on bools as a float addition and fails; torch means or by it."""
    a = torch.rand(3, 4, generator=GENERATOR) > 0.5
    b = torch.rand(3, 4, generator=GENERATOR) > 0.5
    _assert_as_torch(Lambda(arithmetic), a, b, rtol=0, atol=0)
