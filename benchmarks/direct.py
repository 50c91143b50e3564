"""The libraries called directly from C, without TVM: the baseline of the "bridge overhead".

Entry points: :func:`measure_direct` (layers through ``direct_onednn.cpp`` or
``direct_openblas.c``, compiled here on first use), :func:`compute_direct` (the oneDNN
harness's outputs on given inputs, for the numerical check) and :func:`measure_bridge`
(``run.py --bridge``: tir_byoc's oneDNN intrinsics against direct oneDNN calls, interleaved in
one process).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from timing import plan
from workloads import DTYPES, WORKLOADS, Workload, ir_module

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SOURCES = {"onednn": "direct_onednn.cpp", "openblas": "direct_openblas.c"}
#: The seed MLP's two layers, as the direct harnesses take them (:func:`layer_spec`'s format).
MLP_LAYERS = ["64:500:800:f32:dense:1:1", "64:10:500:f32:dense:1:0"]


def _direct_binary(library: str) -> Path:
    """Compile the direct-call harness of ``library`` (cached next to the results)."""
    import tir_byoc
    from tir_byoc import toolchain

    spec = tir_byoc.REGISTRY.backend(library).locate()
    source = HERE / SOURCES[library]
    binary = RESULTS / "bin" / f"direct_{library}"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        binary.parent.mkdir(parents=True, exist_ok=True)
        compiler = toolchain.cxx_compiler() if library == "onednn" else toolchain.c_compiler()
        include = [*spec.include_dirs, str(HERE.parent / "intrinsics" / "include")]
        flags = [f"-I{d}" for d in include] + list(spec.compile_flags)
        command = [
            compiler.path,
            "-O3",  # as tir_byoc builds its intrinsics (toolchain._BASE_FLAGS)
            *flags,
            str(source),
            "-o",
            str(binary),
            *toolchain.link_flags(spec),
        ]
        subprocess.run(command, check=True)
    return binary


def layer_spec(workload: Workload, dtype: str) -> str:
    """The harnesses' LAYER argument for ``workload``'s ``pattern`` call in ``dtype`` (a key of
    DTYPES).

    A batched matmul passes its batch count (``M:N:K:...:EPILOGUE:BATCH``); a leading batch
    over a 2-D weight is the 2-D product with the batch folded into M, as tir_byoc calls it.
    The epilogue after the bias is 0 (none), 1 (relu) or the oneDNN harness's post-op names
    (the epilogue ops' names) joined by ``+``.
    """
    short = {"fp32": "f32", "bf16": "bf16", "int8": "u8s8"}[dtype]
    layout = "dense" if workload.dense else "matmul"
    m = workload.m if workload.batched else workload.rows
    batch = f":{workload.batch}" if workload.batched else ""
    if workload.group == "epilogue":
        post_ops = "+".join(op for op in workload.ops if op != "bias") or "0"
    else:
        post_ops = str(int(workload.has_relu))
    bias = int(workload.has_bias)
    return f"{m}:{workload.n}:{workload.k}:{short}:{layout}:{bias}:{post_ops}{batch}"


def layer_specs(workload: Workload, dtype: str) -> list[str]:
    """The LAYER arguments of every call of ``workload``, in order: the harness chains them
    (the gated MLP's up projection, then the gate GEMM that multiplies by its output)."""
    calls = [replace(workload, pattern=p, tail_from=None) for p in workload.calls]
    return [layer_spec(call, dtype) for call in calls]


def compute_direct(layers, operands: list[list], prepacked: bool = False) -> list:
    """The oneDNN harness's outputs (one float32 array per layer) with ``operands[i]`` as the
    operands layer i owns, in the order x, w, b, t, None for one it does not have or reads from
    the previous layer (see ``direct_onednn.cpp``)."""
    import numpy as np

    with tempfile.TemporaryDirectory() as data:
        for i, owned in enumerate(operands):
            for name, array in zip("xwbt", owned):
                if array is not None:
                    np.ascontiguousarray(array, dtype=np.float32).tofile(f"{data}/{i}.{name}")
        options = f"{'prepacked' if prepacked else 'plain'},check:{data}"
        command = [str(_direct_binary("onednn")), "0", "1", options, *layers]
        subprocess.run(command, capture_output=True, text=True, check=True)
        return [np.fromfile(f"{data}/{i}.y", dtype=np.float32) for i in range(len(layers))]


def _run_direct(library: str, layers, budget: float, mode: str | None = None) -> list[str]:
    """The direct harness's output, timing ``layers`` for about ``budget`` seconds.

    ``mode`` is the oneDNN harness's third argument (plain, prepacked, interleaved:LIBRARY).
    """
    binary = _direct_binary(library)
    modes = [mode] if mode else []

    def run(warmup: int, repeats: int) -> list[str]:
        command = [str(binary), str(warmup), str(repeats), *modes, *layers]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()

    first = float(run(1, 3)[0])
    number, repeat = plan(first * 1e-3, budget)
    return run(max(3, min(200, int(200 / max(first, 1e-6)))), repeat * number)


def measure_direct(library, layers, budget, prepacked=False):
    """(ms, note): ``layers`` run by ``library``'s harness; the note names its kernels."""
    mode = ("prepacked" if prepacked else "plain") if library == "onednn" else None
    output = _run_direct(library, layers, budget, mode)
    return float(output[0]), " ".join(sorted(set(output[1:])))


def _refusal(workload: Workload, dtype: str) -> str | None:
    """Why tir_byoc's oneDNN intrinsic would not serve this layer here (this CPU lacks the
    dtype), or None.  The interleaved harness cannot time such a layer: oneDNN aborts, or the
    intrinsic returns TIR_BYOC_EDTYPE."""
    import tir_byoc

    matches = tir_byoc.scan(ir_module(workload, DTYPES[dtype]), backends=["onednn"])
    return next((m.reason for m in matches if m.intrinsic is None), None)


def measure_bridge(budget: float, workloads=WORKLOADS, mlp: bool = True) -> int:
    """Print the direct oneDNN call against tir_byoc's intrinsic, interleaved in one process.

    This is the bridge without TVM's own call (a compiled PrimFunc reaches the intrinsic by a
    plain C call) and without the drift between processes that the main table suffers.
    ``workloads`` are timed in every dtype, then (``mlp``) the seed MLP's two layers.
    """
    import tir_byoc

    mode = f"interleaved:{tir_byoc.toolchain.shared_library('onednn')}"
    cases = [(w.name, dtype, layer_specs(w, dtype), w) for w in workloads for dtype in w.dtypes]
    if mlp:
        cases.append(("seed MLP, both layers", "fp32", MLP_LAYERS, None))
    print("| workload | dtype | oneDNN direct ms | tir_byoc intrinsic ms | intrinsic / direct |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, dtype, layers, workload in cases:
        refusal = workload and _refusal(workload, dtype)
        if refusal:
            print(f"| {name} | {dtype} | - | - | skipped: {refusal} |")
            continue
        direct, bridged = (float(t) for t in _run_direct("onednn", layers, budget, mode)[:2])
        print(f"| {name} | {dtype} | {direct:.4f} | {bridged:.4f} | {bridged / direct:.3f} |")
    return 0
