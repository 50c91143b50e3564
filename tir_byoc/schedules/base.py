"""What the default rules of :mod:`tir_byoc.schedules` share: a dlight CPU rule that keeps
notes on what it leaves serial.

Entry point: :class:`NotingRule`.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target


class NotingRule(CPUScheduleRule):
    """A dlight CPU rule whose :attr:`notes` hold, after :meth:`apply`, the blocks it left on
    one thread or reducing a row serially, by name, with the reason.

    :meth:`apply` declines (``None``) a function for another target or not in dlight's normal
    form; otherwise it hands the schedule and the function's blocks (dlight ``SBlockInfo``) to
    :meth:`schedule`, which subclasses implement and which may decline too.
    """

    def __init__(self):
        self.notes: dict[str, str] = {}

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = normalize_prim_func(sch)
        if not blocks:
            return None
        self.notes = {}
        return self.schedule(sch, blocks, target)

    def schedule(self, sch: s_tir.Schedule, blocks, target: Target) -> s_tir.Schedule | None:
        raise NotImplementedError
