"""How the benchmarks time a call: medians of repeated runs after warm-up, about a budget long.

Entry points: :func:`time_python` (a Python callable), :func:`time_tvm` (a compiled TVM
function, timed in C++ by TVM's evaluator) and :func:`plan` (how many calls per repeat and how
many repeats fill a budget; the direct harnesses use it too); :func:`median_ms` and
:func:`median_ms_in` (each call timed alone: whole models); and :class:`Parser`, the
benchmarks' command lines.
"""

from __future__ import annotations

import argparse
import statistics
import time

#: Above this many seconds per call, a cell is timed by one more call instead of a median.
SLOW_SECONDS = 2.0


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (status 2), as the ``tir-byoc`` command line has them."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def plan(first_seconds: float, budget: float) -> tuple[int, int]:
    """(number, repeat): each repeat ~1 ms or one call, the whole ~``budget`` seconds."""
    number = max(1, int(1e-3 / max(first_seconds, 1e-9)))
    repeat = int(budget / max(first_seconds * number, 1e-9))
    return number, max(3, min(repeat, 200))


def time_python(run, budget: float) -> float:
    """Median milliseconds of ``run()``, timed from Python."""
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    number, repeat = plan(first, budget)
    for _ in range(max(1, min(number * 5, int(0.2 / max(first, 1e-9))))):
        run()  # warm-up
    means = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            run()
        means.append((time.perf_counter() - start) / number)
    return statistics.median(means) * 1e3


def median_ms(run, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls of ``run()``, each timed alone."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def median_ms_in(run, budget: float) -> float:
    """:func:`median_ms` of as many calls as fill about ``budget`` seconds (3 to 50), counted
    from one call first."""
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    return median_ms(run, max(3, min(50, int(budget / max(once, 1e-6)))))


def time_tvm(module, name: str, args, budget: float) -> float:
    """Median milliseconds of ``module[name](*args)``, timed in C++ by TVM's evaluator.

    A call slower than :data:`SLOW_SECONDS` is timed once more and that time is returned
    (:func:`slow_note` says so).
    """
    import tvm

    start = time.perf_counter()
    module[name](*args)
    first = time.perf_counter() - start
    if first > SLOW_SECONDS:
        evaluator = module.time_evaluator(name, tvm.cpu(), number=1, repeat=1)
        return evaluator(*args).median * 1e3
    number, repeat = plan(first, budget)
    for _ in range(max(1, min(20, int(0.2 / max(first, 1e-9))))):
        module[name](*args)
    evaluator = module.time_evaluator(name, tvm.cpu(), number=number, repeat=repeat)
    return evaluator(*args).median * 1e3


def slow_note(ms: float | None) -> str:
    """The note of a cell :func:`time_tvm` timed by one call, else ``""``."""
    return (
        f"one timed run (a run takes over {SLOW_SECONDS:.0f} s)"
        if ms and ms > 1e3 * SLOW_SECONDS
        else ""
    )
