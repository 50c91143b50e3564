"""benchmarks/zoo.py: every architecture of its table builds and runs in torch, and the
command refuses an unknown architecture in one line before anything runs."""

import subprocess
import sys

import pytest
import torch
import zoo  # benchmarks/zoo.py: the folder is on the path (pyproject.toml's pythonpath)
from support.benchmark_modules import BENCHMARKS


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_each_architecture_builds_from_its_config_and_runs_in_torch(name):
    model = zoo.build(name)
    with torch.no_grad():
        output = model.module(*model.inputs)
    assert isinstance(output, torch.Tensor)
    assert output.shape[0] == model.inputs[0].shape[0]
    assert torch.isfinite(output).all()


def test_an_unknown_architecture_is_one_line_and_status_2():
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "zoo.py"), "--only", "BERT,Nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("got ['Nope']")


def test_the_table_gives_each_row_its_figures_or_its_error():
    rows = [
        {
            "arch": "A",
            "agrees": True,
            "max_abs_diff": 2e-7,
            "unscheduled": {},
            "gemm_offloaded": 1.0,
            "conv_share": 0.25,
            "convs_left": ["groups = 2; im2col serves groups = 1"],
            "epilogues_left": ["f_packed: block T_multiply reads T_add, the output of x.gemm"],
            "why_left": ["bias then scale is not an epilogue of the family"],
            "refused": [],
        },
        {"arch": "B", "error": "build_model: TypeError: no"},
    ]
    lines = zoo.table(rows).splitlines()
    assert lines[2] == (
        "| A | yes | 2.0e-07 | 100% | 1 | convolutions: 25% of the matmul work, 1 left to TVM: "
        "groups = 2; im2col serves groups = 1; "
        "epilogue left as TVM code: block T_multiply (bias then scale is not an epilogue of "
        "the family) |"
    )
    assert lines[3] == "| B | - | - | - | - | build_model: TypeError: no |"
