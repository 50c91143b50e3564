"""A dynamic build tuned at the sizes the user names, dispatching among them at run time.

Entry points: :func:`checked_sizes` (``build_model``'s ``tune_sizes`` checked against the
entry's symbolic dims, before anything is lowered or tuned) and :func:`tune_by_size` (run after
the offload), which returns a :class:`SizeDispatch`: the module, the tuning report, and the
reasons and notes :meth:`SizeDispatch.reported` adds to the default schedule's report.

MetaSchedule's design spaces and measurements need static extents.  :func:`tune_by_size`
leaves the library calls as the offload wrote them (symbolic, and not tuned: the library
chooses its kernel per call) and takes each PrimFunc that calls no intrinsic:

1. a static one is tuned as it is, as in a static build;
2. a symbolic one gets a static copy per tuned size (:mod:`.specialize`: its own dims' values
   at that size, read from its calls), and every copy is tuned in the same run of
   :func:`~.tune.tune_tir`, as TVM code (``offload="never"``), whose ``default_rules``
   comparison keeps a default rule's schedule of a copy where that measures faster;
3. each tuned copy is measured again beside the default rules' symbolic schedule at its size,
   as the build without tuning has it (the first rule that applies, float32 ``exp`` written
   out, small nests on one thread), and the function becomes a dispatcher (:mod:`.dispatch`):
   each copy that measured faster behind a test of its dims' values, then the symbolic
   schedule at every other size.

A function whose dims cannot be read from its calls, whose copy does not become static, none
of whose copies got a tuned schedule (no valid record, a design space MetaSchedule cannot
generate) or measured faster than the symbolic schedule, or whose dispatcher is not well
formed, keeps the default rules' symbolic schedule, with the reason in the tuning report and
in ``Model.rules``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms

from .. import dynamic
from ..calls import intrinsic_calls
from ..frontend import first_line
from ..match import is_s_tir
from ..schedules import ScheduleReport, is_scheduled
from ..schedules.small_nests import serial_when_small
from . import dispatch
from .records import called_intrinsics
from .report import REPORT_FILE, FunctionReport, TuningReport, load_report
from .rule import logger
from .space import call_workers
from .specialize import Specialization, specializations, static_copy
from .tune import tune_tir


def _fail(message: str):
    raise ValueError(f"tir_byoc.build_model: {message}")


def entry_dims(func) -> dict[str, tuple[int, int | None]]:
    """The symbolic dims of ``func``'s parameters, by name, with their (lower, upper) bounds."""
    bounds = dynamic.bounds_of(func)
    return {name: bounds.get(name, (0, None)) for name in dynamic.symbolic_dims(func)}


def checked_sizes(func, tune_sizes, tuned: bool) -> tuple[dict[str, int], ...] | None:
    """``tune_sizes`` as :func:`tune_by_size` takes it (each size a dict of every dim of
    ``func``, the entry, in its order; repeats dropped), or None for a build not tuned by size.

    Raises
    ------
    ValueError
        In one line: a tuned build with symbolic dims and no ``tune_sizes``; ``tune_sizes``
        without tuning, or for static shapes; not a list of dicts of ints; a dim that is not
        the entry's, or missing; a value outside its dim's bounds.
    """
    dims = entry_dims(func)
    names = ", ".join(dims)
    example = "[{" + ", ".join(f"'{n}': {max(low, 1)}" for n, (low, _) in dims.items()) + "}]"
    if tune_sizes is None:
        if tuned and dims:
            _fail(
                f"expected tune_sizes= with tune_trials= or work_dir= on a build with the "
                f"symbolic dims {names} (MetaSchedule tunes static shapes), such as {example}"
            )
        return None
    if not tuned:
        _fail("expected tune_sizes= only with tune_trials= or work_dir=, got it without tuning")
    if not dims:
        _fail(
            "expected tune_sizes= only on a build with symbolic dims, got it on static shapes "
            "(a static build is tuned at its shape)"
        )
    if (
        not isinstance(tune_sizes, list | tuple)
        or not tune_sizes
        or not all(isinstance(size, dict) for size in tune_sizes)
    ):
        _fail(
            f"expected tune_sizes as a list of dicts of ints such as {example}, got {tune_sizes!r}"
        )
    sizes: list[dict[str, int]] = []
    for index, size in enumerate(tune_sizes):
        for name, value in size.items():
            if name not in dims:
                _fail(f"tune_sizes[{index}] names the dim {name!r}; expected the dims {names}")
            if not isinstance(value, int) or isinstance(value, bool):
                _fail(f"tune_sizes[{index}][{name!r}] is {value!r}; expected an int")
            low, high = dims[name]
            if value < low or (high is not None and value > high):
                _fail(
                    f"tune_sizes[{index}] gives {name}={value}, outside its bounds; expected "
                    f"{name} in {dynamic.span(low, high)}"
                )
        missing = [name for name in dims if name not in size]
        if missing:
            _fail(
                f"tune_sizes[{index}] gives no value for {missing[0]}; expected every dim ({names})"
            )
        ordered = {name: size[name] for name in dims}
        if ordered not in sizes:
            sizes.append(ordered)
    return tuple(sizes)


@dataclass(frozen=True)
class SizeDispatch:
    """What :func:`tune_by_size` did.

    Attributes
    ----------
    module : tvm.IRModule
        The module: static functions tuned, symbolic ones written as dispatchers (marked
        scheduled, their :data:`~tir_byoc.schedules.RULE_ATTR` saying what runs at which
        size), the rest as given.
    report : TuningReport
        Per function: ``"by-size"`` with its copies (``sizes``) and each copy's own line,
        a static function's tuning, a function that stays symbolic (``"unchanged"``) and why.
    declined : Mapping[str, str]
        The symbolic functions that keep the default rules' symbolic schedule, with why.
    serial_blocks : Mapping[str, Mapping[str, str]]
        Per dispatcher, the blocks its symbolic schedule leaves on one thread, and why.
    """

    module: tvm.IRModule
    report: TuningReport
    declined: Mapping[str, str] = field(default_factory=dict)
    serial_blocks: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def reported(self, schedule: ScheduleReport) -> ScheduleReport:
        """``schedule`` (the default schedule of :attr:`module`) with each declined function's
        reason after its rule (or after why no rule took it) and each dispatcher's serial
        blocks."""
        rules, unscheduled = dict(schedule.rules), dict(schedule.unscheduled)
        for name, reason in self.declined.items():
            note = f"not tuned by size: {reason}"
            if name in rules:
                rules[name] = f"{rules[name]}; {note}"
            elif name in unscheduled:
                unscheduled[name] = f"{unscheduled[name]}; {note}"
        serial = dict(schedule.serial_blocks)
        for name, notes in self.serial_blocks.items():
            serial[name] = MappingProxyType({**serial.get(name, {}), **notes})
        return replace(
            schedule,
            rules=MappingProxyType(rules),
            unscheduled=MappingProxyType(unscheduled),
            serial_blocks=MappingProxyType(serial),
        )


def _left_to_tvm(func) -> bool:
    return (
        isinstance(func, tirx.PrimFunc)
        and is_s_tir(func)
        and not is_scheduled(func)
        and not intrinsic_calls(func)
    )


def tune_by_size(
    mod: tvm.IRModule,
    entry: str,
    sizes: tuple[dict[str, int], ...],
    target,
    work_dir,
    trials: int,
    **options,
) -> SizeDispatch:
    """Tune an offloaded module with symbolic dims at ``sizes`` (see the module docstring).

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module after the offload (its PrimFuncs called from ``entry``), or a TIR one.
    entry : str
        The function whose dims ``sizes`` give (from :func:`checked_sizes`).
    target : tvm.target.Target
        The build's target; the symbolic schedule is the default rules' for it.
    work_dir, trials, **options
        As for :func:`~.tune.tune_tir` (``offload`` is ``"never"``: the offload is done).
        ``trials=0`` builds from the database in ``work_dir``, and keeps its report.
    """
    target = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    given = options.get("builder"), options.get("runner", "local")
    with call_workers(*given, measures=trials > 0) as (builder, runner):
        options = {**options, "builder": builder, "runner": runner}
        return _tune_by_size(mod, entry, sizes, target, work_dir, trials, options)


def _tune_by_size(mod, entry, sizes, target, work_dir, trials, options) -> SizeDispatch:
    """:func:`tune_by_size` with one builder and runner for the tuning and the measurements."""
    # Step 1. What each function left to TVM is: static, symbolic with copies, or declined.
    names = [g.name_hint for g, f in mod.functions_items() if _left_to_tvm(f)]
    found = specializations(mod, entry, names, sizes)
    tunable: dict[str, tirx.PrimFunc] = {}
    copies: dict[str, tuple[Specialization, ...]] = {}
    declined: dict[str, str] = {}
    for name in names:
        specs = found[name]
        made = specs if isinstance(specs, str) else _copies(mod[name], specs)
        if isinstance(made, str):
            declined[name] = made
        elif not specs:
            tunable[name] = mod[name]
        else:
            copies[name] = specs
            tunable.update(zip((spec.name for spec in specs), made, strict=True))
    # Step 2. The static functions and every copy in one tuning run.
    tuned = _tune(tunable, target, work_dir, trials, options)
    serial_copies = {}  # each tuned copy with its small nests on one thread, as the rules do
    for spec in (spec for specs in copies.values() for spec in specs):
        if is_scheduled(tuned[spec.name]):
            tuned[spec.name], serial_copies[spec.name] = serial_when_small(tuned[spec.name])
    saved = _saved(work_dir)
    reports = {f.name: f for f in saved.functions}
    # Step 3. Each copy measured against the symbolic schedule at its size; each function
    # with copies that won becomes a dispatcher.
    symbolic = {name: dispatch.symbolic_schedule(mod[name], target) for name in copies}
    earlier = {} if trials else {f.name: f for f in saved.functions if f.choice == "by-size"}
    kept, reports = dispatch.choose(symbolic, copies, tuned, reports, target, options, earlier)
    result = mod.clone()
    serial: dict[str, dict[str, str]] = {}
    lines: dict[str, FunctionReport] = {}
    for name in names:
        gvar = mod.get_global_var(name)
        if name in copies:
            func, line, notes = dispatch.write(
                name,
                mod[name],
                symbolic[name],
                copies[name],
                kept[name],
                tuned,
                reports,
                serial_copies,
            )
            if isinstance(func, str):
                declined[name] = func
            else:
                result.update_func(gvar, func)
                serial[name] = notes
            if line is not None:
                lines[name] = line
        elif name in tuned:
            result.update_func(gvar, tuned[name])
        if name in declined and name not in lines:
            note = f"not tuned by size: {declined[name]}; runs the default rules' symbolic schedule"
            lines[name] = FunctionReport(name, "unchanged", note=note)
    # Step 4. The report: each function, each dispatcher followed by its copies.
    report = _report(mod, names, lines, copies, reports, saved.rejected)
    if trials:  # a rebuild keeps the tuning run's report
        report.save(Path(work_dir) / REPORT_FILE)
    progress = options.get("progress", True)
    by_size = [f for f in report.functions if f.choice == "by-size" or f.name in declined]
    if progress is not False and by_size:
        stream = sys.stderr if isinstance(progress, bool) else progress
        print("tir_byoc tuning by size:", *(f"  {f}" for f in by_size), sep="\n", file=stream)
    return SizeDispatch(
        result,
        report,
        MappingProxyType(declined),
        MappingProxyType({k: MappingProxyType(v) for k, v in serial.items() if v}),
    )


def _copies(func, specs) -> list[tirx.PrimFunc] | str:
    """The static copy of ``func`` at each of ``specs``, or why one cannot be made."""
    made = []
    for spec in specs:
        try:
            copy = static_copy(func, spec)
        except Exception as error:  # what TVM refuses leaves the function symbolic
            copy = f"its copy at {spec.label} failed: {first_line(error)}"
        if isinstance(copy, str):
            return copy
        made.append(copy)
    return made


def _tune(tunable, target, work_dir, trials, options) -> dict[str, tirx.PrimFunc]:
    """``tunable`` tuned in one run of :func:`~.tune.tune_tir` (as TVM code), by name."""
    if not tunable:
        database = options.get("database", "json")
        if trials and isinstance(database, str) and database == "json":  # for a rebuild
            os.makedirs(work_dir, exist_ok=True)
            ms.database.JSONDatabase(work_dir=str(work_dir))
        return {}
    options = {**options, "offload": "never"}
    tuned = tune_tir(tvm.IRModule(tunable), target, str(work_dir), trials, **options)
    return {gvar.name_hint: func for gvar, func in tuned.functions_items()}


def _saved(work_dir) -> TuningReport:
    """The tuning run's report in ``work_dir`` (an empty one if there is none)."""
    try:
        return load_report(work_dir)
    except (FileNotFoundError, ValueError, KeyError, TypeError) as error:
        logger.info("no tuning report to read the copies' times from: %s", first_line(error))
        return TuningReport(())


def _report(mod, names, lines, copies, reports, rejected) -> TuningReport:
    """The tuning report: each function of ``mod`` in order, a symbolic one followed by the
    lines of its copies, the offloaded ones as not tuned."""
    functions = []
    for gvar, func in mod.functions_items():
        name = gvar.name_hint
        if isinstance(func, tirx.PrimFunc) and intrinsic_calls(func):
            note = "offloaded before tuning: library calls are not tuned"
            functions.append(
                FunctionReport(
                    name, "offload-untuned", intrinsics=called_intrinsics(func), note=note
                )
            )
        elif name in lines:
            functions.append(lines[name])
        elif name in reports and name in names:
            functions.append(reports[name])
        functions.extend(reports[s.name] for s in copies.get(name, ()) if s.name in reports)
    return TuningReport(tuple(functions), dict(rejected))


__all__ = ["SizeDispatch", "checked_sizes", "entry_dims", "tune_by_size"]
