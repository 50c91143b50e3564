"""The models the AOT tests and ``benchmarks/aot.py`` build: small, random weights, CPU.

Each builder returns a :class:`real_models.RealModel`, a torch model in eval mode with the
inputs it is exported and run with.  The transformers models are the real-model tests' own
(:func:`real_models.bert`, :func:`real_models.gpt2`); the forum MLP is the one of
``tir_byoc.demo`` as a torch model, 64 x 800 -> Linear(500) -> ReLU -> Linear(10), and the
CNN a small convolution, batch norm, pooling and Linear.
"""

from __future__ import annotations

import torch

from support.real_models import RealModel, bert, gpt2


class ForumMLP(torch.nn.Module):
    """The forum thread's model: dense_bias_relu, then dense_bias."""

    def __init__(self, in_features=800, hidden=500, out_features=10):
        super().__init__()
        self.fc1 = torch.nn.Linear(in_features, hidden)
        self.fc2 = torch.nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class SmallCNN(torch.nn.Module):
    """Two 3 x 3 convolutions with batch norm, ReLU and max pooling, then a classifier."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )
        self.classifier = torch.nn.Linear(16, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def _seeded(build):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build().eval()


def forum_mlp(batch: int = 64) -> RealModel:
    inputs = (torch.randn(batch, 800, generator=torch.Generator().manual_seed(1)),)
    return RealModel("forum_mlp", _seeded(ForumMLP), inputs)


def small_cnn() -> RealModel:
    model = _seeded(SmallCNN)
    with torch.no_grad():  # batch norm statistics that are not the identity
        norm = model.features[1]
        norm.running_mean.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
        norm.running_var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(3))
    inputs = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
    return RealModel("small_cnn", model, inputs)


MODELS = {"forum_mlp": forum_mlp, "small_cnn": small_cnn, "bert": bert, "gpt2": gpt2}
