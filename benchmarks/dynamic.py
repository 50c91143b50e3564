"""One dynamic build against a static build per size: a BERT-like encoder, batch x sequence.

Entry point: ``python benchmarks/dynamic.py`` (``make bench-dynamic``).  Each thread count runs
in a child process of its own, every pool told that count before any library loads.  In it:

1. one dynamic build, ``build_model(..., dynamic={"input_ids": {0: "batch", 1: "seq"}})``, with
   the batch in 1..max(--batches) and the sequence in 1..max(--sequences), timed;
2. for each batch and sequence: a static build at that size (timed), ONNX Runtime on one
   export with dynamic axes (``torch.onnx.export``, batch and sequence dynamic; ORT's CPU
   provider, all graph optimisations; see benchmarks/models.py), and torch eager
   (``inference_mode``); each checked against torch eager, then timed in interleaved rounds (a
   round times each column once for about ``--budget`` seconds; the table keeps each
   column's median over the rounds).

The table gives each column's milliseconds a run and ``dynamic / static`` (the target: within
1.10 at every size), then the build time of the one dynamic build against the sum of the
static builds.  The model is built from a ``BertConfig`` with random weights (nothing is
downloaded): ``--hidden`` wide (default 256, 4 heads of 64, FFN 4x), ``--layers`` layers,
positions for 512 tokens, returning the last hidden state.
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

from tir_byoc.threads import IDLE_DEFAULTS

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "dynamic"
#: Relative tolerance of a column's output against torch eager's (fp32, summation order).
TOLERANCE = 1e-3


def build_model(hidden: int, layers: int):
    """A BERT-like encoder (torch module in eval mode) returning the last hidden state."""
    import torch

    from tir_byoc.testing import models

    settings = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
        vocab_size=1000,
    )
    torch.manual_seed(0)
    model = models.from_config("BertConfig", "BertModel", settings, {"add_pooling_layer": False})
    return models.last_hidden_state(model)


def _ids(batch: int, sequence: int):
    import torch

    generator = torch.Generator().manual_seed(batch * 1000 + sequence)
    return torch.randint(0, 1000, (batch, sequence), generator=generator)


def _onnxruntime(model, batch: int, sequence: int, threads: int):
    """A session of one export with batch and sequence dynamic, and its input's name."""
    import onnxruntime
    import torch

    path = Path(tempfile.mkdtemp()) / "model.onnx"
    dims = {
        0: torch.export.Dim("batch", min=1, max=batch),
        1: torch.export.Dim("seq", max=sequence),
    }
    torch.onnx.export(
        model,
        (_ids(2, 16),),
        str(path),
        dynamo=True,
        external_data=False,
        dynamic_shapes=({0: dims[0], 1: dims[1]},),
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, session.get_inputs()[0].name


def _median_ms(run, budget: float) -> float:
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    repeat = max(3, min(50, int(budget / max(once, 1e-6))))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _error(result, expected) -> str:
    import torch

    result = torch.as_tensor(result)
    scale = max(float(expected.abs().max()), 1.0)
    error = float((result - expected).abs().max())
    return "" if error <= TOLERANCE * scale else f"max |diff| {error:.3g} vs torch"


def child(args) -> dict:
    """One thread count: the dynamic build, then every size's columns."""
    import torch

    import tir_byoc

    threads = args.threads[0]
    torch.set_num_threads(threads)
    batches, sequences = args.batches, args.sequences
    model = build_model(args.hidden, args.layers)
    start = time.perf_counter()
    dynamic = tir_byoc.build_model(
        model,
        (_ids(2, 16),),
        dynamic={0: {0: ("batch", 1, max(batches)), 1: ("seq", 1, max(sequences))}},
    )
    dynamic_seconds = time.perf_counter() - start
    session, name = _onnxruntime(model, max(batches), max(sequences), threads)
    rows, static_seconds = [], 0.0
    for batch in batches:
        for sequence in sequences:
            ids = _ids(batch, sequence)
            start = time.perf_counter()
            static = tir_byoc.build_model(model, (ids,))
            static_seconds += time.perf_counter() - start
            with torch.inference_mode():
                expected = model(ids)
            feed = {name: ids.numpy()}

            def eager(ids=ids):
                with torch.inference_mode():
                    return model(ids)

            runs = {
                "dynamic": lambda ids=ids: dynamic(ids),
                "static": lambda ids=ids: static(ids),
                "onnxruntime": lambda feed=feed: session.run(None, feed)[0],
                "torch": eager,
            }
            notes = {k: _error(run(), expected) for k, run in runs.items()}
            times = {k: [] for k in runs}
            for _ in range(args.rounds):
                for column, run in runs.items():
                    times[column].append(_median_ms(run, args.budget))
            row = {"threads": threads, "batch": batch, "sequence": sequence}
            row.update({k: statistics.median(v) for k, v in times.items()})
            row["notes"] = "; ".join(f"{k}: {v}" for k, v in notes.items() if v)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return {
        "threads": threads,
        "rows": rows,
        "dynamic_build_s": dynamic_seconds,
        "static_builds_s": static_seconds,
        "static_builds": len(rows),
    }


def table(results: list[dict]) -> str:
    """The markdown table of every child's rows, and the build times."""
    lines = [
        "| threads | batch | seq | dynamic ms | static ms | dynamic / static | onnxruntime ms "
        "| torch ms | torch / dynamic |",
        "|" + " --- |" * 9,
    ]
    for result in results:
        for row in result["rows"]:
            ratio = row["dynamic"] / row["static"]
            lines.append(
                f"| {row['threads']} | {row['batch']} | {row['sequence']} | {row['dynamic']:.2f} "
                f"| {row['static']:.2f} | {ratio:.2f} | {row['onnxruntime']:.2f} "
                f"| {row['torch']:.2f} | {row['torch'] / row['dynamic']:.2f} |"
                + (f" {row['notes']}" if row["notes"] else "")
            )
    lines.append("")
    for result in results:
        lines.append(
            f"{result['threads']} thread(s): one dynamic build {result['dynamic_build_s']:.1f} s, "
            f"{result['static_builds']} static builds {result['static_builds_s']:.1f} s in all"
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=_numbers, default=[1, 2])
    parser.add_argument("--batches", type=_numbers, default=[1, 4, 16])
    parser.add_argument("--sequences", type=_numbers, default=[32, 128, 384])
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
            "--child", "--threads", str(threads),
            "--batches", ",".join(map(str, args.batches)),
            "--sequences", ",".join(map(str, args.sequences)),
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
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    text = table(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "table.md").write_text(text + "\n")
    (RESULTS / "results.json").write_text(json.dumps(results, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
