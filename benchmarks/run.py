"""tir_byoc against everything a user could pick instead, measured side by side in one run.

Entry point: ``python benchmarks/run.py`` (``make bench``); ``--matcher`` times the matcher
itself instead.  Writes ``benchmarks/results/results.csv`` and ``chart.png`` and prints a table.

Workloads: the seed MLP layers 64x800->500 (+bias+relu) and 64x500->10 (+bias), 128x1024->1024,
512x4096->4096 and the GEMV-like 1x4096->4096 (``MxK->N``, dense weight N x K); the batch forms
(group ``batch``): attention's Q.K^T and P.V as batched matmuls over 8 x 12 heads and a Linear
on an (8, 128, 768) activation; in fp32, plus bf16 and int8 (u8 x s8 -> s32) where oneDNN runs
them on this CPU; the epilogue workloads (group ``epilogue``, fp32): a Linear + GELU, LLaMA's
gated MLP (two GEMMs, SiLU and the gate multiply) and a Linear + residual add, each checked
once against a float64 result before it is timed; and the whole seed MLP on the Relax VM.
Implementations: tir_byoc with each backend; the same libraries called directly from C (no TVM;
``direct_onednn.cpp``, ``direct_openblas.c``, compiled here) to measure the bridge; NumPy;
PyTorch eager (if installed); TVM unscheduled, with its default (dlight) schedule, and tuned by
MetaSchedule (``--trials``, tuning cached under ``results/metaschedule``).

Every implementation runs in its own process (the libraries' thread pools would otherwise
disturb each other's numbers; see ``benchmarks/threads.py``), with ``TVM_NUM_THREADS`` set to
the core count unless set.  Times are medians over repeated runs after warm-up.

This file is the command line and the runner of the children; the rest is in
``workloads.py`` (the workloads, their TIR and arrays), ``implementations.py`` (every
implementation, in one table), ``direct.py`` (the direct-call harnesses and ``--bridge``),
``timing.py`` and ``report.py`` (the table, CSV and chart).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from direct import RESULTS, measure_bridge
from implementations import IMPLEMENTATIONS, Settings, running
from report import Row, best_of_rounds, chart, complete, machine, print_table, write_csv
from timing import Parser
from workloads import DTYPES, GROUPS, MLP, WORKLOADS, select

# --------------------------------------------------------------------------------------
# Children: one implementation each
# --------------------------------------------------------------------------------------


def child(args) -> list[dict]:
    implementation = IMPLEMENTATIONS[args.child]
    settings = Settings(args.budget, args.trials, args.ms_max_gflop, args.ms_batch)
    if args.mlp:
        ms, note = implementation.mlp(settings)
        return [asdict(Row(MLP.name, "fp32", implementation.name, ms, note=note))]
    rows = []
    for workload in select(args.workloads):
        for dtype in (d for d in implementation.dtypes if d in workload.dtypes):
            try:
                ms, note = implementation.measure_layer(workload, dtype, settings)
            except Exception as err:  # report and go on: one failure must not hide the rest
                ms, note = None, f"failed: {type(err).__name__}: {str(err).splitlines()[0]}"
            rows.append(asdict(Row(workload.name, dtype, implementation.name, ms, note=note)))
            print(
                f"  {implementation.name:<36} {workload.name:<26} {dtype:<5} "
                f"{'-' if ms is None else f'{ms:.4f} ms'}  {note}",
                file=sys.stderr,
                flush=True,
            )
    return rows


# --------------------------------------------------------------------------------------
# The parent: each child in turn, with the load of other processes noted
# --------------------------------------------------------------------------------------


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
    if args.ms_batch:
        command.append("--ms-batch")
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


# --------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------


def _names(names) -> str:
    return ", ".join(repr(name) for name in names)


def check_selection(parser: argparse.ArgumentParser, args) -> None:
    """Refuse, before anything runs, filters that name nothing or together select nothing."""
    if args.child:  # the parent already checked what it passes on
        return
    for name in args.workloads or ():
        try:
            select([name])
        except ValueError as err:
            parser.error(
                f"--workload {err}; the seed MLP is not selected by name (it runs unless --no-mlp)"
            )
    for name in args.only or ():
        if name not in IMPLEMENTATIONS:
            parser.error(
                f"--only {name!r} is not an implementation; expected one of "
                f"{_names(IMPLEMENTATIONS)}"
            )
    layer = [i.name for i in running("layer")]
    if args.no_mlp and args.only and not set(args.only) & set(layer):
        parser.error(
            f"--only {_names(args.only)} with --no-mlp selects nothing: those run only on the "
            f"seed MLP; the layer workloads run {_names(layer)}"
        )
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds} measures nothing; expected 1 or more")
    if not args.budget > 0:
        parser.error(f"--budget {args.budget}: expected seconds of timing per cell, above 0")


def main(argv=None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per cell")
    parser.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per workload")
    parser.add_argument(
        "--ms-max-gflop", type=float, default=5.0, help="no MetaSchedule above this size"
    )
    parser.add_argument(
        "--ms-batch",
        action="store_true",
        help="tune the batch forms too (64 trials took 36 min per workload on a 2-vCPU VM)",
    )
    parser.add_argument(
        "--workload",
        dest="workloads",
        action="append",
        help=f"only this layer workload (repeatable): {_names(w.name for w in WORKLOADS)}; "
        f"or a group of them: {_names(GROUPS)}",
    )
    parser.add_argument(
        "--only",
        action="append",
        help=f"only this implementation (repeatable): {_names(IMPLEMENTATIONS)}",
    )
    parser.add_argument("--no-mlp", action="store_true", help="skip the end-to-end MLP")
    parser.add_argument("--matcher", action="store_true", help="time the matcher instead")
    parser.add_argument(
        "--bridge",
        action="store_true",
        help="time tir_byoc's oneDNN intrinsics against direct oneDNN calls in one process "
        "(--workload and --no-mlp select)",
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
        return measure_bridge(args.budget, select(args.workloads), mlp=not args.no_mlp)
    if args.matcher:
        from matcher_speed import main as matcher_main

        return matcher_main()
    # Step 1. One environment for every child: TVM uses all cores unless told otherwise, and
    # every library's pool (OpenMP: oneDNN; OpenBLAS, NumPy's too) as many threads as TVM
    # (PyTorch follows TVM_NUM_THREADS itself); the machine's OpenBLAS core-type override is
    # dropped for this command only.
    env = dict(os.environ)
    threads = env.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(name, threads)
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(name, None)
    print(
        f"machine: {machine()}; TVM_NUM_THREADS={threads}, OMP_NUM_THREADS="
        f"{env['OMP_NUM_THREADS']}, OPENBLAS_NUM_THREADS={env['OPENBLAS_NUM_THREADS']}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    # Step 2. Each implementation in its own process; with --rounds, the best round per cell
    # (interference from other processes only ever adds time).
    raw = []
    for round_ in range(args.rounds):
        for kind in ("layer",) if args.no_mlp else ("layer", "mlp"):
            for implementation in running(kind):
                if args.only and implementation.name not in args.only:
                    continue
                what = "the MLP with " if kind == "mlp" else ""
                print(
                    f"round {round_ + 1}: measuring {what}{implementation.name} ...",
                    file=sys.stderr,
                    flush=True,
                )
                raw += _run_child(implementation.name, kind == "mlp", args, env)
    raw = best_of_rounds(raw)
    order = {w.name: i for i, w in enumerate((*WORKLOADS, MLP))}
    rows = complete([Row(**r) for r in raw])
    rows.sort(key=lambda r: (order.get(r.workload, 99), list(DTYPES).index(r.dtype)))
    # Step 3. Table, CSV, chart.
    args.out.mkdir(parents=True, exist_ok=True)
    print_table(rows)
    write_csv(rows, args.out / "results.csv")
    print(f"wrote {args.out / 'results.csv'}; chart: {chart(rows, args.out / 'chart.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
