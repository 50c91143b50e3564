"""MobileNetV2 with and without its fused 1 x 1 + depthwise pairs (:mod:`tir_byoc.conv_pairs`),
beside ONNX Runtime, in one process per thread count.

Usage: ``python benchmarks/conv_pairs.py [--batches 1,8] [--threads 1,2] [--rounds 5]``.
Each child (its thread count set before any library loads) builds the model zoo's MobileNetV2
(224 x 224, random weights, batch norm calibrated) twice per batch with ``build_model``: with
the pairs the build chooses by timing (the default) and with ``TIR_BYOC_ONEDNN_PAIR=separate``;
and exports it to ONNX for ONNX Runtime.  The three are timed in alternating rounds (each
round the median of ``--repeats`` calls); the table gives the medians of the rounds in ms, the
ratios, and the number of pairs the build fused.  Both builds' outputs are checked against
torch's before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from timing import Parser, median_ms


def measure(batch: int, threads: int, repeats: int, rounds: int) -> dict:
    """One batch in this process: the medians over ``rounds`` of each column, and the pairs."""
    import numpy as np
    import torch
    from models import _onnxruntime

    import tir_byoc
    from tir_byoc.conv_pairs import PAIR_INTRINSIC
    from tir_byoc.testing import cnns

    real = cnns.mobilenet_v2(batch=batch)
    (x,) = real.inputs
    with torch.no_grad():
        want = real.module(x).numpy()
    paired = tir_byoc.build_model(real.module, real.inputs)
    os.environ["TIR_BYOC_ONEDNN_PAIR"] = "separate"
    try:
        separate = tir_byoc.build_model(real.module, real.inputs)
    finally:
        del os.environ["TIR_BYOC_ONEDNN_PAIR"]
    for built in (paired, separate):
        np.testing.assert_allclose(built(x).numpy(), want, rtol=1e-3, atol=1e-3)
    runs = {
        "paired": lambda: paired(x),
        "separate": lambda: separate(x),
        "onnxruntime": _onnxruntime(real.module, x, threads),
    }
    for run in runs.values():  # warm-up
        run()
    medians = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            medians[name].append(median_ms(run, repeats))
    pairs = sum(PAIR_INTRINSIC in calls for calls in paired.intrinsics.values())
    result = {name: statistics.median(values) for name, values in medians.items()}
    return dict(result, batch=batch, pairs=pairs)


def main(argv=None) -> int:
    parser = Parser(prog="conv_pairs.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    counts = {}
    for name in ("batches", "threads"):
        try:
            counts[name] = [int(v) for v in getattr(args, name).split(",")]
        except ValueError:
            parser.error(f"--{name} {getattr(args, name)}: expected comma-separated integers")
    batches, threads = counts["batches"], counts["threads"]
    if min(batches + threads) < 1:
        parser.error("a batch or thread count below 1; expected 1 or more")
    for name in ("repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} measures nothing; expected 1 or more")
    if args.child:
        count = int(os.environ["TVM_NUM_THREADS"])
        for batch in batches:
            print(json.dumps(measure(batch, count, args.repeats, args.rounds)), flush=True)
        return 0
    print(
        "| threads | batch | pairs fused | paired ms | separate ms | paired / separate "
        "| onnxruntime ms | paired / onnxruntime |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for count in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(count), TVM_NUM_THREADS=str(count))
        command = [sys.executable, __file__, "--child", "--batches", args.batches]
        command += ["--repeats", str(args.repeats), "--rounds", str(args.rounds)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            return done.returncode
        for line in done.stdout.splitlines():
            if not line.startswith("{"):
                continue
            print(table_row(count, json.loads(line)), flush=True)
    return 0


def table_row(count: int, row: dict) -> str:
    """The table's row of one child's result at ``count`` threads."""
    cells = [f"{count}", f"{row['batch']}", f"{row['pairs']}"]
    cells += [f"{row['paired']:.2f}", f"{row['separate']:.2f}"]
    cells += [f"{row['paired'] / row['separate']:.3f}", f"{row['onnxruntime']:.2f}"]
    cells += [f"{row['paired'] / row['onnxruntime']:.3f}"]
    return f"| {' | '.join(cells)} |"


if __name__ == "__main__":
    sys.exit(main())
