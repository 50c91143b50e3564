"""A built model: call it, export it, profile it.  Made by :func:`tir_byoc.build_model`.

Entry point: :class:`Model`.  It is called with NumPy arrays or torch tensors and returns the
same kind (a torch model's outputs in the structure the model returns), from any number of
threads at once (each runs a Relax VM of its own), exports with :meth:`Model.export_library`
(the intrinsic code linked in, so the library loads in any process with TVM), and profiles
itself per PrimFunc with :meth:`Model.profile` (:func:`profile`).  Its attributes say how each
PrimFunc runs: :attr:`Model.schedules` (:data:`OFFLOADED`, :data:`DLIGHT` or
:data:`UNSCHEDULED`), :attr:`Model.unscheduled` and :attr:`Model.serial_blocks` (which
functions and blocks still run on one thread as TVM wrote them, and why).
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from . import dynamic, frontend, profiling, schedules
from .export import export_library
from .profiling import DLIGHT, OFFLOADED, UNSCHEDULED, Profile
from .rewrite import intrinsic_calls
from .tensors import from_tvm, kept_outputs, to_tvm

_VM_CREATION = threading.Lock()


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
    declines : tuple of Decline
        Each site tir_byoc left as it was, and why (computed when first read).
    pairs : tuple of str
        Each 1 x 1 + depthwise convolution pair fused into one oneDNN call when the model was
        built (:mod:`tir_byoc.conv_pairs`), e.g. ``main: lv12 -> lv13 -> fused_conv2d1_pair``.
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
        source: tvm.IRModule | None = None,
        offload_report=None,
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
        later = {n: _why_unseen(n, module[n]) for n in calls if n not in seen}
        self.unscheduled = MappingProxyType({**report.unscheduled, **later})
        self.schedules = MappingProxyType(
            {
                name: OFFLOADED if c else DLIGHT if name in report.rules else UNSCHEDULED
                for name, c in calls.items()
            }
        )
        self._output_spec = output_spec
        self._source = source  # what build_model lowered, for declines
        # What the offload decided when it built the model (timed, so not re-derived).
        self._build_declines = offload_report.declines if offload_report else ()
        self.pairs = offload_report.paired if offload_report else ()
        self._tir_signature = tir_signature
        self._per_thread = threading.local()  # each calling thread's Relax VM and entry
        self._expected: dict[int, tuple] = {}  # _expected_inputs, by the number given
        # Outputs that may share memory with what the model keeps (copied for torch).
        self._kept_outputs = kept_outputs(module[entry]) if tir_signature is None else frozenset()

    @functools.cached_property
    def declines(self) -> tuple:
        """Every site tir_byoc left as it was in the model, and why: :func:`tir_byoc.explain` of
        the module :func:`build_model` lowered (the Relax rewrites' declines, such as a
        convolution whose batch is symbolic, then the matcher's; none if it was not kept), then
        what the offload declined as it built the model, by timing or by the weights' values:
        each convolution pair not fused, each weight left plain."""
        if self._source is None:
            return self._build_declines
        from .explanation import explain

        return (*explain(self._source), *self._build_declines)

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
        if len(inputs) != len(expected.inputs):
            raise ValueError(
                f"tir_byoc.Model: {self.entry} expected {len(expected.inputs)} inputs "
                f"({', '.join(item.name for item in expected.inputs)}), got {len(inputs)}"
            )
        written = () if self.is_relax else self._tir_signature.written
        tensors = [
            to_tvm(value, i, copy=item.name in written)
            for i, (value, item) in enumerate(zip(inputs, expected.inputs, strict=True))
        ]
        expected.check([(tuple(t.shape), str(t.dtype)) for t in tensors])
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

    def _expected_inputs(self, given: int) -> dynamic.Signature:
        """Each input a call of ``given`` inputs takes (name, dims, dtype), and the bounds of
        the symbolic dims; read from the entry once per count (reading the IR costs more than
        the rest of a small call)."""
        expected = self._expected.get(given)
        if expected is not None:
            return expected
        func = self.module[self.entry]
        if self.is_relax:
            items = tuple(
                dynamic.Input(p.name, _relax_dims(p.ty), str(p.ty.dtype)) for p in func.params
            )
        else:
            signature = self._tir_signature
            items = tuple(
                dynamic.Input(p.name, tuple(_dim(e) for e in p.ty.shape), str(p.ty.dtype))
                for p in func.params
                if given == len(signature.params) or p.name not in signature.written
            )
        expected = self._expected[given] = dynamic.Signature(items, dynamic.bounds_of(func))
        return expected

    @property
    def dynamic_dims(self) -> dict[str, tuple[int, int | None]]:
        """Each symbolic dim of the inputs, by name, with its (lower, upper) bound (None: no
        upper bound); empty for a model built at one shape."""
        func = self.module[self.entry]
        return self._expected_inputs(len(func.params)).dims

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

    def profile(self, *inputs, repeat: int = 20, warmup: int = 10) -> Profile:
        """Time each PrimFunc the entry calls; see :func:`profile`."""
        if repeat < 1 or warmup < 0:
            raise ValueError(
                f"tir_byoc.profile: expected repeat >= 1, warmup >= 0, got {repeat}, {warmup}"
            )
        return profiling.time_calls(self, self.arguments(inputs), repeat, warmup)


def profile(model: Model, *inputs, repeat: int = 20, warmup: int = 10) -> Profile:
    """Time each PrimFunc one run of ``model`` calls, and count its calls
    (:mod:`tir_byoc.profiling` says how).

    Parameters
    ----------
    model : Model
        What :func:`tir_byoc.build_model` returned.
    *inputs : numpy.ndarray or torch.Tensor
        The inputs, as for calling the model.
    repeat : int
        Runs measured (each with and without the instrument); figures are their medians.
    warmup : int
        Runs before measuring, not counted.

    Returns
    -------
    Profile
    """
    if not isinstance(model, Model):
        raise ValueError(
            f"tir_byoc.profile: expected a tir_byoc.Model (from build_model), got "
            f"{type(model).__name__}"
        )
    return model.profile(*inputs, repeat=repeat, warmup=warmup)


def _why_unseen(name: str, func: tirx.PrimFunc) -> str:
    """Why a PrimFunc the default rules never saw runs as it does: TVM's Relax build pipeline
    writes it after they ran (``DispatchSortScan`` turns ``cumsum``, ``sort`` and ``topk`` into
    TOPI's functions, whose loops TOPI schedules itself)."""
    if name.startswith("shape_func"):
        return _SHAPE_FUNC
    if name == dynamic.CHECK_BOUNDS:
        return _CHECK_BOUNDS
    parallel = []
    tvm_ffi.structural_walk(
        func.body, (tirx.For, lambda loop: parallel.append(loop.kind == tirx.ForKind.PARALLEL))
    )
    how = "with its own parallel loops" if any(parallel) else "on one thread"
    return (
        "added by TVM's Relax build pipeline after the default rules ran (a scan or sort it "
        f"writes with TOPI): runs as TOPI wrote it, {how}"
    )


#: Why ``shape_func`` runs as TVM wrote it.
_SHAPE_FUNC = (
    "added by TVM's Relax build pipeline (VMShapeLower) for the symbolic dims: computes the "
    "shapes of a call's values from its inputs' dims, a few scalar operations a call, nothing "
    "to schedule"
)


#: Why the bounds check runs as written.
_CHECK_BOUNDS = (
    "added by tir_byoc for the symbolic dims (dynamic.with_bounds_check): asserts each within "
    "its bounds, a few comparisons a call, nothing to schedule"
)


def _static(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _dim(expr):
    """A dim as :class:`tir_byoc.dynamic.Input` holds it: an int, or the expression."""
    return int(expr.value) if isinstance(expr, tirx.IntImm) else expr


def _relax_dims(ty) -> tuple | None:
    shape = getattr(ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    return tuple(_dim(e) for e in shape.values)


__all__ = ["DLIGHT", "OFFLOADED", "UNSCHEDULED", "Model", "TirSignature", "profile"]
