"""The package's layering: import-linter's contracts of pyproject.toml hold.

The contracts (``[tool.importlinter]``) say which layer each module belongs to and that no
Relax rewrite and no backend imports another.  A broken contract is shown by a second run
with one layer moved above the command line, which must fail naming the import.
"""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), str(config), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_import_contracts_hold():
    done = _lint(ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in settings["contracts"] if c["type"] == "layers")
    # The epilogue table (imported by the matcher) moved above everything: now the matcher's
    # import of it goes upward.
    rest = [
        " | ".join(m for m in layer.split(" | ") if m != "tir_byoc.epilogues")
        for layer in layers["layers"]
    ]
    moved = ["tir_byoc.epilogues", *(layer for layer in rest if layer)]
    config = tmp_path / "contracts.toml"
    config.write_text(
        f'[tool.importlinter]\nroot_package = "tir_byoc"\n\n'
        f'[[tool.importlinter.contracts]]\nname = "moved"\ntype = "layers"\n'
        f"layers = {moved!r}\n".replace("'", '"')
    )
    done = _lint(config)
    assert done.returncode != 0
    assert "is not allowed to import tir_byoc.epilogues" in done.stdout
