"""The postproc that replaces the chains chosen for offload by intrinsic calls.

Entry point: :class:`OffloadPostproc`.  It reads the marks :class:`~.rule.OffloadRule` left
(:func:`~.rule.block_choices`), plans the candidate once (:func:`tir_byoc.planning.plan`) and
rewrites it with :func:`tir_byoc.rewrite.rewrite_function`, the core of :func:`tir_byoc.offload`.
A candidate that cannot be offloaded as chosen is rejected (:class:`CandidateRejected`) and
counted per reason by :class:`Rejections`, which the tuning report lists.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from tvm import s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc

from ..match import Match, is_s_tir
from ..planning import plan
from ..registry import REGISTRY, Intrinsic, Registry
from ..rewrite import RewriteError, rewrite_function
from .rule import block_choices, logger, only_function


class Rejections:
    """Counts rejected candidates per reason; logs each reason once at WARNING, then DEBUG."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def record(self, task: str, reason: str, *, traceback: bool = False) -> None:
        with self._lock:
            first = reason not in self.counts
            self.counts[reason] = self.counts.get(reason, 0) + 1
        level = logging.WARNING if first else logging.DEBUG
        logger.log(level, "%s: candidate rejected: %s", task, reason, exc_info=traceback and first)


class CandidateRejected(Exception):
    """Internal: why :class:`OffloadPostproc` refuses a candidate (caught and logged)."""


@derived_object
class OffloadPostproc(PyPostproc):
    """Postproc that replaces matched chains of each candidate by intrinsic calls.

    Chains that :class:`OffloadRule` marked ``offload`` must still match and be rewritten, or
    the candidate is rejected (``apply`` returns False) with the reason logged on the
    ``tir_byoc.meta_schedule`` logger; chains marked ``native`` are left to TVM.  Without
    marks (the postproc used on its own) every match with an intrinsic is offloaded, as
    :func:`tir_byoc.offload` would.

    Parameters
    ----------
    backends : str or iterable of str, optional
        Backends allowed, as for :func:`tir_byoc.scan`.
    registry : Registry, optional
        Where intrinsics are looked up.
    """

    def __init__(
        self,
        backends: Iterable[str] | str | None = None,
        registry: Registry = REGISTRY,
        _rejections: Rejections | None = None,
    ):
        super().__init__()
        self.backends = backends
        self.registry = registry
        self.rejections = _rejections if _rejections is not None else Rejections()
        self.task = "main"

    def _initialize_with_tune_context(self, context) -> None:
        self.task = str(context.task_name) if context.task_name else "main"

    def apply(self, sch: s_tir.Schedule) -> bool:
        try:
            func = only_function(sch.mod)[1]
            rewritten = self._rewrite(func)
        except (CandidateRejected, RewriteError) as reason:
            self.rejections.record(self.task, str(reason))
            return False
        except Exception as error:  # MetaSchedule would drop it silently; say what it was.
            reason = f"unexpected {type(error).__name__}: {error}"
            self.rejections.record(self.task, reason, traceback=True)
            return False
        if rewritten is not func:
            root = func.body.block
            sch.state.replace(
                sch.state.get_sref(root), rewritten.body.block, {root: rewritten.body.block}
            )
        return True

    def _rewrite(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` with its chosen chains offloaded; CandidateRejected if one cannot be."""
        return rewrite_function(func, self.offloaded(func))

    def offloaded(self, func: tirx.PrimFunc) -> list[tuple[Match, Intrinsic]]:
        """The chains of ``func`` to offload, each with its intrinsic; CandidateRejected if a
        chain chosen for offload cannot be."""
        if not is_s_tir(func):
            return []
        # Step 1. What the rule chose, and what the matcher finds now.
        choices = block_choices(func)
        if choices and "offload" not in choices.values():
            return []  # every chain was left to TVM: nothing to match
        found = plan(func, backends=self.backends, registry=self.registry)
        chosen = {b for b, choice in choices.items() if choice == "offload"}
        # Step 2. Each match is offloaded if chosen (or, unmarked, if it has an intrinsic).
        planned = []
        for match in found.choices:
            marks = {choices.get(b) for b in match.blocks} - {None}
            if "native" in marks and "offload" not in marks:
                continue
            if match.intrinsic is None:
                if marks:
                    raise CandidateRejected(
                        f"blocks {', '.join(match.blocks)} were chosen for offload but no "
                        f"intrinsic serves them: {match.reason}"
                    )
                continue
            planned.append((match.match, self.registry[match.intrinsic]))
        # Step 3. A chosen block the matcher no longer covers: the candidate is scrambled.
        covered = {b for match, _ in planned for b in match.blocks}
        lost = sorted(chosen - covered)
        if lost:
            why = [r.reason for r in found.rejections if set(r.blocks) & set(lost)]
            detail = why[0] if why else "they no longer form a chain with the same blocks"
            raise CandidateRejected(
                f"blocks {', '.join(lost)} were chosen for offload but do not match any more: "
                f"{detail}"
            )
        return planned

    def clone(self) -> OffloadPostproc:
        return OffloadPostproc(self.backends, self.registry, self.rejections)
