"""Property: a real model of any size, built by tir_byoc, computes what torch computes.

``tests/models/test_real_models.py`` runs twelve architectures at one size each (hidden 64, 4 heads,
batch 2, 16 tokens).  The sizes a user picks reach other paths: one token (a product of one
row), one head, a head dimension of 2, widths that no vector length divides, a feed-forward
narrower than the model, more query heads than key/value heads.  Each example draws an
architecture and its sizes, builds the model from a transformers config (or torch's
``nn.TransformerEncoderLayer``) with random weights, and compares what
:func:`tir_byoc.build_model` makes of it (``torch.export``, tir_byoc's Relax passes, the
offload on the default backend, the default rules) with the eager model: rtol and atol 1e-4,
as for the real models.  It also counts the GEMM FLOPs as ``tests/models/test_real_models.py`` does
(torch's counter against the library calls of the offloaded module): all of them must be
offloaded, at every size.  Encoders give their last hidden state, decoders their logits
under a causal mask (the wrappers of :mod:`tir_byoc.testing.models`):

- ``bert`` (without the pooler); ``deberta``: DeBERTa-v3's relative attention;
  ``clip_text``: CLIP's text encoder (``quick_gelu``, its own causal mask);
- ``gpt2`` (its tanh gelu written in Python); ``llama`` with 1 to all key/value heads
  (grouped-query attention); ``gpt_neox`` and ``falcon``, attention and MLP in parallel
  (Falcon's with one key/value head, split from its fused projection by negative indices);
- ``vit`` on images of 1 to 3 patches of 2 or 4 pixels a side (its patch embedding a
  convolution served as a GEMM); ``whisper``'s encoder on 3 or 16 mel bins (two padded
  convolutions, the second of stride 2);
- torch's ``nn.TransformerEncoderLayer``, relu or gelu, the norm first or last.
"""

from __future__ import annotations

import os

# The models are built from configs; transformers must never reach for the hub.
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import torch
import transformers
from hypothesis import event, given
from hypothesis import strategies as st
from properties.harness import profile
from support import real_models

import tir_byoc
from tir_byoc.testing import models as model_zoo

VOCAB = 50
#: Special tokens inside the small vocabulary (transformers warns of its defaults, 50256...).
_TOKENS_IN_VOCAB = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
ARCHITECTURES = (
    "bert",
    "deberta",
    "clip_text",
    "gpt2",
    "llama",
    "gpt_neox",
    "falcon",
    "vit",
    "whisper",
    "encoder",
)


@st.composite
def models(draw):
    """(architecture, {its sizes}): what :func:`_build` takes."""
    architecture = draw(st.sampled_from(ARCHITECTURES))
    heads = draw(st.integers(1, 4))
    # GPT-NeoX rotates a quarter of each head: at least 2 of its dimensions.  Whisper's
    # sinusoidal positions divide by half its width less one: a width of 2 fails in torch.
    head_dims = {"gpt_neox": [8, 16], "whisper": [4, 6, 16]}.get(architecture, [2, 4, 6, 16])
    sizes = {
        "batch": draw(st.integers(1, 2)),
        "sequence": draw(st.integers(1, 12)),
        "heads": heads,
        "head_dim": draw(st.sampled_from(head_dims)),
        "intermediate": draw(st.sampled_from([4, 12, 40])),
    }
    if architecture == "whisper":
        sizes["mel_bins"] = draw(st.sampled_from([3, 16]))
    if architecture == "vit":  # "sequence": the patches along a side of the image
        sizes["patch"] = draw(st.sampled_from([2, 4]))
        sizes["sequence"] = draw(st.integers(1, 3))
    if architecture == "llama":
        sizes["kv_heads"] = draw(
            st.sampled_from([h for h in range(1, heads + 1) if heads % h == 0])
        )
    if architecture == "encoder":
        sizes["activation"] = draw(st.sampled_from(["relu", "gelu"]))
        sizes["norm_first"] = draw(st.booleans())
    return architecture, sizes


def _build(architecture, batch, sequence, heads, head_dim, intermediate, **extra):
    """(eager model, its input), random weights from torch's seed 0: an encoder's last hidden
    state, a decoder's logits under a causal mask (:mod:`tir_byoc.testing.models`' wrappers)."""
    hidden = heads * head_dim
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ids = torch.randint(0, VOCAB, (batch, sequence))
        if architecture == "encoder":
            layer = torch.nn.TransformerEncoderLayer(
                hidden, heads, intermediate, dropout=0.0, batch_first=True, **extra
            )
            return layer.eval(), torch.randn(batch, sequence, hidden)
        common = dict(attn_implementation="eager")
        layers = dict(num_hidden_layers=1, num_attention_heads=heads)
        bert_like = dict(
            hidden_size=hidden,
            intermediate_size=intermediate,
            vocab_size=VOCAB,
            max_position_embeddings=16,
            **layers,
            **common,
        )
        if architecture == "vit":
            side = extra["patch"] * sequence
            config = transformers.ViTConfig(
                hidden_size=hidden,
                intermediate_size=intermediate,
                image_size=side,
                patch_size=extra["patch"],
                **layers,
                **common,
            )
            model = transformers.ViTModel(config, add_pooling_layer=False)
            pixels = torch.randn(batch, 3, side, side)
            return model_zoo.last_hidden_state(model, "pixel_values"), pixels
        if architecture == "whisper":  # 2 * sequence frames, made sequence by its convolutions
            from transformers.models.whisper.modeling_whisper import WhisperEncoder

            config = transformers.WhisperConfig(
                d_model=hidden,
                encoder_layers=1,
                encoder_attention_heads=heads,
                encoder_ffn_dim=intermediate,
                num_mel_bins=extra["mel_bins"],
                max_source_positions=sequence,
                vocab_size=VOCAB,
                use_cache=False,
                decoder_start_token_id=0,
                **_TOKENS_IN_VOCAB,
                **common,
            )
            frames = torch.randn(batch, extra["mel_bins"], 2 * sequence)
            encoder = WhisperEncoder(config).eval()
            return model_zoo.last_hidden_state(encoder, "input_features"), frames
        if architecture in ("bert", "deberta", "clip_text"):
            if architecture == "bert":
                model = transformers.BertModel(
                    transformers.BertConfig(**bert_like), add_pooling_layer=False
                )
            elif architecture == "deberta":
                config = transformers.DebertaV2Config(**bert_like, **model_zoo.DEBERTA_V3)
                model = transformers.DebertaV2Model(config)
            else:
                tokens = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
                model = transformers.CLIPTextModel(
                    transformers.CLIPTextConfig(**bert_like, **tokens)
                )
            return model_zoo.last_hidden_state(model), ids
        decoder = dict(use_cache=False, **_TOKENS_IN_VOCAB)
        if architecture == "gpt2":
            config = transformers.GPT2Config(
                n_embd=hidden,
                n_layer=1,
                n_head=heads,
                n_inner=intermediate,
                n_positions=16,
                vocab_size=VOCAB,
                **decoder,
                **common,
            )
            model = transformers.GPT2LMHeadModel(config)
        elif architecture == "gpt_neox":
            config = transformers.GPTNeoXConfig(**bert_like, **decoder)
            model = transformers.GPTNeoXForCausalLM(config)
        elif architecture == "falcon":
            settings = {k: v for k, v in bert_like.items() if k != "intermediate_size"}
            config = transformers.FalconConfig(**settings, ffn_hidden_size=intermediate, **decoder)
            model = transformers.FalconForCausalLM(config)
        else:
            config = transformers.LlamaConfig(
                **bert_like, num_key_value_heads=extra["kv_heads"], **decoder
            )
            model = transformers.LlamaForCausalLM(config)
        return model_zoo.causal_logits(model, sequence), ids


@profile(0.03, ci_share=0.03)
@given(model=models())
def test_a_real_model_of_any_size_computes_what_torch_computes(model):
    architecture, sizes = model
    eager, x = _build(architecture, **sizes)
    with torch.no_grad():
        expected = eager(x).numpy()

    built = tir_byoc.build_model(eager, (x,))
    got = built(x).numpy()
    event(f"architecture {architecture}")
    event(f"PrimFuncs offloaded: {len(built.intrinsics)}")
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)

    # Every GEMM FLOP torch counts is handed to a library, at every size.
    real = model_zoo.RealModel(architecture, eager, (x,))
    flops = sum(real_models.torch_gemm_flops(real).values())
    offloaded = tir_byoc.offload(real_models.lower(real))
    served = sum(call.flops for call in real_models.library_calls(offloaded))
    assert served == flops, (
        f"{served} of {flops} GEMM FLOPs offloaded: {real_models.refusals(offloaded)}"
    )
