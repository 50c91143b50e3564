"""What the search has measured so far, per task: printed while tuning, counted for the report.

Entry point: :class:`Progress`, the measure callback ``tune.py`` adds to MetaSchedule's own;
its trial counts go into each :class:`~.report.FunctionReport`.  :func:`mean_seconds` and
:data:`FAILED_RUN` read run times the same way here and where ``tune.py`` reads the database.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from .report import duration
from .rule import recorded_choice

FAILED_RUN = 1e9  # seconds; MetaSchedule records failed runs as 1e10


def mean_seconds(run_secs) -> float:
    """The mean of a candidate's run times, or infinity without any."""
    values = [float(s) for s in run_secs] if run_secs else []
    return sum(values) / len(values) if values else float("inf")


@derived_object
class Progress(PyMeasureCallback):
    """Measure callback printing, per task, the trials done and the best latency so far.

    Parameters
    ----------
    display : bool
        Print a line after each measured batch; False only counts (for the report).
    stream : text stream, optional
        Where lines go (default ``sys.stderr``).
    """

    def __init__(self, display: bool = True, stream: TextIO | None = None):
        super().__init__()
        self.display = display
        self.stream = stream
        self.trials: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.best: dict[str, tuple[float, str]] = {}

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        task = str(task_scheduler.tasks_[task_id].ctx.task_name)
        for candidate, built, ran in zip(measure_candidates, builder_results, runner_results):
            self.trials[task] = self.trials.get(task, 0) + 1
            seconds = mean_seconds(ran.run_secs) if ran.error_msg is None else float("inf")
            if built.error_msg is not None or seconds >= FAILED_RUN:
                self.failed[task] = self.failed.get(task, 0) + 1
                continue
            if seconds < self.best.get(task, (float("inf"), ""))[0]:
                self.best[task] = (seconds, recorded_choice(candidate.sch.trace))
        if self.display and len(measure_candidates):
            self._print(task)

    def note(self, line: str) -> None:
        """Print ``line`` as the progress lines are printed (if they are)."""
        if self.display:
            print(f"[tir_byoc] {line}", file=self.stream or sys.stderr, flush=True)

    def _print(self, task: str) -> None:
        seconds, choice = self.best.get(task, (float("inf"), "none"))
        best = duration(seconds * 1e3) if seconds != float("inf") else "none yet"
        variant = f" ({choice})" if choice != "none" else ""
        total = sum(self.trials.values())
        print(
            f"[tir_byoc] {task}: {self.trials[task]} trials ({self.failed.get(task, 0)} failed), "
            f"best {best}{variant}; {total} trials in all",
            file=self.stream or sys.stderr,
            flush=True,
        )
