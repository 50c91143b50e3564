"""Look for programs whose original or offloaded version crashes the process.

The equivalence property runs both versions in the test process, so a segmentation fault
kills the run and leaves hypothesis nothing to save or shrink.  This runs the same draws with
each example's execution in a forked child, and writes the spec and TVMScript of every
example whose child a signal killed::

    .venv/bin/python tests/properties/hunt_crashes.py --minutes 30 --out crashes.txt

``--backend NAME`` offloads with that bundled backend only (plus the test-only widening
kernels, which serve the signatures no bundled backend does), so that a run can be spent on
each backend in turn.  It prints a line of counts every ``--every`` examples, and the same
at the end: what was drawn, how many were offloaded, and how many children a signal killed.

Not a test (pytest does not collect it): a tool for the open item in README.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings

from harness import PROPERTY_REGISTRY
from hypothesis import strategies as st
from hypothesis.errors import NonInteractiveExampleWarning

import tir_byoc
from tir_byoc.registry import REGISTRY
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
    parser.add_argument(
        "--backend",
        choices=list(REGISTRY.backends),
        help="offload with this bundled backend only (default: each match's preferred one)",
    )
    parser.add_argument("--every", type=int, default=500, help="print counts this often")
    args = parser.parse_args(argv)
    backends = None if args.backend is None else (args.backend, "proptest")
    deadline = time.monotonic() + 60 * args.minutes
    draws = st.tuples(strategies.all_programs(), st.integers(0, 2**16))
    counts = collections.Counter()
    started = time.monotonic()

    def report() -> None:
        minutes = (time.monotonic() - started) / 60
        print(
            f"backend {args.backend or 'any'}: {counts['drawn']} examples drawn in "
            f"{minutes:.1f} min, {counts['offloaded']} with a library call, "
            f"{counts['crashed']} crashed (written to {args.out})",
            flush=True,
        )

    while time.monotonic() < deadline:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonInteractiveExampleWarning)
            program, seed = draws.example()
        counts["drawn"] += 1
        rewritten = tir_byoc.offload(program.func, registry=PROPERTY_REGISTRY, backends=backends)
        counts["offloaded"] += not rewritten.same_as(program.func)
        signal = _run_in_child(program, rewritten, seed)
        if signal is not None:
            counts["crashed"] += 1
            with open(args.out, "a") as out:
                out.write(
                    f"=== signal {signal}, seed {seed}, backend {args.backend or 'any'}\n"
                    f"spec: {program.spec}\nbindings: {program.bindings}\n"
                    f"{program.script()}\n--- offloaded\n{rewritten.script()}\n"
                )
        if counts["drawn"] % args.every == 0:
            report()
    report()
    return 1 if counts["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
