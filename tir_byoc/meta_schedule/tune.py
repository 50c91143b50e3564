"""Tuning with offload in the design space, one call from module to tuned module.

Entry points: :func:`tune_tir` and :func:`tune_relax` (tune, keep the faster variant per
function, return the module ready for ``tvm.compile``) and :func:`apply_record` (the best
record of a workload with its chosen chains offloaded).  A call goes: options checked once
(:class:`~.options.TuneOptions`); every function planned once and turned into tasks
(:func:`plan_tasks`); all tasks tuned in one search over :func:`~.space.design_space`
(:func:`_run_search`); per function, the faster variant's best record replayed
(:func:`_decide`); a function left to TVM's code measured again beside the default rules'
schedule, and the faster kept (:func:`_against_default_rules`); the
:class:`~.report.TuningReport` written.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from .. import toolchain
from ..frontend import first_line
from ..offload import apply
from ..packing import PackedVariant, PackReport, install_packed, packed_variant
from ..registry import REGISTRY, Registry
from ..relax import pipeline
from ..rewrite import RewriteError, intrinsic_calls, rewrite_function
from ..schedules import RULE_ATTR, first_rule, vector_math
from .features import cost_model
from .measure import measure
from .options import TuneOptions
from .postproc import CandidateRejected, OffloadPostproc, Rejections
from .progress import FAILED_RUN, Progress, mean_seconds
from .report import REPORT_FILE, FunctionReport, TuningReport, duration, load_report
from .rule import cpu_target, logger, only_function
from .space import candidate_builder, design_space
from .tasks import Task, plan_tasks

# --------------------------------------------------------------------------------------
# Applying the database
# --------------------------------------------------------------------------------------


def apply_record(
    database: ms.database.Database,
    func: tirx.PrimFunc | tvm.IRModule,
    target,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
) -> tirx.PrimFunc | None:
    """The best schedule of ``func`` in ``database``, with its chosen chains offloaded.

    Parameters
    ----------
    database : tvm.s_tir.meta_schedule.database.Database
        Records of a tuning run that used :func:`offload_space`.
    func : tvm.tirx.PrimFunc or tvm.IRModule
        The workload as it was tuned (a PrimFunc is normalized the way ``ms.tune_tir`` does).
    target : str, dict or tvm.target.Target
        The target it was tuned for.
    backends, registry
        As for :func:`tir_byoc.scan`.

    Returns
    -------
    tvm.tirx.PrimFunc or None
        None when the database has no valid record for ``func``.
    """
    replayed = _replay(database, func, target, backends, registry)
    if replayed is None:
        return None
    before, offloaded = replayed
    try:
        return rewrite_function(before, offloaded)
    except RewriteError as reason:
        raise RuntimeError(
            f"tir_byoc.meta_schedule: the best record of {before.attrs['global_symbol']} "
            f"does not offload any more: {reason}"
        ) from None


def _replay(database, func, target, backends, registry):
    """The best record of ``func`` replayed, and the chains to offload in it; or None."""
    target = cpu_target(target)
    workload = _normalize_mod(func)
    record = database.query_tuning_record(workload, target, "main")
    if record is None:
        return None
    # Step 1. Replay the record: the chain comes back marked and untouched, since the
    # offload itself is not a traced instruction (see offload_space).
    sch = s_tir.Schedule(workload)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    before = only_function(sch.mod)[1]
    # Step 2. What the postproc offloaded in the measured candidate.
    try:
        return before, OffloadPostproc(backends, registry).offloaded(before)
    except CandidateRejected as reason:
        raise RuntimeError(
            f"tir_byoc.meta_schedule: the best record of "
            f"{only_function(workload)[0].name_hint} does not offload any more: {reason}"
        ) from None


# --------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------


def _database(options: TuneOptions, work_dir: str) -> ms.database.Database:
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


def _run_search(tasks, target, work_dir, max_trials_global, options: TuneOptions, rejections):
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
    database = _database(options, work_dir)
    builder = options.builder if options.builder is not None else candidate_builder()
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


def _with_design_space(tasks, target, options: TuneOptions, rejections):
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
    best = {t.name: _best_ms(database, t, target) for t in paired}
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


# --------------------------------------------------------------------------------------
# The decision per function
# --------------------------------------------------------------------------------------


def _called_intrinsics(func: tirx.PrimFunc) -> tuple[str, ...]:
    """The intrinsics ``func`` calls, once per offloaded block, sorted: the report's form."""
    return tuple(sorted(collections.Counter(intrinsic_calls(func)).elements()))


def _best_ms(database, task: Task, target) -> float | None:
    record = database.query_tuning_record(task.workload, target, "main")
    if record is None:
        return None
    seconds = mean_seconds(record.run_secs)
    return seconds * 1e3 if seconds < FAILED_RUN else None


def _decide(name, tasks, functions, database, target, counter, options, planned, packs):
    """Replay the faster variant's best record into ``functions[name]``; report the choice.

    With ``packs`` (Relax modules), the offloaded variant of a function whose weights are
    constants is measured again with them packed, and that time is what the choice compares.
    """
    best = {t.variant: _best_ms(database, t, target) for t in tasks}
    measured = {v: ms_ for v, ms_ in best.items() if ms_ is not None}
    trials = sum(counter.trials.get(t.name, 0) for t in tasks)
    original = functions[name]
    if not measured:
        if options.offload != "never":  # offload="never" offloads nothing, tuned or not
            functions[name] = apply(planned)
        intrinsics = _called_intrinsics(functions[name])
        # build_model gives such a function the default rules afterwards (model.rules).
        note = "no valid measured candidate; " + (
            "chains offloaded, the rest not tuned" if intrinsics else "not tuned"
        )
        logger.warning("%s: %s", name, note)
        forms = (
            packs.pack_untuned(name, original, planned) if packs is not None and intrinsics else ()
        )
        return FunctionReport(
            name,
            "offload" if intrinsics else "none",
            trials,
            intrinsics=intrinsics,
            packed=forms,
            note=note,
        )
    replayed = {}

    def replay(variant):
        if variant not in replayed:
            task = next(t for t in tasks if t.variant == variant)
            replayed[variant] = _replay(
                database, task.workload, target, options.backends, options.registry
            )
        return replayed[variant]

    # An offloaded record that no longer offloads (a database tuned with a backend that is
    # gone) leaves the native one, when there is one.
    variant, packed_ms, note = None, None, ""
    if "offload" in measured and len(measured) > 1:
        try:
            replay("offload")
        except RuntimeError as error:
            note = f"offload not chosen: {error}"
            logger.warning("%s: %s", name, note)
            del measured["offload"]
    # The offloaded variant with its weights packed, where they can be.
    if packs is not None and "offload" in measured:
        task = next(t for t in tasks if t.variant == "offload")
        variant, packed_ms, pack_note = packs.measure(name, task.name, *replay("offload"))
        note = note or pack_note
        if packed_ms is not None:
            measured["offload"] = packed_ms
        else:
            variant = None  # not measured packed: kept plain, as measured
    winner = min(measured, key=measured.get)
    before, offloaded = replay(winner)
    scheduled = rewrite_function(before, offloaded)
    functions[name] = _scheduled(scheduled, original)
    if winner == "offload" and variant is not None:
        packs.chosen.append(replace(variant, func=_scheduled(variant.func, original)))
    return FunctionReport(
        name,
        choice="none" if winner == "plain" else winner,
        trials=trials,
        best_ms=measured[winner],
        best_offload_ms=best.get("offload"),
        best_native_ms=best.get("native"),
        best_packed_ms=packed_ms,
        packed=variant.forms if variant is not None and winner == "offload" else (),
        intrinsics=_called_intrinsics(scheduled),
        note=note,
    )


def _against_default_rules(
    tasks, originals, functions, reports, target, options: TuneOptions, decided=None
):
    """Functions left to TVM's code keep the default rules' schedule where it measures faster.

    For each task with no offloaded variant whose best record was replayed, the record (as
    replayed into ``functions``) and the first of :data:`tir_byoc.schedules.RULES` applied to
    the original are measured in one batch, both as they will be built (float32 ``exp``
    written out where the target allows, as ``build_model`` does); the faster schedule goes
    into ``functions`` for every member of the task, and ``reports`` say both times.

    ``decided`` (a replay: the tuning run's report, by function) gives a function the same
    choice again without measuring, so that a rebuild is the module the tuning run returned
    even where the two schedules measure within noise of each other.
    """
    decided = decided or {}
    offloadable = {name for task in tasks if task.variant == "offload" for name in task.members}
    compared = []
    for task in tasks:
        name = task.members[0]
        if task.variant == "offload" or offloadable & set(task.members):
            continue
        if reports[name].best_ms is None:  # no record: build_model applies the rules anyway
            continue
        try:
            applied = first_rule(originals[name], target)
        except Exception as error:  # a rule's bug leaves the tuned schedule
            logger.info("%s: default rules raised: %s", name, first_line(error))
            continue
        if applied is None:
            continue
        rule, scheduled = applied[0], applied[1]
        earlier = decided.get(name)
        if earlier is not None and earlier.default_rule == rule:
            for member in task.members:
                if earlier.choice == "default":
                    functions[member] = _scheduled(scheduled, originals[member]).with_attr(
                        RULE_ATTR, rule
                    )
                reports[member] = replace(
                    reports[member],
                    choice=earlier.choice,
                    best_ms=earlier.best_ms,
                    default_rule=rule,
                    best_default_ms=earlier.best_default_ms,
                    note=earlier.note,
                )
            continue
        compared.append((task, rule, scheduled))
    if not compared:
        return
    built = vector_math.expand if vector_math.applies(target) else (lambda func: func)
    candidates = [(functions[task.members[0]], scheduled) for task, _, scheduled in compared]
    times = measure(
        [built(func) for pair in candidates for func in pair],
        target,
        options.builder,
        options.runner,
    )
    for i, (task, rule, scheduled) in enumerate(compared):
        (tuned_ms, _), (rule_ms, why) = times[2 * i], times[2 * i + 1]
        if rule_ms is None:
            logger.warning("%s: the default rule %s not measured: %s", task.name, rule, why)
            continue
        again = "not measured again" if tuned_ms is None else f"again {duration(tuned_ms)}"
        kept = tuned_ms is None or rule_ms <= tuned_ms
        for name in task.members:
            report = reports[name]
            if kept:
                functions[name] = _scheduled(scheduled, originals[name]).with_attr(RULE_ATTR, rule)
                note = (
                    f"the default rule {rule} kept: {duration(rule_ms)} against the best record "
                    f"{again}"
                )
                report = replace(report, choice="default", best_ms=rule_ms)
            else:
                note = f"the default rule {rule}: {duration(rule_ms)}, the best record {again}"
            notes = "; ".join(n for n in (report.note, note) if n)
            reports[name] = replace(report, default_rule=rule, best_default_ms=rule_ms, note=notes)


def _earlier_choices(work_dir) -> dict[str, FunctionReport]:
    """The functions the tuning run in ``work_dir`` measured against a default rule, by name
    (none when it left no report)."""
    try:
        saved = load_report(work_dir)
    except (FileNotFoundError, ValueError, KeyError, TypeError) as error:
        logger.info("no earlier choices of the default rules: %s", first_line(error))
        return {}
    return {f.name: f for f in saved.functions if f.default_rule}


def _scheduled(func: tirx.PrimFunc, original: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a replayed record) under ``original``'s attributes, marked scheduled."""
    return tirx.PrimFunc(func.params, func.body, func.ret_type, attrs=original.attrs).with_attr(
        "tirx.is_scheduled", True
    )


class _Packs:
    """The packed variants of one Relax module's tuned functions: measured, then chosen.

    ``measure`` gives a function's best offloaded record its packed variant
    (:func:`tir_byoc.packing.packed_variant`, which chooses each weight's form by timing) and
    measures it (:func:`~.measure.measure`); functions sharing a task and forms share
    the measurement.  ``chosen`` collects the variants of functions offload won, for
    :func:`tir_byoc.packing.install_packed`.
    """

    def __init__(self, mod: tvm.IRModule, target, options: TuneOptions):
        self.mod = mod
        self.target = target
        self.options = options
        self.report = PackReport()
        self.chosen: list[PackedVariant] = []
        self._measured: dict[tuple[str, tuple[str, ...]], tuple[float | None, str]] = {}

    def _variant(self, name, before, offloaded) -> PackedVariant | None:
        return packed_variant(
            self.mod,
            self.mod.get_global_var(name),
            before,
            rewrite_function(before, offloaded),
            offloaded,
            rewrite_function,
            self.options.registry,
            self.report,
        )

    def measure(self, name, task_name, before, offloaded):
        """(variant or None, its latency in ms or None, a note for the report)."""
        kept = len(self.report.kept)
        variant = self._variant(name, before, offloaded)
        if variant is None:  # the report's lines name the function; the caller's does too
            why = [line.removeprefix(f"{name}: ") for line in self.report.kept[kept:]]
            return None, None, "; ".join(why)
        key = (task_name, variant.forms)
        if key not in self._measured:
            self._measured[key] = measure(
                [variant.func],
                self.target,
                self.options.builder,
                self.options.runner,
                variant.blocks(),
            )[0]
        packed_ms, why = self._measured[key]
        if packed_ms is None:
            logger.warning("%s: weights left plain: %s", name, why)
        return variant, packed_ms, why

    def pack_untuned(self, name, before, planned) -> tuple[str, ...]:
        """Pack the weights of a function offloaded whole without tuning; the forms packed."""
        offloaded = [pair for function in planned.functions for pair in planned.offloaded(function)]
        variant = self._variant(name, before, offloaded)
        if variant is None:
            return ()
        self.chosen.append(variant)
        return variant.forms


# --------------------------------------------------------------------------------------
# One-call helpers
# --------------------------------------------------------------------------------------


def _tune_functions(
    functions, target, work_dir, max_trials_global, options: TuneOptions, packs=None
):
    """The core of :func:`tune_tir` and :func:`tune_relax`: named PrimFuncs in, tuned out.

    ``packs`` (a :class:`_Packs`, for a Relax module) measures and collects packed variants.
    """
    target = cpu_target(target)
    os.makedirs(work_dir, exist_ok=True)
    originals, functions = functions, dict(functions)
    # Step 1. Which functions are tuned (in which variants), offloaded whole, or left alone.
    tasks, untuned, plans = plan_tasks(functions, options)
    reports = {}
    for name, reason in untuned.items():
        choice, forms = "unchanged", ()
        if reason == "whole function offloaded":
            before = functions[name]
            functions[name] = apply(plans[name])
            choice = "offload-untuned"
            if packs is not None:  # not measured, as in tir_byoc.offload: packed by timing
                forms = packs.pack_untuned(name, before, plans[name])
        reports[name] = FunctionReport(
            name,
            choice,
            intrinsics=_called_intrinsics(functions[name]),
            packed=forms,
            note=reason,
        )
    # Step 2. Tune every task in one search; then keep the faster variant per function.
    rejections = Rejections()
    if tasks and max_trials_global:
        tasks, failed = _with_design_space(tasks, target, options, rejections)
        for name, reason in failed.items():
            reports[name] = FunctionReport(name, "unchanged", note=reason)
    if tasks:
        if max_trials_global == 0:  # the database of an earlier run, as it is
            database, counter = _database(options, work_dir), Progress(display=False)
        else:
            database, counter = _run_search(
                tasks, target, work_dir, max_trials_global, options, rejections
            )
        for name in functions:
            mine = [t for t in tasks if name in t.members]
            if mine:
                reports[name] = _decide(
                    name, mine, functions, database, target, counter, options, plans[name], packs
                )
        if options.default_rules:
            decided = _earlier_choices(work_dir) if max_trials_global == 0 else None
            _against_default_rules(tasks, originals, functions, reports, target, options, decided)
    # Step 3. Load the libraries the result calls, so that tvm.compile resolves them here.
    registry = options.registry
    for backend in sorted({registry[i].backend for r in reports.values() for i in r.intrinsics}):
        toolchain.load_backend(backend, registry)
    report = TuningReport(tuple(reports[n] for n in functions), dict(rejections.counts))
    if max_trials_global:  # a replay keeps the tuning run's report, trials and all
        report.save(Path(work_dir) / REPORT_FILE)
    logger.info("%s", report)
    if options.progress is not False:
        stream = sys.stderr if isinstance(options.progress, bool) else options.progress
        print(report, file=stream, flush=True)
    return functions


#: The files of MetaSchedule's JSON database in a work_dir (``ms.database.JSONDatabase``).
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")


def check_budget(trials, work_dir, database="json", name="max_trials_global", caller=None):
    """A one-line ``ValueError`` for a budget that is not a count, or for ``0`` (replay the
    database of an earlier run) when ``work_dir`` holds no JSON database to replay.

    ``name`` and ``caller`` are the parameter and the function the message names."""
    caller = caller or "tir_byoc.meta_schedule"
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        raise ValueError(f"{caller}: expected {name} to be an int >= 0, got {trials!r}")
    if trials == 0 and isinstance(database, str) and database == "json":
        missing = [file for file in DATABASE_FILES if not (Path(work_dir) / file).is_file()]
        if missing:
            raise ValueError(
                f"{caller}: {name}=0 builds from the database of an earlier tuning, but "
                f"{work_dir} has no {missing[0]}; expected the work_dir of a tuning run"
            )


def tune_tir(mod, target, work_dir: str, max_trials_global: int, **options):
    """Tune a TIR module with tir_byoc's offload in the design space.

    Parameters
    ----------
    mod : tvm.IRModule or tvm.tirx.PrimFunc
        S-TIR functions to tune.  Not modified.
    target : str, dict or tvm.target.Target
        An llvm (CPU) target.
    work_dir : str
        Where MetaSchedule's database and logs go, and :data:`REPORT_FILE`.
    max_trials_global : int
        Trials for all functions together.  ``0``: no new trial; each function gets its best
        record in the database an earlier run left in ``work_dir`` (tune once, build many
        times; that run's report file is kept), and one without a record is handled as one
        without a valid candidate (its chains offloaded, not tuned).
    **options
        ``offload``: ``"choice"`` (default; offloaded and native variants both measured),
        ``"always"`` (chains always offloaded; functions made only of chains not tuned at
        all) or ``"never"`` (plain MetaSchedule); ``backends``, ``registry``,
        ``progress`` (True: lines on stderr; False: silent; or a text stream); MetaSchedule's
        ``max_trials_per_task``, ``num_trials_per_iter``, ``builder`` (default
        :func:`candidate_builder`), ``runner``, ``database``, ``cost_model``,
        ``measure_callbacks``, ``task_scheduler``, ``module_equality``, ``strategy``,
        ``num_tuning_cores`` and ``seed``.

    Returns
    -------
    tvm.IRModule or tvm.tirx.PrimFunc
        The same kind as ``mod``: every function scheduled by its best record, with the chains
        that won offloaded.  The intrinsic libraries are loaded, so ``tvm.compile`` of it runs
        here; :func:`load_report` tells which variant won per function.
    """
    if not isinstance(mod, tirx.PrimFunc | tvm.IRModule):
        raise TypeError(
            f"tir_byoc.meta_schedule.tune_tir: expected a tvm.IRModule or tvm.tirx.PrimFunc, "
            f"got {type(mod).__name__}"
        )
    checked = TuneOptions.from_kwargs(options)
    check_budget(max_trials_global, work_dir, checked.database)
    if isinstance(mod, tvm.IRModule):
        return _tune_module(mod, target, work_dir, max_trials_global, checked)
    name = str(mod.attrs["global_symbol"]) if mod.attrs and "global_symbol" in mod.attrs else "main"
    return _tune_functions({name: mod}, target, work_dir, max_trials_global, checked)[name]


def tune_relax(mod, target, work_dir: str, max_trials_global: int, **options):
    """Tune the PrimFuncs of a lowered Relax module with tir_byoc's offload in the design space.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module after ``LegalizeOps`` (and usually ``FuseOps`` and ``FuseTIR``), so that
        its operators are PrimFuncs called with ``call_tir``.  Not modified.
    target, work_dir, max_trials_global, **options
        As for :func:`tune_tir`.

    Returns
    -------
    tvm.IRModule
        The Relax module with its PrimFuncs scheduled and offloaded, ready for
        ``tvm.compile(mod, target)`` and the Relax VM.  Unless ``offload="never"``, GEMMs on a
        transposed or broadcast copy of a weight read the weight itself, and the copies are
        gone (``fold_transposes``); constant weights of offloaded chains are packed where the
        packed call was measured faster (``pack_weights``; :mod:`~.packed`).
    """
    from tvm import relax

    if not isinstance(mod, tvm.IRModule) or not any(
        isinstance(f, relax.Function) for f in mod.functions.values()
    ):
        raise TypeError(
            "tir_byoc.meta_schedule.tune_relax: expected a tvm.IRModule with Relax functions, "
            f"got {type(mod).__name__} without any"
        )
    if not any(isinstance(f, tirx.PrimFunc) for f in mod.functions.values()):
        raise ValueError(
            "tir_byoc.meta_schedule.tune_relax: expected PrimFuncs to tune, found none; run "
            "relax.transform.LegalizeOps (and FuseOps, FuseTIR) first"
        )
    checked = TuneOptions.from_kwargs(options)
    check_budget(max_trials_global, work_dir, checked.database)
    return _tune_module(mod, target, work_dir, max_trials_global, checked)


def _tune_module(mod, target, work_dir, max_trials_global, options: TuneOptions) -> tvm.IRModule:
    from tvm import relax

    is_relax = any(isinstance(f, relax.Function) for f in mod.functions.values())
    if is_relax and options.fold_transposes and options.offload != "never":
        # As the offload folds them; the copies left uncalled are not tuned.
        mod = pipeline.fold_weight_copies(mod, backends=options.backends, registry=options.registry)
    primfuncs = {
        gvar.name_hint: func
        for gvar, func in mod.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }
    packs = _Packs(mod, cpu_target(target), options) if is_relax and options.pack_weights else None
    tuned = _tune_functions(primfuncs, target, work_dir, max_trials_global, options, packs)
    result = mod.clone()
    for gvar, _ in mod.functions_items():
        if gvar.name_hint in tuned:
            result.update_func(gvar, tuned[gvar.name_hint])
    if packs is not None:
        result = install_packed(result, packs.chosen, packs.report)
    return result
