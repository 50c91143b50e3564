"""Tuning with offload in the design space, one call from module to tuned module.

Entry points: :func:`tune_tir` and :func:`tune_relax` (tune, keep the faster variant per
function, return the module ready for ``tvm.compile``).  A call goes: options checked once
(:class:`~.options.TuneOptions`); for a Relax module, the weight copies folded as the offload
folds them (:func:`tir_byoc.relax.pipeline.fold_weight_copies`); every function planned once and
turned into tasks (:func:`~.tasks.plan_tasks`); all tasks tuned in one search over
:func:`~.space.design_space` (:func:`~.search.run_search`); per function, the faster variant's
best record replayed (:func:`~.decide.decide`); a function left to TVM's code measured again
beside the default rules' schedule, and the faster kept (:func:`~.decide.against_default_rules`);
the :class:`~.report.TuningReport` written.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import tvm
from tvm import tirx

from .. import toolchain
from ..conv_pairs import pair_convolutions
from ..offload import OffloadReport, apply
from ..packing import install_packed, without_sites
from ..relax import pipeline
from .decide import Packs, against_default_rules, decide, earlier_choices
from .options import TuneOptions
from .postproc import Rejections
from .progress import Progress
from .records import called_intrinsics
from .report import REPORT_FILE, FunctionReport, TuningReport
from .rule import cpu_target, logger
from .search import open_database, run_search, with_design_space
from .space import call_workers
from .tasks import plan_tasks


def _tune_functions(
    functions, target, work_dir, max_trials_global, options: TuneOptions, packs=None
):
    """The core of :func:`tune_tir` and :func:`tune_relax`: named PrimFuncs in, tuned out.

    ``packs`` (a :class:`Packs`, for a Relax module) measures and collects packed variants.
    One builder and one runner serve the search and every measurement of the call
    (:func:`call_workers`).
    """
    measures = max_trials_global > 0
    with call_workers(options.builder, options.runner, measures) as (builder, runner):
        options = dataclasses.replace(options, builder=builder, runner=runner)
        if packs is not None:  # its measurements too
            packs.options = options
        return _tune_with(functions, target, work_dir, max_trials_global, options, packs)


def _tune_with(functions, target, work_dir, max_trials_global, options: TuneOptions, packs):
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
            intrinsics=called_intrinsics(functions[name]),
            packed=forms,
            note=reason,
        )
    # Step 2. Tune every task in one search; then keep the faster variant per function.
    rejections = Rejections()
    if tasks and max_trials_global:
        tasks, failed = with_design_space(tasks, target, options, rejections)
        for name, reason in failed.items():
            reports[name] = FunctionReport(name, "unchanged", note=reason)
    if tasks:
        if max_trials_global == 0:  # the database of an earlier run, as it is
            database, counter = open_database(options, work_dir), Progress(display=False)
        else:
            database, counter = run_search(
                tasks, target, work_dir, max_trials_global, options, rejections
            )
        for name in functions:
            mine = [t for t in tasks if name in t.members]
            if mine:
                reports[name] = decide(
                    name, mine, functions, database, target, counter, options, plans[name], packs
                )
        if options.default_rules:
            decided = earlier_choices(work_dir) if max_trials_global == 0 else None
            against_default_rules(tasks, originals, functions, reports, target, options, decided)
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
        :func:`~.space.candidate_builder`), ``runner``, ``database``, ``cost_model``,
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
        return _tune_module(mod, target, work_dir, max_trials_global, checked)[0]
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
    return tune_relax_reported(mod, target, work_dir, max_trials_global, **options)[0]


def tune_relax_reported(mod, target, work_dir: str, max_trials_global: int, **options):
    """:func:`tune_relax`, and what its offload decided beyond the tuning:
    ``(module, tir_byoc.offload.OffloadReport)``, as :func:`tir_byoc.offload_reported` gives
    it (the convolution pairs fused and not, the packing's declines).  The input is checked
    here, for both."""
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


def _tune_module(mod, target, work_dir, max_trials_global, options: TuneOptions):
    """``(the tuned module, OffloadReport)``; see :func:`tune_relax_reported`."""
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
    packs = Packs(mod, cpu_target(target), options) if is_relax and options.pack_weights else None
    tuned = _tune_functions(primfuncs, target, work_dir, max_trials_global, options, packs)
    result = mod.clone()
    for gvar, _ in mod.functions_items():
        if gvar.name_hint in tuned:
            result.update_func(gvar, tuned[gvar.name_hint])
    if packs is None:
        return result, OffloadReport()
    # As in tir_byoc.offload: the pairs of convolutions offloaded whole first, then the packed
    # variants at the call sites no pair replaced.
    rewritten = [(result.get_global_var(n), before, done) for n, before, done in packs.rewritten]
    result, pairs = pair_convolutions(result, rewritten, options.registry)
    chosen = [without_sites(v, pairs.bindings) for v in packs.chosen]
    result = install_packed(result, [v for v in chosen if v is not None], packs.report)
    return result, OffloadReport.of(pairs, packs.report)
