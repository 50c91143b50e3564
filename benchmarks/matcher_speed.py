"""How fast the matcher is: scan time per PrimFunc on lowered models and 1,000 / 2,000 PrimFuncs.

Entry point: ``python benchmarks/run.py --matcher`` (or this file).  Target: under 1 ms per
PrimFunc, about 1 s per 1,000.  Times :func:`tir_byoc.match.scan_function` alone (the
matcher) and :func:`tir_byoc.scan` (matcher plus choosing intrinsics, and for Relax modules
the transpose fold), medians of repeated runs.
"""

from __future__ import annotations

import statistics
import sys
import time

import tvm
from tvm import relax, tirx
from tvm.relax.frontend import nn

import tir_byoc
from tir_byoc.demo import lowered_mlp
from tir_byoc.match import scan_function
from tir_byoc.patterns import PATTERNS


def lowered(model: nn.Module, shape) -> tvm.IRModule:
    spec = {"forward": {"x": nn.spec.Tensor(shape, "float32")}}
    mod, _ = model.export_tvm(spec=spec)
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    return tvm.transform.Sequential(passes)(mod)


class Block(nn.Module):
    """A transformer-ish MLP block: Linear, GELU, Linear, residual add, layer norm."""

    def __init__(self, width=256):
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(nn.gelu(self.up(x))))


def synthetic(count: int = 1000) -> tvm.IRModule:
    """``count`` PrimFuncs: every pattern and, as decoys, transposes and elementwise ops."""
    funcs = {}
    decoys = lowered_mlp()
    decoy_funcs = [f for _, f in decoys.functions_items() if isinstance(f, tirx.PrimFunc)]
    patterns = [tir_byoc.describe(p) for p in PATTERNS]
    block = [
        f for _, f in lowered(Block(), (8, 256)).functions_items() if isinstance(f, tirx.PrimFunc)
    ]
    pool = patterns + decoy_funcs + block
    for i in range(count):
        funcs[f"f{i}"] = pool[i % len(pool)]
    return tvm.IRModule(funcs)


def time_scans(mod: tvm.IRModule, repeats: int = 5) -> tuple[float, float, int]:
    """(matcher ms per PrimFunc, tir_byoc.scan ms per PrimFunc, PrimFunc count)."""
    funcs = [(g.name_hint, f) for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    matcher, full = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        for name, func in funcs:
            scan_function(name, func)
        matcher.append(time.perf_counter() - start)
        start = time.perf_counter()
        tir_byoc.scan(mod)
        full.append(time.perf_counter() - start)
    per = 1e3 / len(funcs)
    return statistics.median(matcher) * per, statistics.median(full) * per, len(funcs)


def main() -> int:
    cases = {
        "seed MLP (Relax)": lowered_mlp(),
        "MLP block, Relax (Linear-GELU-Linear-add-LayerNorm)": lowered(Block(), (8, 256)),
        "synthetic module of 1,000 PrimFuncs": synthetic(1000),
        "synthetic module of 2,000 PrimFuncs (linear: same ms/func)": synthetic(2000),
    }
    print(f"| {'module':<58} | PrimFuncs | matcher ms/func | scan ms/func | scan total ms |")
    print(f"|{'-' * 60}|-----------|-----------------|--------------|---------------|")
    for name, mod in cases.items():
        scan_function("warm-up", tir_byoc.describe("dense"))
        matcher, full, count = time_scans(mod)
        print(
            f"| {name:<58} | {count:9d} | {matcher:15.3f} | {full:12.3f} | {full * count:13.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
