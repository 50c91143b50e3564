"""Everything a user could pick instead of tir_byoc (and tir_byoc itself), in one table.

Entry point: :data:`IMPLEMENTATIONS`, name -> :class:`Implementation`: how to time it on a
layer workload and on the seed MLP (either may be absent), which dtypes it runs, what it is
compared with.  ``run.py`` checks ``--only`` against it, runs from it and reports from it.
Each measure function returns ``(milliseconds or None, note)`` and runs in a child process of
its own (see ``run.py``).  On an epilogue workload each first computes the workload once on
the inputs of :func:`workloads.arrays` and checks the result against
:func:`workloads.expected` (:func:`check`); a wrong result is reported, not timed.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from direct import MLP_LAYERS, RESULTS, compute_direct, layer_specs, measure_direct
from timing import slow_note, time_python, time_tvm
from workloads import DTYPES, Workload, arrays, expected, ir_module, target


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


#: The largest error an fp32 result may have, relative to the result's largest magnitude.
TOLERANCE = 1e-5


def check(workload: Workload, operands, result) -> tuple[bool, str]:
    """(agrees, what the check found) for ``result``, the workload's output on ``operands``.

    It is compared with :func:`workloads.expected` (float64): the largest error relative to
    the largest magnitude of the result (an fp32 GEMM's rounding grows with its sums, not with
    each element) must be at most :data:`TOLERANCE`.
    """
    import numpy as np

    reference = expected(workload, operands)
    got = np.asarray(result, dtype=np.float64).reshape(reference.shape)
    error = float(np.max(np.abs(got - reference)) / np.max(np.abs(reference)))
    found = f"error {error:.1e} of the largest magnitude"
    if not error <= TOLERANCE:  # NaN too
        return False, f"WRONG RESULT: {found}, above {TOLERANCE:g}"
    return True, found


def _verified(workload: Workload, operands, compute) -> tuple[bool, str]:
    """:func:`check` of ``compute()`` (run once, untimed) on an epilogue workload; other
    workloads are not checked here: (True, "")."""
    if workload.group != "epilogue":
        return True, ""
    return check(workload, operands, compute())


class Compiled(NamedTuple):
    """A built module on random arrays: ``module["main"](*args)`` runs it (TVM's evaluator
    times that), ``compute()`` runs it and returns its output, ``operands`` are its inputs."""

    module: object
    args: list
    compute: Callable
    operands: list


def _compile(mod, workload: Workload, signature: str) -> Compiled:
    """Build ``mod`` (:func:`workloads.ir_module` of ``workload``, maybe rewritten): a PrimFunc
    ``main`` as a module, a Relax ``main`` on the Relax VM."""
    import tvm
    from tvm import relax

    built = tvm.compile(mod, target=target())
    operands, out = arrays(workload, signature)
    inputs = [tvm.runtime.tensor(a) for a in operands]
    if isinstance(mod["main"], relax.Function):
        vm = relax.VirtualMachine(built, tvm.cpu())
        return Compiled(vm, inputs, lambda: vm["main"](*inputs).numpy(), operands)
    module = built.mod if hasattr(built, "mod") else built
    args = [*inputs, tvm.runtime.tensor(out)]

    def compute():
        module["main"](*args)
        return args[-1].numpy()

    return Compiled(module, args, compute, operands)


def _time_compiled(compiled: Compiled, workload: Workload, budget: float) -> Measured:
    """Check the result once (epilogue workloads), then time ``main``; a wrong result is not
    timed."""
    agrees, checked = _verified(workload, compiled.operands, compiled.compute)
    if not agrees:
        return None, checked
    return time_tvm(compiled.module, "main", compiled.args, budget), checked


def layer_tir_byoc(backend: str, workload, dtype, settings) -> Measured:
    import tir_byoc
    from tir_byoc.offload import apply

    signature = DTYPES[dtype]
    planned = tir_byoc.plan(ir_module(workload, signature), backends=[backend])
    refused = [c.reason for c in planned.choices if c.intrinsic is None]
    if refused:
        return None, refused[0]
    compiled = _compile(apply(planned), workload, signature)
    ms, checked = _time_compiled(compiled, workload, settings.budget)
    served = [
        c.intrinsic if c.cut_from is None else f"{c.intrinsic} (cut: {c.reason})"
        for c in planned.choices
    ]
    notes = [", ".join(served), checked]
    if backend == "openblas":
        notes.append(_blas_note())
    if backend == "onednn" and workload.group == "epilogue" and ms is not None:
        notes.append(_onednn_kernels(compiled.compute))
    return ms, "; ".join(n for n in notes if n)


def _constant_weight_module(workload: Workload, signature: str, operands) -> tuple:
    """(module, inputs): a Relax ``main`` computing the workload with its weights (W, and the
    first call's weight in a workload of two calls) bound as constants of the model, which is
    what ``from_exported_program`` makes of a Linear's weight; and the operands it still takes.
    """
    import tvm
    from tvm import relax

    mod = ir_module(workload, signature)
    if workload.tail_from is None:  # one PrimFunc: a Relax main calling it
        func = mod["main"]
        *params, out = func.params

        def tensor_type(param):
            return relax.TensorType([int(e) for e in param.ty.shape], str(param.ty.dtype.dtype))

        variables = [relax.Var(p.name, tensor_type(p)) for p in params]
        builder = relax.BlockBuilder()
        with builder.function("main", variables):
            with builder.dataflow():
                gv = builder.add_func(func.without_attr("global_symbol"), workload.pattern)
                call = relax.op.call_tir(gv, relax.Tuple(variables), tensor_type(out))
                result = builder.emit_output(call)
            builder.emit_func_output(result)
        mod = builder.get()
    weights = [1] + ([len(operands) - 1] if workload.tail_from is not None else [])
    names = [p.name for p in mod["main"].params]
    bound = {names[i]: tvm.runtime.tensor(operands[i]) for i in weights}
    inputs = [a for i, a in enumerate(operands) if i not in weights]
    return relax.transform.BindParams("main", bound)(mod), inputs


def layer_tir_byoc_constant(backend: str, workload, dtype, settings) -> Measured:
    """tir_byoc + ``backend`` with the weights constants of a Relax model, so that the offload
    may pack them once (issue 15); the note says whether it did."""
    import tvm
    from tvm import relax

    import tir_byoc

    signature = DTYPES[dtype]
    operands, _ = arrays(workload, signature)
    module, given = _constant_weight_module(workload, signature, operands)
    offloaded = tir_byoc.offload(module, backends=[backend])
    packed = sorted(g.name_hint for g in offloaded.functions if g.name_hint.endswith("_packed"))
    built = tvm.compile(offloaded, target=target())
    vm = relax.VirtualMachine(built, tvm.cpu())
    inputs = [tvm.runtime.tensor(a) for a in given]
    agrees, checked = _verified(workload, operands, lambda: vm["main"](*inputs).numpy())
    if not agrees:
        return None, checked
    ms = time_tvm(vm, "main", inputs, settings.budget)
    how = (
        f"weights packed once ({', '.join(packed)})"
        if packed
        else "weights left plain: no packed form timed 5 % faster (see tir_byoc.packing)"
    )
    return ms, "; ".join(n for n in (how, checked) if n)


def _onednn_kernels(run: Callable) -> str:
    """The oneDNN kernels one ``run()`` executed (after the primitives exist), with their fused
    post-ops, from oneDNN's verbose log switched on for that run: "gemm:jit:f32 +bias
    +eltwise_gelu_erf"."""
    import ctypes
    import sys
    import tempfile

    maps = Path("/proc/self/maps").read_text()
    found = re.search(r"(/\S*libdnnl\.so[.\d]*)", maps)
    if not found:
        return "oneDNN not loaded"
    dnnl, libc = ctypes.CDLL(found.group(1)), ctypes.CDLL(None)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            dnnl.dnnl_set_verbose(1)
            run()
            dnnl.dnnl_set_verbose(0)
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        lines = log.read().decode().splitlines()
    kernels = []
    for line in lines:
        fields = line.split(",")
        if len(fields) > 7 and fields[1] == "exec":
            fused = ["+bias"] if " bia_" in f" {fields[6]}" else []
            post_ops = fields[7].partition("attr-post-ops:")[2].strip()
            fused += [f"+{op.split(':')[0]}" for op in post_ops.split("+") if op]
            kernels.append(" ".join([fields[4], *fused]))
    return "oneDNN ran " + ", ".join(kernels)


def layer_tvm(schedule: str | None, workload, dtype, settings) -> Measured:
    """TVM alone: unscheduled, or with dlight's default CPU schedule (``"dlight"``)."""
    from tvm.s_tir import dlight

    signature = DTYPES[dtype]
    mod = ir_module(workload, signature)
    if schedule == "dlight":
        with target():
            mod = dlight.ApplyDefaultSchedule(dlight.cpu.GEMV(), dlight.cpu.Reduction())(mod)
    compiled = _compile(mod, workload, signature)
    ms, checked = _time_compiled(compiled, workload, min(settings.budget, 3.0))
    return ms, "; ".join(n for n in (checked, slow_note(ms)) if n)


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
    compiled = _compile(schedule.mod, workload, signature)
    return _time_compiled(compiled, workload, settings.budget)[0], note


def _tuning_too_long(workload: Workload, settings: Settings) -> str | None:
    if settings.trials <= 0:
        return "skipped (--trials 0)"
    if workload.flops > settings.ms_max_gflop * 1e9:
        return f"skipped: above --ms-max-gflop {settings.ms_max_gflop} (tuning takes too long)"
    if workload.batch is not None and not settings.ms_batch:
        return "skipped: a batch form takes too long to tune (36 min for Q.K^T here); --ms-batch"
    if workload.group == "epilogue":
        return "skipped: not tuned on the epilogue workloads (the gated MLP is two PrimFuncs)"
    return None


def _reference_too_slow(workload: Workload, settings: Settings) -> str | None:
    if workload.flops > 2e8:
        return "skipped: the reference kernel needs seconds per call here"
    return None


def _nothing_to_prepack(workload: Workload, settings: Settings) -> str | None:
    if workload.batched:
        return "skipped: a batched matmul's weight is an activation (K, V), not packed ahead"
    return None


def _no_epilogue_ops(workload: Workload, settings: Settings) -> str | None:
    if workload.group == "epilogue":
        return "skipped: the OpenBLAS harness has no epilogue ops beyond bias and relu"
    return None


def layer_direct(library: str, workload, dtype, settings, prepacked=False) -> Measured:
    specs = layer_specs(workload, dtype)
    if library == "onednn":  # the OpenBLAS harness runs no epilogue workload
        operands, _ = arrays(workload, DTYPES[dtype])
        owned = _owned(workload, operands)
        outputs = partial(compute_direct, specs, owned, prepacked)
        agrees, checked = _verified(workload, operands, lambda: outputs()[-1])
        if not agrees:
            return None, checked
        ms, kernels = measure_direct(library, specs, settings.budget, prepacked)
        return ms, "; ".join(n for n in (kernels, checked) if n)
    return measure_direct(library, specs, settings.budget, prepacked)


def _owned(workload: Workload, operands) -> list[list]:
    """The operands each call of the direct harness owns (x, w, b, t; None where it has none
    or reads the previous call's): the tail call takes X and its weight, the main call its
    weight, bias and (without a tail call) its tensor."""
    x, w_tail, w, tensors = _split(workload, operands)
    bias = tensors.pop(0) if workload.has_bias else None
    tensor = tensors[0] if tensors else None
    if w_tail is None:
        return [[x, w, bias, tensor]]
    return [[x, w_tail, None, None], [None, w, bias, None]]


def _split(workload: Workload, operands):
    """(x, w_tail, w, tensors): the input, the tail call's weight (None without one), the main
    call's weight and the tensors its epilogue ops read in order, None standing for the tail
    call's output (the tensor of the last slot)."""
    x, w, *tensors = operands
    w_tail = tensors.pop() if workload.tail_from else None
    if w_tail is not None:
        tensors.append(None)
    return x, w_tail, w, tensors


def _numpy_gelu(y, _, scratch):
    """y * (0.5 + 0.5 erf(y / sqrt 2)) in place, in fp32.  NumPy has no erf: Abramowitz and
    Stegun 7.1.26 (error below 1.5e-7), 1 - t (a1 + t (a2 + ...)) exp(-u^2), t = 1 / (1 + p|u|)."""
    import numpy as np

    u, t, poly = scratch
    np.multiply(y, np.float32(0.5**0.5), out=u)
    np.abs(u, out=t)
    t *= np.float32(0.3275911)
    t += 1
    np.reciprocal(t, out=t)
    np.multiply(t, np.float32(1.061405429), out=poly)
    for a in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(a)
        poly *= t
    np.square(u, out=u)
    np.negative(u, out=u)
    np.exp(u, out=u)
    poly *= u
    np.subtract(1, poly, out=poly)  # erf(|u|)
    np.copysign(poly, y, out=poly)
    poly *= np.float32(0.5)
    poly += np.float32(0.5)
    y *= poly


def _numpy_gelu_tanh(y, _, scratch):
    """0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3))) in place, in fp32."""
    import numpy as np

    u = scratch[0]
    np.multiply(y, y, out=u)
    u *= y
    u *= np.float32(0.044715)
    u += y
    u *= np.float32((2.0 / np.pi) ** 0.5)
    np.tanh(u, out=u)
    u += 1
    u *= np.float32(0.5)
    y *= u


def _numpy_silu(y, _, scratch):
    """y / (1 + exp(-y)) in place, in fp32."""
    import numpy as np

    e = scratch[0]
    np.negative(y, out=e)
    with np.errstate(over="ignore"):  # exp(-y) = inf for y < -88: y / inf = -0, as TIR gives
        np.exp(e, out=e)
    e += 1
    np.divide(y, e, out=y)


def _numpy_ops():
    """Each epilogue op in NumPy, in place on the output: ``op(y, tensor, scratch)``."""
    import numpy as np

    return {
        "bias": lambda y, t, _: np.add(y, t, out=y),
        "relu": lambda y, t, _: np.maximum(y, 0, out=y),
        "gelu": _numpy_gelu,
        "gelu_tanh": _numpy_gelu_tanh,
        "silu": _numpy_silu,
        "add": lambda y, t, _: np.add(y, t, out=y),
        "mul": lambda y, t, _: np.multiply(y, t, out=y),
    }


def layer_numpy(workload, dtype, settings) -> Measured:
    """``np.matmul`` into a preallocated output (batched: one product per batch index), then
    each epilogue op in place (:func:`_numpy_ops`)."""
    import numpy as np

    from tir_byoc.epilogues import OPS

    operands, out = arrays(workload, DTYPES[dtype])
    x, w_tail, w, tensors = _split(workload, operands)
    tail = None if w_tail is None else np.empty_like(out)
    tensors = iter(tail if t is None else t for t in tensors)
    table = _numpy_ops()
    ops = [(table[op], next(tensors) if OPS[op].tensor else None) for op in workload.ops]
    scratch = [np.empty_like(out) for _ in range(3)] if workload.group == "epilogue" else []

    def transposed(weight):
        return weight if weight is None or not workload.dense else np.swapaxes(weight, -1, -2)

    wt, wt_tail = transposed(w), transposed(w_tail)

    def run():
        if tail is not None:
            np.matmul(x, wt_tail, out=tail)
        np.matmul(x, wt, out=out)
        for op, tensor in ops:
            op(out, tensor, scratch)
        return out

    agrees, checked = _verified(workload, operands, lambda: run().copy())
    if not agrees:
        return None, checked
    return time_python(run, settings.budget), "; ".join(n for n in (_blas_note(), checked) if n)


def _torch_ops(torch):
    """Each epilogue op in PyTorch eager: ``op(y, tensor) -> y`` (in place where torch has it)."""
    functional = torch.nn.functional
    return {
        "bias": lambda y, t: y.add_(t),
        "relu": lambda y, t: y.relu_(),
        "gelu": lambda y, t: functional.gelu(y),
        "gelu_tanh": lambda y, t: functional.gelu(y, approximate="tanh"),
        "silu": lambda y, t: functional.silu(y, inplace=True),
        "add": lambda y, t: y.add_(t),
        "mul": lambda y, t: y.mul_(t),
    }


def layer_torch(workload, dtype, settings) -> Measured:
    """``F.linear`` (with the bias) or ``torch.matmul`` (batched: one bmm), then each epilogue
    op (:func:`_torch_ops`); a tail call is one more ``F.linear``."""
    torch = _torch()
    if torch is None:
        return None, "torch not installed (pip install torch==2.13.0)"
    from tir_byoc.epilogues import OPS

    operands, _ = arrays(workload, DTYPES[dtype])
    x, w_tail, w, tensors = _split(workload, operands)
    x, w = torch.from_numpy(x), torch.from_numpy(w)
    w_tail = None if w_tail is None else torch.from_numpy(w_tail)
    tensors = [None if t is None else torch.from_numpy(t) for t in tensors]
    ops = list(workload.ops)
    fused_bias = None
    if workload.batched:  # (B, M, K) x (B, K, N): torch.matmul, one bmm
        w_kn = w.transpose(-1, -2) if workload.dense else w

        def product():
            return torch.matmul(x, w_kn)
    else:  # F.linear takes the (N, K) weight and a 2-D or (B, M, K) input, and the bias
        if ops[:1] == ["bias"]:
            ops, fused_bias = ops[1:], tensors.pop(0)
        w_nk = w if workload.dense else w.t()

        def product():
            return torch.nn.functional.linear(x, w_nk, fused_bias)

    table, tensors = _torch_ops(torch), iter(tensors)
    epilogue = [(table[op], next(tensors) if OPS[op].tensor else None) for op in ops]
    w_tail_nk = None if w_tail is None else w_tail if workload.dense else w_tail.t()

    def run():
        with torch.no_grad():
            tail = None if w_tail_nk is None else torch.nn.functional.linear(x, w_tail_nk)
            y = product()
            for op, tensor in epilogue:
                y = op(y, tail if tensor is None else tensor)
            return y

    agrees, checked = _verified(workload, operands, lambda: run().numpy())
    if not agrees:
        return None, checked
    note = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    return time_python(run, settings.budget), "; ".join(n for n in (note, checked) if n)


def layer_onnxruntime(workload, dtype, settings) -> Measured:
    """ONNX Runtime's CPU provider on one ``Gemm`` (``transB=1``, the weight and bias as
    initializers, so ORT may pack the weight when the session is created), then ``Relu``."""
    try:
        import onnx
        import onnxruntime
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None, "onnxruntime not installed (make bench installs the bench extra)"
    operands, _ = arrays(workload, DTYPES[dtype])
    x, w, *rest = operands
    ops = list(workload.ops)
    gemm_inputs, initializers = ["x", "w"], [numpy_helper.from_array(w, "w")]
    if ops[:1] == ["bias"]:
        gemm_inputs.append("b")
        initializers.append(numpy_helper.from_array(rest[0].reshape(-1), "b"))
        ops = ops[1:]
    nodes = [helper.make_node("Gemm", gemm_inputs, ["g"], transB=1)]
    if ops == ["relu"]:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    else:
        nodes[0].output[0] = "y"
    n = w.shape[0]
    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.shape[0], n])],
        initializers,
    )
    # IR version 9 (onnx 1.15): onnx writes its newest, which ORT may not read yet.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feed = {"x": x}

    def run():
        return session.run(None, feed)[0]

    agrees, checked = _verified(workload, operands, run)
    if not agrees:
        return None, checked
    note = f"onnxruntime {onnxruntime.__version__} (onnx {onnx.__version__})"
    return time_python(run, settings.budget), "; ".join(n for n in (note, checked) if n)


def _not_one_gemm(workload: Workload, settings: Settings) -> str | None:
    if (
        workload.batch
        or not workload.dense
        or workload.ops not in ((), ("bias",), ("relu",), ("bias", "relu"))
    ):
        return "skipped: the ONNX Runtime harness builds 2-D dense layers with bias and relu"
    return None


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
            "tir_byoc+onednn, constant weight",
            layer=partial(layer_tir_byoc_constant, "onednn"),
            skip=_nothing_to_prepack,
            tir_byoc=True,
        ),
        Implementation(
            "tir_byoc+onednn (transposes kept)",
            mlp=partial(mlp_relax, "onednn", fold_transposes=False),
            tir_byoc=True,
        ),
        Implementation(
            "tir_byoc+mkl",
            layer=partial(layer_tir_byoc, "mkl"),
            mlp=partial(mlp_relax, "mkl"),
            tir_byoc=True,
        ),
        Implementation(
            "tir_byoc+mkl, constant weight",
            layer=partial(layer_tir_byoc_constant, "mkl"),
            skip=_nothing_to_prepack,
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
            skip=_no_epilogue_ops,
        ),
        Implementation("NumPy", layer=layer_numpy, mlp=mlp_numpy),
        Implementation("PyTorch eager", layer=layer_torch, mlp=mlp_torch),
        Implementation("ONNX Runtime", layer=layer_onnxruntime, skip=_not_one_gemm),
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
