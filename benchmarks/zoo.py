"""How far the flow reaches across transformers' architectures: a coverage table, not a timing.

Each architecture of :data:`ZOO` is built from a small config with random weights (2 layers,
hidden 64, 4 heads, feed-forward 128, vocabulary 100, batch 2, sequence 16; nothing is
downloaded) and goes, in a child process of its own, through:

- :func:`tir_byoc.build_model`, the flow a user takes, its output compared with torch eager's
  (fp32, rtol = atol = 1e-4), and its PrimFuncs that run as TVM wrote them, with why;
- the steps of ``tests/support/real_models.py``, which the real-model tests use: the GEMM
  FLOPs the offloaded module hands to a library against torch's count of the model's GEMM work, the
  epilogue blocks left as TVM code beside a library call, and tir_byoc's reasons for any
  GEMM work it refused.  A convolution's work counts as the GEMM of its im2col, which is how
  tir_byoc serves it (:mod:`tir_byoc.relax.convolutions`); a convolution it leaves to TVM says why.

Usage::

    .venv/bin/python benchmarks/zoo.py [--only Falcon,GPTNeoX] [--out DIR]

One row per architecture on stdout (a markdown table) and in ``DIR/zoo.csv`` and
``DIR/zoo.json``.  An architecture whose build raises gets the stage and the error's first
line; a child that crashes or takes more than ``--timeout`` seconds gets that.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# The models' sizes and how they are built: the real-model tests' own (torch-free to import).
from tir_byoc.testing import models
from tir_byoc.testing.models import HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, LAYERS, POSITIONS, VOCAB

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
RESULTS = HERE / "results" / "zoo"

#: A small model's dimensions (those of the real-model tests), shared by every config.
_BERT = models.BERT_LIKE
_LLAMA = dict(_BERT, num_key_value_heads=models.KV_HEADS)
#: A vision transformer's: 32 x 32 images in patches of 8 x 8.
_VISION = models.VISION
_TOKENS = dict(bos_token_id=0, eos_token_id=0)


@dataclass(frozen=True)
class Arch:
    """One architecture: its transformers classes, config and how it is called.

    ``kind``: ``"encoder"`` (``last_hidden_state`` of token ids), ``"decoder"`` (logits under
    the prepared causal mask of :func:`tir_byoc.frontend.causal_mask`), ``"decoder-positions"``
    (the same with explicit position ids: OPT derives them from a 2-D mask),
    ``"decoder-own-mask"`` (no mask passed: Bloom builds its alibi from a 2-D one),
    ``"vision"`` (32 x 32 images), ``"audio"`` (16 mel bins), ``"waveform"`` (raw samples) or
    ``"video"`` (4 frames of 32 x 32).
    """

    config: str
    model: str
    kind: str
    settings: dict = field(default_factory=dict)
    model_args: dict = field(default_factory=dict)
    part: str | None = None  # a method of the model giving the part to run (BART's encoder)


ZOO: dict[str, Arch] = {
    "BERT": Arch("BertConfig", "BertModel", "encoder", _BERT, {"add_pooling_layer": False}),
    "DistilBERT": Arch(
        "DistilBertConfig",
        "DistilBertModel",
        "encoder",
        dict(
            dim=HIDDEN,
            n_layers=LAYERS,
            n_heads=HEADS,
            hidden_dim=INTERMEDIATE,
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
        ),
    ),
    "RoBERTa": Arch(
        "RobertaConfig", "RobertaModel", "encoder", _BERT, {"add_pooling_layer": False}
    ),
    "ALBERT": Arch(
        "AlbertConfig",
        "AlbertModel",
        "encoder",
        dict(_BERT, embedding_size=32),
        {"add_pooling_layer": False},
    ),
    "ELECTRA": Arch("ElectraConfig", "ElectraModel", "encoder", dict(_BERT, embedding_size=32)),
    "DeBERTa-v3": Arch(
        "DebertaV2Config",
        "DebertaV2Model",
        "encoder",
        dict(_BERT, **models.DEBERTA_V3),
    ),
    "MPNet": Arch("MPNetConfig", "MPNetModel", "encoder", _BERT, {"add_pooling_layer": False}),
    "T5 encoder": Arch(
        "T5Config",
        "T5EncoderModel",
        "encoder",
        dict(
            d_model=HIDDEN,
            d_kv=HEAD_DIM,
            d_ff=INTERMEDIATE,
            num_layers=LAYERS,
            num_heads=HEADS,
            vocab_size=VOCAB,
            use_cache=False,
        ),
    ),
    "BART encoder": Arch(
        "BartConfig",
        "BartModel",
        "encoder",
        dict(
            d_model=HIDDEN,
            encoder_layers=LAYERS,
            decoder_layers=LAYERS,
            encoder_attention_heads=HEADS,
            decoder_attention_heads=HEADS,
            encoder_ffn_dim=INTERMEDIATE,
            decoder_ffn_dim=INTERMEDIATE,
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            use_cache=False,
        ),
        part="get_encoder",
    ),
    "CLIP text": Arch(
        "CLIPTextConfig",
        "CLIPTextModel",
        "encoder",
        dict(_BERT, pad_token_id=1, bos_token_id=0, eos_token_id=2),
    ),
    "GPT-2": Arch(
        "GPT2Config",
        "GPT2LMHeadModel",
        "decoder",
        dict(
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=INTERMEDIATE,
            vocab_size=VOCAB,
            n_positions=POSITIONS,
            **_TOKENS,
        ),
    ),
    "GPT-Neo": Arch(
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        "decoder",
        dict(
            hidden_size=HIDDEN,
            num_layers=LAYERS,
            num_heads=HEADS,
            intermediate_size=INTERMEDIATE,
            attention_types=[[["global", "local"], 1]],
            window_size=8,
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            **_TOKENS,
        ),
    ),
    "GPT-NeoX": Arch("GPTNeoXConfig", "GPTNeoXForCausalLM", "decoder", _BERT),
    "GPT-J": Arch(
        "GPTJConfig",
        "GPTJForCausalLM",
        "decoder",
        dict(
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=INTERMEDIATE,
            rotary_dim=HEAD_DIM // 2,
            vocab_size=VOCAB,
            n_positions=POSITIONS,
            **_TOKENS,
        ),
    ),
    "OPT": Arch(
        "OPTConfig",
        "OPTForCausalLM",
        "decoder-positions",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            ffn_dim=INTERMEDIATE,
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            word_embed_proj_dim=HIDDEN,
        ),
    ),
    "Bloom": Arch(
        "BloomConfig",
        "BloomForCausalLM",
        "decoder-own-mask",
        dict(hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB),
    ),
    "Falcon": Arch(
        "FalconConfig",
        "FalconForCausalLM",
        "decoder",
        dict(
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            ffn_hidden_size=INTERMEDIATE,
            vocab_size=VOCAB,
            max_position_embeddings=POSITIONS,
            **_TOKENS,
        ),
    ),
    "LLaMA": Arch("LlamaConfig", "LlamaForCausalLM", "decoder", _LLAMA),
    "Mistral": Arch("MistralConfig", "MistralForCausalLM", "decoder", _LLAMA),
    "Qwen2": Arch("Qwen2Config", "Qwen2ForCausalLM", "decoder", _LLAMA),
    "Qwen3": Arch("Qwen3Config", "Qwen3ForCausalLM", "decoder", dict(_LLAMA, head_dim=HEAD_DIM)),
    "Phi": Arch("PhiConfig", "PhiForCausalLM", "decoder", _LLAMA),
    "Phi-3": Arch(
        "Phi3Config",
        "Phi3ForCausalLM",
        "decoder",
        dict(_LLAMA, original_max_position_embeddings=POSITIONS, pad_token_id=0, **_TOKENS),
    ),
    "Gemma": Arch("GemmaConfig", "GemmaForCausalLM", "decoder", dict(_LLAMA, head_dim=HEAD_DIM)),
    "Gemma 2": Arch(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        "decoder",
        dict(_LLAMA, head_dim=HEAD_DIM, query_pre_attn_scalar=HEAD_DIM),
    ),
    "StableLM": Arch("StableLmConfig", "StableLmForCausalLM", "decoder", _LLAMA),
    "ViT": Arch(
        "ViTConfig",
        "ViTModel",
        "vision",
        _VISION,
        {"add_pooling_layer": False},
    ),
    "Whisper encoder": Arch(
        "WhisperConfig",
        "models.whisper.modeling_whisper.WhisperEncoder",
        "audio",
        dict(
            d_model=HIDDEN,
            encoder_layers=LAYERS,
            encoder_attention_heads=HEADS,
            encoder_ffn_dim=INTERMEDIATE,
            vocab_size=VOCAB,
            num_mel_bins=16,
            max_source_positions=16,
            use_cache=False,
        ),
    ),
    "Wav2Vec2": Arch(
        "Wav2Vec2Config",
        "Wav2Vec2Model",
        "waveform",
        dict(_BERT, **models.WAV2VEC2_CONVOLUTIONS),
    ),
    "VideoMAE": Arch(
        "VideoMAEConfig",
        "VideoMAEModel",
        "video",
        dict(_VISION, num_frames=4, tubelet_size=2),
    ),
    "ConvNeXt": Arch(
        "ConvNextConfig",
        "ConvNextModel",
        "vision",
        dict(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32, patch_size=4),
    ),
    # A ViT whose attention and MLP outputs are multiplied by a per-channel layer scale.
    "DINOv2": Arch("Dinov2Config", "Dinov2Model", "vision", dict(_VISION, mlp_ratio=4)),
}


# --------------------------------------------------------------------------------------
# The child: one architecture
# --------------------------------------------------------------------------------------


def build(name: str):
    """The :class:`tir_byoc.testing.models.RealModel` of architecture ``name``: built by
    :func:`~tir_byoc.testing.models.from_config`, inputs drawn with seed 1."""
    arch = ZOO[name]
    model = models.from_config(arch.config, arch.model, arch.settings, arch.model_args, arch.part)
    # "vision", "audio" (32 frames -> 16), "waveform" (39 frames), "video" (4 frames)
    kind = arch.kind if arch.kind in models.INPUTS else "tokens"
    inputs = models.inputs_for(kind, 1)
    if arch.kind.startswith("decoder"):
        module = models.causal_logits(model, models.SEQUENCE, arch.kind)
    else:
        module = models.last_hidden_state(model, models.INPUTS[kind][0])
    return models.RealModel(name, module, inputs)


def _flops(model) -> tuple[int, int]:
    """(GEMM FLOPs, convolution FLOPs) of one eager run, by torch's counter."""
    import torch
    from support import real_models
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), real_models._plain_attention(), counter:
        model.module(*model.inputs)
    counts = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    work = {op: n for op, n in counts.items() if op in real_models.GEMM_OPS}
    conv = sum(n for op, n in work.items() if "convolution" in op)
    return sum(work.values()) - conv, conv


def child(name: str) -> dict:
    """The row of architecture ``name``; an exception's stage and first line in ``error``."""
    import numpy as np
    import torch
    from support import real_models

    import tir_byoc
    from tir_byoc.frontend import first_line
    from tir_byoc.relax import convolutions

    row: dict = {"arch": name}
    stage = "config"
    try:
        model = build(name)
        with torch.no_grad():
            expected = model.module(*model.inputs).numpy()
        stage = "build_model"
        built = tir_byoc.build_model(model.module, model.inputs)
        got = built(*model.inputs).numpy()
        row["max_abs_diff"] = float(np.abs(got - expected).max())
        row["agrees"] = bool(np.allclose(got, expected, rtol=1e-4, atol=1e-4))
        row["unscheduled"] = dict(built.unscheduled)
        stage = "offload"
        lowered = real_models.lower(model)
        offloaded = tir_byoc.offload(lowered)
        gemm, conv = _flops(model)
        library = sum(c.flops for c in real_models.library_calls(offloaded))
        # A convolution's work is its im2col's GEMM, which tir_byoc serves (relax.convolutions).
        row["gemm_offloaded"] = library / (gemm + conv) if gemm + conv else None
        row["conv_share"] = conv / (gemm + conv) if gemm + conv else 0.0
        if conv:
            imported, _ = tir_byoc.frontend.import_torch(model.module, model.inputs)
            _, declines = convolutions.find(imported)
            row["convs_left"] = [c.reason for c in declines]
        row["epilogues_left"] = real_models.epilogues_left_behind(offloaded)
        left = {e.split(":")[0].removesuffix("_packed") for e in row["epilogues_left"]}
        row["why_left"] = sorted({r.reason for r in tir_byoc.explain(lowered) if r.func in left})
        row["refused"] = sorted(set(real_models.refusals(offloaded)))
    except Exception as error:
        row["error"] = f"{stage}: {first_line(error)}"
    return row


# --------------------------------------------------------------------------------------
# The parent: every architecture, a child each
# --------------------------------------------------------------------------------------


def run(name: str, timeout: float) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(TESTS), str(HERE.parent), env.get("PYTHONPATH")) if p
    )
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", name],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"arch": name, "error": f"took more than {timeout:g} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"arch": name, "error": f"the child exited with {done.returncode}: {tail}"}
    row = json.loads(lines[-1])
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def _cell(row: dict) -> list[str]:
    if "error" in row:
        return [row["arch"], "-", "-", "-", "-", row["error"]]
    offloaded = row["gemm_offloaded"]
    notes = []
    if row["conv_share"]:
        left = row.get("convs_left", [])
        served = f"{len(left)} left to TVM: {'; '.join(left)}" if left else "as GEMMs"
        notes.append(f"convolutions: {row['conv_share']:.0%} of the matmul work, {served}")
    if row["epilogues_left"]:
        blocks = sorted({e.split(": ", 1)[1].split(" reads")[0] for e in row["epilogues_left"]})
        why = "; ".join(row["why_left"]) or "no reason given"
        notes.append(f"epilogue left as TVM code: {', '.join(blocks)} ({why})")
    notes += [f"unscheduled: {f} ({why})" for f, why in row["unscheduled"].items()]
    return [
        row["arch"],
        "yes" if row["agrees"] else "**no**",
        f"{row['max_abs_diff']:.1e}",
        "-" if offloaded is None else f"{offloaded:.0%}",
        str(len(row["epilogues_left"])),
        "; ".join(notes),
    ]


def table(rows: list[dict]) -> str:
    header = [
        "architecture",
        "agrees with torch",
        "max abs diff",
        "GEMM FLOPs offloaded",
        "epilogue blocks left",
        "notes",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(row)) + " |" for row in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated architectures")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"expected architectures from {list(ZOO)}, got {unknown}")
    rows = []
    for name in names:
        rows.append(run(name, args.timeout))
        print(f"  {name}: {rows[-1].get('error') or 'done'}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "zoo.json").write_text(json.dumps(rows, indent=1))
    with open(args.out / "zoo.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arch", "agrees", "max_abs_diff", "gemm_offloaded", "epilogues", "notes"])
        writer.writerows(_cell(row) for row in rows)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
