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
