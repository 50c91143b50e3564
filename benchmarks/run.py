"""tir_byoc against everything a user could pick instead, measured side by side in one run.

Entry point: ``python benchmarks/run.py`` (``make bench``); ``--matcher`` times the matcher
itself instead.  Writes ``benchmarks/results/results.csv`` and ``chart.png`` and prints a table.

Workloads: the seed MLP layers 64x800->500 (+bias+relu) and 64x500->10 (+bias), 128x1024->1024,
512x4096->4096 and the GEMV-like 1x4096->4096 (``MxK->N``, dense weight N x K), in fp32, plus
bf16 and int8 (u8 x s8 -> s32) where oneDNN runs them on this CPU; and the whole seed MLP on the
Relax VM.  Implementations: tir_byoc with each backend; the same libraries called directly from
C (no TVM; ``direct_onednn.cpp``, ``direct_openblas.c``, compiled here) to measure the bridge;
NumPy; PyTorch eager (if installed); TVM unscheduled, with its default (dlight) schedule, and
tuned by MetaSchedule (``--trials``, tuning cached under ``results/metaschedule``).

Every implementation runs in its own process (the libraries' thread pools would otherwise
disturb each other's numbers; see ``benchmarks/threads.py``), with ``TVM_NUM_THREADS`` set to
the core count unless set.  Times are medians over repeated runs after warm-up.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


@dataclass(frozen=True)
class Workload:
    name: str
    m: int
    n: int
    k: int
    pattern: str

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


WORKLOADS = (
    Workload("64x800->500 +bias+relu", 64, 500, 800, "dense_bias_relu"),
    Workload("64x500->10 +bias", 64, 10, 500, "dense_bias"),
    Workload("128x1024->1024", 128, 1024, 1024, "dense"),
    Workload("512x4096->4096", 512, 4096, 4096, "dense"),
    Workload("1x4096->4096", 1, 4096, 4096, "dense"),
)
MLP = Workload("seed MLP (Relax VM)", 64, 0, 0, "mlp")
MLP_FLOPS = 2.0 * 64 * (800 * 500 + 500 * 10)
#: The seed MLP's two layers, as the direct harnesses take them (``_layer``'s format).
MLP_LAYERS = ["64:500:800:f32:dense:1:1", "64:10:500:f32:dense:1:0"]
#: dtype label -> tir_byoc signature; bf16 / int8 only for implementations that take them.
DTYPES = {"fp32": "float32", "bf16": "bfloat16,bfloat16->float32", "int8": "uint8,int8->int32"}
TIR_BYOC = ("tir_byoc+onednn", "tir_byoc+openblas", "tir_byoc+ref")
DIRECT = {"tir_byoc+onednn": "oneDNN direct (C)", "tir_byoc+openblas": "OpenBLAS direct (C)"}


@dataclass
class Row:
    workload: str
    dtype: str
    implementation: str
    ms: float | None
    gflops: float | None = None
    vs_direct: float | None = None
    vs_best_peer: float | None = None
    note: str = ""


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def _plan(first_seconds: float, budget: float) -> tuple[int, int]:
    """(number, repeat): each repeat ~1 ms or one call, the whole ~``budget`` seconds."""
    number = max(1, int(1e-3 / max(first_seconds, 1e-9)))
    repeat = int(budget / max(first_seconds * number, 1e-9))
    return number, max(3, min(repeat, 200))


def time_python(run, budget: float) -> float:
    """Median milliseconds of ``run()``, timed from Python."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    number, repeat = _plan(first, budget)
    for _ in range(max(1, min(number * 5, int(0.2 / max(first, 1e-9))))):
        run()  # warm-up
    means = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            run()
        means.append((time.perf_counter() - start) / number)
    return statistics.median(means) * 1e3


#: Above this many seconds per call, a cell is timed by one more call instead of a median.
SLOW_SECONDS = 2.0


def time_tvm(module, name: str, args, budget: float) -> float:
    """Median milliseconds of ``module[name](*args)``, timed in C++ by TVM's evaluator.

    A call slower than :data:`SLOW_SECONDS` is timed once more and that time is returned
    (``slow_note`` says so).
    """
    import tvm

    start = time.perf_counter()
    module[name](*args)
    first = time.perf_counter() - start
    if first > SLOW_SECONDS:
        evaluator = module.time_evaluator(name, tvm.cpu(), number=1, repeat=1)
        return evaluator(*args).median * 1e3
    number, repeat = _plan(first, budget)
    for _ in range(max(1, min(20, int(0.2 / max(first, 1e-9))))):
        module[name](*args)
    evaluator = module.time_evaluator(name, tvm.cpu(), number=number, repeat=repeat)
    return evaluator(*args).median * 1e3


def slow_note(ms: float | None) -> str:
    return (
        f"one timed run (a run takes over {SLOW_SECONDS:.0f} s)"
        if ms and ms > 1e3 * SLOW_SECONDS
        else ""
    )


# --------------------------------------------------------------------------------------
# The workloads as TIR and as arrays
# --------------------------------------------------------------------------------------


def target():
    import tvm

    cores = int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": cores})


def prim_func(workload: Workload, signature: str):
    """The workload as TVM lowers it: a TE matmul with bias / relu blocks, static shapes."""
    import tvm
    from tvm import te, tirx

    from tir_byoc.signature import DtypeSignature

    dtypes = DtypeSignature.parse(signature)
    m, n, k = workload.m, workload.n, workload.k
    x = te.placeholder((m, k), dtypes.x, name="X")
    w = te.placeholder((n, k), dtypes.w, name="W")
    r = te.reduce_axis((0, k), name="k")

    def widen(load, dtype):
        return load if dtype == dtypes.out else load.astype(dtypes.out)

    y = te.compute(
        (m, n),
        lambda i, j: te.sum(widen(x[i, r], dtypes.x) * widen(w[j, r], dtypes.w), axis=r),
        name="dense",
    )
    args = [x, w]
    if "bias" in workload.pattern:
        b = te.placeholder((n,), dtypes.out, name="b")
        args.append(b)
        y = te.compute((m, n), lambda i, j: y[i, j] + b[j], name="T_add")
    if "relu" in workload.pattern:
        zero = tirx.const(0, dtypes.out)
        y = te.compute((m, n), lambda i, j: te.max(y[i, j], zero), name="compute")
    func = te.create_prim_func([*args, y]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def arrays(workload: Workload, signature: str, seed: int = 0):
    import ml_dtypes
    import numpy as np

    from tir_byoc.signature import DtypeSignature

    dtypes = DtypeSignature.parse(signature)
    rng = np.random.default_rng(seed)

    def make(shape, dtype):
        if dtype in ("uint8", "int8"):
            info = np.iinfo(dtype)
            return rng.integers(info.min, info.max + 1, shape).astype(dtype)
        if dtype == "int32":
            return rng.integers(-1000, 1000, shape).astype(dtype)
        np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
        return rng.standard_normal(shape).astype(np_dtype)

    m, n, k = workload.m, workload.n, workload.k
    operands = [make((m, k), dtypes.x), make((n, k), dtypes.w)]
    if "bias" in workload.pattern:
        operands.append(make((n,), dtypes.out))
    return operands, np.zeros((m, n), dtypes.out)


# --------------------------------------------------------------------------------------
# Implementations (each runs in a child process)
# --------------------------------------------------------------------------------------


def _tvm_run(mod, workload, signature, budget):
    import tvm

    built = tvm.compile(mod, target=target())
    operands, out = arrays(workload, signature)
    args = [tvm.runtime.tensor(a) for a in (*operands, out)]
    return time_tvm(built.mod if hasattr(built, "mod") else built, "main", args, budget)


def measure_tir_byoc(backend, workload, signature, budget):
    import tir_byoc

    mod = prim_func(workload, signature)
    (match,) = tir_byoc.scan(mod, backends=[backend])
    if match.intrinsic is None:
        return None, match.reason
    offloaded = tir_byoc.offload(mod, backends=[backend])
    ms = _tvm_run(offloaded, workload, signature, budget)
    note = match.intrinsic if backend != "openblas" else f"{match.intrinsic}; {_blas_note()}"
    return ms, note


def measure_tvm(schedule, workload, signature, budget):
    from tvm.s_tir import dlight

    mod = prim_func(workload, signature)
    if schedule == "dlight":
        with target():
            mod = dlight.ApplyDefaultSchedule(dlight.cpu.GEMV(), dlight.cpu.Reduction())(mod)
    ms = _tvm_run(mod, workload, signature, budget)
    return ms, slow_note(ms)


def measure_metaschedule(trials, workload, signature, budget):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mod = prim_func(workload, signature)
    work_dir = (
        RESULTS
        / "metaschedule"
        / f"{workload.m}x{workload.k}x{workload.n}-{workload.pattern}-{trials}"
    )
    marker = work_dir / "tuned.json"
    if marker.is_file():
        tuning = json.loads(marker.read_text())["seconds"]
        database = ms.database.JSONDatabase(
            str(work_dir / "database_workload.json"), str(work_dir / "database_tuning_record.json")
        )
        note = f"{trials} trials, tuned in {tuning:.0f} s (cached)"
    else:
        work_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        # Generous timeouts: on a busy 2-core machine the defaults (30 s) time out builds.
        database = ms.tune_tir(
            mod,
            target(),
            str(work_dir),
            max_trials_global=trials,
            num_trials_per_iter=min(16, trials),
            builder=ms.builder.LocalBuilder(timeout_sec=300),
            runner=ms.runner.LocalRunner(
                timeout_sec=300, evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1)
            ),
        )
        tuning = time.perf_counter() - start
        marker.write_text(json.dumps({"seconds": tuning, "trials": trials}))
        note = f"{trials} trials, tuned in {tuning:.0f} s"
    schedule = ms.tir_integration.compile_tir(database, mod, target())
    if schedule is None:
        return None, f"{note}; no tuned schedule found"
    built = tvm.compile(schedule.mod, target=target())
    operands, out = arrays(workload, signature)
    args = [tvm.runtime.tensor(a) for a in (*operands, out)]
    return time_tvm(built.mod if hasattr(built, "mod") else built, "main", args, budget), note


def measure_numpy(workload, signature, budget):
    import numpy as np

    (x, w, *bias), out = arrays(workload, signature)
    wt = w.T

    def run():
        np.matmul(x, wt, out=out)
        if bias:
            np.add(out, bias[0], out=out)
        if "relu" in workload.pattern:
            np.maximum(out, 0, out=out)

    return time_python(run, budget), _blas_note()


def measure_torch(workload, signature, budget):
    try:
        import torch
    except ImportError:
        return None, "torch not installed (pip install torch==2.13.0)"
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1)))
    (x, w, *bias), _ = arrays(workload, signature)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    tb = torch.from_numpy(bias[0]) if bias else None
    relu = "relu" in workload.pattern

    def run():
        with torch.no_grad():
            y = torch.nn.functional.linear(tx, tw, tb)
            if relu:
                y.relu_()

    return time_python(run, budget), f"torch {torch.__version__}, {torch.get_num_threads()} threads"


def _direct_binary(library: str) -> Path:
    """Compile the direct-call harness of ``library`` (cached next to the results)."""
    import tir_byoc
    from tir_byoc import toolchain

    spec = tir_byoc.REGISTRY.backend(library).locate()
    source = HERE / ("direct_onednn.cpp" if library == "onednn" else "direct_openblas.c")
    binary = RESULTS / "bin" / f"direct_{library}"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        binary.parent.mkdir(parents=True, exist_ok=True)
        compiler = toolchain.cxx_compiler() if library == "onednn" else toolchain.c_compiler()
        include = [*spec.include_dirs, str(HERE.parent / "intrinsics" / "include")]
        flags = [f"-I{d}" for d in include] + list(spec.compile_flags)
        command = [
            compiler.path,
            "-O3",  # as tir_byoc builds its intrinsics (toolchain._BASE_FLAGS)
            *flags,
            str(source),
            "-o",
            str(binary),
            *toolchain.link_flags(spec),
        ]
        subprocess.run(command, check=True)
    return binary


def _layer(workload: Workload, dtype: str) -> str:
    short = {"fp32": "f32", "bf16": "bf16", "int8": "u8s8"}[dtype]
    bias, relu = int("bias" in workload.pattern), int("relu" in workload.pattern)
    return f"{workload.m}:{workload.n}:{workload.k}:{short}:dense:{bias}:{relu}"


def _run_direct(library: str, layers, budget: float, mode: str | None = None) -> list[str]:
    """The direct harness's output, timing ``layers`` for about ``budget`` seconds.

    ``mode`` is the oneDNN harness's third argument (plain, prepacked, interleaved:LIBRARY).
    """
    binary = _direct_binary(library)
    modes = [mode] if mode else []

    def run(warmup: int, repeats: int) -> list[str]:
        command = [str(binary), str(warmup), str(repeats), *modes, *layers]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()

    first = float(run(1, 3)[0])
    number, repeat = _plan(first * 1e-3, budget)
    return run(max(3, min(200, int(200 / max(first, 1e-6)))), repeat * number)


def measure_direct(library, layers, budget, prepacked=False):
    mode = ("prepacked" if prepacked else "plain") if library == "onednn" else None
    output = _run_direct(library, layers, budget, mode)
    return float(output[0]), " ".join(sorted(set(output[1:])))


def measure_bridge(budget: float) -> int:
    """Print the direct oneDNN call against tir_byoc's intrinsic, interleaved in one process.

    This is the bridge without TVM's own call (a compiled PrimFunc reaches the intrinsic by a
    plain C call) and without the drift between processes that the main table suffers.
    """
    import tir_byoc

    mode = f"interleaved:{tir_byoc.toolchain.shared_library('onednn')}"
    cases = [(w.name, dtype, [_layer(w, dtype)]) for w in WORKLOADS for dtype in DTYPES]
    cases.append(("seed MLP, both layers", "fp32", MLP_LAYERS))
    print("| workload | dtype | oneDNN direct ms | tir_byoc intrinsic ms | intrinsic / direct |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, dtype, layers in cases:
        direct, bridged = (float(t) for t in _run_direct("onednn", layers, budget, mode)[:2])
        print(f"| {name} | {dtype} | {direct:.4f} | {bridged:.4f} | {bridged / direct:.3f} |")
    return 0


def _blas_note() -> str:
    """The BLAS libraries loaded in this process and the kernel (core) each runs."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return "; ".join(
        f"{Path(p['filepath']).name} {p.get('architecture')} x{p.get('num_threads')}" for p in pools
    )


# --------------------------------------------------------------------------------------
# The seed MLP on the Relax VM
# --------------------------------------------------------------------------------------


def measure_mlp(implementation, budget):
    import numpy as np
    import tvm
    from tvm import relax

    import tir_byoc
    from tir_byoc.demo import default_schedule, lowered_mlp, mlp_weights

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 800)).astype("float32")
    params = mlp_weights(rng)
    if implementation in ("NumPy", "PyTorch eager"):
        return _mlp_python(implementation, x, params, budget)
    if implementation in DIRECT.values():
        library = "onednn" if "oneDNN" in implementation else "openblas"
        return measure_direct(library, MLP_LAYERS, budget)
    mod = lowered_mlp()
    note = ""
    if implementation.startswith("tir_byoc"):
        backend = implementation.split("+")[1].split(" ")[0]
        fold = "transposes kept" not in implementation
        mod = tir_byoc.offload(mod, backends=[backend], fold_transposes=fold)
        note = f"{mod['forward'].script().count('call_tir(')} call_tir per run"
    if implementation != "Relax unscheduled":  # dlight for whatever tir_byoc left to TVM
        mod = default_schedule(mod, target())
    vm = relax.VirtualMachine(tvm.compile(mod, target=target()), tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in (x, *params)]
    expected = np.maximum(x @ params[0].T + params[1], 0) @ params[2].T + params[3]
    if not np.allclose(vm["forward"](*args).numpy(), expected, rtol=1e-4, atol=1e-4):
        return None, "WRONG RESULT"
    return time_tvm(vm, "forward", args, budget), note


def _mlp_python(implementation, x, params, budget):
    import numpy as np

    w1, b1, w2, b2 = params
    if implementation == "NumPy":
        h = np.empty((64, 500), "float32")
        y = np.empty((64, 10), "float32")
        w1t, w2t = w1.T, w2.T

        def run():
            np.matmul(x, w1t, out=h)
            np.add(h, b1, out=h)
            np.maximum(h, 0, out=h)
            np.matmul(h, w2t, out=y)
            np.add(y, b2, out=y)

        return time_python(run, budget), _blas_note()
    try:
        import torch
    except ImportError:
        return None, "torch not installed (pip install torch==2.13.0)"
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1)))
    tx, tw1, tb1, tw2, tb2 = (torch.from_numpy(a) for a in (x, w1, b1, w2, b2))
    linear = torch.nn.functional.linear

    def run():
        with torch.no_grad():
            linear(linear(tx, tw1, tb1).relu_(), tw2, tb2)

    return time_python(run, budget), f"torch {torch.__version__}"


# --------------------------------------------------------------------------------------
# Children and the table
# --------------------------------------------------------------------------------------

LAYER_IMPLEMENTATIONS = (
    "tir_byoc+onednn",
    "tir_byoc+openblas",
    "tir_byoc+ref",
    "oneDNN direct (C)",
    "oneDNN direct, prepacked weight (C)",
    "OpenBLAS direct (C)",
    "NumPy",
    "PyTorch eager",
    "TVM unscheduled",
    "TVM dlight default",
    "TVM MetaSchedule",
)
MLP_IMPLEMENTATIONS = (
    "tir_byoc+onednn",
    "tir_byoc+onednn (transposes kept)",
    "tir_byoc+openblas",
    "oneDNN direct (C)",
    "OpenBLAS direct (C)",
    "NumPy",
    "PyTorch eager",
    "Relax unscheduled",
    "Relax + dlight",
)
#: Implementations that run bf16 / int8.
TYPED = ("tir_byoc+onednn", "oneDNN direct (C)")


def measure_layer(implementation, workload, dtype, args):
    signature = DTYPES[dtype]
    budget = args.budget
    if implementation.startswith("tir_byoc+"):
        backend = implementation.split("+")[1]
        if backend == "ref" and workload.flops > 2e8:
            return None, "skipped: the reference kernel needs seconds per call here"
        return measure_tir_byoc(backend, workload, signature, budget)
    if implementation.startswith("oneDNN direct"):
        return measure_direct(
            "onednn", [_layer(workload, dtype)], budget, "prepacked" in implementation
        )
    if implementation == "OpenBLAS direct (C)":
        return measure_direct("openblas", [_layer(workload, dtype)], budget)
    if implementation == "NumPy":
        return measure_numpy(workload, signature, budget)
    if implementation == "PyTorch eager":
        return measure_torch(workload, signature, budget)
    if implementation == "TVM MetaSchedule":
        if args.trials <= 0:
            return None, "skipped (--trials 0)"
        if workload.flops > args.ms_max_gflop * 1e9:
            return (
                None,
                f"skipped: above --ms-max-gflop {args.ms_max_gflop} (tuning takes too long)",
            )
        return measure_metaschedule(args.trials, workload, signature, budget)
    schedule = "dlight" if "dlight" in implementation else "none"
    return measure_tvm(schedule, workload, signature, min(budget, 3.0))


def child(args) -> list[dict]:
    implementation = args.child
    rows = []
    if args.mlp:
        ms, note = measure_mlp(implementation, args.budget)
        rows.append(asdict(Row(MLP.name, "fp32", implementation, ms, note=note)))
        return rows
    for workload in WORKLOADS:
        if args.workloads and workload.name not in args.workloads:
            continue
        for dtype in ("fp32", "bf16", "int8"):
            if dtype != "fp32" and implementation not in TYPED:
                continue
            try:
                ms, note = measure_layer(implementation, workload, dtype, args)
            except Exception as err:  # report and go on: one failure must not hide the rest
                ms, note = None, f"failed: {type(err).__name__}: {str(err).splitlines()[0]}"
            rows.append(asdict(Row(workload.name, dtype, implementation, ms, note=note)))
            print(
                f"  {implementation:<36} {workload.name:<24} {dtype:<5} "
                f"{'-' if ms is None else f'{ms:.4f} ms'}  {note}",
                file=sys.stderr,
                flush=True,
            )
    return rows


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, from /proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return math.nan
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _run_child(implementation, mlp, args, env) -> list[dict]:
    """Run one implementation in a child; its rows note how busy other processes kept the CPU."""
    busy, own, start = _busy_seconds(), _own_seconds(), time.perf_counter()
    rows = _run_child_process(implementation, mlp, args, env)
    wall = time.perf_counter() - start
    foreign = (_busy_seconds() - busy - (_own_seconds() - own)) / (wall * (os.cpu_count() or 1))
    for row in rows:
        row["note"] = f"{row['note']}; other load {max(foreign, 0):.0%}".lstrip("; ")
    return rows


def _run_child_process(implementation, mlp, args, env) -> list[dict]:
    command = [
        sys.executable,
        __file__,
        "--child",
        implementation,
        "--budget",
        str(args.budget),
        "--trials",
        str(args.trials),
        "--ms-max-gflop",
        str(args.ms_max_gflop),
    ]
    if mlp:
        command.append("--mlp")
    for name in args.workloads or ():
        command += ["--workload", name]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        return [
            asdict(
                Row(
                    MLP.name if mlp else "all",
                    "fp32",
                    implementation,
                    None,
                    note=f"child exited with {done.returncode}",
                )
            )
        ]
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_of_rounds(raw: list[dict]) -> list[dict]:
    """One row per (workload, dtype, implementation): the fastest round's."""
    best = {}
    for row in raw:
        key = (row["workload"], row["dtype"], row["implementation"])
        kept = best.get(key)
        if kept is None or (
            row["ms"] is not None and (kept["ms"] is None or row["ms"] < kept["ms"])
        ):
            best[key] = row
    return list(best.values())


def complete(rows: list[Row]) -> list[Row]:
    """Fill GFLOP/s and the two ratio columns."""
    flops = {w.name: w.flops for w in WORKLOADS} | {MLP.name: MLP_FLOPS}
    by_key = {}
    for row in rows:
        by_key.setdefault((row.workload, row.dtype), []).append(row)
    for (workload, _), group in by_key.items():
        times = {r.implementation: r.ms for r in group if r.ms}
        peers = [ms for name, ms in times.items() if not name.startswith("tir_byoc")]
        best_peer = min(peers) if peers else None
        for row in group:
            if not row.ms:
                continue
            row.gflops = flops[workload] / row.ms / 1e6
            base = DIRECT.get(row.implementation.split(" ")[0], "oneDNN direct (C)")
            if times.get(base):
                row.vs_direct = row.ms / times[base]
            if best_peer:
                row.vs_best_peer = best_peer / row.ms
    return rows


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_table(rows: list[Row], out=sys.stdout) -> None:
    header = (
        f"| {'workload':<24} | {'dtype':<5} | {'implementation':<36} | {'ms':>9} | "
        f"{'GFLOP/s':>7} | {'x direct':>8} | {'best peer / this':>16} | note |"
    )
    print(header, file=out)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|", file=out)
    for r in rows:
        print(
            f"| {r.workload:<24} | {r.dtype:<5} | {r.implementation:<36} | {_fmt(r.ms, '9.4f')} | "
            f"{_fmt(r.gflops, '7.1f')} | {_fmt(r.vs_direct, '8.2f')} | "
            f"{_fmt(r.vs_best_peer, '16.2f')} | {r.note} |",
            file=out,
        )


def chart(rows: list[Row], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no chart: matplotlib not installed (pip install -e '.[bench]')"
    groups = [(w, d) for w, d in dict.fromkeys((r.workload, r.dtype) for r in rows)]
    names = list(dict.fromkeys(r.implementation for r in rows))
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 2.2 * len(groups)), squeeze=False)
    for ax, (workload, dtype) in zip(axes[:, 0], groups):
        values = {
            r.implementation: r.gflops for r in rows if (r.workload, r.dtype) == (workload, dtype)
        }
        shown = [n for n in names if values.get(n)]
        ax.barh(
            shown,
            [values[n] for n in shown],
            color=["tab:orange" if n.startswith("tir_byoc") else "tab:blue" for n in shown],
        )
        ax.set_xscale("log")
        ax.set_title(f"{workload} [{dtype}]: GFLOP/s (log scale)", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical cores, Linux {platform.release()}"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (status 2), as the ``tir-byoc`` command line has them."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _names(names) -> str:
    return ", ".join(repr(name) for name in names)


def check_selection(parser: argparse.ArgumentParser, args) -> None:
    """Refuse, before anything runs, filters that name nothing or together select nothing."""
    if args.child:  # the parent already checked what it passes on
        return
    workloads = [w.name for w in WORKLOADS]
    for name in args.workloads or ():
        if name not in workloads:
            parser.error(
                f"--workload {name!r} is not a workload; expected one of {_names(workloads)}; "
                "the seed MLP is not selected by name (it runs unless --no-mlp)"
            )
    implementations = list(dict.fromkeys((*LAYER_IMPLEMENTATIONS, *MLP_IMPLEMENTATIONS)))
    for name in args.only or ():
        if name not in implementations:
            parser.error(
                f"--only {name!r} is not an implementation; expected one of "
                f"{_names(implementations)}"
            )
    if args.no_mlp and args.only and not set(args.only) & set(LAYER_IMPLEMENTATIONS):
        parser.error(
            f"--only {_names(args.only)} with --no-mlp selects nothing: those run only on the "
            f"seed MLP; the layer workloads run {_names(LAYER_IMPLEMENTATIONS)}"
        )
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} measures nothing; expected 1 or more")
    if not args.budget > 0:
        parser.error(f"--budget {args.budget}: expected seconds of timing per cell, above 0")


def main(argv=None) -> int:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per cell")
    parser.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per workload")
    parser.add_argument(
        "--ms-max-gflop", type=float, default=5.0, help="no MetaSchedule above this size"
    )
    parser.add_argument(
        "--workload",
        dest="workloads",
        action="append",
        help=f"only this layer workload (repeatable): {_names(w.name for w in WORKLOADS)}",
    )
    parser.add_argument(
        "--only",
        action="append",
        help="only this implementation (repeatable): "
        + _names(dict.fromkeys((*LAYER_IMPLEMENTATIONS, *MLP_IMPLEMENTATIONS))),
    )
    parser.add_argument("--no-mlp", action="store_true", help="skip the end-to-end MLP")
    parser.add_argument("--matcher", action="store_true", help="time the matcher instead")
    parser.add_argument(
        "--bridge",
        action="store_true",
        help="time tir_byoc's oneDNN intrinsics against direct oneDNN calls in one process",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure everything N times, keep the best"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mlp", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    check_selection(parser, args)
    if args.child:
        print(json.dumps(child(args)))
        return 0
    if args.bridge:
        return measure_bridge(args.budget)
    if args.matcher:
        from matcher_speed import main as matcher_main

        return matcher_main()
    # Step 1. One environment for every child: TVM uses all cores, as the libraries do;
    # the machine's OpenBLAS core-type override is dropped for this command only.
    env = dict(os.environ)
    env.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(name, None)
    print(
        f"machine: {machine()}; TVM_NUM_THREADS={env['TVM_NUM_THREADS']}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    # Step 2. Each implementation in its own process; with --rounds, the best round per cell
    # (interference from other processes only ever adds time).
    raw = []
    for round_ in range(args.rounds):
        for mlp, names in ((False, LAYER_IMPLEMENTATIONS), (True, MLP_IMPLEMENTATIONS)):
            if mlp and args.no_mlp:
                continue
            for implementation in names:
                if args.only and implementation not in args.only:
                    continue
                what = "the MLP with " if mlp else ""
                print(
                    f"round {round_ + 1}: measuring {what}{implementation} ...",
                    file=sys.stderr,
                    flush=True,
                )
                raw += _run_child(implementation, mlp, args, env)
    raw = best_of_rounds(raw)
    order = {w.name: i for i, w in enumerate((*WORKLOADS, MLP))}
    rows = complete([Row(**r) for r in raw])
    rows.sort(key=lambda r: (order.get(r.workload, 99), list(DTYPES).index(r.dtype)))
    # Step 3. Table, CSV, chart.
    args.out.mkdir(parents=True, exist_ok=True)
    print_table(rows)
    with open(args.out / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    print(f"wrote {args.out / 'results.csv'}; chart: {chart(rows, args.out / 'chart.png')}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
