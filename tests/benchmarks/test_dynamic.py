"""benchmarks/dynamic.py: its table (each size's columns and dynamic / static, the build
times) and its options, without running the benchmark."""

from __future__ import annotations

import pytest
from support.benchmark_modules import benchmark_modules


@pytest.fixture(scope="module")
def dynamic():
    with benchmark_modules("dynamic") as (module,):
        yield module


def _row(batch, sequence, dynamic_ms, static_ms, notes=""):
    return {
        "threads": 1,
        "model": "gpt2",
        "batch": batch,
        "sequence": sequence,
        "dynamic": dynamic_ms,
        "static": static_ms,
        "onnxruntime": 2.0,
        "onnxruntime_static": 1.6,
        "torch": 4.0,
        "notes": notes,
    }


def test_the_table_gives_dynamic_over_static_and_the_build_times(dynamic):
    result = {
        "threads": 1,
        "model": "gpt2",
        "rows": [_row(1, 32, 1.1, 1.0), _row(16, 384, 2.0, 2.0, "static: max |diff| 1")],
        "dynamic_build_s": 12.5,
        "static_builds_s": 80.25,
        "static_builds": 2,
    }
    lines = dynamic.table([result]).splitlines()
    # dynamic / static, onnxruntime's dynamic session / dynamic and its static one / static,
    # torch / dynamic
    assert lines[2] == (
        "| 1 | gpt2 | 1 | 32 | 1.10 | 1.00 | 1.10 | 2.00 | 1.60 | 1.82 | 1.60 | 4.00 | 3.64 |"
    )
    assert lines[3].endswith(
        "| 2.00 | 1.00 | 2.00 | 1.60 | 1.00 | 0.80 | 4.00 | 2.00 | static: max |diff| 1"
    )
    assert lines[-1] == (
        "1 thread(s), gpt2: one dynamic build 12.5 s, 2 static builds 80.2 s in all"
    )


def test_sizes_threads_and_models_are_comma_lists(dynamic):
    assert dynamic._numbers("1,4,16") == [1, 4, 16]
    assert dynamic._environment(2)["TVM_NUM_THREADS"] == "2"
    assert dynamic._models("gpt2,bert") == ["gpt2", "bert"]
    assert dynamic._dims("resnet50", 8, 384) == {0: ("batch", 1, 8)}  # a CNN: the batch only
    with pytest.raises(
        Exception,
        match="expected models among bert, gpt2, llama, resnet50, mobilenet_v2, got 'opt'",
    ):
        dynamic._models("opt")


def test_an_unknown_model_is_refused_in_one_line(dynamic):
    with pytest.raises(
        ValueError, match=r"expected a model of \('bert', 'gpt2', 'llama', 'resnet50'"
    ):
        dynamic.build_model("opt", 64, 1)
