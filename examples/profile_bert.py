"""Profile a small BERT-like encoder per PrimFunc, built without and with tir_byoc.

The model of docs/model-flow.md's profile table: transformers' ``BertModel`` from a config
(hidden 64, 2 layers, 4 heads, feed-forward 128, vocabulary 100, eager attention, no pooler)
with random weights, on token ids of shape (2, 16).  Needs torch and transformers (the ``dev``
extra); ``--chart DIR`` also writes one PNG per build (needs matplotlib, the ``bench`` extra).

    python examples/profile_bert.py [--repeat 50] [--top 12] [--chart DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from a config: nothing to download

import numpy as np
import torch
import transformers

import tir_byoc


class LastHiddenState(torch.nn.Module):
    """``forward(ids)`` -> the encoder's ``last_hidden_state``."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, ids):
        return self.encoder(input_ids=ids).last_hidden_state


def bert() -> tuple[torch.nn.Module, torch.Tensor]:
    config = transformers.BertConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    encoder = transformers.BertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    return LastHiddenState(encoder).eval(), ids


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--chart", type=Path, default=None)
    args = parser.parse_args(argv)
    model, ids = bert()
    with torch.no_grad():
        expected = model(ids).numpy()
    print(f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', '(unset)')}")
    for offload in (False, True):
        built = tir_byoc.build_model(model, ids, offload=offload)
        error = np.abs(built(ids).numpy() - expected).max()
        profile = built.profile(ids, repeat=args.repeat)
        print(f"\n## {'with' if offload else 'without'} tir_byoc: {built!r}")
        print(f"max abs difference from torch: {error:.2e}")
        print(profile.table(top=args.top))
        if args.chart:
            path = args.chart / f"bert_{'offloaded' if offload else 'tvm'}.png"
            print(f"chart: {profile.chart(path, top=args.top)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
