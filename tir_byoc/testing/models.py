"""The models the tests and the benchmarks build, written once: random weights, nothing downloaded.

Each is built from a transformers config (or torch.nn layers) with torch's seed fixed, with the
inputs it is exported and run with (:class:`RealModel`).  This module imports neither torch
nor transformers itself: its builders do, when called.

- :data:`MODELS`: the real-model tests' small models (hidden 64, 2 layers, 4 heads, batch 2,
  sequence 16), and :func:`convnext`; :data:`AOT_MODELS`, the AOT tests' models;
- :func:`from_config`, :func:`inputs_for`, :func:`last_hidden_state` and :func:`causal_logits`:
  what a table of architectures (``benchmarks/zoo.py``, ``benchmarks/models.py``) builds with;
- the convolutional networks are in :mod:`.cnns`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The models are built from configs; transformers must never reach for the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Batch and sequence length of every small model's input.
BATCH, SEQUENCE = 2, 16
#: The small models' sizes: hidden, layers, heads, key/value heads (grouped-query attention),
#: feed-forward, vocabulary and positions.
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, POSITIONS = 64, 2, 4, 2, 128, 100, 32
HEAD_DIM = HIDDEN // HEADS
#: The config fields BERT-like configs name this way (LLaMA, GPT-NeoX, DeBERTa...).
BERT_LIKE = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE,
    vocab_size=VOCAB,
    max_position_embeddings=POSITIONS,
)
#: A vision transformer's: 32 x 32 images in patches of 8 x 8.
VISION = dict(
    {k: v for k, v in BERT_LIKE.items() if k not in ("vocab_size", "max_position_embeddings")},
    image_size=32,
    patch_size=8,
)
#: DeBERTa-v3's relative attention: content to position and back, log-bucketed positions,
#: keys shared between content and position.
DEBERTA_V3 = dict(
    relative_attention=True,
    pos_att_type=["p2c", "c2p"],
    position_buckets=16,
    max_relative_positions=-1,
    share_att_key=True,
    norm_rel_ebd="layer_norm",
)
#: A small Wav2Vec2's convolutions: two in its feature extractor (strides 5 and 2: 400 raw
#: samples make 39 frames) and its positional convolution in 4 groups, a kernel of 16.
WAV2VEC2_CONVOLUTIONS = dict(
    conv_dim=(32, 32),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
)
WAV2VEC2_SAMPLES = 400


@dataclass(frozen=True)
class RealModel:
    """A torch model in eval mode and the arguments it is exported and run with."""

    name: str
    module: Any  # torch.nn.Module
    inputs: tuple  # of torch.Tensor


@functools.cache
def _classes():
    """The torch.nn.Module classes of this module, defined when torch is first needed."""
    import torch

    from tir_byoc.frontend import causal_mask

    nn = torch.nn

    class Output(nn.Module):
        """``forward(x)``: the model's ``output`` (``last_hidden_state``, ``logits``) for
        ``argument=x``, with ``attention_mask=mask`` when a mask is given."""

        def __init__(self, model, argument, mask, output):
            super().__init__()
            self.encoder = model
            self.argument, self.output = argument, output
            self.register_buffer("mask", mask)

        def forward(self, x):
            masks = {} if self.mask is None else {"attention_mask": self.mask}
            return getattr(self.encoder(**{self.argument: x}, **masks), self.output)

    class Logits(nn.Module):
        """A decoder's logits under the additive float causal mask eager attention adds:
        transformers builds its mask from boolean comparisons that TVM 0.27 imports but
        cannot compile, and uses a 4-D mask as given.  ``kind``: ``"decoder"``,
        ``"decoder-positions"`` (explicit position ids: OPT derives them from a 2-D mask) or
        ``"decoder-own-mask"`` (no mask: Bloom builds its alibi from a 2-D one)."""

        def __init__(self, model, sequence, kind):
            super().__init__()
            self.decoder, self.kind = model, kind
            self.register_buffer("mask", causal_mask(sequence))
            if kind == "decoder-positions":
                self.register_buffer("positions", torch.arange(sequence)[None])

        def forward(self, ids):
            if self.kind == "decoder-own-mask":
                return self.decoder(input_ids=ids, use_cache=False).logits
            extra = {"position_ids": self.positions} if self.kind == "decoder-positions" else {}
            return self.decoder(
                input_ids=ids, attention_mask=self.mask, use_cache=False, **extra
            ).logits

    class ForumMLP(nn.Module):
        """800 -> Linear(500) -> ReLU -> Linear(10): dense_bias_relu, then dense_bias."""

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(800, 500), nn.Linear(500, 10)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    class SmallCNN(nn.Module):
        """Two 3 x 3 convolutions with batch norm, ReLU and max pooling, then a classifier."""

        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            )  # fmt: skip
            self.classifier = nn.Linear(16, 10)

        def forward(self, x):
            return self.classifier(self.features(x))

    return Output, Logits, ForumMLP, SmallCNN


def last_hidden_state(model, argument="input_ids", mask=None, output="last_hidden_state"):
    """``forward(x)`` -> ``model(argument=x).last_hidden_state`` (or ``output``), in eval mode."""
    return _classes()[0](model.eval(), argument, mask, output).eval()


def causal_logits(model, sequence=SEQUENCE, kind="decoder"):
    """``forward(ids)`` -> the decoder's logits under a prepared causal mask, in eval mode."""
    return _classes()[1](model.eval(), sequence, kind).eval()


def from_config(config_class: str, model_class, settings: dict, model_args=None, part=None):
    """``model_class`` (a class, or a name in transformers: ``"BertModel"``,
    ``"models.whisper.modeling_whisper.WhisperEncoder"``) built from
    ``<config_class>(**settings)`` with eager attention, its weights drawn with torch's seed 0,
    in eval mode; ``part``: a method giving the part to keep (BART's ``get_encoder``)."""
    import importlib

    import torch
    import transformers

    config = getattr(transformers, config_class)(**settings, attn_implementation="eager")
    if isinstance(model_class, str):
        path, _, name = model_class.rpartition(".")
        owner = importlib.import_module(f"transformers.{path}") if path else transformers
        model_class = getattr(owner, name)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = model_class(config, **(model_args or {})).eval()
    return getattr(model, part)().eval() if part else model


def inputs_for(kind: str, seed: int) -> tuple:
    """The small models' input of ``kind`` (``"tokens"``, ``"vision"``: 32 x 32 images,
    ``"audio"``: 32 frames of 16 mel bins, ``"waveform"``: raw samples, ``"video"``: 4 frames
    of 32 x 32), drawn from a generator seeded with ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    if kind == "tokens":
        return (torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=generator),)
    return (torch.randn(*INPUTS[kind][1], generator=generator),)


#: Each input kind's argument name and shape (a token kind's: ``(BATCH, SEQUENCE)``).
INPUTS = {
    "tokens": ("input_ids", (BATCH, SEQUENCE)),
    "vision": ("pixel_values", (BATCH, 3, 32, 32)),
    "audio": ("input_features", (BATCH, 16, 2 * SEQUENCE)),
    "waveform": ("input_values", (BATCH, WAV2VEC2_SAMPLES)),
    "video": ("pixel_values", (BATCH, 4, 3, 32, 32)),
}


def _encoder(name, kind, seed, config_class, model_class, settings, model_args=None):
    model = from_config(config_class, model_class, settings, model_args)
    return RealModel(name, last_hidden_state(model, INPUTS[kind][0]), inputs_for(kind, seed))


def _decoder(name, seed, config_class, model_class, **settings):
    model = from_config(config_class, model_class, dict(settings, use_cache=False))
    return RealModel(name, causal_logits(model), inputs_for("tokens", seed))


def _draw_scales(model, attribute: str, seed: int):
    """Layer scales (which start as ones) drawn in [0.5, 1.5), so a scale read at the wrong
    channel shows."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            scale = getattr(module, attribute, None)
            if scale is not None:
                scale.copy_(torch.rand(scale.shape, generator=generator) + 0.5)
    return model


def bert() -> RealModel:
    """A two-layer BERT encoder without its pooler (``last_hidden_state`` does not use it);
    no attention mask."""
    return _encoder("bert", "tokens", 1, "BertConfig", "BertModel", BERT_LIKE,
                    {"add_pooling_layer": False})  # fmt: skip


def deberta() -> RealModel:
    """DeBERTa-v2 with DeBERTa-v3's relative attention; its buckets divide integer tensors,
    which TVM 0.27 imports as an integer division (:func:`tir_byoc.frontend.divide_in_float`)."""
    settings = dict(BERT_LIKE, **DEBERTA_V3)
    return _encoder("deberta", "tokens", 6, "DebertaV2Config", "DebertaV2Model", settings)


def clip_text() -> RealModel:
    """A CLIP text encoder: its ``quick_gelu`` is the swish op with alpha 1.702."""
    settings = dict(BERT_LIKE, pad_token_id=1, bos_token_id=0, eos_token_id=2)
    return _encoder("clip_text", "tokens", 7, "CLIPTextConfig", "CLIPTextModel", settings)


def vit() -> RealModel:
    """A ViT on 32 x 32 images: its patch embedding is a convolution of stride 8."""
    return _encoder("vit", "vision", 8, "ViTConfig", "ViTModel", VISION,
                    {"add_pooling_layer": False})  # fmt: skip


def dinov2() -> RealModel:
    """A DINOv2: a ViT whose attention and MLP outputs are multiplied by a per-channel layer
    scale before the residual add (the epilogue op ``channel_scale``), scales drawn."""
    settings = dict(
        {k: v for k, v in VISION.items() if k != "intermediate_size"},
        mlp_ratio=INTERMEDIATE // HIDDEN,
    )
    model = _draw_scales(from_config("Dinov2Config", "Dinov2Model", settings), "lambda1", 12)
    return RealModel("dinov2", last_hidden_state(model, "pixel_values"), inputs_for("vision", 9))


def convnext() -> RealModel:
    """A two-stage ConvNeXt on 32 x 32 images: its 7 x 7 depthwise convolutions are no GEMM
    and stay TVM code.  Not in :data:`MODELS` (none of that work goes to a library); layer
    scales drawn (the epilogue op ``channel_scale``)."""
    settings = dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32,
                    patch_size=4)  # fmt: skip
    model = from_config("ConvNextConfig", "ConvNextModel", settings)
    model = _draw_scales(model, "layer_scale_parameter", 13)
    return RealModel("convnext", last_hidden_state(model, "pixel_values"),
                     inputs_for("vision", 10))  # fmt: skip


def whisper_encoder() -> RealModel:
    """A Whisper encoder on 32 frames of 16 mel bins: two convolutions with a GELU each."""
    settings = dict(d_model=HIDDEN, encoder_layers=LAYERS, encoder_attention_heads=HEADS,
                    encoder_ffn_dim=INTERMEDIATE, vocab_size=VOCAB, num_mel_bins=16,
                    max_source_positions=SEQUENCE, use_cache=False)  # fmt: skip
    encoder = "models.whisper.modeling_whisper.WhisperEncoder"
    return _encoder("whisper_encoder", "audio", 9, "WhisperConfig", encoder, settings)


def wav2vec2() -> RealModel:
    """A Wav2Vec2 on 400 raw samples: two strided convolutions, and a positional convolution
    in 4 groups served as one batched GEMM."""
    settings = dict(BERT_LIKE, **WAV2VEC2_CONVOLUTIONS)
    return _encoder("wav2vec2", "waveform", 10, "Wav2Vec2Config", "Wav2Vec2Model", settings)


def llama() -> RealModel:
    """A LLaMA decoder with grouped-query attention (4 heads, 2 key/value heads)."""
    return _decoder("llama", 2, "LlamaConfig", "LlamaForCausalLM", **BERT_LIKE,
                    num_key_value_heads=KV_HEADS)  # fmt: skip


def gpt2() -> RealModel:
    """A GPT-2 decoder: its tanh gelu is written in Python (``gelu_new``)."""
    return _decoder("gpt2", 4, "GPT2Config", "GPT2LMHeadModel", n_embd=HIDDEN, n_layer=LAYERS,
                    n_head=HEADS, n_inner=INTERMEDIATE, vocab_size=VOCAB, n_positions=POSITIONS,
                    bos_token_id=0, eos_token_id=0)  # fmt: skip


def gpt_neox() -> RealModel:
    """A GPT-NeoX decoder: attention and MLP in parallel, both added to the layer's input."""
    return _decoder("gpt_neox", 7, "GPTNeoXConfig", "GPTNeoXForCausalLM", **BERT_LIKE)


def falcon() -> RealModel:
    """A Falcon decoder: multi-query attention, attention and MLP in parallel, a q/k/v split
    with negative indices (:mod:`tir_byoc.relax.wrap_indices`)."""
    settings = {k: v for k, v in BERT_LIKE.items() if k != "intermediate_size"}
    return _decoder("falcon", 5, "FalconConfig", "FalconForCausalLM", **settings,
                    ffn_hidden_size=INTERMEDIATE, bos_token_id=0, eos_token_id=0)  # fmt: skip


def encoder_layer() -> RealModel:
    """torch's own ``nn.TransformerEncoderLayer`` (``nn.MultiheadAttention`` inside)."""
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            HIDDEN, HEADS, INTERMEDIATE, batch_first=True, dropout=0.0
        ).eval()
    x = torch.randn(BATCH, SEQUENCE, HIDDEN, generator=torch.Generator().manual_seed(3))
    return RealModel("encoder_layer", layer, (x,))


#: The real-model tests' models, by name.
_TESTED = (bert, deberta, clip_text, vit, dinov2, whisper_encoder, wav2vec2, llama, gpt2)
MODELS: dict[str, Callable[[], RealModel]] = {
    f.__name__: f for f in (*_TESTED, gpt_neox, falcon, encoder_layer)
}


# --------------------------------------------------------------------------------------
# The AOT tests' models
# --------------------------------------------------------------------------------------


def _seeded(build):
    import torch

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build().eval()


def forum_mlp(batch: int = 64) -> RealModel:
    """The forum thread's model, ``tir_byoc.demo``'s MLP as torch, on ``batch`` rows."""
    import torch

    inputs = (torch.randn(batch, 800, generator=torch.Generator().manual_seed(1)),)
    return RealModel("forum_mlp", _seeded(_classes()[2]), inputs)


def small_cnn() -> RealModel:
    """The small CNN on 2 images of 16 x 16, its batch norm's statistics drawn."""
    import torch

    model = _seeded(_classes()[3])
    with torch.no_grad():
        norm = model.features[1]
        norm.running_mean.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
        norm.running_var.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(3))
    inputs = (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
    return RealModel("small_cnn", model, inputs)


#: The AOT tests' and ``benchmarks/aot.py``'s models, by name.
AOT_MODELS: dict[str, Callable[[], RealModel]] = {
    f.__name__: f for f in (forum_mlp, small_cnn, bert, gpt2)
}
