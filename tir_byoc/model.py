"""One call from a model to something you can run: lower, offload, schedule the rest, build.

Entry point: :func:`build_model`, which returns a :class:`~tir_byoc.built_model.Model`.  It takes

- a torch ``nn.Module`` with example inputs: ``torch.export`` under ``no_grad``, then
  ``from_exported_program`` (:mod:`tir_byoc.frontend`, which also reports the known frontend
  problems in one line saying what to change);
- a Relax ``IRModule``: the stages of :mod:`tir_byoc.relax.pipeline`, in their order (the
  lowering, :func:`tir_byoc.offload`, dead code eliminated, the default schedule, TVM's
  Relax build pipeline);
- a TIR ``IRModule`` or a ``PrimFunc``: :func:`tir_byoc.offload`.

What tir_byoc leaves to TVM gets the default CPU schedule of :mod:`tir_byoc.schedules`
(dlight's CPU rules, then rules for the elementwise, gather and reduction blocks they leave),
function by function: the model's ``unscheduled`` and ``serial_blocks`` say which functions
and blocks still run on one thread as TVM wrote them, and why; a function a rule fails on keeps
its loops and is recorded in its ``dlight_failures``.  Relax modules then go
through TVM's Relax build pipeline here rather than inside ``tvm.compile``, so that
the model's ``module`` is the module the executable runs, call for call.

A :class:`~tir_byoc.built_model.Model` is called with NumPy arrays or torch tensors and returns
the same kind, exports itself as a shared library and profiles itself per PrimFunc
(:mod:`tir_byoc.built_model`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import tvm
from tvm import relax, tirx
from tvm.target import codegen

from . import dynamic as dynamic_dims
from . import frontend, meta_schedule
from .built_model import Model, TirSignature
from .meta_schedule import sizes as by_size
from .meta_schedule.tune import check_budget
from .offload import OffloadReport, offload_reported
from .relax import conv_choice, pipeline


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
    dynamic_shapes=None,
    dynamic: dict | None = None,
    tune_sizes: list[dict[str, int]] | None = None,
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
        variant measured packed; transposes are not folded on this path.  A build with
        symbolic dims is tuned at ``tune_sizes`` instead.
    work_dir : str or os.PathLike
        With ``tune_trials``: MetaSchedule's database, logs and report.  With
        ``tune_trials=0``: the work_dir of an earlier tuning of this model, whose best records
        are built without a new trial (tune once, build many times).
    tune_options : dict, optional
        With ``tune_trials``: more options of :func:`tir_byoc.meta_schedule.tune_tir`.
    dynamic_shapes : dict or tuple, optional
        For a torch model: its dynamic dims as ``torch.export`` takes them
        (``{"input_ids": {0: torch.export.Dim("batch", max=64)}}``); the build then runs at
        every size within the bounds ([dynamic shapes](docs/model-flow.md#dynamic-shapes)).
    dynamic : dict, optional
        The same in short: ``{"input_ids": {0: "batch", 1: "seq"}}`` (input by name or
        position, axis to a dim's name, ``(name, min, max)`` or a ``Dim``); a name used on
        several inputs is one dim.  A Relax or TIR module's own symbolic dims need neither.
    tune_sizes : list of dict, optional
        Required to tune a build with symbolic dims (``tune_trials`` or ``work_dir``), refused
        otherwise: the sizes to tune at, each a dict giving every dim of the entry (by name, as
        :attr:`Model.dynamic_dims` lists them) an int within its bounds, such as
        ``[{"batch": 1, "seq": 128}, {"batch": 4, "seq": 32}]``.  The library calls stay
        symbolic and are not tuned; every other PrimFunc with symbolic extents is tuned as a
        static copy per size, all in one MetaSchedule run, then runs each tuned copy where its
        dims take that size's values and the default rules' symbolic schedule at every other
        size; static PrimFuncs are tuned once as usual
        (:mod:`tir_byoc.meta_schedule.sizes`; ``model.rules`` says what runs at which size).

    Returns
    -------
    Model

    Raises
    ------
    ValueError
        Input of the wrong kind, missing example inputs, a torch model in training mode, a
        target that is not llvm, ``tune_trials`` without ``work_dir``, ``tune_trials=0`` with
        a ``work_dir`` that holds no database, a tuned build with symbolic dims without
        ``tune_sizes``, or ``tune_sizes`` that do not give each dim an int within its bounds.
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
        inputs = frontend.example_tuple(example_inputs)
        spec = dynamic_dims.export_spec(model, inputs, dynamic_shapes, dynamic)
        mod, output_spec = frontend.import_torch(model, inputs, spec)
    elif dynamic_shapes is not None or dynamic is not None:
        raise ValueError(
            "tir_byoc.build_model: dynamic_shapes= and dynamic= are for a torch model, got "
            f"them with a {type(model).__name__} (a module's own symbolic dims are used)"
        )
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
    source = mod  # before the lowering: what Model.declines explains
    entry = _entry(mod, relax.Function if is_relax else tirx.PrimFunc, entry)
    # Step 2. The pipeline's stages in order (tir_byoc.relax.pipeline): the lowering (Relax),
    # the offload or tuning, dead code eliminated (Relax: the weight copies folded away).  A
    # tuned build with symbolic dims is lowered and offloaded as the untuned one, then tuned
    # by size (tir_byoc.meta_schedule.sizes).
    tuned = tune_trials != 0 or work_dir is not None
    sizes = by_size.checked_sizes(mod[entry], tune_sizes, tuned)
    if is_relax:
        with conv_choice.backends_in_scope(backends):  # which convolutions stay whole
            mod = pipeline.lower(mod, library=offload or (tuned and sizes is None))
    signature = TirSignature.of(mod[entry]) if not is_relax else None
    dispatch, decided = None, OffloadReport()
    if tuned and sizes is None:
        mod, decided = _tune(
            mod, resolved, is_relax, tune_trials, work_dir, offload, backends, tune_options
        )
    elif offload:
        mod, decided = offload_reported(mod, backends=backends)
    if is_relax:
        mod = pipeline.after_offload(mod)
    if sizes is not None:
        options = _tune_options(offload, backends, tune_options)
        dispatch = by_size.tune_by_size(
            mod, entry, sizes, resolved, str(work_dir), tune_trials, **options
        )
        mod = dispatch.module
    # Step 3. The default CPU schedule for the rest, function by function.
    report = pipeline.schedule(mod, resolved)
    if dispatch is not None:  # which functions stayed symbolic, and why
        report = dispatch.reported(report)
    mod = report.module
    # Step 4. The Relax build pipeline (as tvm.compile would run it), then the build.
    if is_relax:
        # The entry checks its symbolic dims' bounds itself, for a VM that loads it raw.
        mod = dynamic_dims.with_bounds_check(mod, entry)
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
        source=source,
        offload_report=decided,
    )


def _check_tuning(trials, work_dir, options) -> None:
    """A one-line ``ValueError`` for a tuning budget or work_dir ``build_model`` cannot use."""
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 0:
        raise ValueError(
            f"tir_byoc.build_model: expected tune_trials to be an int >= 0, got {trials!r}"
        )
    if work_dir is not None and trials == 0:
        database = (options or {}).get("database", "json")
        check_budget(0, work_dir, database, "tune_trials", "tir_byoc.build_model")
    if trials and work_dir is None:
        raise ValueError(
            f"tir_byoc.build_model: expected work_dir= (MetaSchedule's database) with "
            f"tune_trials={trials}, got none"
        )


def _tune_options(offload, backends, options) -> dict:
    """The options of a tuning run, from ``build_model``'s."""
    options = {"progress": True, **(options or {})}
    options.setdefault("offload", "choice" if offload else "never")
    if backends is not None:
        options.setdefault("backends", backends)
    return options


def _tune(mod, target, is_relax, trials, work_dir, offload, backends, options):
    """MetaSchedule on every PrimFunc, offloaded or native variant per chain, as measured:
    ``(module, OffloadReport)``."""
    options = _tune_options(offload, backends, options)
    if is_relax:
        return meta_schedule.tune_relax_reported(mod, target, str(work_dir), trials, **options)
    return meta_schedule.tune_tir(mod, target, str(work_dir), trials, **options), OffloadReport()


__all__ = ["build_model", "host_target"]
