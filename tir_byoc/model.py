"""One call from a model to something you can run: lower, offload, schedule the rest, build.

Entry point: :func:`build_model`, which returns a :class:`Model`.  It takes

- a torch ``nn.Module`` with example inputs: ``torch.export`` under ``no_grad``, then
  ``from_exported_program`` (:mod:`tir_byoc.frontend`, which also reports the known frontend
  problems in one line saying what to change);
- a Relax ``IRModule``: the stages of :mod:`tir_byoc.relax.pipeline`, in their order (the
  lowering, :func:`tir_byoc.offload`, dead code eliminated, the default schedule, TVM's
  Relax build pipeline);
- a TIR ``IRModule`` or a ``PrimFunc``: :func:`tir_byoc.offload`.

What tir_byoc leaves to TVM gets the default CPU schedule of :mod:`tir_byoc.schedules`
(dlight's CPU rules, then rules for the elementwise, gather and reduction blocks they leave),
function by function: :attr:`Model.unscheduled` and :attr:`Model.serial_blocks` say which
functions and blocks still run on one thread as TVM wrote them, and why; a function a rule
fails on keeps its loops and is recorded in :attr:`Model.dlight_failures`.  Relax modules then go
through TVM's Relax build pipeline here rather than inside ``tvm.compile``, so that
:attr:`Model.module` is the module the executable runs, call for call.

A :class:`Model` is called with NumPy arrays or torch tensors and returns the same kind (a torch
model's outputs in the structure the model returns), exports with
:meth:`Model.export_library` (the intrinsic code linked in, so the library loads in any
process with TVM), and profiles itself per PrimFunc with :meth:`Model.profile`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.target import codegen

from . import frontend, schedules
from .export import export_library
from .offload import offload as offload_module
from .relax import pipeline
from .rewrite import intrinsic_calls
from .tensors import from_tvm, kept_outputs, to_tvm

logger = logging.getLogger("tir_byoc")

#: How a PrimFunc of a built model runs (:attr:`Model.schedules`): it calls an intrinsic, a
#: default rule scheduled it (dlight's or :mod:`tir_byoc.schedules`'), or it runs as TVM wrote it.
OFFLOADED, DLIGHT, UNSCHEDULED = "tir_byoc", "dlight", "unscheduled"

_VM_CREATION = threading.Lock()


def host_target() -> tvm.target.Target:
    """An llvm target for this machine's CPU: ``mcpu`` as LLVM names the host (``"rocketlake"``
    on an AVX-512 Xeon), so that TVM's code uses the host's vector width.  Plain ``"llvm"`` is
    generic x86-64: SSE2 only, while dlight and the default rules split loops for the host's
    width (16 float32 lanes with AVX-512)."""
    cpu, triple = codegen.llvm_get_system_cpu(), codegen.llvm_get_system_triple()
    if not cpu or cpu == "generic" or not codegen.llvm_is_valid_cpu(cpu, triple):
        return tvm.target.Target("llvm")
    return tvm.target.Target({"kind": "llvm", "mcpu": cpu})


def _target(target) -> tvm.target.Target:
    if target is None:
        return host_target()
    try:
        resolved = target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    except Exception as error:
        raise ValueError(
            f"tir_byoc.build_model: expected an llvm (CPU) target, got {target!r} "
            f"({frontend.first_line(error)})"
        ) from error
    if resolved.kind.name != "llvm":
        raise ValueError(
            f"tir_byoc.build_model: expected an llvm (CPU) target, got {resolved.kind.name}"
        )
    return resolved


def _kind(model) -> str:
    """``"torch"``, ``"relax"`` or ``"tir"``, or a one-line ``ValueError``."""
    if frontend.is_torch_module(model):
        return "torch"
    if isinstance(model, tirx.PrimFunc):
        return "tir"
    if isinstance(model, tvm.IRModule):
        functions = [f for _, f in model.functions_items()]
        if any(isinstance(f, relax.Function) for f in functions):
            return "relax"
        if functions and all(isinstance(f, tirx.PrimFunc) for f in functions):
            return "tir"
        raise ValueError(
            "tir_byoc.build_model: expected an IRModule with Relax functions or PrimFuncs, "
            f"got one with {len(functions)} function(s) of neither kind"
        )
    raise ValueError(
        "tir_byoc.build_model: expected a torch.nn.Module (with example_inputs), a Relax or "
        f"TIR tvm.IRModule, or a tvm.tirx.PrimFunc, got {type(model).__name__}"
    )


def _entry(mod: tvm.IRModule, function_type, entry: str | None) -> str:
    names = sorted(g.name_hint for g, f in mod.functions_items() if isinstance(f, function_type))
    if entry is None:
        entry = "main" if "main" in names else (names[0] if len(names) == 1 else None)
    if entry not in names:
        raise ValueError(
            f"tir_byoc.build_model: expected entry= naming one of {names}, got {entry!r}"
        )
    return entry


def build_model(
    model,
    example_inputs=None,
    *,
    target=None,
    backends: Iterable[str] | str | None = None,
    offload: bool = True,
    entry: str | None = None,
    tune_trials: int = 0,
    work_dir: str | os.PathLike | None = None,
    tune_options: dict | None = None,
) -> Model:
    """Lower, offload, schedule and build a model; the result runs with NumPy or torch inputs.

    Parameters
    ----------
    model : torch.nn.Module, tvm.IRModule or tvm.tirx.PrimFunc
        A torch model in eval mode, a Relax module (lowered or not) or a TIR module.
    example_inputs : torch.Tensor or tuple of torch.Tensor, optional
        What a torch model is exported with (required for one, refused for anything else).
    target : str, dict or tvm.target.Target, optional
        An llvm target.  Default: this machine's CPU (:func:`host_target`); a model built so
        and exported runs on CPUs with the same instruction set.  ``"llvm"`` builds for any
        x86-64 CPU, with SSE2 vectors.
    backends : str or iterable of str, optional
        As for :func:`tir_byoc.offload`.
    offload : bool
        ``False`` builds the same model without tir_byoc (for comparing).
    entry : str, optional
        The function to call (default: ``main``, or the module's only Relax function /
        PrimFunc).
    tune_trials : int
        ``0`` (default): no tuning; offload, then the default rules.  Otherwise MetaSchedule
        tunes every PrimFunc with this many trials in all, measuring offloaded and TVM
        variants of each chain (``offload="choice"`` of
        :func:`tir_byoc.meta_schedule.tune_relax`; ``"never"`` with ``offload=False``), and
        prints its progress on stderr.  Constant weights are packed, and the offloaded
        variant measured packed; transposes are not folded on this path.
    work_dir : str or os.PathLike
        With ``tune_trials``: MetaSchedule's database, logs and report.  With
        ``tune_trials=0``: the work_dir of an earlier tuning of this model, whose best records
        are built without a new trial (tune once, build many times).
    tune_options : dict, optional
        With ``tune_trials``: more options of :func:`tir_byoc.meta_schedule.tune_tir`.

    Returns
    -------
    Model

    Raises
    ------
    ValueError
        Input of the wrong kind, missing example inputs, a torch model in training mode, a
        target that is not llvm, ``tune_trials`` without ``work_dir``, ``tune_trials=0`` with
        a ``work_dir`` that holds no database.
    tir_byoc.frontend.UnsupportedModel
        A known frontend problem (a ``use_cache`` cache, sdpa attention torch cannot
        decompose, a boolean mask TVM cannot compile); the one-line message says what to
        change in the model.
    """
    # Step 1. What the model is; torch models become Relax here.
    kind = _kind(model)
    resolved = _target(target)
    _check_tuning(tune_trials, work_dir, tune_options)
    output_spec = None
    if kind == "torch":
        mod, output_spec = frontend.import_torch(model, example_inputs)
    elif example_inputs is not None:
        raise ValueError(
            "tir_byoc.build_model: example_inputs are only for a torch model, got them with "
            f"a {type(model).__name__}"
        )
    elif isinstance(model, tirx.PrimFunc):
        name = str((model.attrs or {}).get("global_symbol", "main"))
        mod = tvm.IRModule({name: model.with_attr("global_symbol", name)})
    else:
        mod = model
    is_relax = kind != "tir"
    entry = _entry(mod, relax.Function if is_relax else tirx.PrimFunc, entry)
    # Step 2. The pipeline's stages in order (tir_byoc.relax.pipeline): the lowering (Relax),
    # the offload or tuning, dead code eliminated (Relax: the weight copies folded away).
    tuned = tune_trials != 0 or work_dir is not None
    if is_relax:
        mod = pipeline.lower(mod)
    signature = TirSignature.of(mod[entry]) if not is_relax else None
    if tuned:
        mod = _tune(mod, resolved, is_relax, tune_trials, work_dir, offload, backends, tune_options)
    elif offload:
        mod = offload_module(mod, backends=backends)
    if is_relax:
        mod = pipeline.after_offload(mod)
    # Step 3. The default CPU schedule for the rest, function by function.
    report = pipeline.schedule(mod, resolved)
    mod = report.module
    # Step 4. The Relax build pipeline (as tvm.compile would run it), then the build.
    if is_relax:
        mod = pipeline.build(mod, resolved)
        executable = frontend.compile_module(mod, resolved, relax_pipeline=None)
    else:
        executable = frontend.compile_module(mod, resolved)
    return Model(
        executable,
        mod,
        resolved,
        entry,
        schedule_report=report,
        output_spec=output_spec,
        tir_signature=signature,
    )


def _check_tuning(trials, work_dir, options) -> None:
    """A one-line ``ValueError`` for a tuning budget or work_dir ``build_model`` cannot use."""
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        raise ValueError(
            f"tir_byoc.build_model: expected tune_trials to be an int >= 0, got {trials!r}"
        )
    if work_dir is not None and trials == 0:
        from .meta_schedule.tune import check_budget

        database = (options or {}).get("database", "json")
        check_budget(0, work_dir, database, "tune_trials", "tir_byoc.build_model")
    if trials and work_dir is None:
        raise ValueError(
            f"tir_byoc.build_model: expected work_dir= (MetaSchedule's database) with "
            f"tune_trials={trials}, got none"
        )


def _tune(mod, target, is_relax, trials, work_dir, offload, backends, options):
    """MetaSchedule on every PrimFunc, offloaded or native variant per chain, as measured."""
    from .meta_schedule import tune_relax, tune_tir

    options = {"progress": True, **(options or {})}
    options.setdefault("offload", "choice" if offload else "never")
    if backends is not None:
        options.setdefault("backends", backends)
    tune = tune_relax if is_relax else tune_tir
    return tune(mod, target, str(work_dir), trials, **options)


@dataclass(frozen=True)
class TirSignature:
    """A TIR entry's buffer parameters, by name, and those it writes (its outputs)."""

    params: tuple[str, ...]
    written: tuple[str, ...]

    @classmethod
    def of(cls, func: tirx.PrimFunc) -> TirSignature:
        for param in func.params:
            if not isinstance(param.ty, tirx.BufferType):
                raise ValueError(
                    "tir_byoc.build_model: expected only buffer parameters, got the scalar "
                    f"{param.name}"
                )
        targets = []
        tvm_ffi.structural_walk(
            func.body,
            [
                (s_tir.SBlock, lambda block: targets.extend(r.source for r in block.writes)),
                (tirx.BufferStore, lambda store: targets.append(store.buffer)),
            ],
        )
        written = [p.name for p in func.params if any(p.same_as(t) for t in targets)]
        return cls(tuple(p.name for p in func.params), tuple(written))


class Model:
    """A built model: call it, export it, profile it.  Made by :func:`build_model`.

    Attributes
    ----------
    executable : tvm.runtime.Executable
        What ``tvm.compile`` returned.
    module : tvm.IRModule
        The module it was built from (for Relax, after TVM's Relax build pipeline: ``R.call_tir``
        has become direct calls of the PrimFuncs).
    target : tvm.target.Target
    entry : str
        The function :meth:`__call__` runs.
    schedules : Mapping[str, str]
        Each PrimFunc's way of running: :data:`OFFLOADED` (it calls an intrinsic),
        :data:`DLIGHT` or :data:`UNSCHEDULED`.
    intrinsics : Mapping[str, tuple of str]
        The intrinsics each offloaded PrimFunc calls.
    rules : Mapping[str, str]
        PrimFuncs a default rule scheduled, with the rule (``"Reduction"``, ``"Elementwise"``...).
    unscheduled : Mapping[str, str]
        PrimFuncs that call no intrinsic and run as TVM wrote them, with the reason; among them
        those TVM's Relax build pipeline adds after the default rules ran (``cumsum``).
    serial_blocks : Mapping[str, Mapping[str, str]]
        Per PrimFunc, the blocks that run on one thread, or reduce a row serially, with the
        reason.
    dlight_failures : Mapping[str, str]
        PrimFuncs a rule raised on, with the error's first line.
    """

    def __init__(
        self,
        executable,
        module: tvm.IRModule,
        target: tvm.target.Target,
        entry: str,
        *,
        schedule_report: schedules.ScheduleReport | None = None,
        output_spec=None,
        tir_signature=None,
    ):
        self.executable = executable
        self.module = module
        self.target = target
        self.entry = entry
        report = schedule_report or schedules.ScheduleReport(module)
        self.rules = report.rules
        self.serial_blocks = report.serial_blocks
        self.dlight_failures = report.failures
        calls = {
            g.name_hint: intrinsic_calls(f)
            for g, f in module.functions_items()
            if isinstance(f, tirx.PrimFunc)
        }
        self.intrinsics = MappingProxyType({n: tuple(sorted(c)) for n, c in calls.items() if c})
        seen = set(report.rules) | set(report.unscheduled) | set(self.intrinsics)
        later = {n: _why_unseen(module[n]) for n in calls if n not in seen}
        self.unscheduled = MappingProxyType({**report.unscheduled, **later})
        self.schedules = MappingProxyType(
            {
                name: OFFLOADED if c else DLIGHT if name in report.rules else UNSCHEDULED
                for name, c in calls.items()
            }
        )
        self._output_spec = output_spec
        self._tir_signature = tir_signature
        self._per_thread = threading.local()  # each calling thread's Relax VM and entry
        self._expected: dict[int, tuple] = {}  # _expected_inputs, by the number given
        # Outputs that may share memory with what the model keeps (copied for torch).
        self._kept_outputs = kept_outputs(module[entry]) if tir_signature is None else frozenset()

    @property
    def is_relax(self) -> bool:
        return self._tir_signature is None

    def __repr__(self) -> str:
        ways = list(self.schedules.values())
        counts = {k: ways.count(k) for k in (OFFLOADED, DLIGHT, UNSCHEDULED)}
        return (
            f"<tir_byoc.Model {self.entry} on {self.target.kind.name}: "
            f"{len(self.schedules)} PrimFuncs, "
            + ", ".join(f"{n} {k}" for k, n in counts.items())
            + ">"
        )

    # -- running ---------------------------------------------------------------------------

    def vm(self) -> relax.VirtualMachine:
        """The calling thread's Relax VM (created on its first call).

        A Relax VM keeps the registers of the call it is running, so two threads calling one
        VM overwrite each other's values.  Each thread gets its own VM over the shared
        executable instead: the compiled code, the constants and packed weights are shared,
        only the registers (and the storage each VM allocates) are per thread.
        """
        if not self.is_relax:
            raise ValueError("tir_byoc.Model: expected a Relax model for vm(), got a TIR one")
        vm = getattr(self._per_thread, "vm", None)
        if vm is None:
            with _VM_CREATION:  # loading (and jitting) an executable once at a time
                vm = relax.VirtualMachine(self.executable, tvm.cpu())
            self._per_thread.vm = vm
        return vm

    def arguments(self, inputs) -> list:
        """``inputs`` (NumPy arrays or torch tensors) as TVM tensors, checked against the entry.

        Torch tensors and NumPy arrays are passed without a copy where TVM can read them as
        they lie (:mod:`tir_byoc.tensors`).  A TIR model takes every buffer parameter, or only
        those its entry does not write: the others are then allocated, zero-filled.  Either
        way :meth:`__call__` returns the written ones, in memory of their own: a buffer the
        entry writes is always copied from what the caller gave.
        """
        expected = self._expected_inputs(len(inputs))
        if len(inputs) != len(expected):
            raise ValueError(
                f"tir_byoc.Model: {self.entry} expected {len(expected)} inputs "
                f"({', '.join(name for name, _, _ in expected)}), got {len(inputs)}"
            )
        written = () if self.is_relax else self._tir_signature.written
        tensors = [
            to_tvm(value, i, copy=name in written)
            for i, (value, (name, _, _)) in enumerate(zip(inputs, expected, strict=True))
        ]
        for i, (tensor, (name, shape, dtype)) in enumerate(zip(tensors, expected, strict=True)):
            if not _conforms(tuple(tensor.shape), str(tensor.dtype), shape, dtype):
                raise ValueError(
                    f"tir_byoc.Model: input {i} ({name}) expected shape {_shape_text(shape)} "
                    f"{dtype}, got {tuple(tensor.shape)} {tensor.dtype}"
                )
        if not self.is_relax and len(tensors) < len(self._tir_signature.params):
            tensors = self._with_outputs(tensors)
        return tensors

    def run(self, tensors):
        """Run the entry on TVM tensors (from :meth:`arguments`); returns what TVM returns."""
        if self.is_relax:
            entry = getattr(self._per_thread, "entry", None)
            if entry is None:
                entry = self._per_thread.entry = self.vm()[self.entry]
            return entry(*tensors)
        self.executable[self.entry](*tensors)
        signature = self._tir_signature
        outputs = tuple(tensors[signature.params.index(name)] for name in signature.written)
        return outputs[0] if len(outputs) == 1 else outputs

    def __call__(self, *inputs):
        """Run the model; outputs are NumPy arrays, or torch tensors if any input was one.

        Torch outputs share the memory TVM wrote them to (DLPack, no copy), except those that
        may share memory the model keeps (a constant it returns), which are copied.  Calls from
        several threads at once are safe: each thread runs its own VM.
        """
        as_torch = any(frontend.is_torch_tensor(x) for x in inputs)
        result = self.run(self.arguments(inputs))
        return self._structured(from_tvm(result, as_torch, self._kept_outputs))

    def _structured(self, result):
        if self._output_spec is None:
            return result
        from torch.utils import _pytree

        leaves = list(result) if isinstance(result, tuple) else [result]
        if len(leaves) != self._output_spec.num_leaves:
            return result
        return _pytree.tree_unflatten(leaves, self._output_spec)

    def _expected_inputs(self, given: int) -> tuple[tuple[str, tuple, str], ...]:
        """(name, shape, dtype) of each input a call of ``given`` inputs takes; read from the
        entry once per count (reading the IR costs more than the rest of a small call)."""
        expected = self._expected.get(given)
        if expected is not None:
            return expected
        func = self.module[self.entry]
        if self.is_relax:
            expected = tuple((p.name, _relax_shape(p.ty), str(p.ty.dtype)) for p in func.params)
        else:
            signature = self._tir_signature
            expected = tuple(
                (p.name, tuple(_static(e) for e in p.ty.shape), str(p.ty.dtype))
                for p in func.params
                if given == len(signature.params) or p.name not in signature.written
            )
        self._expected[given] = expected
        return expected

    def _with_outputs(self, tensors):
        signature = self._tir_signature
        given = iter(tensors)
        full = []
        for param in self.module[self.entry].params:
            if param.name not in signature.written:
                full.append(next(given))
                continue
            shape = tuple(_static(e) for e in param.ty.shape)
            if None in shape:
                raise ValueError(
                    f"tir_byoc.Model: output {param.name} has a symbolic shape; expected "
                    f"every buffer ({', '.join(signature.params)}) to be given"
                )
            full.append(tvm.runtime.tensor(np.zeros(shape, str(param.ty.dtype)), tvm.cpu()))
        return full

    # -- exporting and profiling -------------------------------------------------------------

    def export_library(self, path: str | os.PathLike) -> Path:
        """Write the built model as a shared library with its intrinsic code linked in.

        It loads with ``tvm.runtime.load_module(path)`` in a process that never imports
        tir_byoc (a Relax model then runs on ``relax.VirtualMachine(lib, tvm.cpu())``).
        """
        return export_library(self.executable, path)

    def profile(self, *inputs, repeat: int = 20, warmup: int = 10):
        """Time each PrimFunc the entry calls; see :func:`tir_byoc.profile`."""
        from .profiling import profile

        return profile(self, *inputs, repeat=repeat, warmup=warmup)


def _why_unseen(func: tirx.PrimFunc) -> str:
    """Why a PrimFunc the default rules never saw runs as it does: TVM's Relax build pipeline
    writes it after they ran (``DispatchSortScan`` turns ``cumsum``, ``sort`` and ``topk`` into
    TOPI's functions, whose loops TOPI schedules itself)."""
    parallel = []
    tvm_ffi.structural_walk(
        func.body, (tirx.For, lambda loop: parallel.append(loop.kind == tirx.ForKind.PARALLEL))
    )
    how = "with its own parallel loops" if any(parallel) else "on one thread"
    return (
        "added by TVM's Relax build pipeline after the default rules ran (a scan or sort it "
        f"writes with TOPI): runs as TOPI wrote it, {how}"
    )


def _static(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _relax_shape(ty) -> tuple | None:
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    return tuple(_static(e) for e in shape.values)


def _shape_text(shape) -> str:
    if shape is None:
        return "(any)"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _conforms(shape: tuple, dtype: str, expected_shape, expected_dtype: str) -> bool:
    if dtype != expected_dtype:
        return False
    if expected_shape is None:
        return True
    return len(shape) == len(expected_shape) and all(
        d is None or d == n for d, n in zip(expected_shape, shape, strict=True)
    )


__all__ = [
    "DLIGHT",
    "OFFLOADED",
    "UNSCHEDULED",
    "Model",
    "build_model",
]
