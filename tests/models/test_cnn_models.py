"""Convolutional networks end to end: batch norms folded (or a scale and a shift), results equal
torch's.

The model zoo's ResNet-50, MobileNetV2 and VGG-like network (:data:`tir_byoc.testing.cnns.CNNS`,
``small=True``: transformers' configs with few channels, random weights, batch-norm statistics
calibrated on random batches in training mode) go the way a user's model goes, as
:mod:`support.real_models` takes them: ``torch.export`` -> Relax -> the lowering (batch norms
folded, :mod:`tir_byoc.relax.batch_norm`) -> :func:`tir_byoc.offload` -> the Relax VM.  An
EfficientNet, built here, has the final pooling whose window reaches far past its input
(:mod:`tir_byoc.relax.pooling`).

The batch is 2: with batch 1, a 1 x 1 feature map's residual add has the shape of a
convolution's bias, (1, O, 1, 1), and the convolution rewrite takes it for one.
"""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import tvm_ffi
from support import real_models
from tvm import tirx

import tir_byoc
from tir_byoc.relax import batch_norm, pipeline, pooling
from tir_byoc.testing import cnns, models

BATCH = 2


@pytest.fixture(scope="module", params=list(cnns.CNNS))
def compiled(request):
    """One CNN lowered, offloaded with every available backend, and built: once per model."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(tir_byoc.registry.BACKENDS_ENV, raising=False)
        return real_models.compile_model(cnns.CNNS[request.param](small=True, batch=BATCH))


def _batch_norms(module) -> int:
    return sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())


def test_every_batch_norm_is_folded_or_a_scale_and_shift(compiled):
    """Each batch norm is folded into the convolution or Linear before it, except after a
    convolution of one group without a bias (ResNet's, MobileNetV2's 1 x 1), where it is a
    scale and a shift that says why (``batch_norm.FOLD_INTO_UNBIASED_CONVOLUTIONS``)."""
    model = compiled.model
    mod, _ = tir_byoc.frontend.import_torch(model.module, model.inputs)
    sites, declines = batch_norm.find(mod)
    assert len(sites) == _batch_norms(model.module)
    scaled = [s for s in sites if isinstance(s, batch_norm.ScaleShift)]
    assert len(declines) == len(scaled)
    assert all("its convolution has no bias" in d.reason for d in declines), declines
    # VGG's convolutions have biases: all folded.  ResNet's have none: none folded.
    assert {"vgg": len(scaled) == 0, "resnet50": len(scaled) == len(sites)}.get(model.name, True)
    assert not [g.name_hint for g in compiled.offloaded.functions if "batch_norm" in g.name_hint]


def test_the_offloaded_cnn_agrees_with_torch(compiled):
    result = compiled.run()
    # Calibrated batch norms keep the activations of order 1, so the comparison means something.
    assert np.abs(compiled.expected).max() > 0.1
    difference = float(np.abs(result - compiled.expected).max())
    np.testing.assert_allclose(
        result,
        compiled.expected,
        rtol=1e-4,
        atol=1e-4,
        err_msg=f"{compiled.model.name}: max abs difference {difference:.3g}",
    )


def test_no_epilogue_stays_behind_an_offloaded_gemm(compiled):
    """A folded shift (or a scale and a shift) and the activation after it run in the call.
    The padding of the next convolution, which ``FuseOps`` fuses after a convolution kept
    whole (MobileNetV2's 1 x 1 before a depthwise one), is a copy for that convolution, not an
    epilogue of this one."""
    left = real_models.epilogues_left_behind(compiled.offloaded)
    assert [line for line in left if "block PadInput reads" not in line] == []


@pytest.mark.parametrize("name", ["resnet50", "vgg"])
def test_every_gemm_flop_of_a_cnn_without_depthwise_convolutions_is_offloaded(name):
    """MobileNetV2's depthwise convolutions are no GEMM, which the FLOP count does not know
    from the others; ResNet's and VGG's convolutions are all GEMMs."""
    model = cnns.CNNS[name](small=True, batch=BATCH)
    total = sum(real_models.torch_gemm_flops(model).values())
    offloaded = tir_byoc.offload(real_models.lower(model))
    calls = real_models.library_calls(offloaded)
    assert sum(c.flops for c in calls) == total, real_models.refusals(offloaded)


def _efficientnet():
    """A small EfficientNet whose pooler is transformers' ``nn.AvgPool2d(hidden_dim,
    ceil_mode=True)``: one window of 320 x 320 over a 2 x 2 map.  The weights are drawn with
    torch's default initialisation and the batch norms' scales and shifts at random, so that
    the activations stay of order 1 through the blocks."""
    import transformers

    torch.manual_seed(0)
    config = transformers.EfficientNetConfig(
        image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320
    )
    model = transformers.EfficientNetModel(config)
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, torch.nn.Conv2d | torch.nn.Linear):
                layer.reset_parameters()
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.normal_()
    model = models.last_hidden_state(model, "pixel_values", output="pooler_output")
    cnns.calibrate_batch_norm(model, (4, 3, 64, 64))
    pixels = torch.randn(BATCH, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    return models.RealModel("efficientnet", model, (pixels,))


def test_efficientnets_pooling_reads_only_its_input_and_agrees_with_torch():
    model = _efficientnet()
    mod, _ = tir_byoc.frontend.import_torch(model.module, model.inputs)
    ((pool,), declines) = pooling.find(mod)
    assert declines == () and pool.form == "whole input" and pool.divisor == 2 * 2
    lowered = pipeline.lower(mod)
    assert not [g.name_hint for g in lowered.functions if "pool" in g.name_hint]
    built = tir_byoc.build_model(model.module, model.inputs)
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(built(*model.inputs).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_without_the_clip_efficientnets_pool_loops_over_its_whole_window(monkeypatch):
    without = tuple(p for p in pipeline.BEFORE_LEGALIZE if p is not pooling.ClipPoolWindows)
    monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", without)
    model = _efficientnet()
    mod, _ = tir_byoc.frontend.import_torch(model.module, model.inputs)
    (pool,) = [f for g, f in pipeline.lower(mod).functions_items() if "pool" in g.name_hint]
    extents = []
    tvm_ffi.structural_walk(pool, (tirx.For, lambda loop: extents.append(loop.extent)))
    assert 320 in [int(e) for e in extents]
