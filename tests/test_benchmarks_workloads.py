"""benchmarks/workloads.py and the implementation table of benchmarks/implementations.py.

The workloads are tir_byoc's own pattern descriptions with static shapes, so the matcher must
recognise each one as its pattern; the table is what ``run.py`` checks ``--only`` against and
runs from, in the order the layer and MLP runs always had.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tvm import tirx

import tir_byoc

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
MODULES = ("workloads", "timing", "direct", "implementations")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import implementations
        import workloads

        yield SimpleNamespace(workloads=workloads, implementations=implementations)
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in MODULES:
            sys.modules.pop(name, None)


def _cases():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import workloads

        return [(w, d) for w in workloads.WORKLOADS for d in workloads.DTYPES]
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("workload, dtype", _cases(), ids=lambda case: getattr(case, "name", case))
def test_a_workload_is_its_pattern_with_static_shapes(bench, workload, dtype):
    signature = bench.workloads.DTYPES[dtype]
    func = bench.workloads.prim_func(workload, signature)
    m, n, k = workload.m, workload.n, workload.k
    expected = [(m, k), (n, k), *([(n,)] if workload.has_bias else []), (m, n)]
    shapes = [tuple(int(e) for e in p.ty.shape) for p in func.params]
    assert shapes == expected
    assert all(isinstance(e, tirx.IntImm) for p in func.params for e in p.ty.shape)
    (choice,) = tir_byoc.scan(func)
    assert (choice.pattern, str(choice.dtype)) == (workload.pattern, signature)
    operands, out = bench.workloads.arrays(workload, signature)
    assert [(a.shape, str(a.dtype)) for a in (*operands, out)] == [
        (shape, str(p.ty.dtype.dtype)) for shape, p in zip(expected, func.params)
    ]


def test_static_shapes_names_an_extent_it_was_not_given(bench):
    func = tir_byoc.describe("dense")
    with pytest.raises(ValueError, match="neither a constant nor a variable given"):
        bench.workloads.static_shapes(func, {"M": 2, "N": 3})


def test_the_table_runs_in_the_order_the_runs_always_had(bench):
    running = bench.implementations.running
    assert [i.name for i in running("layer")] == [
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
    ]
    assert [i.name for i in running("mlp")] == [
        "tir_byoc+onednn",
        "tir_byoc+onednn (transposes kept)",
        "tir_byoc+openblas",
        "oneDNN direct (C)",
        "OpenBLAS direct (C)",
        "NumPy",
        "PyTorch eager",
        "Relax unscheduled",
        "Relax + dlight",
    ]
    table = bench.implementations.IMPLEMENTATIONS
    assert {n for n, i in table.items() if len(i.dtypes) > 1} == {
        "tir_byoc+onednn",
        "oneDNN direct (C)",
    }
    assert all(i.direct in table for i in table.values())


def test_an_implementation_without_a_measure_or_with_an_unknown_dtype_is_refused(bench):
    implementation = bench.implementations.Implementation
    with pytest.raises(ValueError, match="expected a layer or mlp measure"):
        implementation("nothing")
    with pytest.raises(ValueError, match=r"expected dtypes among .* got \['fp8'\]"):
        implementation("fp8 only", layer=lambda *a: (None, ""), dtypes=("fp8",))


def test_skip_reasons_come_before_any_measuring(bench):
    table, settings = bench.implementations.IMPLEMENTATIONS, bench.implementations.Settings
    big = bench.workloads.WORKLOADS[3]  # 512x4096->4096
    ms, note = table["tir_byoc+ref"].measure_layer(big, "fp32", settings(1.0, 64, 5.0))
    assert ms is None and "reference kernel" in note
    ms, note = table["TVM MetaSchedule"].measure_layer(big, "fp32", settings(1.0, 0, 5.0))
    assert (ms, note) == (None, "skipped (--trials 0)")
    ms, note = table["TVM MetaSchedule"].measure_layer(big, "fp32", settings(1.0, 64, 5.0))
    assert ms is None and "above --ms-max-gflop 5.0" in note
