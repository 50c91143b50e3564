"""``tir-byoc aot FILE -o DIR``: a TVMScript module as plain C from the command line."""

import textwrap
from pathlib import Path

import pytest

from tir_byoc import cli

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp_lowered.py"

DYNAMIC = textwrap.dedent(
    """
    from tvm.script import ir as I
    from tvm.script import relax as R


    @I.ir_module
    class Dynamic:
        @R.function
        def main(x: R.Tensor(("n", 4), "float32")) -> R.Tensor(("n", 4), "float32"):
            y = R.add(x, x)
            return y
    """
)


def test_aot_writes_the_folder_and_says_what_it_holds(capsys, tmp_path):
    out = tmp_path / "mlp"
    status = cli.main(["aot", str(MLP), "-o", str(out), "--name", "mlp", "--backends", "ref"])
    printed = capsys.readouterr()
    assert status == cli.EXIT_OK, printed.err
    lines = printed.out.splitlines()
    assert lines[0] == f"wrote {out}: mlp_run() in mlp.c, 2 steps, 2 of them intrinsic calls (ref)"
    assert lines[1].startswith("workspace 128000 bytes (")
    assert lines[2] == f"build: make -C {out}; link libmlp.a -lm"
    source = (out / "mlp.c").read_text()
    assert "status = tir_byoc_ref_dense_bias_relu(x, fc1_weight, fc1_bias, ws + 0," in source
    assert {"Makefile", "mlp.h", "mlp_main.c", "link_flags"} <= {p.name for p in out.iterdir()}


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (DYNAMIC, "tir_byoc.aot: symbolic shape R.shape([n, 4]) of parameter x in main is not "
                  "supported"),
        (None, "aot needs one module, the file defines"),
    ],
)  # fmt: skip
def test_what_aot_cannot_build_is_one_line_and_status_2(capsys, tmp_path, script, message):
    source = tmp_path / "model.py"
    if script is None:  # two modules in one file
        source.write_text(DYNAMIC + DYNAMIC.split("\n\n\n", 1)[1].replace("Dynamic", "Other"))
    else:
        source.write_text(script)
    status = cli.main(["aot", str(source), "-o", str(tmp_path / "out")])
    printed = capsys.readouterr()
    assert status == cli.EXIT_USAGE
    assert printed.err.count("\n") == 1 and message in printed.err
    assert printed.err.startswith(f"tir-byoc: error: {source}: ")
    assert not (tmp_path / "out").exists()
