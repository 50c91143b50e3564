"""benchmarks/models.py: the library / TVM-code split of a tir_byoc time, the GEMM floor, their
table columns, and the children that time the columns (libgomp's spin in each)."""

from __future__ import annotations

import os
import sys

import pytest
from support import built_models
from support.benchmark_modules import BENCHMARKS, benchmark_modules


@pytest.fixture(scope="module")
def models():
    with benchmark_modules("models") as (models,):
        yield models


def test_the_split_puts_offloaded_prim_funcs_in_library_and_the_rest_in_tvm_code(models):
    offloaded, native = built_models.mlp(), built_models.mlp_native()
    split = models._split(offloaded.model, *offloaded.inputs)
    assert split["library_ms"] > 0 and split["tvm_ms"] >= 0
    assert models._split(native.model, *native.inputs)["library_ms"] == 0


def test_the_table_gives_the_split_and_torch_over_library(models):
    rows = [
        {"model": "bert", "batch": 1, "threads": 1, "column": "torch", "ms": 30.0, "note": ""},
        {
            "model": "bert",
            "batch": 1,
            "threads": 1,
            "column": "tir_byoc",
            "ms": 27.0,
            "note": "",
            "library_ms": 24.0,
            "tvm_ms": 2.5,
        },
    ]
    models._ratios(rows)
    table = models._table(rows, ["torch", "tir_byoc"])
    assert "| tir_byoc: library + TVM code | torch / library |" in table.splitlines()[0]
    assert table.splitlines()[-1] == "| bert | 1 | 1 | 30.0 | 27.0 | 1.11 | 24.0 + 2.5 | 1.25 |"


@pytest.mark.parametrize(("choice", "expected"), [("1000", "1000"), ("default", None)])
def test_each_child_gets_the_thread_count_and_libgomps_spin(models, monkeypatch, choice, expected):
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")  # the parent's own is never passed on
    env = models._environment(2, choice)
    assert env["OMP_NUM_THREADS"] == env["TVM_NUM_THREADS"] == "2"
    assert env.get("GOMP_SPINCOUNT") == expected


def test_a_spin_count_that_is_not_a_count_is_refused_before_anything_runs():
    import subprocess

    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "models.py"), "--gomp-spincount", "fast"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        "expected a count of spins, 'own' or 'default', got 'fast'" in done.stderr.splitlines()[-1]
    )


def _args(models, *more):
    argv = ["--models", "bert,gpt2", "--batches", "1,8", "--columns", "torch,onnxruntime,tir_byoc"]
    return models.parse([*argv, *more])


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_at_two_threads_each_cell_alternates_a_child_per_side_and_round_at_its_own_spin(models):
    children = models._time_children(_args(models, "--rounds", "3"), 2)
    cells = [(_option(argv, "--models"), _option(argv, "--batches")) for argv, _ in children]
    assert cells == [(m, b) for m in ("bert", "gpt2") for b in ("1", "8") for _ in range(6)]
    assert {_option(argv, "--rounds") for argv, _ in children} == {"1"}
    peers, tvm = ("torch,onnxruntime", "default"), ("tir_byoc", "1000")
    sides = [(_option(argv, "--columns"), spin) for argv, spin in children[:6]]
    assert sides == [peers, tvm, tvm, peers, peers, tvm]


def test_merging_keeps_each_columns_median_over_its_children(models):
    cell = {"model": "bert", "batch": 1, "threads": 2, "column": "tir_byoc"}
    rows = [
        {**cell, "ms": 12.0, "library_ms": 10.0, "note": ""},
        {**cell, "ms": 10.0, "library_ms": 9.0, "note": ""},
        {**cell, "ms": 11.0, "library_ms": 8.0, "note": "slow"},
        {**cell, "column": "torch", "ms": 15.0, "note": ""},
    ]
    merged = {row["column"]: row for row in models._merge(rows)}
    assert merged["tir_byoc"]["ms"] == 11.0 and merged["tir_byoc"]["library_ms"] == 9.0
    assert merged["tir_byoc"]["processes"] == 3 and merged["tir_byoc"]["note"] == "slow"
    assert merged["torch"]["ms"] == 15.0 and merged["torch"]["processes"] == 1


@pytest.mark.parametrize(("threads", "choice", "spin"), [(1, "own", "1000"), (2, "50", "50")])
def test_one_child_times_every_column_at_one_thread_or_one_spin(models, threads, choice, spin):
    ((argv, chosen),) = models._time_children(_args(models, "--gomp-spincount", choice), threads)
    assert chosen == spin
    assert _option(argv, "--columns") == "torch,onnxruntime,tir_byoc"
    assert _option(argv, "--models") == "bert,gpt2"


def test_the_gemm_floor_counts_a_models_gemm_flops_at_the_measured_peak(models):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    floor = models._gemm_floor(model.eval(), torch.randn(8, 64), budget=0.05)
    assert floor["gemm_gflop"] == 2 * 8 * (64 * 32 + 32 * 16) / 1e9
    assert floor["peak_gflops"] > 0
    row = {"model": "mlp", "batch": 8, "threads": 1, "column": "torch", "ms": 1.0, **floor}
    models._ratios([row])
    assert row["floor_ms"] == pytest.approx(floor["gemm_gflop"] / floor["peak_gflops"] * 1e3)
    assert floor["fma_gflops"] > 0
    assert row["fma_ms"] == pytest.approx(floor["gemm_gflop"] / floor["fma_gflops"] * 1e3)
    assert row["torch/fma"] == pytest.approx(1.0 / row["fma_ms"])


def test_the_table_takes_the_cells_floor_at_its_best_peak(models):
    cell = {"model": "bert", "batch": 1, "threads": 2, "note": "", "gemm_gflop": 3.0}
    rows = [
        {**cell, "column": "torch", "ms": 30.0, "peak_gflops": 200.0},
        {**cell, "column": "tir_byoc", "ms": 25.0, "peak_gflops": 300.0},
    ]
    models._ratios(rows)
    table = models._table(rows, ["torch", "tir_byoc"])
    assert table.splitlines()[0].endswith("| GEMM floor | torch / floor |")
    assert table.splitlines()[-1] == "| bert | 1 | 2 | 30.0 | 25.0 | 1.20 | 10.0 | 3.00 |"


def test_the_table_takes_the_cells_fma_bound_at_its_best_multiply_add_peak(models):
    cell = {"model": "bert", "batch": 8, "threads": 1, "note": "", "gemm_gflop": 6.0}
    rows = [
        {**cell, "column": "torch", "ms": 60.0, "peak_gflops": 100.0, "fma_gflops": 120.0},
        {**cell, "column": "tir_byoc", "ms": 50.0, "peak_gflops": 90.0, "fma_gflops": 150.0},
    ]
    models._ratios(rows)
    table = models._table(rows, ["torch", "tir_byoc"])
    assert table.splitlines()[0].endswith("| FMA bound | torch / FMA bound |")
    assert table.splitlines()[-1].endswith("| 60.0 | 1.00 | 40.0 | 1.50 |")


def test_a_tuned_column_tunes_once_then_builds_its_cached_database(models, monkeypatch, tmp_path):
    import tir_byoc

    calls = []

    def build_model(model, inputs, offload, backends, tune_trials, work_dir):
        calls.append((tune_trials, work_dir.name))
        if tune_trials:  # what a tuning run leaves
            work_dir.mkdir(parents=True)
        return lambda x: x

    monkeypatch.setattr(tir_byoc, "build_model", build_model)
    args = models.parse(["--tune-trials", "64", "--work-dir", str(tmp_path)])
    args.model_key = "bert-b1-s128-l2"
    tuned = models.column("tir_byoc+ms", None, 1.0, 1, args)
    assert tuned.tuning.startswith("tuned at 1 thread(s) in ") and "cached" not in tuned.tuning
    again = models.column("tir_byoc+ms", None, 1.0, 2, args)
    assert again.tuning == tuned.tuning + ", cached"
    # One database per model, column, budget and CPU (the target build_model tunes for).
    cpu = tir_byoc.model.host_target().attrs.get("mcpu", "generic")
    work_dir = f"bert-b1-s128-l2-tir_byoc+ms-t64-{cpu}"
    assert calls == [(64, work_dir), (0, work_dir)]
    args.tune_trials = 128
    models.column("tir_byoc+ms", None, 1.0, 2, args)
    assert calls[-1] == (128, f"bert-b1-s128-l2-tir_byoc+ms-t128-{cpu}")


def test_a_backend_column_offloads_to_that_backend_only(models, monkeypatch):
    import tir_byoc

    seen = []

    def build_model(model, inputs, offload, backends, tune_trials, work_dir):
        seen.append((offload, backends, os.environ.get("TIR_BYOC_MKL_PACK")))
        return lambda x: x

    monkeypatch.setattr(tir_byoc, "build_model", build_model)
    monkeypatch.delenv("TIR_BYOC_MKL_PACK", raising=False)
    args = models.parse([])
    args.model_key = "bert-b1-s128-l2"
    for name in ("tir_byoc", "tir_byoc-onednn", "tir_byoc-plain", "tvm"):
        models.column(name, None, 1.0, 1, args)
    # The plain column names the plain form while it builds, and only then.
    assert seen == [
        (True, None, None),
        (True, ["onednn"], None),
        (True, None, "plain"),
        (False, None, None),
    ]
    assert "TIR_BYOC_MKL_PACK" not in os.environ


def test_onnxruntimes_split_counts_gemm_nodes_apart_in_the_last_runs_only(models):
    def node(op, ts, dur):
        return {
            "cat": "Node",
            "name": f"n_{op}_kernel_time",
            "ts": ts,
            "dur": dur,
            "args": {"op_name": op},
        }

    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 50},  # a warm-up run: left out
        node("Gemm", 10, 9000),
        {"cat": "Session", "name": "model_run", "ts": 100, "dur": 50},
        node("Gemm", 110, 3000),
        node("FusedMatMul", 120, 1000),
        {
            "cat": "Node",
            "name": "n_Gemm_fence_before",
            "ts": 121,
            "dur": 7,
            "args": {"op_name": "Gemm"},
        },
        node("Softmax", 130, 500),
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
        node("MatMul", 210, 2000),
        node("SkipLayerNormalization", 220, 700),
    ]
    assert models._node_times(events, runs=2) == {"ort_gemm_ms": 3.0, "ort_rest_ms": 0.6}
    with pytest.raises(ValueError, match="holds 3 runs, not 4"):
        models._node_times(events, runs=4)


def test_the_table_gives_onnxruntimes_gemm_nodes_and_the_rest(models):
    rows = [
        {"model": "gpt2", "batch": 1, "threads": 1, "column": "torch", "ms": 60.0, "note": ""},
        {
            "model": "gpt2",
            "batch": 1,
            "threads": 1,
            "column": "onnxruntime",
            "ms": 46.4,
            "note": "",
            "ort_gemm_ms": 41.3,
            "ort_rest_ms": 3.5,
        },
    ]
    models._ratios(rows)
    table = models._table(rows, ["torch", "onnxruntime"]).splitlines()
    assert table[0].endswith("| ONNX Runtime: GEMM nodes + other nodes |")
    assert table[1].count("---") == 7
    assert table[-1] == "| gpt2 | 1 | 1 | 60.0 | 46.4 | - | 41.3 + 3.5 |"


def test_the_native_conv_column_builds_without_the_convolution_rewrite(models, monkeypatch):
    import torch

    import tir_byoc
    from tir_byoc.relax import pipeline

    seen = []

    def build_model(model, inputs, **options):
        seen.append((pipeline.BEFORE_LEGALIZE, options["backends"]))
        return lambda x: x

    monkeypatch.setattr(tir_byoc, "build_model", build_model)
    conv = torch.nn.Conv1d(2, 2, 3).eval()
    for name in ("tir_byoc", "tir_byoc-native-conv"):
        models.column(name, conv, torch.zeros(1, 2, 5), 1, None)
    (default, _), (native, backends) = seen
    names = [p.__name__ for p in default]
    assert "ConvolutionsAsGemms" in names
    assert [p.__name__ for p in native] == [n for n in names if n != "ConvolutionsAsGemms"]
    assert backends is None  # not a backend column
    assert pipeline.BEFORE_LEGALIZE == default  # restored
