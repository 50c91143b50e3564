"""A Python script run in a fresh interpreter, as a user's process that loads an export runs."""

import subprocess
import sys
import textwrap


def run_python(script: str, cwd) -> str:
    """Run ``script`` (dedented) with this interpreter in ``cwd``; its stdout.  A non-zero exit
    fails the test with the end of its stderr."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
