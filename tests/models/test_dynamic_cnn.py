"""A CNN built once for every batch: channels-last, its convolutions the library's at any batch.

The zoo's small MobileNetV2 and ResNet-50 (transformers' configs, random weights, batch norm
calibrated) are built with a symbolic batch in 1..32 and called at batch 1, 3, 8 and 17, each
result equal to torch's; every convolution is a library call (its weight packed once, for one
batch) and every batch norm folded into one.
"""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

import tir_byoc
from tir_byoc.relax import channels_last
from tir_byoc.testing import cnns


@pytest.fixture(scope="module", params=["mobilenet_v2", "resnet50"])
def built(request):
    model = cnns.CNNS[request.param](small=True, batch=2)
    with pytest.MonkeyPatch.context() as env:
        env.delenv(tir_byoc.registry.BACKENDS_ENV, raising=False)
        dynamic = tir_byoc.build_model(
            model.module, model.inputs, dynamic={0: {0: ("batch", 1, 32)}}
        )
    return model, dynamic


def _logits(output):
    return (output[0] if isinstance(output, (tuple, list)) else output).numpy()


@pytest.mark.parametrize("batch", [1, 3, 8, 17])
def test_every_batch_agrees_with_torch(built, batch):
    model, dynamic = built
    x = torch.randn(
        batch, *model.inputs[0].shape[1:], generator=torch.Generator().manual_seed(batch)
    )
    with torch.no_grad():
        expected = _logits(model.module(x))
    np.testing.assert_allclose(_logits(dynamic(x)), expected, rtol=1e-4, atol=1e-4)


def test_every_convolution_is_a_library_call_in_nhwc_at_a_symbolic_batch(built):
    model, dynamic = built
    x = torch.randn(3, *model.inputs[0].shape[1:])
    profile = dynamic.profile(x, repeat=1, warmup=0)
    convolutions = [f for f in profile.functions if "conv2d" in f.name]
    assert convolutions and all(f.offloaded for f in convolutions), [
        (f.name, f.code) for f in convolutions if not f.offloaded
    ]
    assert not [d for d in dynamic.declines if d.what == channels_last.CHANNELS_LAST]
    assert not [d for d in dynamic.declines if "batch_norm" in str(d.nearest)]
