"""How the thread pools of TVM, oneDNN (OpenMP) and OpenBLAS get along, measured.

Entry point: ``python benchmarks/threads.py`` (``make bench-threads``).  Each configuration
runs in its own process (the pools read their environment when they load) and times, median
of repeated runs after warm-up:

* each kernel alone: the seed layer 64x800->500+bias+relu on oneDNN and on OpenBLAS through
  tir_byoc, a TVM-parallel elementwise kernel (exp over 512x1024, ``T.parallel``), and the
  seed MLP on the Relax VM (two oneDNN calls back to back, which short spins could slow);
* the pairs alternating in one loop, as they do in a model where tir_byoc offloaded some
  PrimFuncs and TVM runs the rest: the cost of sharing the cores is
  ``alternating - (a alone + b alone)``.

Configurations: the libraries' own defaults (``TIR_BYOC_THREAD_DEFAULTS=0``), tir_byoc's
defaults (:mod:`tir_byoc.threads`), and every pool passive (threads sleep at once).
TVM runs 2 threads in all of them (``TVM_NUM_THREADS=2``), so that its kernel is parallel.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from timing import median_ms

CONFIGS = {
    "library defaults": {"TIR_BYOC_THREAD_DEFAULTS": "0"},
    "tir_byoc defaults": {},
    "all passive": {
        "OMP_WAIT_POLICY": "PASSIVE",
        "OPENBLAS_THREAD_TIMEOUT": "4",
        "TVM_THREAD_POOL_SPIN_COUNT": "0",
    },
}
#: Variables cleared before each configuration, so that only its own settings apply.
CLEARED = (
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_THREAD_TIMEOUT",
    "TVM_THREAD_POOL_SPIN_COUNT",
    "TIR_BYOC_THREAD_DEFAULTS",
)


def _median_ms(run, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        run()
    return median_ms(run, repeats)


def _kernels():
    import numpy as np
    import tvm
    from tvm.script import tirx as T

    import tir_byoc

    @T.prim_func
    def parallel_exp(a: T.Buffer((512, 1024), "float32"), b: T.Buffer((512, 1024), "float32")):
        for i in T.parallel(512):
            for j in range(1024):
                b[i, j] = T.exp(a[i, j])

    rng = np.random.default_rng(0)
    kernels = {}
    tvm_exp = tvm.compile(tvm.IRModule({"main": parallel_exp}), target="llvm")
    a = tvm.runtime.tensor(rng.standard_normal((512, 1024)).astype("float32"))
    b = tvm.runtime.tensor(np.zeros((512, 1024), "float32"))
    kernels["tvm-parallel"] = lambda: tvm_exp["main"](a, b)
    layer = tir_byoc.describe("dense_bias_relu")
    operands = [rng.standard_normal(s).astype("float32") for s in ((64, 800), (500, 800), (500,))]
    args = [tvm.runtime.tensor(x) for x in operands]
    out = tvm.runtime.tensor(np.zeros((64, 500), "float32"))
    for backend in ("onednn", "openblas"):
        offloaded = tir_byoc.offload(layer, backends=[backend])
        built = tvm.compile(tvm.IRModule({"main": offloaded}), target="llvm")
        kernels[backend] = lambda built=built: built["main"](*args, out)
    # The seed MLP end to end: two oneDNN calls back to back on the Relax VM.
    from tvm import relax

    from tir_byoc.demo import lowered_mlp, mlp_weights

    vm = relax.VirtualMachine(tvm.compile(tir_byoc.offload(lowered_mlp()), "llvm"), tvm.cpu())
    x = rng.standard_normal((64, 800)).astype("float32")
    mlp_args = [tvm.runtime.tensor(a) for a in (x, *mlp_weights(rng))]
    kernels["onednn MLP (2 calls)"] = lambda: vm["forward"](*mlp_args)
    return kernels


PAIRS = (("onednn", "tvm-parallel"), ("openblas", "tvm-parallel"), ("onednn", "openblas"))


def measure(warmup: int, repeats: int) -> dict:
    """Run in the configured process: each kernel alone, then each pair alternating."""
    kernels = _kernels()
    alone = {name: _median_ms(run, warmup, repeats) for name, run in kernels.items()}
    pairs = {}
    for first, second in PAIRS:

        def both(first=first, second=second):
            kernels[first]()
            kernels[second]()

        pairs[f"{first}+{second}"] = _median_ms(both, warmup, repeats)
    import tir_byoc

    return {"alone": alone, "pairs": pairs, "set": tir_byoc.threads.applied()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.warmup, args.repeats)))
        return 0
    rows = []
    for name, settings in CONFIGS.items():
        env = {k: v for k, v in os.environ.items() if k not in CLEARED}
        env.update(settings, TVM_NUM_THREADS="2")
        command = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--warmup",
            str(args.warmup),
            "--repeats",
            str(args.repeats),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append((name, result))
    print("median ms per run, TVM_NUM_THREADS=2; alternating = both kernels in one loop")
    print(f"{'configuration':<20} {'kernel or pair':<24} {'ms':>8} {'vs sum alone':>13}")
    for name, result in rows:
        alone = result["alone"]
        for kernel, ms in alone.items():
            print(f"{name:<20} {kernel:<24} {ms:8.3f}")
        for pair, ms in result["pairs"].items():
            first, second = pair.split("+")
            ratio = ms / (alone[first] + alone[second])
            print(f"{name:<20} {pair:<24} {ms:8.3f} {ratio:12.2f}x")
        print(f"{name:<20} set by tir_byoc: {result['set'] or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
