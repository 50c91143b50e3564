"""Everything a user could pick instead of tir_byoc (and tir_byoc itself), in one table.

Entry point: :data:`IMPLEMENTATIONS`, name -> :class:`Implementation`: how to time it on a
layer workload and on the seed MLP (either may be absent), which dtypes it runs, what it is
compared with.  ``run.py`` checks ``--only`` against it, runs from it and reports from it.
Each measure function returns ``(milliseconds or None, note)`` and runs in a child process of
its own (see ``run.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from direct import MLP_LAYERS, RESULTS, layer_spec, measure_direct
from timing import slow_note, time_python, time_tvm
from workloads import DTYPES, Workload, arrays, ir_module, target


@dataclass(frozen=True)
class Settings:
    """The command-line options measure functions read."""

    budget: float
    trials: int
    ms_max_gflop: float
    ms_batch: bool = False  # tune the batch forms too


Measured = tuple[float | None, str]


@dataclass(frozen=True)
class Implementation:
    """One implementation and how to time it.

    Parameters
    ----------
    name : str
        As ``--only`` takes it and the table shows it.
    layer : callable, optional
        ``layer(workload, dtype, settings) -> (ms, note)`` times one layer workload in one
        dtype (a key of ``DTYPES``); None: the implementation runs only the seed MLP.
    mlp : callable, optional
        ``mlp(settings) -> (ms, note)`` times the seed MLP; None: layers only.
    dtypes : tuple of str
        The layer dtypes it runs.
    skip : callable, optional
        ``skip(workload, settings) -> reason or None``: a layer it is not timed on.
    direct : str
        The implementation its "x direct" column divides by.
    tir_byoc : bool
        It runs through tir_byoc: not a peer in the "best peer / this" column, orange in the
        chart.
    """

    name: str
    layer: Callable[[Workload, str, Settings], Measured] | None = None
    mlp: Callable[[Settings], Measured] | None = None
    dtypes: tuple[str, ...] = ("fp32",)
    skip: Callable[[Workload, Settings], str | None] | None = None
    direct: str = "oneDNN direct (C)"
    tir_byoc: bool = False

    def __post_init__(self):
        if self.layer is None and self.mlp is None:
            raise ValueError(f"implementation {self.name!r}: expected a layer or mlp measure")
        unknown = set(self.dtypes) - set(DTYPES)
        if unknown:
            raise ValueError(
                f"implementation {self.name!r}: expected dtypes among {list(DTYPES)}, "
                f"got {sorted(unknown)}"
            )

    @property
    def kind(self) -> str:
        """``"layer"``, ``"mlp"`` or ``"both"``: what it is timed on."""
        return "both" if self.layer and self.mlp else "layer" if self.layer else "mlp"

    def measure_layer(self, workload: Workload, dtype: str, settings: Settings) -> Measured:
        reason = self.skip(workload, settings) if self.skip else None
        return (None, reason) if reason else self.layer(workload, dtype, settings)


# --------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------


def _time_compiled(mod, workload: Workload, signature: str, budget: float) -> float:
    """Compile ``mod`` (``main`` computes ``workload``) and time it on random arrays."""
    import tvm

    built = tvm.compile(mod, target=target())
    operands, out = arrays(workload, signature)
    args = [tvm.runtime.tensor(a) for a in (*operands, out)]
    return time_tvm(built.mod if hasattr(built, "mod") else built, "main", args, budget)


def layer_tir_byoc(backend: str, workload, dtype, settings) -> Measured:
    import tir_byoc
    from tir_byoc.offload import apply

    signature = DTYPES[dtype]
    planned = tir_byoc.plan(ir_module(workload, signature), backends=[backend])
    (choice,) = planned.choices
    if choice.intrinsic is None:
        return None, choice.reason
    ms = _time_compiled(apply(planned), workload, signature, settings.budget)
    note = choice.intrinsic if backend != "openblas" else f"{choice.intrinsic}; {_blas_note()}"
    return ms, note


def layer_tvm(schedule: str | None, workload, dtype, settings) -> Measured:
    """TVM alone: unscheduled, or with dlight's default CPU schedule (``"dlight"``)."""
    from tvm.s_tir import dlight

    signature = DTYPES[dtype]
    mod = ir_module(workload, signature)
    if schedule == "dlight":
        with target():
            mod = dlight.ApplyDefaultSchedule(dlight.cpu.GEMV(), dlight.cpu.Reduction())(mod)
    ms = _time_compiled(mod, workload, signature, min(settings.budget, 3.0))
    return ms, slow_note(ms)


def layer_metaschedule(workload, dtype, settings) -> Measured:
    """TVM tuned by MetaSchedule; the tuning is cached under ``results/metaschedule``."""
    from tvm.s_tir import meta_schedule as ms

    signature, trials = DTYPES[dtype], settings.trials
    mod = ir_module(workload, signature)
    batch = f"{workload.batch}x" if workload.batch else ""
    work_dir = (
        RESULTS
        / "metaschedule"
        / f"{batch}{workload.m}x{workload.k}x{workload.n}-{workload.pattern}-{trials}"
    )
    marker = work_dir / "tuned.json"
    if marker.is_file():
        tuning = json.loads(marker.read_text())["seconds"]
        database = ms.database.JSONDatabase(
            str(work_dir / "database_workload.json"), str(work_dir / "database_tuning_record.json")
        )
        note = f"{trials} trials, tuned in {tuning:.0f} s (cached)"
    else:
        work_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        # Generous timeouts: on a busy 2-core machine the defaults (30 s) time out builds.
        database = ms.tune_tir(
            mod,
            target(),
            str(work_dir),
            max_trials_global=trials,
            num_trials_per_iter=min(16, trials),
            builder=ms.builder.LocalBuilder(timeout_sec=300),
            runner=ms.runner.LocalRunner(
                timeout_sec=300, evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1)
            ),
        )
        tuning = time.perf_counter() - start
        marker.write_text(json.dumps({"seconds": tuning, "trials": trials}))
        note = f"{trials} trials, tuned in {tuning:.0f} s"
    schedule = ms.tir_integration.compile_tir(database, mod, target())
    if schedule is None:
        return None, f"{note}; no tuned schedule found"
    return _time_compiled(schedule.mod, workload, signature, settings.budget), note


def _tuning_too_long(workload: Workload, settings: Settings) -> str | None:
    if settings.trials <= 0:
        return "skipped (--trials 0)"
    if workload.flops > settings.ms_max_gflop * 1e9:
        return f"skipped: above --ms-max-gflop {settings.ms_max_gflop} (tuning takes too long)"
    if workload.batch is not None and not settings.ms_batch:
        return "skipped: a batch form takes too long to tune (36 min for Q.K^T here); --ms-batch"
    return None


def _reference_too_slow(workload: Workload, settings: Settings) -> str | None:
    if workload.flops > 2e8:
        return "skipped: the reference kernel needs seconds per call here"
    return None


def _nothing_to_prepack(workload: Workload, settings: Settings) -> str | None:
    if workload.batched:
        return "skipped: a batched matmul's weight is an activation (K, V), not packed ahead"
    return None


def layer_direct(library: str, workload, dtype, settings, prepacked=False) -> Measured:
    return measure_direct(library, [layer_spec(workload, dtype)], settings.budget, prepacked)


def layer_numpy(workload, dtype, settings) -> Measured:
    """``np.matmul`` into a preallocated output (batched: one product per batch index)."""
    import numpy as np

    (x, w, *bias), out = arrays(workload, DTYPES[dtype])
    wt = np.swapaxes(w, -1, -2) if workload.dense else w

    def run():
        np.matmul(x, wt, out=out)
        if bias:
            np.add(out, bias[0], out=out)
        if workload.has_relu:
            np.maximum(out, 0, out=out)

    return time_python(run, settings.budget), _blas_note()


def layer_torch(workload, dtype, settings) -> Measured:
    torch = _torch()
    if torch is None:
        return None, "torch not installed (pip install torch==2.13.0)"
    (x, w, *bias), _ = arrays(workload, DTYPES[dtype])
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    tb = torch.from_numpy(bias[0]) if bias else None
    if workload.batched:  # (B, M, K) x (B, K, N): torch.matmul, one bmm
        tw_kn = tw.transpose(-1, -2) if workload.dense else tw

        def product():
            y = torch.matmul(tx, tw_kn)
            return y if tb is None else y.add_(tb)
    else:  # F.linear takes the (N, K) weight and a 2-D or (B, M, K) input
        tw_nk = tw if workload.dense else tw.t()

        def product():
            return torch.nn.functional.linear(tx, tw_nk, tb)

    def run():
        with torch.no_grad():
            y = product()
            if workload.has_relu:
                y.relu_()

    note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    return time_python(run, settings.budget), note


def _torch():
    """torch, using the threads TVM uses; None if not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1)))
    return torch


def _blas_note() -> str:
    """The BLAS libraries loaded in this process and the kernel (core) each runs."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return "; ".join(
        f"{Path(p['filepath']).name} {p.get('architecture')} x{p.get('num_threads')}" for p in pools
    )


# --------------------------------------------------------------------------------------
# The seed MLP
# --------------------------------------------------------------------------------------


def _mlp_inputs():
    """The seed MLP's input (64 x 800) and parameters (w1, b1, w2, b2), from seed 0."""
    import numpy as np

    from tir_byoc.demo import mlp_weights
    from tir_byoc.testing.inputs import random_array

    rng = np.random.default_rng(0)
    x = random_array((64, 800), "float32", rng)
    return x, mlp_weights(rng)


def mlp_relax(backend: str | None, settings, fold_transposes=True, schedule=True) -> Measured:
    """The MLP on the Relax VM: offloaded to ``backend`` (None: not), the rest by dlight."""
    import numpy as np
    import tvm
    from tvm import relax

    import tir_byoc
    from tir_byoc.demo import default_schedule, lowered_mlp

    x, params = _mlp_inputs()
    mod = lowered_mlp()
    note = ""
    if backend is not None:
        mod = tir_byoc.offload(mod, backends=[backend], fold_transposes=fold_transposes)
        note = f"{mod['forward'].script().count('call_tir(')} call_tir per run"
    if schedule:  # dlight for whatever tir_byoc left to TVM
        mod = default_schedule(mod, target())
    vm = relax.VirtualMachine(tvm.compile(mod, target=target()), tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in (x, *params)]
    expected = np.maximum(x @ params[0].T + params[1], 0) @ params[2].T + params[3]
    if not np.allclose(vm["forward"](*args).numpy(), expected, rtol=1e-4, atol=1e-4):
        return None, "WRONG RESULT"
    return time_tvm(vm, "forward", args, settings.budget), note


def mlp_direct(library: str, settings) -> Measured:
    return measure_direct(library, MLP_LAYERS, settings.budget)


def mlp_numpy(settings) -> Measured:
    import numpy as np

    x, (w1, b1, w2, b2) = _mlp_inputs()
    h = np.empty((64, 500), "float32")
    y = np.empty((64, 10), "float32")
    w1t, w2t = w1.T, w2.T

    def run():
        np.matmul(x, w1t, out=h)
        np.add(h, b1, out=h)
        np.maximum(h, 0, out=h)
        np.matmul(h, w2t, out=y)
        np.add(y, b2, out=y)

    return time_python(run, settings.budget), _blas_note()


def mlp_torch(settings) -> Measured:
    torch = _torch()
    if torch is None:
        return None, "torch not installed (pip install torch==2.13.0)"
    x, params = _mlp_inputs()
    tx, tw1, tb1, tw2, tb2 = (torch.from_numpy(a) for a in (x, *params))
    linear = torch.nn.functional.linear

    def run():
        with torch.no_grad():
            linear(linear(tx, tw1, tb1).relu_(), tw2, tb2)

    return time_python(run, settings.budget), f"torch {torch.__version__}"


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------

_ALL_DTYPES = tuple(DTYPES)

#: Every implementation, in the order they run (layers first, then the MLP) and are listed.
IMPLEMENTATIONS: dict[str, Implementation] = {
    i.name: i
    for i in (
        Implementation(
            "tir_byoc+onednn",
            layer=partial(layer_tir_byoc, "onednn"),
            mlp=partial(mlp_relax, "onednn"),
            dtypes=_ALL_DTYPES,
            tir_byoc=True,
        ),
        Implementation(
            "tir_byoc+onednn (transposes kept)",
            mlp=partial(mlp_relax, "onednn", fold_transposes=False),
            tir_byoc=True,
        ),
        Implementation(
            "tir_byoc+openblas",
            layer=partial(layer_tir_byoc, "openblas"),
            mlp=partial(mlp_relax, "openblas"),
            direct="OpenBLAS direct (C)",
            tir_byoc=True,
        ),
        Implementation(
            "tir_byoc+ref",
            layer=partial(layer_tir_byoc, "ref"),
            skip=_reference_too_slow,
            tir_byoc=True,
        ),
        Implementation(
            "oneDNN direct (C)",
            layer=partial(layer_direct, "onednn"),
            mlp=partial(mlp_direct, "onednn"),
            dtypes=_ALL_DTYPES,
        ),
        Implementation(
            "oneDNN direct, prepacked weight (C)",
            layer=partial(layer_direct, "onednn", prepacked=True),
            skip=_nothing_to_prepack,
        ),
        Implementation(
            "OpenBLAS direct (C)",
            layer=partial(layer_direct, "openblas"),
            mlp=partial(mlp_direct, "openblas"),
        ),
        Implementation("NumPy", layer=layer_numpy, mlp=mlp_numpy),
        Implementation("PyTorch eager", layer=layer_torch, mlp=mlp_torch),
        Implementation("TVM unscheduled", layer=partial(layer_tvm, None)),
        Implementation("TVM dlight default", layer=partial(layer_tvm, "dlight")),
        Implementation("TVM MetaSchedule", layer=layer_metaschedule, skip=_tuning_too_long),
        Implementation("Relax unscheduled", mlp=partial(mlp_relax, None, schedule=False)),
        Implementation("Relax + dlight", mlp=partial(mlp_relax, None)),
    )
}


def running(kind: str) -> list[Implementation]:
    """The implementations timed on ``kind`` (``"layer"`` or ``"mlp"``), in table order."""
    return [i for i in IMPLEMENTATIONS.values() if i.kind in (kind, "both")]
