"""The options of :func:`tune_tir` and :func:`tune_relax`, typed and checked once.

Entry point: :meth:`TuneOptions.from_kwargs`, which turns the ``**options`` of the public
functions into one frozen :class:`TuneOptions`; ``tune.py`` reads its fields and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import TextIO

from tvm.s_tir.meta_schedule import (
    Builder,
    CostModel,
    Database,
    MeasureCallback,
    Runner,
    SearchStrategy,
    TaskScheduler,
)

from ..registry import REGISTRY, Registry
from .rule import check_mode


@dataclass(frozen=True)
class TuneOptions:
    """Everything a tuning run can be told besides its module, target, work_dir and budget.

    The fields come in three groups, in this order (which is also the order the error for an
    unknown option lists them in): MetaSchedule's ``ms.tune.tune_tasks`` options, each task's
    ``ms.TuneContext`` options, and tir_byoc's own.  The defaults are MetaSchedule's, except
    for ``builder``.

    Attributes
    ----------
    max_trials_per_task, num_trials_per_iter, runner, cost_model, task_scheduler
        Passed to ``ms.tune.tune_tasks``.
    builder : Builder or str, optional
        Passed to ``ms.tune.tune_tasks``; None: a :func:`candidate_builder`.
    database : Database or str
        A database, or the kind of database to create (``"json"`` in ``work_dir``).
    measure_callbacks : MeasureCallback, list of MeasureCallback, or "default"
        MetaSchedule's callbacks; a :class:`Progress` is added to them.
    module_equality : str
        Passed to ``ms.tune.tune_tasks`` and to the database it creates.
    strategy, num_tuning_cores
        Each ``ms.TuneContext``'s ``search_strategy`` and ``num_threads``.
    seed : int, optional
        Seed the tasks' random states are forked from.
    offload : {"choice", "always", "never"}
        How chains enter the search; see :func:`tune_tir`.
    backends : str or iterable of str, optional
        Backends allowed, as for :func:`tir_byoc.scan`.
    registry : Registry
        Where intrinsics are looked up.
    progress : bool or text stream
        True: progress lines and the report on stderr; False: silent; or where they go.
    fold_transposes : bool
        Relax modules, unless ``offload="never"``: GEMMs on a transposed or broadcast copy of
        a weight read the weight itself, and the copies are not tuned (as
        :func:`tir_byoc.offload` does; :mod:`tir_byoc.relax.weight_copies`).
    pack_weights : bool
        Relax modules: an offloaded function whose weights are constants is measured, and
        built, with them packed (:mod:`tir_byoc.meta_schedule.measure`).
    default_rules : bool
        A function left to TVM's code (no chain offloaded, in any variant) has its best
        record measured again beside the schedule the default rules of
        :mod:`tir_byoc.schedules` give it, in one batch, and keeps the faster: the untuned
        build's schedule is a candidate too, so tuning never makes such a function slower
        than ``build_model`` without tuning would (as measured).
    native_cutoff : float or None
        ``offload="choice"``: after a first round of ``first_round_trials`` trials per
        variant, a native variant slower than this many times its offloaded variant gets no
        more trials; the budget goes to the rest of the module.  None: both variants are
        tuned to the end, as MetaSchedule's scheduler shares the budget.
    first_round_trials : int
        With ``native_cutoff``: the trials of that first round per variant (at most
        ``num_trials_per_iter``).  16 by default: a model has one pair per GEMM, and on the
        LLaMA-like model of ``benchmarks/models.py`` the native GEMMs were 4.2-6.6x behind
        their offloaded variants after 16 trials and still 3.6-5.1x after 64, so more decided
        nothing and took the whole budget of 512 trials.
    """

    # MetaSchedule's ms.tune.tune_tasks.
    max_trials_per_task: int | None = None
    num_trials_per_iter: int = 64
    builder: Builder | str | None = None
    runner: Runner | str = "local"
    database: Database | str = "json"
    cost_model: CostModel | str = "xgb"
    measure_callbacks: MeasureCallback | list[MeasureCallback] | str = "default"
    task_scheduler: TaskScheduler | str = "gradient"
    module_equality: str = "structural"
    # Each task's ms.TuneContext.
    strategy: SearchStrategy | str = "evolutionary"
    num_tuning_cores: int | str = "physical"
    seed: int | None = None
    # tir_byoc's own.
    offload: str = "choice"
    backends: Iterable[str] | str | None = None
    registry: Registry = REGISTRY
    progress: bool | TextIO = True
    fold_transposes: bool = True
    pack_weights: bool = True
    default_rules: bool = True
    native_cutoff: float | None = 2.0
    first_round_trials: int = 16

    def __post_init__(self):
        check_mode(self.offload)
        if self.native_cutoff is not None and not self.native_cutoff >= 1.0:
            raise ValueError(
                f"tir_byoc.meta_schedule: native_cutoff={self.native_cutoff!r}; expected a "
                "number >= 1 (how many times slower than offloaded a native variant may be) "
                "or None"
            )
        trials = self.first_round_trials
        if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
            raise ValueError(
                f"tir_byoc.meta_schedule: first_round_trials={trials!r}; expected an int >= 1"
            )

    @classmethod
    def from_kwargs(cls, options: dict) -> TuneOptions:
        """``options`` as given to :func:`tune_tir`; TypeError naming any unknown one."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(
                f"tir_byoc.meta_schedule: unknown option(s) {unknown}; expected some of {known}"
            )
        return cls(**options)
