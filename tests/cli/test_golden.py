"""The command line's output on ``examples/``, compared with the recorded output in ``golden/``.

A refactoring must leave what a user sees unchanged.  When a change is meant to alter the
output, rewrite the records with ``TIR_BYOC_UPDATE_GOLDEN=1`` and review the diff.
"""

import os
from pathlib import Path

import pytest

from tir_byoc import cli

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
EXAMPLES = ("mlp_lowered", "near_misses")
COMMANDS = {
    "scan": ["scan", "--backends", "ref"],
    "scan_json": ["scan", "--json", "--backends", "ref"],
    "explain": ["explain"],
    "explain_json": ["explain", "--json"],
}


def _record(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TIR_BYOC_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden record {path}; run with TIR_BYOC_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"the output differs from {path}"


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("example", EXAMPLES)
def test_cli_output_on_the_examples_is_unchanged(capsys, monkeypatch, example, command):
    monkeypatch.chdir(ROOT)  # paths in the output are the ones given
    status = cli.main([*COMMANDS[command], f"examples/{example}.py"])
    captured = capsys.readouterr()
    _record(
        f"{example}.{command}.txt", f"status {status}\n{captured.out}--- stderr\n{captured.err}"
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_offloaded_tvmscript_of_the_examples_is_unchanged(capsys, monkeypatch, tmp_path, example):
    monkeypatch.chdir(ROOT)
    output = tmp_path / f"{example}_offloaded.py"
    status = cli.main(["offload", f"examples/{example}.py", "-o", str(output), "--backends", "ref"])
    captured = capsys.readouterr()
    err = captured.err.replace(str(output), "OUT.py")
    _record(f"{example}.offload.txt", f"status {status}\n{captured.out}--- stderr\n{err}")
    _record(f"{example}.offloaded.py.txt", output.read_text())
