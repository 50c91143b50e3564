"""benchmarks/models.py: the library / TVM-code split of a tir_byoc time, its table columns, and
the environment each thread count's child runs in (libgomp's spin among it)."""

from __future__ import annotations

import sys
from pathlib import Path

import built_models
import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def models():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import models

        yield models
    finally:
        sys.path.remove(str(BENCHMARKS))
        sys.modules.pop("models", None)


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
    assert "expected a count of spins or 'default', got 'fast'" in done.stderr.splitlines()[-1]
