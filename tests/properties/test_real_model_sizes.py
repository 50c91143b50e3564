"""Property: a real model of any size, built by tir_byoc, computes what torch computes.

``tests/test_real_models.py`` runs twelve architectures at one size each (hidden 64, 4 heads,
batch 2, 16 tokens).  The sizes a user picks reach other paths: one token (a product of one
row), one head, a head dimension of 2, widths that no vector length divides, a feed-forward
narrower than the model, more query heads than key/value heads.  Each example draws an
architecture and its sizes, builds the model from a transformers config (or torch's
``nn.TransformerEncoderLayer``) with random weights, and compares what
:func:`tir_byoc.build_model` makes of it (``torch.export``, tir_byoc's Relax passes, the
offload on the default backend, the default rules) with the eager model: rtol and atol 1e-4,
as for the real models.

- ``bert``: ``BertModel`` without the pooler, ``last_hidden_state``;
- ``gpt2``: ``GPT2Model`` under a causal mask (its tanh gelu written in Python), its hidden
  state;
- ``llama``: ``LlamaModel`` under a causal mask, with 1 to all key/value heads (grouped-query
  attention), its hidden state;
- ``gpt_neox`` and ``falcon``: attention and MLP in parallel (Falcon's with one key/value
  head, split from its fused projection by negative indices), under a causal mask;
- ``vit``: ``ViTModel`` on images of 1 to 3 patches of 2 or 4 pixels a side (its patch
  embedding a convolution served as a GEMM);
- ``encoder``: ``nn.TransformerEncoderLayer``, relu or gelu, the norm first or last.
"""

from __future__ import annotations

import os

# The models are built from configs; transformers must never reach for the hub.
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import torch
import transformers
from harness import profile
from hypothesis import event, given
from hypothesis import strategies as st

import tir_byoc
from tir_byoc.frontend import causal_mask

VOCAB = 50
ARCHITECTURES = ("bert", "gpt2", "llama", "gpt_neox", "falcon", "vit", "encoder")


class _Hidden(torch.nn.Module):
    """``forward(ids)`` -> a transformers model's last hidden state (under a causal mask, for
    a decoder: transformers' own boolean mask is one TVM 0.27 cannot compile)."""

    def __init__(self, model, sequence: int | None, argument: str = "input_ids"):
        super().__init__()
        self.model, self.argument = model, argument
        self.register_buffer("mask", causal_mask(sequence) if sequence else None)

    def forward(self, x):
        if self.mask is None:
            return self.model(**{self.argument: x}).last_hidden_state
        return self.model(**{self.argument: x}, attention_mask=self.mask).last_hidden_state


@st.composite
def models(draw):
    """(architecture, {its sizes}): what :func:`_build` takes."""
    architecture = draw(st.sampled_from(ARCHITECTURES))
    heads = draw(st.integers(1, 4))
    # GPT-NeoX rotates a quarter of each head: at least 2 of its dimensions.
    head_dims = [8, 16] if architecture == "gpt_neox" else [2, 4, 6, 16]
    sizes = {
        "batch": draw(st.integers(1, 2)),
        "sequence": draw(st.integers(1, 12)),
        "heads": heads,
        "head_dim": draw(st.sampled_from(head_dims)),
        "intermediate": draw(st.sampled_from([4, 12, 40])),
    }
    if architecture == "vit":  # the sequence is the patches of the image, and its class token
        sizes["patch"] = draw(st.sampled_from([2, 4]))
        sizes["sequence"] = draw(st.integers(1, 3))  # patches along a side
    if architecture == "llama":
        sizes["kv_heads"] = draw(
            st.sampled_from([h for h in range(1, heads + 1) if heads % h == 0])
        )
    if architecture == "encoder":
        sizes["activation"] = draw(st.sampled_from(["relu", "gelu"]))
        sizes["norm_first"] = draw(st.booleans())
    return architecture, sizes


def _build(architecture, batch, sequence, heads, head_dim, intermediate, **extra):
    """(eager model, its input), random weights from torch's seed 0."""
    hidden = heads * head_dim
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ids = torch.randint(0, VOCAB, (batch, sequence))
        if architecture == "encoder":
            layer = torch.nn.TransformerEncoderLayer(
                hidden, heads, intermediate, dropout=0.0, batch_first=True, **extra
            )
            return layer.eval(), torch.randn(batch, sequence, hidden)
        common = dict(vocab_size=VOCAB, attn_implementation="eager")
        if architecture == "vit":
            side = extra["patch"] * sequence
            config = transformers.ViTConfig(
                hidden_size=hidden,
                num_hidden_layers=1,
                num_attention_heads=heads,
                intermediate_size=intermediate,
                image_size=side,
                patch_size=extra["patch"],
                attn_implementation="eager",
            )
            model = transformers.ViTModel(config, add_pooling_layer=False).eval()
            return _Hidden(model, None, "pixel_values").eval(), torch.randn(batch, 3, side, side)
        if architecture == "bert":
            config = transformers.BertConfig(
                hidden_size=hidden,
                num_hidden_layers=1,
                num_attention_heads=heads,
                intermediate_size=intermediate,
                max_position_embeddings=16,
                **common,
            )
            model = transformers.BertModel(config, add_pooling_layer=False)
            return _Hidden(model.eval(), None).eval(), ids
        if architecture == "gpt2":
            config = transformers.GPT2Config(
                n_embd=hidden,
                n_layer=1,
                n_head=heads,
                n_inner=intermediate,
                n_positions=16,
                use_cache=False,
                **common,
            )
            model = transformers.GPT2Model(config)
        elif architecture == "gpt_neox":
            config = transformers.GPTNeoXConfig(
                hidden_size=hidden,
                num_hidden_layers=1,
                num_attention_heads=heads,
                intermediate_size=intermediate,
                max_position_embeddings=16,
                use_cache=False,
                **common,
            )
            model = transformers.GPTNeoXModel(config)
        elif architecture == "falcon":
            config = transformers.FalconConfig(
                hidden_size=hidden,
                num_hidden_layers=1,
                num_attention_heads=heads,
                ffn_hidden_size=intermediate,
                use_cache=False,
                **common,
            )
            model = transformers.FalconModel(config)
        else:
            config = transformers.LlamaConfig(
                hidden_size=hidden,
                num_hidden_layers=1,
                num_attention_heads=heads,
                num_key_value_heads=extra["kv_heads"],
                intermediate_size=intermediate,
                max_position_embeddings=16,
                use_cache=False,
                **common,
            )
            model = transformers.LlamaModel(config)
        return _Hidden(model.eval(), sequence).eval(), ids


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
    for name in built.schedules:
        if "matmul" in name and name not in built.intrinsics:
            event(f"a product left to TVM: {name}")

    assert built.intrinsics, f"nothing was offloaded; unscheduled: {dict(built.unscheduled)}"
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
