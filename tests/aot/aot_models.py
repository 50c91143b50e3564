"""The models the AOT tests and ``benchmarks/aot.py`` build: small, random weights, CPU.

Each builder returns an :class:`AotModel`, a torch model in eval mode with the inputs it is
exported and run with.  The transformers models are built from configs (nothing is
downloaded), with eager attention and, for the decoder, no cache and a prepared float causal
mask: what TVM 0.27's importer takes (``docs`` of tir_byoc.frontend).  The forum MLP is the one
of ``tir_byoc.demo`` as a torch model: 64 x 800 -> Linear(500) -> ReLU -> Linear(10).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import tir_byoc

#: Batch and sequence length of the transformers models' token ids.
BATCH, SEQUENCE = 2, 16
#: Hidden size, heads, feed-forward size, vocabulary of the transformers models.
HIDDEN, HEADS, INTERMEDIATE, VOCAB = 64, 4, 128, 100


@dataclass(frozen=True)
class AotModel:
    """A torch model in eval mode and the example inputs it is built and run with."""

    name: str
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]


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


class LastHiddenState(torch.nn.Module):
    """``forward(ids)`` -> a transformers encoder's ``last_hidden_state``."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, ids):
        return self.encoder(input_ids=ids).last_hidden_state


class CausalLogits(torch.nn.Module):
    """``forward(ids)`` -> a decoder's logits under a prepared additive causal mask."""

    def __init__(self, decoder, sequence):
        super().__init__()
        self.decoder = decoder
        self.register_buffer("mask", tir_byoc.frontend.causal_mask(sequence))

    def forward(self, ids):
        return self.decoder(input_ids=ids, attention_mask=self.mask, use_cache=False).logits


def _seeded(build):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build().eval()


def _token_ids(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=generator)


def forum_mlp(batch: int = 64) -> AotModel:
    inputs = (torch.randn(batch, 800, generator=torch.Generator().manual_seed(1)),)
    return AotModel("forum_mlp", _seeded(ForumMLP), inputs)


def small_cnn() -> AotModel:
    model = _seeded(SmallCNN)
    with torch.no_grad():  # batch norm statistics that are not the identity
        norm = model.features[1]
        norm.running_mean.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
        norm.running_var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(3))
    inputs = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
    return AotModel("small_cnn", model, inputs)


def bert() -> AotModel:
    """A two-layer BERT encoder (no pooler, no attention mask)."""
    import transformers

    config = transformers.BertConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    model = _seeded(
        lambda: LastHiddenState(transformers.BertModel(config, add_pooling_layer=False))
    )
    return AotModel("bert", model, (_token_ids(1),))


def gpt2() -> AotModel:
    """A two-layer GPT-2 decoder (its tanh gelu written out in Python, as transformers does)."""
    import transformers

    config = transformers.GPT2Config(
        n_embd=HIDDEN,
        n_layer=2,
        n_head=HEADS,
        n_inner=INTERMEDIATE,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_implementation="eager",
    )
    model = _seeded(lambda: CausalLogits(transformers.GPT2LMHeadModel(config), SEQUENCE))
    return AotModel("gpt2", model, (_token_ids(4),))


MODELS = {"forum_mlp": forum_mlp, "small_cnn": small_cnn, "bert": bert, "gpt2": gpt2}
