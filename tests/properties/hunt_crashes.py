"""Look for programs whose original or offloaded version crashes the process.

The equivalence property runs both versions in the test process, so a segmentation fault
kills the run and leaves hypothesis nothing to save or shrink.  This runs the same draws with
each example's execution in a forked child, and writes the spec and TVMScript of every
example whose child a signal killed::

    .venv/bin/python tests/properties/hunt_crashes.py --minutes 30 --out crashes.txt

Not a test (pytest does not collect it): a tool for the open item in README.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.errors import NonInteractiveExampleWarning

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import offload

from tir_byoc.testing import strategies
from tir_byoc.testing.equivalence import differences


def _run_in_child(program, rewritten, seed) -> int | None:
    """The signal that killed the child running both versions, or None."""
    pid = os.fork()
    if pid == 0:
        try:
            differences(program.func, rewritten, bindings=program.bindings, seed=seed)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to draw")
    parser.add_argument("--out", default="crashes.txt", help="where crashing examples go")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + 60 * args.minutes
    draws = st.tuples(strategies.all_programs(), st.integers(0, 2**16))
    drawn = crashed = 0
    while time.monotonic() < deadline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonInteractiveExampleWarning)
            program, seed = draws.example()
        drawn += 1
        rewritten = offload(program.func)
        signal = _run_in_child(program, rewritten, seed)
        if signal is not None:
            crashed += 1
            with open(args.out, "a") as out:
                out.write(
                    f"=== signal {signal}, seed {seed}\nspec: {program.spec}\n"
                    f"bindings: {program.bindings}\n{program.script()}\n--- offloaded\n"
                    f"{rewritten.script()}\n"
                )
    print(f"{drawn} examples drawn, {crashed} crashed (written to {args.out})")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
