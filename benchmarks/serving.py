"""A built model served as a service serves it: callers in parallel, and the cost of a call.

Entry point: ``python benchmarks/serving.py`` (``make bench-serving``).  Two measurements, each
configuration in child processes of its own (thread pools read their sizes when they load),
the configurations alternated round by round so that all of them see the same machine:

* **throughput**: one BERT-like model (``--layers`` layers of BERT-base's widths, batch 1,
  ``--sequence`` tokens; built in each child with :func:`tir_byoc.build_model`) called for
  ``--budget`` seconds by ``C`` Python threads, each pool of ``T`` threads: 2 callers x 1
  thread, 1 caller x 2 threads, and 1 caller x 1 thread for scale.  Calls per second, the
  median over the rounds.
* **per-call overhead** (``--overhead``): a 2-layer MLP (8 x 32 -> 64 -> 10) small enough
  that a call is mostly overhead, timed per call with torch tensors in and out, with NumPy
  arrays, and as a bare VM call on TVM tensors made beforehand (the floor).  With
  ``--before REV`` the same children also run the tir_byoc of git revision ``REV`` (checked
  out into a temporary worktree), alternated with this tree's.

Results: a table on stdout and ``benchmarks/results/serving.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

#: (callers, threads per pool) of each throughput configuration.
SERVING = {
    "2 callers x 1 thread": (2, 1),
    "1 caller x 2 threads": (1, 2),
    "1 caller x 1 thread": (1, 1),
}


# --------------------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------------------


def _throughput_child(args) -> dict:
    import torch
    from models import build

    import tir_byoc

    module, ids = build("bert", args.layers, 1, args.sequence)
    model = tir_byoc.build_model(module, (ids,))
    with torch.no_grad():
        expected = module(ids)
    assert torch.allclose(model(ids), expected, rtol=1e-3, atol=1e-3), "disagrees with torch"
    for _ in range(3):
        model(ids)
    calls = [0] * args.callers
    deadline = time.perf_counter() + args.budget

    def serve(caller: int) -> None:
        model(ids)  # this thread's VM and pools, before the clock counts
        while time.perf_counter() < deadline:
            model(ids)
            calls[caller] += 1

    started = time.perf_counter()
    workers = [threading.Thread(target=serve, args=(c,)) for c in range(args.callers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"calls_per_s": sum(calls) / (time.perf_counter() - started)}


def _overhead_child(args) -> dict:
    import numpy as np
    import torch
    import tvm

    import tir_byoc

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).eval()
    x = torch.randn(8, 32)
    model = tir_byoc.build_model(module, (x,))
    as_numpy = x.numpy()
    entry = model.vm()[model.entry]
    prepared = tvm.runtime.tensor(as_numpy, tvm.cpu())
    ways = {
        "torch in, torch out": lambda: model(x),
        "numpy in, numpy out": lambda: model(as_numpy),
        "bare VM call": lambda: entry(prepared),
    }
    result = {}
    for name, call in ways.items():
        for _ in range(200):
            call()
        samples = []
        for _ in range(args.samples):
            start = time.perf_counter_ns()
            for _ in range(100):
                call()
            samples.append((time.perf_counter_ns() - start) / 100 / 1e3)
        result[name] = statistics.median(samples)
    np.testing.assert_allclose(model(x).numpy(), module(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    return result


# --------------------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------------------


def _child(argv: list[str], threads: int, tree: Path = ROOT) -> dict:
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(HERE)])
    done = subprocess.run(
        [sys.executable, __file__, *argv], env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"benchmarks/serving.py: child {' '.join(argv)} exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _throughput(args) -> list[dict]:
    samples = {name: [] for name in SERVING}
    for round_ in range(args.rounds):
        for name, (callers, threads) in SERVING.items():
            argv = ["--child", "throughput", "--callers", str(callers)]
            argv += ["--layers", str(args.layers), "--sequence", str(args.sequence)]
            argv += ["--budget", str(args.budget)]
            samples[name].append(_child(argv, threads)["calls_per_s"])
            print(f"round {round_ + 1}, {name}: {samples[name][-1]:.1f} calls/s", file=sys.stderr)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    base = medians["1 caller x 2 threads"]
    return [
        {"configuration": n, "calls_per_s": m, "vs_1_caller_2_threads": m / base, "rounds": s}
        for (n, m), s in zip(medians.items(), samples.values(), strict=True)
    ]


def _overhead(args) -> list[dict]:
    trees = {"this tree": ROOT}
    with tempfile.TemporaryDirectory() as scratch:
        if args.before:
            before = Path(scratch) / "before"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before],
                check=True,
                capture_output=True,
            )
            trees = {f"at {args.before}": before, **trees}
        try:
            samples = {tree: [] for tree in trees}
            for _ in range(args.rounds):
                for tree, path in trees.items():
                    argv = ["--child", "overhead", "--samples", str(args.samples)]
                    samples[tree].append(_child(argv, 1, path))
        finally:
            if args.before:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
                    check=False,
                )
    rows = []
    for tree, runs in samples.items():
        for way in runs[0]:
            rows.append({"tree": tree, "call": way, "us": statistics.median(r[way] for r in runs)})
    return rows


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=5.0, help="seconds per throughput run")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--overhead", action="store_true", help="measure the per-call overhead")
    parser.add_argument("--before", help="with --overhead: also time tir_byoc at this revision")
    parser.add_argument("--samples", type=int, default=30, help="overhead samples per child")
    parser.add_argument("--child", choices=("throughput", "overhead"), help=argparse.SUPPRESS)
    parser.add_argument("--callers", type=int, default=1, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if args.child:
        run = _throughput_child if args.child == "throughput" else _overhead_child
        print(json.dumps(run(args)))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    report = {"machine": _machine()}
    if args.overhead:
        report["overhead"] = rows = _overhead(args)
        print("| tree | call | us per call (median) |\n| --- | --- | ---: |")
        for row in rows:
            print(f"| {row['tree']} | {row['call']} | {row['us']:.1f} |")
    else:
        report["throughput"] = rows = _throughput(args)
        print(
            "| configuration | calls/s (median) | vs 1 caller x 2 threads |\n| --- | ---: | ---: |"
        )
        for row in rows:
            print(
                f"| {row['configuration']} | {row['calls_per_s']:.1f} | "
                f"{row['vs_1_caller_2_threads']:.2f} |"
            )
    name = "serving-overhead.json" if args.overhead else "serving.json"
    (RESULTS / name).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        "unknown CPU",
    )
    return f"{model}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
