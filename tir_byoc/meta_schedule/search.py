"""The search: every task tuned in one MetaSchedule search over :func:`~.space.design_space`.

Entry point: :func:`run_search`, with a first round for the functions tuned in both variants
(offload and native) where ``native_cutoff`` asks for one; :func:`with_design_space` drops
the tasks whose design space MetaSchedule cannot generate, and :func:`best_ms` reads a task's
best time from the database.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from ..frontend import first_line
from .features import cost_model
from .options import TuneOptions
from .progress import FAILED_RUN, Progress, mean_seconds
from .report import duration
from .rule import logger
from .space import design_space
from .tasks import Task


def open_database(options: TuneOptions, work_dir: str) -> ms.database.Database:
    database, equality = options.database, options.module_equality
    if isinstance(database, ms.database.Database):
        return database
    if database == "json":
        return ms.database.Database.create("json", work_dir=work_dir, module_equality=equality)
    return ms.database.Database.create(database, module_equality=equality)


@contextlib.contextmanager
def _task_loggers(work_dir: str, names: list[str]):
    """One DEBUG file logger per task in ``work_dir/logs``, closed on exit.

    MetaSchedule's own ``get_loggers_from_work_dir`` fails on its second call in a process
    whose MetaSchedule logger carries an unnamed handler (pytest adds some), and it prints
    every task table to stdout; these loggers keep the per-task files without either.
    """
    log_dir = Path(work_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    loggers, handlers = [], []
    for i, name in enumerate(names):
        task_logger = logging.getLogger(f"{logger.name}.task.{i}_{name}")
        handler = logging.FileHandler(log_dir / f"task_{i:02d}_{name[:100]}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
        task_logger.addHandler(handler)
        task_logger.setLevel(logging.DEBUG)
        task_logger.propagate = False
        loggers.append(task_logger)
        handlers.append(handler)
    try:
        yield loggers
    finally:
        for task_logger, handler in zip(loggers, handlers):
            task_logger.removeHandler(handler)
            handler.close()


#: The offload rule's mode for each variant a task tunes.
RULE_MODE = {"offload": "always", "native": "never", "plain": "never"}


def run_search(tasks, target, work_dir, max_trials_global, options: TuneOptions, rejections):
    """Tune ``tasks``; returns the database and the trial counter.

    With ``options.native_cutoff``, the functions tuned in both variants get a first round
    (``first_round_trials`` trials per variant) in a search of their own; a native variant
    then slower than ``native_cutoff`` times its offloaded variant gets no more trials, and
    the rest of the budget goes to every other task in a second search.  MetaSchedule's
    gradient scheduler would otherwise give most of the budget to those native variants, the
    slowest tasks of a model, whose tuning cannot change the choice.
    """
    # Step 1. MetaSchedule's callbacks, plus ours (which also counts trials for the report).
    progress = options.progress
    counter = Progress(progress is not False, None if isinstance(progress, bool) else progress)
    callbacks = options.measure_callbacks
    if callbacks == "default":
        callbacks = ms.MeasureCallback.create("default")
    elif isinstance(callbacks, ms.MeasureCallback):
        callbacks = [callbacks]
    database = open_database(options, work_dir)
    builder = options.builder  # the caller's, or the one tune.py made for the whole call
    # "xgb" on features that give an offloaded candidate a row (features.py); one model for
    # both searches, so that the second learns from the first.
    model = options.cost_model
    if isinstance(model, str) and model == "xgb":
        model = cost_model(ms.TuneContext(num_threads=options.num_tuning_cores).num_threads)
    per_task = options.max_trials_per_task or max_trials_global
    with _task_loggers(work_dir, [t.name for t in tasks]) as loggers:
        task_logger = dict(zip((t.name for t in tasks), loggers))

        def search(chosen: list[Task], budget: int, per_task_limit: int, seed) -> None:
            # One context per task, with the rule told which variant it tunes; then tune.
            seeds = ms.utils.fork_seed(seed, n=len(chosen))
            contexts = [
                ms.TuneContext(
                    mod=task.workload,
                    target=target,
                    space_generator=design_space(
                        target,
                        RULE_MODE[task.variant],
                        options.backends,
                        options.registry,
                        rejections,
                    ),
                    search_strategy=options.strategy,
                    task_name=task.name,
                    rand_state=task_seed,
                    num_threads=options.num_tuning_cores,
                    logger=task_logger[task.name],
                ).clone()
                for task, task_seed in zip(chosen, seeds)
            ]
            ms.tune.tune_tasks(
                tasks=contexts,
                task_weights=[float(len(t.members)) for t in chosen],
                work_dir=work_dir,
                max_trials_global=budget,
                max_trials_per_task=per_task_limit,
                num_trials_per_iter=options.num_trials_per_iter,
                builder=builder,
                runner=options.runner,
                database=database,
                cost_model=model,
                measure_callbacks=[*callbacks, counter],
                task_scheduler=options.task_scheduler,
                module_equality=options.module_equality,
            )

        # Step 2. The first round of the functions tuned in both variants.
        paired = _paired(tasks) if options.native_cutoff is not None else []
        rest = tasks
        if paired:
            first = min(per_task, options.num_trials_per_iter, options.first_round_trials)
            search(paired, max_trials_global, first, options.seed)
            behind = _far_behind(paired, database, target, options.native_cutoff, counter)
            # Gone too: a wholly offloaded variant measured (its one candidate), and a task
            # at its trial limit.
            gone = {t.name for t in behind} | {
                t.name for t in paired if t.whole and t.name in counter.best
            }
            rest = [
                t for t in tasks if t.name not in gone and counter.trials.get(t.name, 0) < per_task
            ]
        # Step 3. The rest of the budget to every other task.
        budget = max_trials_global - sum(counter.trials.values())
        if rest and budget > 0:
            seed = options.seed + 1 if paired and options.seed is not None else options.seed
            search(rest, budget, per_task, seed)
    return database, counter


def with_design_space(tasks, target, options: TuneOptions, rejections):
    """The tasks whose design space MetaSchedule can generate, and the functions left with no
    task, with why.

    A schedule rule that raises while MetaSchedule generates a task's design space ends the
    whole tuning run (TVM 0.27 raises ``reverse-compute-at`` on a softmax with its scale and
    mask fused in).  Such a task is dropped here instead; its function keeps no tuned
    schedule, and ``build_model`` schedules it with the default rules.
    """
    kept, errors = [], {}
    for task in tasks:
        space = design_space(
            target, RULE_MODE[task.variant], options.backends, options.registry, rejections
        )
        context = ms.TuneContext(mod=task.workload, target=target, space_generator=space)
        try:
            context.generate_design_space()
        except Exception as error:
            logger.info("task %s dropped: %s", task.name, error)
            errors[task.name] = first_line(error)
            continue
        kept.append(task)
    covered = {name for task in kept for name in task.members}
    failed = {
        name: f"not tuned: MetaSchedule's design space raised: {reason}"
        for task in tasks
        if (reason := errors.get(task.name))
        for name in task.members
        if name not in covered
    }
    return kept, failed


def _paired(tasks: list[Task]) -> list[Task]:
    """The tasks of the functions tuned in both variants (offload and native)."""
    variants = collections.defaultdict(set)
    for task in tasks:
        variants[tuple(task.members)].add(task.variant)
    both = {members for members, found in variants.items() if {"offload", "native"} <= found}
    return [t for t in tasks if tuple(t.members) in both]


def _far_behind(paired, database, target, cutoff: float, counter: Progress) -> list[Task]:
    """The native tasks of ``paired`` slower than ``cutoff`` times their offloaded task."""
    best = {t.name: best_ms(database, t, target) for t in paired}
    offloaded = {tuple(t.members): best[t.name] for t in paired if t.variant == "offload"}
    behind = []
    for task in paired:
        offload_ms, native_ms = offloaded.get(tuple(task.members)), best[task.name]
        if task.variant != "native" or offload_ms is None or native_ms is None:
            continue
        if native_ms > cutoff * offload_ms:
            behind.append(task)
            counter.note(
                f"{task.name}: no more trials, {duration(native_ms)} after "
                f"{counter.trials.get(task.name, 0)} against {duration(offload_ms)} offloaded "
                f"(native_cutoff {cutoff:g})"
            )
    return behind


def best_ms(database, task: Task, target) -> float | None:
    record = database.query_tuning_record(task.workload, target, "main")
    if record is None:
        return None
    seconds = mean_seconds(record.run_secs)
    return seconds * 1e3 if seconds < FAILED_RUN else None


__all__ = ["RULE_MODE", "best_ms", "open_database", "run_search", "with_design_space"]
