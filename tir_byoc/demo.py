"""The forum story, end to end: an MLP 64x800 -> Linear(500) -> ReLU -> Linear(10).

Entry point: ``python -m tir_byoc.demo`` (or :func:`main`).  The model is built with
``tvm.relax.frontend.nn``, lowered with ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FuseOps``
and ``FuseTIR``, offloaded by tir_byoc, the remaining PrimFuncs get TVM's default (dlight)
schedule, and the result runs on the Relax VM and is compared with NumPy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.s_tir import dlight

from .offload import offload, scan

BATCH, IN_FEATURES, HIDDEN, OUT_FEATURES = 64, 800, 500, 10


class MLP(nn.Module):
    """The model from the forum thread: dense_bias_relu, then dense_bias."""

    def __init__(self, in_features=IN_FEATURES, hidden=HIDDEN, out_features=OUT_FEATURES):
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(nn.relu(self.fc1(x)))


def lowered_mlp(batch=BATCH, in_features=IN_FEATURES, hidden=HIDDEN, out_features=OUT_FEATURES):
    """The MLP as Relax lowers it: fused PrimFuncs called from ``forward``."""
    spec = {"forward": {"x": nn.spec.Tensor((batch, in_features), "float32")}}
    mod, _ = MLP(in_features, hidden, out_features).export_tvm(spec=spec)
    return tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """TVM's default CPU schedule (dlight) for what tir_byoc left to TVM."""
    with target:
        return dlight.ApplyDefaultSchedule(dlight.cpu.GEMV(), dlight.cpu.Reduction())(mod)


def mlp_weights(rng, in_features=IN_FEATURES, hidden=HIDDEN, out_features=OUT_FEATURES):
    """Random parameters in the order ``forward`` takes them after ``x``."""
    return [
        (rng.standard_normal((hidden, in_features)) / np.sqrt(in_features)).astype("float32"),
        rng.standard_normal(hidden).astype("float32"),
        (rng.standard_normal((out_features, hidden)) / np.sqrt(hidden)).astype("float32"),
        rng.standard_normal(out_features).astype("float32"),
    ]


def mlp_reference(x, w1, b1, w2, b2):
    return np.maximum(x @ w1.T + b1, 0) @ w2.T + b2


def run(target="llvm", out=sys.stdout) -> float:
    """Run the demo; returns the largest absolute difference from NumPy."""
    target = tvm.target.Target(target) if isinstance(target, str) else target
    # Step 1. Lower the model the standard way.
    mod = lowered_mlp()
    # Step 2. What tir_byoc finds.
    print("Matches in the lowered MLP:", file=out)
    for match in scan(mod):
        served = match.intrinsic or f"left to TVM ({match.reason})"
        m, n, k = match.shape
        print(
            f"  {match.func}: blocks {', '.join(match.blocks)} = {match.pattern} "
            f"[{match.dtype}, M={m} N={n} K={k}] -> {served}",
            file=out,
        )
    # Step 3. Offload, schedule the rest, build, run.
    built = tvm.compile(default_schedule(offload(mod), target), target=target)
    vm = relax.VirtualMachine(built, tvm.cpu())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, IN_FEATURES)).astype("float32")
    params = mlp_weights(rng)
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, *params)]).numpy()
    expected = mlp_reference(x, *params)
    error = float(np.abs(result - expected).max())
    agree = np.allclose(result, expected, rtol=1e-4, atol=1e-4)
    verdict = "agree with" if agree else "DIFFER from"
    print(f"Relax VM results {verdict} NumPy (max abs difference {error:.2e})", file=out)
    if not agree:
        raise SystemExit(1)
    return error


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
