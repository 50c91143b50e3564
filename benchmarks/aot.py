"""The model as plain C (``tir_byoc.aot``) against the Relax VM build and torch eager, 1 thread.

For the forum MLP (64 x 800 -> 500 -> 10), the BERT-like encoder and the small CNN of
:data:`tir_byoc.testing.models.AOT_MODELS`, each built once by :func:`tir_byoc.aot.build` (whose
``Artifact.model`` is the Relax VM build of the very same lowering, offload and schedules):

- time: the median of ``--rounds`` interleaved rounds, each the median of ``--runs`` calls of
  the AOT runner (``<name> -n RUNS``, timed inside it), of the VM (``Model.run`` on prepared
  tensors) and of torch eager (``no_grad``);
- binary size: the AOT runner, stripped, against the VM's exported library plus the TVM
  runtime it loads into (``libtvm_runtime.so``, ``libtvm_ffi.so``); the backend library both
  link (oneDNN's, OpenBLAS's) is listed apart;
- peak RSS: each way in a fresh process that loads the model and runs it ``--runs`` times
  (``ru_maxrss``; the VM's and torch's include their Python interpreter and imports);
- memory plan: the AOT workspace, every intermediate side by side, the most bytes live at one
  step (the lower bound), and the storage the Relax VM's plan allocates.

Usage::

    .venv/bin/python benchmarks/aot.py [--models forum_mlp,bert,small_cnn] [--backends LIST]
        [--rounds 7] [--runs 50] [--cflags "-O3 -march=native"] [--out DIR]

One thread everywhere (``OMP_NUM_THREADS=1``, ``TVM_NUM_THREADS=1``, torch's
``set_num_threads(1)``), set before TVM or torch load.  The table goes to stdout, the records
to ``DIR/aot.json`` (default ``benchmarks/results/aot``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

for _variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_variable] = "1"  # before TVM, torch and the libraries read them

HERE = Path(__file__).resolve().parent

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402

import tir_byoc.aot as aot  # noqa: E402
from tir_byoc.testing import models  # noqa: E402

RESULTS = HERE / "results" / "aot"
GNU_TIME = "/usr/bin/time"
MODELS = ("forum_mlp", "bert", "small_cnn")

_VM_PROCESS = textwrap.dedent(
    """
    import sys
    import numpy as np, tvm
    from tvm import relax
    library, data, runs = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3])
    vm = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
    inputs = [tvm.runtime.tensor(data[f"input{i}"]) for i in range(len(data.files))]
    for _ in range(runs):
        vm["main"](*inputs)
    """
)

_TORCH_PROCESS = textwrap.dedent(
    """
    import sys
    # What the AOT tests' models module imported, so that the footprint is the same.
    import torch, transformers, tvm, tir_byoc
    from tir_byoc.testing import models
    torch.set_num_threads(1)
    model = models.AOT_MODELS[sys.argv[1]]()
    with torch.no_grad():
        for _ in range(int(sys.argv[2])):
            model.module(*model.inputs)
    """
)


def _median_ns(function, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        function()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times)


def _runner_command(artifact, runner: Path, io: Path, inputs, runs: int) -> list[str]:
    paths = []
    for index, value in enumerate(inputs):
        path = io / f"input{index}.bin"
        np.ascontiguousarray(value).tofile(path)
        paths.append(str(path))
    outputs = [str(io / f"output{i}.bin") for i in range(len(artifact.outputs))]
    constants = (
        ["-c", str(artifact.path(f"{artifact.name}_constants.bin"))] if artifact.blob else []
    )
    return [str(runner), "-n", str(runs), *constants, *paths, *outputs]


def _peak_rss_kib(command: list[str]) -> int | None:
    """The peak resident set (KiB) of ``command``, through GNU time (None without it).

    Not ``os.wait4``: Linux keeps a process's peak RSS across fork and exec, so a child of
    this process would report at least this process's peak (hundreds of MiB of TVM and
    torch); a child of the small ``time`` process reports its own.
    """
    if not Path(GNU_TIME).exists():
        return None
    result = subprocess.run(
        [GNU_TIME, "-f", "%M", *command], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {result.stderr.strip()[-500:]}")
    return int(result.stderr.strip().splitlines()[-1])


def _stripped_size(path: Path, work: Path) -> int:
    copy = work / f"{path.name}.stripped"
    shutil.copyfile(path, copy)
    subprocess.run(["strip", str(copy)], check=True)
    return copy.stat().st_size


def _tvm_runtime_bytes() -> int:
    found = 0
    roots = {Path(tvm.__file__).parent, Path(tvm.__file__).parent.parent / "tvm_ffi"}
    for name in ("libtvm_runtime.so", "libtvm_ffi.so"):
        paths = [p for root in roots for p in root.rglob(name)]
        found += paths[0].stat().st_size if paths else 0
    return found


def measure(name: str, args, work: Path) -> dict:
    # Step 1. One build: the C folder and, as artifact.model, the VM build of the same module.
    model = models.AOT_MODELS[name]()
    artifact = aot.build(
        model.module, model.inputs, out_dir=work / name, name=name, backends=args.backends
    )
    made = subprocess.run(
        ["make", "-s", "-j2", f"CFLAGS={args.cflags}", f"CXXFLAGS={args.cflags}"],
        cwd=artifact.out_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise RuntimeError(f"make failed for {name}: {made.stderr[-800:]}")
    runner = artifact.path(name)
    inputs = [x.numpy() for x in model.inputs]
    io = work / f"{name}_io"
    io.mkdir()
    command = _runner_command(artifact, runner, io, inputs, args.runs)
    built = artifact.model
    tensors = built.arguments(inputs)
    # Step 2. Agreement, then interleaved rounds.
    subprocess.run(command, check=True, capture_output=True)
    aot_out = np.fromfile(io / "output0.bin", artifact.outputs[0].dtype)
    with torch.no_grad():
        expected = model.module(*model.inputs)
    expected = (expected[0] if isinstance(expected, tuple) else expected).numpy().reshape(-1)
    error = float(np.abs(aot_out - expected).max())
    rounds = {"aot": [], "vm": [], "torch": []}
    for _ in range(args.rounds):
        printed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rounds["aot"].append(float(printed.split()[-1]))
        built.run(tensors)  # warm
        rounds["vm"].append(_median_ns(lambda: built.run(tensors), args.runs))
        with torch.no_grad():
            rounds["torch"].append(_median_ns(lambda: model.module(*model.inputs), args.runs))
    times = {way: statistics.median(values) / 1e3 for way, values in rounds.items()}
    # Step 3. Sizes and peak memory, each way in a process of its own.
    library = built.export_library(work / f"{name}_vm.so")
    np.savez(io / "inputs.npz", **{f"input{i}": x for i, x in enumerate(inputs)})
    vm_command = [sys.executable, "-c", _VM_PROCESS, str(library), str(io / "inputs.npz")]
    torch_command = [sys.executable, "-c", _TORCH_PROCESS, name]
    rss = {
        "aot": _peak_rss_kib(command),
        "vm": _peak_rss_kib([*vm_command, str(args.runs)]),
        "torch": _peak_rss_kib([*torch_command, str(args.runs)]),
    }
    return {
        "model": name,
        "backends": list(artifact.backends),
        "max_abs_error_vs_torch": error,
        "time_us": times,
        "rounds_us": {way: [v / 1e3 for v in values] for way, values in rounds.items()},
        "aot_binary_bytes": _stripped_size(runner, work),
        "vm_library_bytes": library.stat().st_size,
        "tvm_runtime_bytes": _tvm_runtime_bytes(),
        "peak_rss_kib": rss,
        "workspace_bytes": artifact.workspace_bytes,
        "intermediate_bytes": artifact.intermediate_bytes,
        "peak_live_bytes": artifact.peak_live_bytes,
        "vm_storage_bytes": artifact.vm_storage_bytes,
        "constants_bytes": artifact.constants_bytes,
        "steps": len(artifact.steps),
        "intrinsic_steps": artifact.intrinsic_steps,
    }


def _mib(kib: int | None, digits: int = 0) -> str:
    return "n/a" if kib is None else f"{kib / 1024:,.{digits}f}"


def table(records: list[dict]) -> str:
    def kib(n):
        return f"{n / 1024:,.0f} KiB"

    lines = [
        "| model | AOT C | Relax VM | torch eager | AOT / VM | AOT binary | VM library + TVM "
        "runtime | peak RSS AOT / VM / torch | workspace | all intermediates | live peak | "
        "VM storage |",
        "|" + " --- |" * 12,
    ]
    for r in records:
        t, rss = r["time_us"], r["peak_rss_kib"]
        lines.append(
            f"| {r['model']} | {t['aot']:,.1f} us | {t['vm']:,.1f} us | {t['torch']:,.1f} us | "
            f"{t['aot'] / t['vm']:.2f} | {kib(r['aot_binary_bytes'])} | "
            f"{kib(r['vm_library_bytes'])} + {kib(r['tvm_runtime_bytes'])} | "
            f"{_mib(rss['aot'], 1)} / {_mib(rss['vm'])} / {_mib(rss['torch'])} MiB"
            f" | {kib(r['workspace_bytes'])} | {kib(r['intermediate_bytes'])} | "
            f"{kib(r['peak_live_bytes'])} | {kib(r['vm_storage_bytes'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--backends", default=None, help="as for tir_byoc.build_model")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--cflags", default="-O3 -march=native", help="the C's CFLAGS")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    records = []
    with tempfile.TemporaryDirectory(prefix="tir_byoc_aot_bench_") as work:
        for name in args.models.split(","):
            records.append(measure(name, args, Path(work)))
            print(f"{name}: done", file=sys.stderr)
    cpu = _cpu_name()
    print(f"{cpu}, 1 thread, C built with {args.cflags!r}; backends {records[0]['backends']}")
    print(table(records))
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"cpu": cpu, "python": platform.python_version(), "cflags": args.cflags,
              "rounds": args.rounds, "runs": args.runs, "models": records}  # fmt: skip
    (args.out / "aot.json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


def _cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
