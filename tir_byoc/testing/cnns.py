"""The convolutional networks the tests and the benchmarks build: random weights, batch norm
calibrated on random batches, nothing downloaded.

:data:`CNNS`: ResNet-50, MobileNetV2 and a VGG-like network at 224 x 224 (``small=True``: a
few channels at 32 x 32, for tests).  Like :mod:`.models`, this module imports neither torch
nor transformers itself: its builders do, when called.
"""

from __future__ import annotations

from collections.abc import Callable

from .models import RealModel, from_config, last_hidden_state


def calibrate_batch_norm(model, shape: tuple, batches: int = 4, seed: int = 2):
    """Set every batch norm's running statistics to the average over ``batches`` random
    batches of ``shape`` run in train mode (weights unchanged), so that eval mode normalises
    with statistics that are not the identity; returns ``model`` in eval mode."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches
    generator = torch.Generator().manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(*shape, generator=generator))
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    return model.eval()


def _cnn(name, model, image, batch):
    """``model`` (its ``pixel_values`` logits when it is transformers') calibrated on images
    of ``image`` x ``image``, with one batch of them as its input."""
    import torch

    shape = (batch, 3, image, image)
    if not isinstance(model, torch.nn.Sequential):
        model = last_hidden_state(model, "pixel_values", output="logits")
    calibrate_batch_norm(model, (max(batch, 4), 3, image, image))
    return RealModel(
        name, model, (torch.randn(*shape, generator=torch.Generator().manual_seed(1)),)
    )


def resnet50(small: bool = False, batch: int = 1) -> RealModel:
    """ResNet-50 (transformers' ``ResNetConfig`` defaults: bottlenecks of depths 3, 4, 6, 3)
    with a 1000-class head on 224 x 224 images; ``small``: one bottleneck per stage, 8 to 64
    channels, 10 classes, 32 x 32."""
    small_settings = dict(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 48, 64], embedding_size=8)
    settings = dict(small_settings if small else {}, num_labels=10 if small else 1000)
    model = from_config("ResNetConfig", "ResNetForImageClassification", settings)
    return _cnn("resnet50", model, 32 if small else 224, batch)


def mobilenet_v2(small: bool = False, batch: int = 1) -> RealModel:
    """MobileNetV2 (``MobileNetV2Config`` defaults: inverted residuals of depthwise
    convolutions, ReLU6) with a 1000-class head on 224 x 224 images; ``small``: a quarter of
    the widths, 10 classes, 32 x 32."""
    settings = dict(depth_multiplier=0.25, num_labels=10) if small else dict(num_labels=1000)
    model = from_config("MobileNetV2Config", "MobileNetV2ForImageClassification", settings)
    return _cnn("mobilenet_v2", model, 32 if small else 224, batch)


#: The VGG-like network's 3 x 3 convolutions (output channels) and max poolings ("M").
VGG_LAYERS = (32, "M", 64, "M", 128, 128, "M", 256, 256, "M", 256, 256, "M")


def vgg(small: bool = False, batch: int = 1) -> RealModel:
    """A VGG-like network of plain torch.nn layers: 3 x 3 convolutions with batch norm and
    ReLU, five max poolings, then Linear, ReLU, Linear (1000 classes) on 224 x 224 images;
    ``small``: an eighth of the channels, three poolings, 10 classes, 32 x 32."""
    import torch

    nn = torch.nn
    widths = [w if w == "M" else w // 8 for w in VGG_LAYERS[:7]] if small else VGG_LAYERS
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layers, channels = [], 3
        for width in widths:
            if width == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
        side = (32 if small else 224) // 2 ** widths.count("M")
        hidden, classes = (64, 10) if small else (512, 1000)
        model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * side * side, hidden),
                              nn.ReLU(), nn.Linear(hidden, classes))  # fmt: skip
    return _cnn("vgg", model, 32 if small else 224, batch)


#: The convolutional networks, by name: ``CNNS[name](small=False, batch=1)``.
CNNS: dict[str, Callable[..., RealModel]] = {f.__name__: f for f in (resnet50, mobilenet_v2, vgg)}
