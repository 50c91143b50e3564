"""The C epilogue alone against torch eager's elementwise ops: one op over one GEMM output.

Entry point: ``python benchmarks/epilogue.py`` (``make bench-epilogue``).  For each op and
thread count, median of per-call times after warm-up, in a child process per thread count
(TVM's pool and torch's read their size once):

* ``C epilogue``: ``tir_byoc_<backend>_epilogue``, the epilogue the gemm entry point runs after
  the product (``intrinsics/include/tir_byoc_epilogue.h``), over the output in place.  Each
  call gets a fresh copy of the values, made outside the timed interval.  At more than one
  thread it shares the rows among TVM's threads above a size (``parts`` says into how many);
* ``torch eager``: the op as a model's torch code computes it (``F.gelu``,
  ``F.gelu(approximate="tanh")``, ``F.silu``, ``torch.sigmoid``, ``torch.tanh``, ``y + t``),
  out of place, at the same thread count.

The values are uniform in [-3, 3], where the gelus and silu are not saturated.  The table
gives torch's time over the C epilogue's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

#: op: (epilogue op code, constants, torch's function of (torch, z, t)).
OPS = {
    "gelu": (6, (math.sqrt(0.5),), lambda torch, z, t: torch.nn.functional.gelu(z)),
    "gelu_tanh": (
        7,
        (math.sqrt(2 / math.pi), 0.044715),
        lambda torch, z, t: torch.nn.functional.gelu(z, approximate="tanh"),
    ),
    "silu": (8, (), lambda torch, z, t: torch.nn.functional.silu(z)),
    "sigmoid": (9, (), lambda torch, z, t: torch.sigmoid(z)),
    "tanh": (10, (), lambda torch, z, t: torch.tanh(z)),
    "add": (13, (), lambda torch, z, t: z + t),
}


def _median_ms(run, budget: float, prepare=None) -> float:
    """Median of per-call milliseconds of ``run()``, ``prepare()`` untimed before each."""
    for _ in range(5):
        if prepare:
            prepare()
        run()
    times, end = [], time.perf_counter() + budget
    while time.perf_counter() < end or len(times) < 5:
        if prepare:
            prepare()
        start = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e6


def measure(backend: str, rows: int, cols: int, threads: int, budget: float) -> list[dict]:
    """In the child: every op, the C epilogue then torch, at ``threads`` threads."""
    import numpy as np

    import tir_byoc  # noqa: F401  (before torch: the thread settings; loads TVM's runtime)
    from tir_byoc import toolchain

    import torch  # isort: skip

    reason = toolchain.unavailable(backend)
    if reason is not None:
        raise SystemExit(f"benchmarks/epilogue.py: --backend {backend}: {reason}")
    torch.set_num_threads(threads)
    epilogue = toolchain.entry_point(backend, "epilogue")
    parts = toolchain.entry_point(backend, "epilogue_parts")
    rng = np.random.default_rng(0)
    values = rng.uniform(-3, 3, (rows, cols)).astype(np.float32)
    tensor = rng.standard_normal((rows, cols)).astype(np.float32)
    y = np.empty_like(values)
    z, t = torch.from_numpy(values), torch.from_numpy(tensor)
    results = []
    for name, (code, constants, torch_op) in OPS.items():
        arguments = [y.ctypes.data, rows, cols, code, *constants, *[0.0] * (6 - len(constants))]
        arguments += [tensor.ctypes.data if name == "add" else None, None, None, None]
        status = epilogue(*arguments)
        if status != 0:
            raise SystemExit(f"benchmarks/epilogue.py: {backend} epilogue {name}: status {status}")
        c_ms = _median_ms(lambda a=arguments: epilogue(*a), budget, lambda: np.copyto(y, values))
        with torch.inference_mode():
            torch_ms = _median_ms(lambda op=torch_op: op(torch, z, t), budget)
        results.append(
            {
                "op": name,
                "threads": threads,
                "c_ms": c_ms,
                "torch_ms": torch_ms,
                "parts": parts(code, rows, cols),
            }
        )
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        default="openblas",
        choices=("openblas", "ref", "onednn"),
        help="whose C epilogue (oneMKL runs its own, with MKL's vector math)",
    )
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--cols", type=int, default=3072)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per timed cell")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.cols < 1 or args.budget <= 0:
        parser.error(f"expected --rows, --cols >= 1 and --budget > 0, got {args.rows}, "
                     f"{args.cols}, {args.budget}")  # fmt: skip
    counts = args.threads.split(",")
    if not all(t.isdigit() and int(t) >= 1 for t in counts):
        parser.error(f"--threads {args.threads!r}: expected thread counts >= 1, e.g. 1,2")
    if args.child:
        results = measure(args.backend, args.rows, args.cols, args.child, args.budget)
        print(json.dumps(results))
        return 0
    from report import machine  # beside this script, on the path as the script's folder

    rows = []
    for threads in (int(t) for t in counts):
        env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        command = [sys.executable, __file__, *(argv or sys.argv[1:]), "--child", str(threads)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:  # a refusal is the child's last line; a crash, its traceback
            raise SystemExit(done.stderr.strip()[-2000:] or f"child at {threads} threads failed")
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    print(f"machine: {machine()}; {args.rows} x {args.cols} fp32 values in [-3, 3]; ms, medians")
    print(f"| op | threads | C epilogue ({args.backend}) | parts | torch eager | torch / C |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        ratio = row["torch_ms"] / row["c_ms"]
        print(
            f"| {row['op']} | {row['threads']} | {row['c_ms']:.3f} | {row['parts']} "
            f"| {row['torch_ms']:.3f} | {ratio:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
