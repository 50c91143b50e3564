"""Per symbolic function tuned by size: which tuned copies it dispatches to, and the dispatcher.

Entry points: :func:`symbolic_schedule` (the function as the default schedule writes it for
every size: what runs at the sizes not dispatched), :func:`choose` (each tuned copy measured
again beside the symbolic schedule at its size, in one batch for all functions, and kept only
where it measures faster; a rebuild takes the tuning run's choice again, without measuring)
and :func:`write` (the dispatcher of the copies kept, with its report line).

The tuning run's own comparison (``default_rules``) weighs a copy's best record against a
default rule's schedule of the static copy; where no rule applies to the copy at its size (a
unit batch takes a row reduction out of dlight's normal form), that comparison has nothing to
weigh, while the symbolic schedule still runs there, and the symbolic schedule runs a nest of
little work on one thread where a tuned one starts TVM's thread pool.  :func:`choose` weighs
the copy, its small nests on one thread as the default schedule runs them
(:func:`tir_byoc.schedules.small_nests.serial_when_small`, applied before), against what the
build without tuning runs at that size, so that a dispatched size does not run slower than it
would untuned, as measured.
"""

from __future__ import annotations

from dataclasses import replace

from ..frontend import first_line
from ..schedules import RULE_ATTR, is_scheduled, rule_schedule, vector_math
from .measure import measure
from .records import as_scheduled
from .report import FunctionReport, duration
from .rule import cpu_target, logger
from .specialize import dispatcher, static_copy


def symbolic_schedule(func, target) -> tuple:
    """``func`` as the default schedule writes it for every size: (the function, the rule's
    name or what runs instead, its blocks left on one thread with why)."""
    try:
        applied = rule_schedule(func, target, vector_math.applies(target))
    except Exception as error:  # a rule's bug leaves the loops, as in the default schedule
        return func, f"TVM's loops as written (a default rule raised: {first_line(error)})", {}
    if applied is None:
        return func, "TVM's loops as written (no default rule applies)", {}
    rule, scheduled, notes = applied
    return scheduled, rule, notes


def choose(symbolic: dict, copies: dict, tuned: dict, reports: dict, target, options, earlier):
    """The copies each function dispatches to, and the copies' report lines with the
    comparison added.

    ``symbolic`` holds each function's :func:`symbolic_schedule`, ``copies`` its
    specializations, ``tuned`` the tuned copies by name; a copy without a tuned schedule is
    not dispatched.  ``earlier`` (a rebuild: the tuning run's ``by-size`` lines by function)
    gives a function the same copies again without measuring."""
    chosen, pairs = {}, []
    for name, specs in copies.items():
        ready = [s for s in specs if is_scheduled(tuned[s.name])]
        if name in earlier:
            chosen[name] = [s for s in ready if s.name in earlier[name].sizes]
            continue
        chosen[name] = []
        for spec in ready:
            try:
                at_size = static_copy(symbolic[name][0], spec)
            except Exception as error:  # not measured: the copy is judged on its own time
                at_size = first_line(error)
            pairs.append((name, spec, at_size))
    built = vector_math.expand if vector_math.applies(target) else (lambda func: func)
    funcs = []
    for _, spec, at_size in pairs:
        funcs.append(built(tuned[spec.name]))
        if not isinstance(at_size, str):
            funcs.append(built(at_size))
    runner = options.get("runner", "local")
    measured = measure(funcs, cpu_target(target), options.get("builder"), runner) if funcs else []
    times = iter(measured)
    reports = dict(reports)
    for name, spec, at_size in pairs:
        tuned_ms, tuned_why = next(times)
        symbolic_ms, why = (None, at_size) if isinstance(at_size, str) else next(times)
        kept = tuned_ms is not None and (symbolic_ms is None or tuned_ms < symbolic_ms)
        if kept:
            chosen[name].append(spec)
        report = reports.get(spec.name) or FunctionReport(spec.name, "none")
        compared = _compared(tuned_ms, tuned_why, symbolic_ms, why)
        note = "; ".join(n for n in (report.note, compared) if n)
        best = tuned_ms if kept and tuned_ms is not None else report.best_ms  # as dispatched
        reports[spec.name] = replace(report, best_ms=best, symbolic_ms=symbolic_ms, note=note)
    return chosen, reports


def _compared(tuned_ms, tuned_why: str, symbolic_ms, why: str) -> str:
    """The comparison with the symbolic schedule, for a copy's report line: dispatched only if
    measured again, and faster than the symbolic schedule where that was measured."""
    if tuned_ms is None:
        return f"not dispatched: not measured again ({tuned_why})"
    again = f"again {duration(tuned_ms)}"
    if symbolic_ms is None:
        logger.warning("the symbolic schedule at a tuned size not measured: %s", why)
        return f"dispatched: {again}, the symbolic schedule at this size not measured ({why})"
    symbolic = f"the symbolic schedule at this size {duration(symbolic_ms)}"
    if tuned_ms < symbolic_ms:
        return f"dispatched: {again} against {symbolic}"
    return f"not dispatched: {symbolic} against this schedule {again}"


def _kept(spec, copy, reports) -> str:
    """What runs at ``spec``'s size, with its time: ``MetaSchedule at batch=1 (3.20 us)``."""
    rule = (copy.attrs or {}).get(RULE_ATTR)
    report = reports.get(spec.name)
    time = f" ({duration(report.best_ms)})" if report and report.best_ms is not None else ""
    return f"{'MetaSchedule' if rule is None else rule} at {spec.label}{time}"


def write(name: str, func, symbolic: tuple, specs, kept, tuned: dict, reports: dict, serial):
    """(the dispatcher of ``func`` to the tuned copies of ``kept``, its report line, its
    serial blocks), or (why there is none, its report line or None, ``{}``).

    ``serial`` gives each copy's blocks on one thread (by the copy's name) and why."""
    fallback, otherwise, notes = symbolic
    trials = sum(getattr(reports.get(s.name), "trials", 0) for s in specs)
    left = [s.label for s in specs if s not in kept]
    elsewhere = f" (among them {' and '.join(left)}, not dispatched)" if left else ""
    if not kept:
        if any(is_scheduled(tuned[s.name]) for s in specs):
            why = "no tuned copy measured faster than the symbolic schedule at its size"
        else:
            why = "none of its copies got a tuned schedule"
        line = FunctionReport(name, "by-size", trials, note=f"{why}; runs {otherwise}")
        return why, line, {}
    branches = [(spec, tuned[spec.name]) for spec in kept]
    try:
        written = dispatcher(fallback, branches)
    except Exception as error:  # what TVM refuses leaves the function symbolic
        written = f"its dispatcher failed: {first_line(error)}"
    if isinstance(written, str):
        return written, None, {}
    described = (
        f"by size: {', '.join(_kept(spec, copy, reports) for spec, copy in branches)}; "
        f"{otherwise} at other sizes"
    )
    written = as_scheduled(written, func).with_attr(RULE_ATTR, described)
    sizes = tuple(spec.name for spec in kept)
    line = FunctionReport(name, "by-size", trials, sizes=sizes, note=described + elsewhere)
    where = [*((spec.label, serial.get(spec.name, {})) for spec in kept), ("other sizes", notes)]
    blocks: dict = {}
    for size, found in where:
        for block, why in found.items():
            blocks[block] = "; ".join(filter(None, (blocks.get(block), f"at {size}: {why}")))
    return written, line, blocks


__all__ = ["choose", "symbolic_schedule", "write"]
