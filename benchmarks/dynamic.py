"""One dynamic build against a static build per size: BERT, GPT-2 and LLaMA, batch x sequence;
ResNet-50 and MobileNetV2, batch.

Entry point: ``python benchmarks/dynamic.py`` (``make bench-dynamic``);
``--models bert,gpt2,llama,resnet50,mobilenet_v2``, ``--batches 1,4,16``,
``--sequences 32,128,384``, ``--image-batches 1,8`` and ``--threads 1,2`` choose the matrix
(those are the defaults).  Each thread count runs in a
child process of its own, every pool told that count before any library loads.  In it, for
each model:

1. one dynamic build, ``build_model(..., dynamic={0: {0: ("batch", 1, B), 1: ("seq", 1, S)}})``
   with B and S the largest batch and sequence asked for (a CNN: the batch only, its images
   224 x 224), timed after one untimed static build (the process's first export and compile
   are slower than the rest);
2. for each batch and sequence: a static build at that size (timed), ONNX Runtime on one
   export with dynamic axes (``torch.onnx.export``, batch and sequence dynamic; ORT's CPU
   provider, all graph optimisations; see benchmarks/models.py) and on an export at that
   size (its static session), and torch eager
   (``inference_mode``); each checked against torch eager, then timed in interleaved rounds (a
   round times each column once for about ``--budget`` seconds; the table keeps each
   column's median over the rounds; each round starts one column later than the last).

The table gives each column's milliseconds a run, ``dynamic / static`` (the target: within
1.10 at every size), ``onnxruntime dynamic / dynamic`` and ``onnxruntime static / static``
(the target: the dynamic build ahead of ONNX Runtime's dynamic session wherever the static
build is ahead of its static session) and ``torch / dynamic``; then,
per model, the build time of the one dynamic build against the sum of the static builds.  The
models (:func:`build_model`) are the zoo's architectures built from configs with random
weights (nothing is downloaded): ``--hidden`` wide (default 256, heads of 64, FFN 4x),
``--layers`` layers, positions for 512 tokens; BERT returns its last hidden state, the
decoders their logits under a causal mask sliced to the sequence's length; the CNNs are the
zoo's (:mod:`tir_byoc.testing.cnns`: transformers' configs, batch norm calibrated), their
logits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import median_ms_in

from tir_byoc.threads import IDLE_DEFAULTS

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "dynamic"
#: Relative tolerance of a column's output against torch eager's (fp32, summation order).
TOLERANCE = 1e-3


#: The models (``--models``): each a transformers config of the zoo's architecture at the
#: benchmark's width, ids in; the encoder returns its last hidden state, the decoders their
#: logits under a causal mask sliced to the sequence's length.
MODELS = ("bert", "gpt2", "llama", "resnet50", "mobilenet_v2")
#: The models of :data:`MODELS` that take images: a symbolic batch, no sequence.
CNNS = ("resnet50", "mobilenet_v2")
IMAGE = 224
#: Positions every model takes (the longest sequence must be below: see DynamicCausal).
POSITIONS = 512
VOCAB = 1000


def _decoder_class():
    import torch

    from tir_byoc.frontend import causal_mask

    class DynamicCausal(torch.nn.Module):
        """A decoder's logits under the additive causal mask sliced to the sequence's length.

        The mask has one row more than the longest sequence: a slice that takes the whole
        tensor is one torch.export specializes (its guard would refuse the bound)."""

        def __init__(self, decoder, longest: int):
            super().__init__()
            self.decoder = decoder
            self.register_buffer("mask", causal_mask(longest + 1))

        def forward(self, ids):
            s = ids.shape[1]
            mask = self.mask[:, :, :s, :s]
            return self.decoder(input_ids=ids, attention_mask=mask, use_cache=False).logits

    return DynamicCausal


def build_model(name: str, hidden: int, layers: int, longest: int = 384):
    """The model ``name`` of :data:`MODELS` (torch module in eval mode, random weights):
    ``hidden`` wide in heads of 64 (LLaMA with half as many key/value heads), feed-forward
    4 x ``hidden``, ``layers`` layers, sequences up to ``longest``."""
    import torch

    from tir_byoc.testing import models

    heads = max(1, hidden // 64)
    bert_like = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=POSITIONS,
        vocab_size=VOCAB,
    )
    torch.manual_seed(0)
    if name in CNNS:
        from tir_byoc.testing import cnns

        return cnns.CNNS[name]().module
    if name == "bert":
        model = models.from_config(
            "BertConfig", "BertModel", bert_like, {"add_pooling_layer": False}
        )
        return models.last_hidden_state(model)
    if name == "gpt2":
        settings = dict(
            n_embd=hidden, n_layer=layers, n_head=heads, n_inner=4 * hidden,
            vocab_size=VOCAB, n_positions=POSITIONS, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        config, model_class = "GPT2Config", "GPT2LMHeadModel"
    elif name == "llama":
        settings = dict(bert_like, num_key_value_heads=max(1, heads // 2))
        config, model_class = "LlamaConfig", "LlamaForCausalLM"
    else:
        raise ValueError(f"benchmarks/dynamic.py: expected a model of {MODELS}, got {name!r}")
    decoder = models.from_config(config, model_class, dict(settings, use_cache=False))
    return _decoder_class()(decoder, longest).eval()


def _ids(batch: int, sequence: int):
    import torch

    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    return torch.randint(0, VOCAB, (batch, sequence), generator=generator)


def _images(batch: int):
    import torch

    generator = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 3, IMAGE, IMAGE, generator=generator)


def _input(name: str, batch: int, sequence: int | None):
    return _images(batch) if name in CNNS else _ids(batch, sequence)


def _dims(name: str, batch: int, sequence: int | None) -> dict:
    """The input's dynamic dims as build_model's short form takes them."""
    if name in CNNS:
        return {0: ("batch", 1, batch)}
    return {0: ("batch", 1, batch), 1: ("seq", 1, sequence)}


def _onnxruntime(model, name: str, batch: int, sequence: int | None, threads: int, static=False):
    """A session and its input's name: of one export with batch (and sequence) dynamic, up to
    ``batch`` and ``sequence``, or with ``static``, of an export at exactly that size."""
    import onnxruntime
    import torch

    path = Path(tempfile.mkdtemp()) / "model.onnx"
    if static:
        example, dynamic_shapes = _input(name, batch, sequence), None
    else:
        dims = {0: torch.export.Dim("batch", min=1, max=batch)}
        if name not in CNNS:
            dims[1] = torch.export.Dim("seq", max=sequence)
        example, dynamic_shapes = _input(name, 2, 16), (dims,)
    torch.onnx.export(
        model,
        (example,),
        str(path),
        dynamo=True,
        external_data=False,
        dynamic_shapes=dynamic_shapes,
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, session.get_inputs()[0].name


def _error(result, expected) -> str:
    import torch

    result = torch.as_tensor(result)
    scale = max(float(expected.abs().max()), 1.0)
    error = float((result - expected).abs().max())
    return "" if error <= TOLERANCE * scale else f"max |diff| {error:.3g} vs torch"


def _model_rows(args, name: str, threads: int) -> dict:
    """One model at one thread count: its dynamic build, then every size's columns."""
    import torch

    import tir_byoc

    if name in CNNS:
        sizes = [(batch, None) for batch in args.image_batches]
    else:
        sizes = [(batch, sequence) for batch in args.batches for sequence in args.sequences]
    longest = max(args.sequences)
    model = build_model(name, args.hidden, args.layers, longest)
    # A build first, not timed, at the example's size: a process's first torch.export and
    # tvm.compile (and the intrinsics' loading) take seconds more than the next ones, and
    # would be counted against whichever build ran first (the dynamic one).
    tir_byoc.build_model(model, (_input(name, 2, 16),))
    start = time.perf_counter()
    # The bounds take the example (batch 2, sequence 16) and every size asked for.
    most = max(2, *(batch for batch, _ in sizes))
    dims = _dims(name, most, max(16, longest))
    dynamic = tir_byoc.build_model(model, (_input(name, 2, 16),), dynamic={0: dims})
    dynamic_seconds = time.perf_counter() - start
    session, input_name = _onnxruntime(model, name, most, longest, threads)
    rows, static_seconds = [], 0.0
    for batch, sequence in sizes:
        ids = _input(name, batch, sequence)
        start = time.perf_counter()
        static = tir_byoc.build_model(model, (ids,))
        static_seconds += time.perf_counter() - start
        fixed_session, _ = _onnxruntime(model, name, batch, sequence, threads, static=True)
        with torch.inference_mode():
            expected = model(ids)
        feed = {input_name: ids.numpy()}

        def eager(ids=ids):
            with torch.inference_mode():
                return model(ids)

        runs = {
            "dynamic": lambda ids=ids: dynamic(ids),
            "static": lambda ids=ids: static(ids),
            "onnxruntime": lambda feed=feed: session.run(None, feed)[0],
            "onnxruntime_static": lambda feed=feed, fixed=fixed_session: fixed.run(None, feed)[0],
            "torch": eager,
        }
        notes = {k: _error(run(), expected) for k, run in runs.items()}
        times = {k: [] for k in runs}
        columns = list(runs)
        for round_ in range(args.rounds):
            # Each round starts at the next column, so that no column always runs right after
            # the same other one (ONNX Runtime's workers keep spinning after its run ends).
            for column in columns[round_ % len(columns) :] + columns[: round_ % len(columns)]:
                times[column].append(median_ms_in(runs[column], args.budget))
        row = {"threads": threads, "model": name, "batch": batch, "sequence": sequence}
        row.update({k: statistics.median(v) for k, v in times.items()})
        row["notes"] = "; ".join(f"{k}: {v}" for k, v in notes.items() if v)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return {
        "threads": threads,
        "model": name,
        "rows": rows,
        "dynamic_build_s": dynamic_seconds,
        "static_builds_s": static_seconds,
        "static_builds": len(rows),
    }


def child(args) -> list[dict]:
    """One thread count: each model's rows and build times."""
    import torch

    threads = args.threads[0]
    torch.set_num_threads(threads)
    return [_model_rows(args, name, threads) for name in args.models]


def table(results: list[dict]) -> str:
    """The markdown table of every child's rows, and the build times."""
    lines = [
        "| threads | model | batch | seq | dynamic ms | static ms | dynamic / static "
        "| onnxruntime dynamic ms | onnxruntime static ms | onnxruntime dynamic / dynamic "
        "| onnxruntime static / static | torch ms | torch / dynamic |",
        "|" + " --- |" * 13,
    ]
    for result in results:
        for row in result["rows"]:
            dynamic, static = row["dynamic"], row["static"]
            ort, fixed = row["onnxruntime"], row["onnxruntime_static"]
            lines.append(
                f"| {row['threads']} | {row['model']} | {row['batch']} | {row['sequence'] or '-'} "
                f"| {dynamic:.2f} | {static:.2f} | {dynamic / static:.2f} | {ort:.2f} "
                f"| {fixed:.2f} | {ort / dynamic:.2f} | {fixed / static:.2f} | {row['torch']:.2f} "
                f"| {row['torch'] / dynamic:.2f} |" + (f" {row['notes']}" if row["notes"] else "")
            )
    lines.append("")
    for result in results:
        lines.append(
            f"{result['threads']} thread(s), {result['model']}: one dynamic build "
            f"{result['dynamic_build_s']:.1f} s, {result['static_builds']} static builds "
            f"{result['static_builds_s']:.1f} s in all"
        )
    return "\n".join(lines)


def _environment(threads: int) -> dict:
    """Every pool at ``threads``; libgomp's idle spin tir_byoc's, since the child imports torch
    (which loads libgomp) before tir_byoc could set it (docs/backends.md, Threads): torch eager
    runs at it too."""
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(threads)
    env.setdefault("GOMP_SPINCOUNT", IDLE_DEFAULTS["GOMP_SPINCOUNT"])
    return env


def _numbers(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _models(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected models among {', '.join(MODELS)}, got {text!r}")
    return names


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=_models, default=list(MODELS))
    parser.add_argument("--threads", type=_numbers, default=[1, 2])
    parser.add_argument("--batches", type=_numbers, default=[1, 4, 16])
    parser.add_argument("--sequences", type=_numbers, default=[32, 128, 384])
    parser.add_argument("--image-batches", type=_numbers, default=[1, 8])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per column a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    results = []
    for threads in args.threads:
        argv_child = [
            "--child", "--threads", str(threads), "--models", ",".join(args.models),
            "--batches", ",".join(map(str, args.batches)),
            "--sequences", ",".join(map(str, args.sequences)),
            "--image-batches", ",".join(map(str, args.image_batches)),
            "--hidden", str(args.hidden), "--layers", str(args.layers),
            "--budget", str(args.budget), "--rounds", str(args.rounds),
        ]  # fmt: skip
        done = subprocess.run(
            [sys.executable, __file__, *argv_child],
            env=_environment(threads),
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"benchmarks/dynamic.py: child at {threads} thread(s) failed")
        results += json.loads(done.stdout.strip().splitlines()[-1])
    text = table(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(text + "\n")
    (RESULTS / "results.json").write_text(json.dumps(results, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
