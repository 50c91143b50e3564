"""benchmarks/run.py refuses a selection that names nothing, in one line, before anything runs."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
from support.benchmark_modules import BENCHMARKS, benchmark_modules

RUN = BENCHMARKS / "run.py"


@pytest.fixture(scope="module")
def run_main():
    """``benchmarks/run.py``'s ``main`` in this process: what it exits with and prints.

    The refusals are checked here, not in a fresh process each (one import of TVM and torch,
    about 5 s on the 2-vCPU VM); one test runs the script itself as a user does.
    """
    with benchmark_modules("run") as (run,):

        def call(*argv, capsys):
            with pytest.raises(SystemExit) as exited:
                run.main(list(argv))
            out, err = capsys.readouterr()
            return SimpleNamespace(returncode=exited.value.code, stdout=out, stderr=err)

        yield call


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--workload", "nosuchname"],
            "--workload 'nosuchname' is not a workload; expected one of",
        ),
        (["--only", "nosuchname"], "--only 'nosuchname' is not an implementation; expected one of"),
        (["--only", "Relax unscheduled", "--no-mlp"], "selects nothing"),
        (["--rounds", "0"], "--rounds 0 measures nothing"),
        (["--budget", "0"], "--budget 0.0: expected seconds of timing per cell"),
    ],
    ids=["workload", "implementation", "mlp-only-without-mlp", "rounds", "budget"],
)
def test_a_selection_of_nothing_is_one_line_and_status_2(run_main, capsys, argv, expected):
    result = run_main(*argv, capsys=capsys)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert expected in result.stderr


def test_the_script_lists_the_valid_names_in_one_line_and_status_2():
    result = subprocess.run(
        [sys.executable, str(RUN), "--workload", "nosuchname"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "'64x800->500 +bias+relu'" in result.stderr and "'1x4096->4096'" in result.stderr
    assert "'attn Q.K^T 96x128x64->128'" in result.stderr
    assert "or a group: '2d', 'batch'" in result.stderr


@pytest.mark.parametrize("name", ["batch", "2d", "Linear 8x128x768->3072"])
def test_a_workload_or_group_name_passes_the_check(run_main, capsys, name):
    # The next check refuses, so nothing runs: the refusal is --only's, not --workload's.
    result = run_main("--workload", name, "--only", "nosuchname", capsys=capsys)
    assert result.returncode == 2 and "--workload" not in result.stderr
    assert "--only 'nosuchname' is not an implementation" in result.stderr


EPILOGUE = RUN.with_name("epilogue.py")


def test_the_epilogue_benchmark_times_every_op_at_each_thread_count():
    done = subprocess.run(
        [sys.executable, str(EPILOGUE), "--backend", "ref", "--rows", "8", "--cols", "64",
         "--threads", "1,2", "--budget", "0.02"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in row] for row in rows[2:]]  # after the header and rule
    ops = ["gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "add"]
    assert [(c[0], c[1]) for c in cells] == [(op, t) for t in "12" for op in ops]
    for op, _, c_ms, parts, torch_ms, ratio in cells:
        assert float(c_ms) >= 0 and float(torch_ms) > 0 and float(ratio) > 0, op
        assert parts == "1", op  # 8 x 64 values: too few to share


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--threads", "0"], "--threads '0': expected thread counts >= 1"),
        (["--rows", "0"], "expected --rows, --cols >= 1 and --budget > 0"),
        (["--backend", "mkl"], "argument --backend: invalid choice: 'mkl'"),
    ],
    ids=["threads", "rows", "mkl"],
)
def test_the_epilogue_benchmark_refuses_bad_arguments_in_one_line(argv, expected):
    done = subprocess.run(
        [sys.executable, str(EPILOGUE), *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert expected in done.stderr.strip().splitlines()[-1]
