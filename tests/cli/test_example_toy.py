"""The bring-your-own-intrinsic example runs as docs/intrinsics.md says, export included."""

import subprocess
import sys
from pathlib import Path

import tir_byoc

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "toy_cg_thflow" / "run_mlp.py"


def test_the_toy_cg_thflow_example_runs_end_to_end(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "registered toy_cg_thflow.dense_bias_relu from toy_cg_thflow.c"
    # The first layer goes to the user's kernel, the second to the best bundled backend here.
    second, first = sorted(lines[1:3])
    assert first == "  fused_NT_matmul_add_relu: dense_bias_relu -> toy_cg_thflow.dense_bias_relu"
    best = tir_byoc.scan(tir_byoc.describe("dense_bias"))[0].intrinsic
    assert second == f"  fused_NT_matmul1_add1: dense_bias -> {best}"
    assert lines[3].startswith("built and ran here: max abs difference ")
    assert lines[3].endswith(", toy kernel calls 1")
    assert lines[4].startswith("exported mlp_toy_cg_thflow.so; a fresh Python loaded it: ")
    assert lines[4].endswith("toy kernel calls 1, tir_byoc imported: False")
    assert lines[5] == "OK"
    assert (tmp_path / "mlp_toy_cg_thflow.so").is_file()


def test_the_example_fails_loudly_when_the_kernel_is_wrong(tmp_path):
    # The same example with a kernel that forgets the relu: the comparison must catch it.
    example = tmp_path / "example"
    example.mkdir()
    source = (EXAMPLE.parent / "toy_cg_thflow.c").read_text()
    broken = source.replace("y[i * n + j] = acc > 0.0f ? acc : 0.0f;", "y[i * n + j] = acc;")
    assert broken != source
    (example / "toy_cg_thflow.c").write_text(broken)
    for name in ("toy_intrinsic.py", "run_mlp.py"):
        (example / name).write_text((EXAMPLE.parent / name).read_text())
    result = subprocess.run(
        [sys.executable, str(example / "run_mlp.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1 and result.stdout.splitlines()[-1] == "FAILED"
