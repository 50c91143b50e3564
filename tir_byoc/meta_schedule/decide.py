"""The decision per function, after the search: the faster variant's best record replayed.

Entry points: :func:`decide` (per function, the offloaded or the native variant, whichever
measured faster; in a Relax module the offloaded one measured again with its constant weights
packed, :class:`Packs`) and :func:`against_default_rules` (a function left to TVM's code
measured again beside the default rules' schedule, and the faster kept).
"""

from __future__ import annotations

from dataclasses import replace

import tvm

from ..frontend import first_line
from ..offload import apply
from ..packing import PackedVariant, PackReport, packed_variant
from ..rewrite import rewrite_function
from ..schedules import RULE_ATTR, first_rule, vector_math
from . import search
from .measure import measure
from .options import TuneOptions
from .records import as_scheduled, called_intrinsics, replay_best
from .report import FunctionReport, duration, load_report
from .rule import logger


def decide(name, tasks, functions, database, target, counter, options, planned, packs):
    """Replay the faster variant's best record into ``functions[name]``; report the choice.

    With ``packs`` (Relax modules), the offloaded variant of a function whose weights are
    constants is measured again with them packed, and that time is what the choice compares.
    """
    best = {t.variant: search.best_ms(database, t, target) for t in tasks}
    measured = {v: ms_ for v, ms_ in best.items() if ms_ is not None}
    trials = sum(counter.trials.get(t.name, 0) for t in tasks)
    original = functions[name]
    if not measured:
        if options.offload != "never":  # offload="never" offloads nothing, tuned or not
            functions[name] = apply(planned)
        intrinsics = called_intrinsics(functions[name])
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
            replayed[variant] = replay_best(
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
    functions[name] = as_scheduled(scheduled, original)
    if winner == "offload" and packs is not None:
        packs.rewritten.append((name, before, offloaded))
        if variant is not None:
            packs.chosen.append(replace(variant, func=as_scheduled(variant.func, original)))
    return FunctionReport(
        name,
        choice="none" if winner == "plain" else winner,
        trials=trials,
        best_ms=measured[winner],
        best_offload_ms=best.get("offload"),
        best_native_ms=best.get("native"),
        best_packed_ms=packed_ms,
        packed=variant.forms if variant is not None and winner == "offload" else (),
        intrinsics=called_intrinsics(scheduled),
        note=note,
    )


def against_default_rules(
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
                    functions[member] = as_scheduled(scheduled, originals[member]).with_attr(
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
                functions[name] = as_scheduled(scheduled, originals[name]).with_attr(
                    RULE_ATTR, rule
                )
                note = (
                    f"the default rule {rule} kept: {duration(rule_ms)} against the best record "
                    f"{again}"
                )
                report = replace(report, choice="default", best_ms=rule_ms)
            else:
                note = f"the default rule {rule}: {duration(rule_ms)}, the best record {again}"
            notes = "; ".join(n for n in (report.note, note) if n)
            reports[name] = replace(report, default_rule=rule, best_default_ms=rule_ms, note=notes)


def earlier_choices(work_dir) -> dict[str, FunctionReport]:
    """The functions the tuning run in ``work_dir`` measured against a default rule, by name
    (none when it left no report)."""
    try:
        saved = load_report(work_dir)
    except (FileNotFoundError, ValueError, KeyError, TypeError) as error:
        logger.info("no earlier choices of the default rules: %s", first_line(error))
        return {}
    return {f.name: f for f in saved.functions if f.default_rule}


class Packs:
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
        #: Each function whose chains were offloaded, tuned or not: (name, the function
        #: before the rewrite, what was offloaded), for :func:`tir_byoc.conv_pairs`.
        self.rewritten: list[tuple] = []
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
        if variant is None:  # the caller's note names the function: the blocks and reasons
            why = [f"{', '.join(d.blocks)}: {d.reason}" for d in self.report.kept[kept:]]
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
        self.rewritten.append((name, before, offloaded))
        variant = self._variant(name, before, offloaded)
        if variant is None:
            return ()
        self.chosen.append(variant)
        return variant.forms


__all__ = ["Packs", "against_default_rules", "decide", "earlier_choices"]
