"""The benchmark's results: rows, their ratio columns, and the table, CSV and chart of them.

Entry points: :class:`Row`, :func:`best_of_rounds`, :func:`complete` (GFLOP/s and the two
ratio columns, read from :data:`implementations.IMPLEMENTATIONS`), :func:`print_table`,
:func:`write_csv`, :func:`chart` and :func:`machine`.
"""

from __future__ import annotations

import csv
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from implementations import IMPLEMENTATIONS
from workloads import FLOPS

from tir_byoc.backends.cpu import cpuinfo_field


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
    by_key = {}
    for row in rows:
        by_key.setdefault((row.workload, row.dtype), []).append(row)
    for (workload, _), group in by_key.items():
        times = {r.implementation: r.ms for r in group if r.ms}
        peers = [ms for name, ms in times.items() if not IMPLEMENTATIONS[name].tir_byoc]
        best_peer = min(peers) if peers else None
        for row in group:
            if not row.ms:
                continue
            row.gflops = FLOPS[workload] / row.ms / 1e6
            base = IMPLEMENTATIONS[row.implementation].direct
            if times.get(base):
                row.vs_direct = row.ms / times[base]
            if best_peer:
                row.vs_best_peer = best_peer / row.ms
    return rows


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_table(rows: list[Row], out=sys.stdout) -> None:
    header = (
        f"| {'workload':<26} | {'dtype':<5} | {'implementation':<36} | {'ms':>9} | "
        f"{'GFLOP/s':>7} | {'x direct':>8} | {'best peer / this':>16} | note |"
    )
    print(header, file=out)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|", file=out)
    for r in rows:
        print(
            f"| {r.workload:<26} | {r.dtype:<5} | {r.implementation:<36} | {_fmt(r.ms, '9.4f')} | "
            f"{_fmt(r.gflops, '7.1f')} | {_fmt(r.vs_direct, '8.2f')} | "
            f"{_fmt(r.vs_best_peer, '16.2f')} | {r.note} |",
            file=out,
        )


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def chart(rows: list[Row], path: Path) -> str:
    """Bars of GFLOP/s per (workload, dtype) in ``path``; returns the path or why not."""
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
            color=["tab:orange" if IMPLEMENTATIONS[n].tir_byoc else "tab:blue" for n in shown],
        )
        ax.set_xscale("log")
        ax.set_title(f"{workload} [{dtype}]: GFLOP/s (log scale)", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def machine() -> str:
    cpu = cpuinfo_field("model name") or platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} logical cores, Linux {platform.release()}"
