"""How fast the matcher is: scan time per PrimFunc on lowered models and 1,000 / 2,000 PrimFuncs.

Entry point: ``python benchmarks/run.py --matcher`` (or this file).  Target: under 1 ms per
PrimFunc, about 1 s per 1,000.  Times :func:`tir_byoc.match.scan_function` alone (the
matcher) and :func:`tir_byoc.scan` (matcher plus choosing intrinsics, and for Relax modules
the transpose fold), medians of repeated runs; then each PrimFunc alone, best of several
passes, for the median and the slowest PrimFunc of each module.

The modules: the seed MLP, a Linear-GELU-Linear-add-LayerNorm block, BERT-, GPT-2- and
LLaMA-like models (two layers of the base widths, from :func:`models.build`, random weights)
exported with torch and lowered the way :func:`tir_byoc.build_model` lowers them, and the
synthetic modules built from the patterns' own descriptions and decoys.  Last, each Relax
pass of the lowering on BERT-like models of 2, 12 and 24 layers, in ms per layer: tir_byoc's
own passes must stay linear in the model's size, as TVM's do.
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
from tir_byoc.relax import pipeline

#: The real models (names of :func:`models.build`) and how they are built: layers, batch,
#: sequence length.
REAL_MODELS = {"bert": "BERT-like", "gpt2": "GPT-2-like", "llama": "LLaMA-like"}
REAL_SHAPE = {"layers": 2, "batch": 1, "sequence": 16}
#: Passes over a module's PrimFuncs for the per-PrimFunc times (each keeps its best).
PASSES = 20


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


def lowered_torch(name: str) -> tvm.IRModule:
    """A real model (:data:`REAL_MODELS`) exported and lowered as ``build_model`` does."""
    from models import build  # torch and transformers: imported last (see main)

    from tir_byoc.frontend import import_torch

    model, x = build(name, **REAL_SHAPE)
    mod, _ = import_torch(model, (x,))
    return pipeline.lower(mod)


#: Layer counts of the BERT-like model the Relax passes are timed on (linear: the same ms per
#: layer at each).
PASS_LAYERS = (2, 12, 24)


def time_relax_passes(name: str = "bert", repeats: int = 3) -> dict[int, dict[str, float]]:
    """Layers -> {pass: ms} for each pass of :func:`tir_byoc.relax.pipeline.lowering_passes`
    before ``FuseTIR`` (tir_byoc's own Relax passes and, beside them, TVM's), each on the module
    the passes before it made, medians of ``repeats`` runs."""
    from models import build

    from tir_byoc.frontend import import_torch

    times = {}
    for layers in PASS_LAYERS:
        model, x = build(name, layers=layers, batch=1, sequence=REAL_SHAPE["sequence"])
        mod, _ = import_torch(model, (x,))
        times[layers] = {}
        for make_pass in pipeline.lowering_passes()[:-1]:
            runs = []
            for _ in range(repeats):
                start = time.perf_counter()
                out = make_pass()(mod)
                runs.append(time.perf_counter() - start)
            times[layers][make_pass.__name__] = statistics.median(runs) * 1e3
            mod = out
    return times


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


def time_each(mod: tvm.IRModule, passes: int = PASSES) -> dict[str, float]:
    """PrimFunc name -> ms of :func:`scan_function` on it alone, best of ``passes`` passes."""
    funcs = [(g.name_hint, f) for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    best = dict.fromkeys((name for name, _ in funcs), float("inf"))
    for _ in range(passes):
        for name, func in funcs:
            start = time.perf_counter()
            scan_function(name, func)
            best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
    return best


def main() -> int:
    # The real models come last, so that torch and transformers (which nearly double the
    # objects the garbage collector tracks) are not loaded while the others are timed.
    cases = {
        "seed MLP (Relax)": lowered_mlp,
        "MLP block, Relax (Linear-GELU-Linear-add-LayerNorm)": lambda: lowered(Block(), (8, 256)),
        "synthetic module of 1,000 PrimFuncs": lambda: synthetic(1000),
        "synthetic module of 2,000 PrimFuncs (linear: same ms/func)": lambda: synthetic(2000),
    }
    for name, label in REAL_MODELS.items():
        layers = REAL_SHAPE["layers"]
        cases[f"{label} ({layers} layers, torch.export, Relax)"] = lambda n=name: lowered_torch(n)
    print(f"| {'module':<58} | PrimFuncs | matcher ms/func | scan ms/func | scan total ms |")
    print(f"|{'-' * 60}|-----------|-----------------|--------------|---------------|")
    each, modules = {}, {}
    for name, build_module in cases.items():
        mod = modules[name] = build_module()
        scan_function("warm-up", tir_byoc.describe("dense"))
        matcher, full, count = time_scans(mod)
        print(
            f"| {name:<58} | {count:9d} | {matcher:15.3f} | {full:12.3f} | {full * count:13.1f} |"
        )
        if not name.startswith("synthetic module of 2,000"):  # the 1,000 one's PrimFuncs again
            each[name] = time_each(mod, PASSES if count < 100 else 3)
    print(f"\nEach PrimFunc alone, best of {PASSES} passes (3 for the synthetic module), ms:\n")
    print(f"| {'module':<58} | median | worst | worst PrimFunc |")
    print(f"|{'-' * 60}|--------|-------|----------------|")
    for name, times in each.items():
        worst = max(times, key=times.get)
        print(
            f"| {name:<58} | {statistics.median(times.values()):6.3f} | {times[worst]:5.3f} | "
            f"{described(modules[name], worst)} |"
        )
    passes = time_relax_passes()
    names = list(next(iter(passes.values())))
    print("\nThe lowering's Relax passes on the BERT-like model, ms per layer (median of 3):\n")
    print("| layers | " + " | ".join(names) + " |")
    print("|-------:|" + "|".join("-" * (len(n) + 1) + ":" for n in names) + "|")
    for layers, times in passes.items():
        cells = " | ".join(f"{times[n] / layers:{len(n)}.2f}" for n in names)
        print(f"| {layers:6d} | {cells} |")
    return 0


def described(mod: tvm.IRModule, name: str) -> str:
    """``name``, and the pattern it matches if it matches one (synthetic PrimFuncs are f0, ...)."""
    matches = scan_function(name, mod[name]).matches
    return f"{name} ({matches[0].pattern})" if matches else name


if __name__ == "__main__":
    sys.exit(main())
