"""The plan: what each PrimFunc of a module matches, and which intrinsic serves each match.

Entry point: :func:`plan`.  It scans every PrimFunc once (:func:`tir_byoc.match.scan_function`)
and chooses an intrinsic per match (:func:`tir_byoc.registry.choose`); the results are a
:class:`Plan`.  Everything else is a view of one: :func:`tir_byoc.scan` lists its choices,
:func:`tir_byoc.explain` its rejections, :func:`tir_byoc.offload` rewrites what it chose, and
the command line and the MetaSchedule rule and postproc read plans too, so no call scans a
function twice.

A plan is a view: it never rewrites the module it is given.  The one rewrite that needs plans
before the offload, the fold of weight copies in a Relax module
(:mod:`tir_byoc.relax.weight_copies`), is run by :func:`tir_byoc.offload.offload_plan` with a
:class:`Planner`'s :meth:`~Planner.plan_function`, and the module it leaves is then planned by
the same :class:`Planner`, so that no function is scanned twice.

Who calls whom: ``plan`` -> ``match.scan_function`` (the matcher), ``registry.choose`` (the
choice), ``toolchain.unavailable`` (whether a backend can be built).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import tvm
from tvm import tirx

from . import toolchain
from .decline import GEMM_CHAIN, Decline
from .match import FunctionScan, Match, scan_function
from .patterns import GEMM_ENTRY
from .registry import REGISTRY, Choice, Intrinsic, Registry, backend_order, choose


@dataclass(frozen=True)
class FunctionPlan:
    """One PrimFunc: its scan and the choice for each of its matches.

    The choices are made when first read: a view that needs only the scan (``explain``)
    neither resolves the backend order nor asks which backends are available.
    """

    gvar: tvm.ir.GlobalVar
    func: tirx.PrimFunc
    scan: FunctionScan
    choose: Callable[[], tuple[Choice, ...]] = field(repr=False, compare=False)

    @functools.cached_property
    def choices(self) -> tuple[Choice, ...]:
        return self.choose()


@dataclass(frozen=True)
class Plan:
    """What a module's PrimFuncs match and which intrinsics serve them.

    Attributes
    ----------
    module : tvm.IRModule
        The module planned, as it was given (a PrimFunc wrapped into a module).
    functions : tuple of FunctionPlan
        One per PrimFunc, in module order.
    registry : Registry
        Where the chosen intrinsics are registered.
    wrapped : bool
        The input was a single PrimFunc (wrapped into ``module``).
    declines : tuple of Decline
        What a rewrite run before planning declined: the weight copies that
        :func:`tir_byoc.offload.offload_plan` did not fold (kind
        :data:`~tir_byoc.decline.WEIGHT_COPY`).
    """

    module: tvm.IRModule
    functions: tuple[FunctionPlan, ...]
    registry: Registry
    wrapped: bool = False
    declines: tuple[Decline, ...] = ()

    @property
    def choices(self) -> list[Choice]:
        return [c for f in self.functions for c in f.choices]

    @property
    def rejections(self) -> list[Decline]:
        """The matcher's refusals, the ends of chains no intrinsic takes whole, then
        :attr:`declines`, each a :class:`~tir_byoc.decline.Decline` with its reason.

        Only a function with an epilogue beyond bias and relu asks for its choices, so
        explaining a module of bias and relu chains resolves no backend (a choice's
        :attr:`~tir_byoc.registry.Choice.reason` says why one of those was cut).
        """
        refused = [r for f in self.functions for r in f.scan.rejections]
        for function in self.functions:
            if any(m.shorter and m.pattern_entry == GEMM_ENTRY for m in function.scan.matches):
                refused += [cut_rejection(c) for c in function.choices if c.cut_from is not None]
        return refused + list(self.declines)

    def offloaded(self, function: FunctionPlan) -> Iterator[tuple[Match, Intrinsic]]:
        """The matches of ``function`` that have an intrinsic, with that intrinsic."""
        for choice in function.choices:
            if choice.intrinsic is not None:
                yield choice.match, self.registry[choice.intrinsic]

    @property
    def backends(self) -> set[str]:
        """The backends whose intrinsics the plan chose."""
        return {self.registry[c.intrinsic].backend for c in self.choices if c.intrinsic}


def cut_rejection(choice: Choice) -> Decline:
    """The blocks of a chain that stay TVM code because no intrinsic takes the whole chain."""
    whole, served = choice.cut_from, choice.match
    left = tuple(b for b in whole.blocks if b not in served.blocks)
    reason = (
        f"no intrinsic takes {whole.pattern} whole ({choice.reason}), so {choice.intrinsic} "
        f"serves its prefix {served.pattern} and these blocks stay TVM code"
    )
    return Decline(whole.func, left, GEMM_CHAIN, reason, whole.pattern)


def as_module(mod_or_func) -> tuple[tvm.IRModule, bool]:
    """``(module, wrapped)``: a PrimFunc is wrapped into a module named after its symbol."""
    if isinstance(mod_or_func, tirx.PrimFunc):
        attrs = mod_or_func.attrs
        name = attrs["global_symbol"] if attrs and "global_symbol" in attrs else "main"
        return tvm.IRModule({str(name): mod_or_func}), True
    if isinstance(mod_or_func, tvm.IRModule):
        return mod_or_func, False
    raise TypeError(
        f"tir_byoc: expected a tvm.IRModule or a tvm.tirx.PrimFunc, "
        f"got {type(mod_or_func).__name__}"
    )


class Planner:
    """Scans each (name, function) once and chooses intrinsics for its matches.

    One planner serves every plan of one call, so that a function planned twice (a callee the
    fold of weight copies judged, then the module it left) is scanned once.
    """

    def __init__(self, backends, registry: Registry):
        self.registry = registry
        self.backends = backends
        self._scans: dict[tuple[str, tirx.PrimFunc], FunctionScan] = {}
        self._choices: dict[tuple[str, tirx.PrimFunc], tuple[Choice, ...]] = {}

    @functools.cached_property
    def order(self) -> tuple[str, ...] | None:
        return backend_order(self.backends, self.registry)

    def _unavailable(self, backend: str) -> str | None:
        return toolchain.unavailable(backend, self.registry)

    def _choose(self, key) -> tuple[Choice, ...]:
        if key not in self._choices:
            self._choices[key] = tuple(
                choose(m, self.registry, self._unavailable, self.order)
                for m in self._scans[key].matches
            )
        return self._choices[key]

    def function(self, gvar: tvm.ir.GlobalVar, func: tirx.PrimFunc) -> FunctionPlan:
        key = (gvar.name_hint, func)
        if key not in self._scans:
            self._scans[key] = scan_function(gvar.name_hint, func)
        return FunctionPlan(gvar, func, self._scans[key], lambda: self._choose(key))

    def plan_function(self, name: str, func: tirx.PrimFunc) -> FunctionPlan:
        """The plan of the PrimFunc ``func`` named ``name`` (what the fold of weight copies
        judges a rewritten callee by)."""
        return self.function(tvm.ir.GlobalVar(name), func)

    def plan(self, mod: tvm.IRModule, wrapped: bool = False, declines: tuple = ()) -> Plan:
        """The plan of every PrimFunc of ``mod``, in module order."""
        functions = tuple(
            self.function(gvar, func)
            for gvar, func in mod.functions_items()
            if isinstance(func, tirx.PrimFunc)
        )
        return Plan(mod, functions, self.registry, wrapped, tuple(declines))


def plan(
    mod_or_func,
    *,
    backends: Iterable[str] | str | None = None,
    registry: Registry = REGISTRY,
) -> Plan:
    """Scan every PrimFunc of ``mod_or_func`` once and choose an intrinsic per match.

    Parameters
    ----------
    mod_or_func : tvm.IRModule or tvm.tirx.PrimFunc
        TIR or Relax module, or one PrimFunc.  Not modified, and planned as it is: the
        plan of what :func:`tir_byoc.offload` rewrites in a Relax module, after it folds the
        weight copies, is :func:`tir_byoc.offload.offload_plan`'s.
    backends : str or iterable of str, optional
        Backends allowed, most preferred first (default: ``$TIR_BYOC_BACKENDS``, else all by
        intrinsic priority).
    registry : Registry, optional
        Where intrinsics are looked up.

    Returns
    -------
    Plan
    """
    mod, wrapped = as_module(mod_or_func)
    return Planner(backends, registry).plan(mod, wrapped)


__all__ = ["Choice", "FunctionPlan", "Plan", "Planner", "as_module", "plan"]
