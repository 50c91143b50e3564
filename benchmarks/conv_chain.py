"""MobileNetV2's convolutions in model order, each a oneDNN primitive called directly, against
the same chain with each 1 x 1 expand convolution and the 3 x 3 depthwise one after it fused
by oneDNN's depthwise post-op (``append_dw``): what that fusion would give a CNN, measured
before tir_byoc offers it.

Usage: ``python benchmarks/conv_chain.py [--batches 1,8] [--threads 1,2] [--repeats 20]
[--rounds 3] [--steps] [--in-model]``.  The layers are those the zoo's MobileNetV2
(``tir_byoc.testing.cnns``: transformers' ``MobileNetV2Config`` defaults, 224 x 224) runs, read
off its ``MobileNetV2ConvLayer`` modules in forward order: geometry, TensorFlow's padding,
ReLU6 where the layer has it, the residual add of each inverted residual block on its last
convolution.
Each convolution is channels last with a bias, its weight in the layout oneDNN asks for, as
tir_byoc's oneDNN backend runs it (``conv_bridge.py`` measures that bridge).  Batch norm is
folded (a bias), as ``build_model`` folds it.  ``conv_chain_onednn.cpp`` (compiled here) runs
three chains (:data:`CHAINS`: no pair fused, every pair oneDNN has a fused kernel for, and
only the pairs whose fused primitive measured faster than the two alone, as a build choosing
by measurement would) in one process per thread count (``OMP_NUM_THREADS``, set before oneDNN
loads), with the same weights; it prints the medians of each whole chain, their ratios to the
separate chain, and the largest difference between a fused pair and its two layers alone
(:func:`pair_difference`); ``--steps`` adds each step.  ``--in-model`` also builds the model
with tir_byoc in the same process and sets each of its convolution calls, timed in the model,
beside the separate chain's primitive for the same layer (:func:`model_calls`): whether each
offloaded convolution runs as fast as oneDNN's own primitive where the model runs it.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

from conv_bridge import onednn_library
from timing import Parser

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "conv_chain_onednn.cpp"
LIBRARY = HERE / "results" / "bin" / "conv_chain_onednn.so"
FIELDS = 11  # a row of conv_chain's layers
#: The chains, by conv_chain's ``fuse``: no pair fused, every pair oneDNN offers a fused kernel
#: for, the pairs whose fused primitive measured faster.
CHAINS = ("separate", "fused", "chosen")


def mobilenet_v2_layers() -> list[tuple[int, ...]]:
    """Each convolution of the zoo's MobileNetV2 on one image, in forward order, as a row of
    conv_chain: (c, o, groups, h, w, kernel, stride, pad_l, pad_r, clip, residual)."""
    import torch

    from tir_byoc.testing import cnns

    real = cnns.mobilenet_v2()
    layers: list[tuple[int, ...]] = []
    index = {}  # a conv layer module -> its row

    def on_layer(module, args):
        conv, (_, c, h, w) = module.convolution, args[0].shape
        (k, _), (s, _) = conv.kernel_size, conv.stride
        if module.config.tf_padding:  # TensorFlow's SAME: the extra row after
            along = max(k - s, 0) if h % s == 0 else max(k - h % s, 0)
            pad_l, pad_r = along // 2, along - along // 2
        else:
            pad_l = pad_r = conv.padding[0]
        clip = int(module.activation is not None)
        index[module] = len(layers)
        layers.append([c, conv.out_channels, conv.groups, h, w, k, s, pad_l, pad_r, clip, -1])

    def on_block(module, _args, _output):
        if module.use_residual:  # the block's input is the input of its first layer
            layers[index[module.reduce_1x1]][10] = index[module.expand_1x1]

    handles = []
    for module in real.module.modules():
        if type(module).__name__ == "MobileNetV2ConvLayer":
            handles.append(module.register_forward_pre_hook(on_layer))
        elif type(module).__name__ == "MobileNetV2InvertedResidual":
            handles.append(module.register_forward_hook(on_block))
    with torch.no_grad():
        real.module(*real.inputs)
    for handle in handles:
        handle.remove()
    return [tuple(row) for row in layers]


def _library() -> Path:
    return onednn_library(SOURCE, LIBRARY)


def _run(chain, layers, batch: int, fuse: int, repeats: int):
    """``conv_chain`` on ``layers``: the chain's median and each step's, the steps' names and
    the last layer's output."""
    import numpy as np

    rows = (ctypes.c_int64 * (FIELDS * len(layers)))(*(v for row in layers for v in row))
    o, _, h, w, k, s, pad_l, pad_r = layers[-1][1:9]
    out_h, out_w = (h + pad_l + pad_r - k) // s + 1, (w + pad_l + pad_r - k) // s + 1
    out = (ctypes.c_double * (1 + len(layers)))()
    names = ctypes.create_string_buffer(64 * len(layers))
    output = np.zeros(batch * o * out_h * out_w, dtype=np.float32)
    steps = chain.conv_chain(
        rows,
        ctypes.c_int(len(layers)),
        ctypes.c_int64(batch),
        ctypes.c_int(fuse),
        ctypes.c_int(repeats),
        out,
        names,
        ctypes.c_int64(len(names)),
        output.ctypes.data_as(ctypes.c_void_p),
    )
    if steps < 0:
        refusal = f"oneDNN refused the {CHAINS[fuse]} chain at {batch=}: {names.value.decode()}"
        raise SystemExit(f"conv_chain.py: {refusal}")
    listing = names.value.decode().split("\n")
    return out[0], list(zip(listing, out[1 : 1 + steps])), output


def pair_difference(chain, layers, batch: int) -> float:
    """The largest difference, relative to the largest value, between a fused pair's output
    and the two layers' alone, over every pair oneDNN fuses (each run alone, on the same
    weights and input).  The whole chains are not compared: over 52 layers of ReLU6 and
    residual adds, a rounding difference of one layer grows by orders of magnitude."""
    import numpy as np

    worst = 0.0
    for first, second in itertools.pairwise(layers):
        pair = [(*row[:10], -1) for row in (first, second)]
        _, steps, fused = _run(chain, pair, batch, 1, 1)
        if len(steps) == 1:
            _, _, alone = _run(chain, pair, batch, 0, 1)
            scale = float(np.max(np.abs(alone))) or 1.0
            worst = max(worst, float(np.max(np.abs(fused - alone))) / scale)
    return worst


def load_chain():
    """``conv_chain_onednn.cpp``'s library, compiled if needed and loaded."""
    chain = ctypes.CDLL(str(_library()))
    chain.conv_chain.restype = ctypes.c_int
    return chain


def run_chains(chain, layers, batch: int, repeats: int, rounds: int) -> dict:
    """The chains of ``layers`` at ``batch`` in this process (its OpenMP thread count), each
    built and run ``rounds`` times, in a rotating order so that none always runs first: the
    median of their medians in ms; each step's medians and names from the last round."""
    import numpy as np

    result = {"batch": batch, "layers": len(layers)}
    medians = {key: [] for key in CHAINS}
    for round_ in range(rounds):
        for fuse in ((round_ + i) % len(CHAINS) for i in range(len(CHAINS))):
            key = CHAINS[fuse]
            median, result[key + "_steps"], _ = _run(chain, layers, batch, fuse, repeats)
            medians[key].append(median)
    for key in CHAINS:
        result[key] = float(np.median(medians[key]))
    result["difference"] = pair_difference(chain, layers, batch)
    return result


def model_calls(batch: int, repeats: int) -> dict:
    """tir_byoc's build of the same MobileNetV2 at ``batch`` (``build_model``), in this
    process: the median us of each of its convolution calls, in the order the model makes them
    (the Relax VM's instrument times each call), and the median ms of a whole run without the
    instrument.  The instrument adds a few microseconds to each timed call."""
    import statistics
    import time

    import tvm
    from tvm import relax

    import tir_byoc
    from tir_byoc.testing import cnns

    real = cnns.mobilenet_v2(batch=batch)
    model = tir_byoc.build_model(real.module, real.inputs)
    convs = {n for n, code in model.schedules.items() if code == "tir_byoc" and "conv" in n}
    runs: list[list[int]] = []
    started = [0]

    def instrument(_func, symbol, before_run, _ret, *_args):
        now = time.perf_counter_ns()
        if before_run:
            started[0] = time.perf_counter_ns()
        elif str(symbol) in convs:
            runs[-1].append(now - started[0])
        return 0

    timed = relax.VirtualMachine(model.executable, tvm.cpu())
    timed.set_instrument(instrument)
    arguments = model.arguments(real.inputs)
    entry, plain = timed[model.entry], model.vm()[model.entry]
    whole = []
    for index in range(repeats + 2):  # two warm-up runs of each
        runs.append([])
        entry(*arguments)
        start = time.perf_counter_ns()
        plain(*arguments)
        if index >= 2:
            whole.append(time.perf_counter_ns() - start)
    runs = runs[2:]
    calls = [statistics.median(run[i] for run in runs) / 1e3 for i in range(len(runs[0]))]
    return {"calls_us": calls, "run_ms": statistics.median(whole) / 1e6}


def print_in_model(details) -> None:
    """The table of ``--in-model``: tir_byoc's convolution calls in the model against the
    separate chain's primitives (its last round), layer by layer."""
    print(
        "\n| threads | batch | direct chain ms (steps) | tir_byoc conv calls ms | ratio "
        "| layers over 1.05 | worst layer | tir_byoc whole run ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for count, row in details:
        direct = [1e3 * ms for _, ms in row["separate_steps"]]
        calls = row["model"]["calls_us"]
        if len(calls) != len(direct):
            print(f"| {count} | {row['batch']} | {len(direct)} layers, {len(calls)} calls |")
            continue
        ratios = [c / d for c, d in zip(calls, direct)]
        worst = max(range(len(ratios)), key=ratios.__getitem__)
        print(
            f"| {count} | {row['batch']} | {sum(direct) / 1e3:.2f} | {sum(calls) / 1e3:.2f} | "
            f"{sum(calls) / sum(direct):.3f} | {sum(r > 1.05 for r in ratios)} | "
            f"{worst}: {calls[worst]:.0f} / {direct[worst]:.0f} us | {row['model']['run_ms']:.2f} |"
        )


def main(argv=None) -> int:
    parser = Parser(prog="conv_chain.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=20, help="runs of a chain per build")
    parser.add_argument("--rounds", type=int, default=3, help="builds of each chain")
    parser.add_argument("--steps", action="store_true", help="print each step's median too")
    parser.add_argument(
        "--in-model",
        action="store_true",
        help="also time each convolution call of tir_byoc's build of the model, beside the chain",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError:
        batches = threads = []
    if not batches or not threads or min(batches + threads) < 1:
        parser.error("--batches and --threads take comma-separated counts of 1 or more, as 1,8")
    for name in ("repeats", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} measures nothing; expected 1 or more")
    if args.child:  # one thread count, set by the parent before oneDNN loaded
        chain, layers = load_chain(), mobilenet_v2_layers()  # the same at every batch
        for batch in batches:
            result = run_chains(chain, layers, batch, args.repeats, args.rounds)
            if args.in_model:
                result["model"] = model_calls(batch, args.repeats)
            print(json.dumps(result), flush=True)
        return 0
    print(
        "| threads | batch | separate ms | all fused ms | ratio | pairs | chosen ms | ratio "
        "| pairs | pair difference |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    details = []
    for count in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(count), TVM_NUM_THREADS=str(count))
        command = [sys.executable, __file__, "--child", "--batches", args.batches]
        command += ["--repeats", str(args.repeats), "--rounds", str(args.rounds)]
        command += ["--in-model"] if args.in_model else []
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return done.returncode
        for line in done.stdout.splitlines():
            row = json.loads(line)
            cells = [f"{count}", f"{row['batch']}", f"{row['separate']:.2f}"]
            for key in CHAINS[1:]:
                pairs = sum(name.endswith("+ dw") for name, _ in row[key + "_steps"])
                cells += [f"{row[key]:.2f}", f"{row[key] / row['separate']:.3f}", f"{pairs}"]
            print(f"| {' | '.join(cells)} | {row['difference']:.1e} |")
            details.append((count, row))
    if args.in_model:
        print_in_model(details)
    if args.steps:
        for count, row in details:
            print(f"\n{count} thread(s), batch {row['batch']}:")
            for key in CHAINS:
                steps = ", ".join(f"{name} {ms:.3f}" for name, ms in row[key + "_steps"])
                print(f"- {key}: {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
