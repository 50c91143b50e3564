"""The direct-call harnesses of benchmarks/direct.py: the LAYER specs they take and refuse.

Each harness is compiled once (cached under benchmarks/results/bin, as the benchmark does) and
run for one untimed repeat on tiny layers: 2-D and batched, plain, prepacked, and interleaved
with tir_byoc's oneDNN intrinsics, where the harness first checks that the intrinsic computes
what the primitive does.  Only the output's form is checked, never a time.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from tir_byoc import toolchain

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

#: LAYER specs both harnesses take: 2-D, batched (the trailing count), with bias and relu.
SPECS = ["4:3:5:f32:dense:1:1", "4:3:5:f32:matmul:0:0:2", "4:3:5:f32:dense:1:1:3"]
#: Specs both refuse: a batch of 0, a batch that is not a number, a field too many.
BAD_SPECS = ["4:3:5:f32:matmul:0:0:0", "4:3:5:f32:matmul:0:0:x", "4:3:5:f32:dense:0:0:2:2"]


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import direct

        yield {library: direct._direct_binary(library) for library in direct.SOURCES}
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("direct", "timing", "workloads"):
            sys.modules.pop(name, None)


def _run(binary, *argv):
    return subprocess.run(
        [str(binary), "0", "1", *argv], capture_output=True, text=True, timeout=120
    )


def _check_output(stdout: str, times: int) -> None:
    """The harness printed ``times`` times in ms, then the kernel that ran the one layer."""
    fields = stdout.split()
    assert len(fields) == times + 1
    assert all(float(f) >= 0 for f in fields[:times])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("mode", ["plain", "prepacked", "interleaved"])
def test_the_onednn_harness_runs_2d_and_batched_layers(harness, mode, spec):
    if mode == "interleaved":
        mode = f"interleaved:{toolchain.shared_library('onednn')}"
    result = _run(harness["onednn"], mode, spec)
    assert result.returncode == 0, result.stderr
    _check_output(result.stdout, 2 if mode.startswith("interleaved") else 1)


@pytest.mark.parametrize("spec", SPECS)
def test_the_openblas_harness_runs_2d_and_batched_layers(harness, spec):
    result = _run(harness["openblas"], spec)
    assert result.returncode == 0, result.stderr
    _check_output(result.stdout, 1)


@pytest.mark.parametrize("spec", BAD_SPECS)
@pytest.mark.parametrize("library", ["onednn", "openblas"])
def test_a_bad_layer_is_refused_with_the_format(harness, library, spec):
    argv = ["plain", spec] if library == "onednn" else [spec]
    result = _run(harness[library], *argv)
    assert result.returncode == 2 and result.stdout == ""
    assert f"bad layer {spec}: expected M:N:K:" in result.stderr and "[:BATCH]" in result.stderr
