"""BERT-like and GPT-2-like models as plain C: made, run in a fresh process, compared with
torch and the Relax VM; the BERT one also cross-compiled for aarch64 and run under qemu."""

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from support import aot_harness as harness

import tir_byoc.aot as aot
from tir_byoc.aot.program import TensorRef, read_program
from tir_byoc.testing import models

CROSS_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
#: ELF's e_machine of AArch64.
EM_AARCH64 = 183
#: What TVM's own C backend would have written: its headers, runtime and FFI calls.
RUNTIME = re.compile(r'TVMBackend|TVMFFI|__tvm|#include "tvm/')
#: libm's functions (fp32 and fp64) the kernels and the reference intrinsics may call.
LIBM = {
    f"{name}{suffix}"
    for name in ("exp", "erf", "tanh", "sqrt", "floor", "ceil", "log", "pow", "fabs", "round")
    for suffix in ("", "f")
}
#: Where Debian's gcc-aarch64-linux-gnu puts the aarch64 C library (qemu's -L).
AARCH64_SYSROOT = "/usr/aarch64-linux-gnu"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Each model built as C (reference kernels) and made, on first use."""
    made = {}

    def build(name):
        if name not in made:
            model = models.AOT_MODELS[name]()
            artifact = aot.build(
                model.module,
                model.inputs,
                out_dir=tmp_path_factory.mktemp(name),
                name=name,
                backends="ref",
            )
            made[name] = model, artifact, harness.make(artifact)
        return made[name]

    return build


@pytest.fixture(params=["bert", "gpt2"])
def built(request, builds):
    return builds(request.param)


def _expected(model):
    with torch.no_grad():
        return harness.as_list(model.module(*model.inputs))


def test_runs_without_tvm_and_agrees_with_torch_and_the_vm(built):
    model, artifact, runner = built
    assert harness.tvm_symbols(runner) == set()
    inputs = harness.numpy_inputs(model.inputs)
    results, _ = harness.run(artifact, runner, inputs)
    vm = harness.as_list(artifact.model(*inputs))
    for result, expected, on_vm in zip(results, _expected(model), vm, strict=True):
        np.testing.assert_allclose(result, expected, rtol=harness.RTOL, atol=harness.ATOL)
        np.testing.assert_allclose(result, on_vm, rtol=harness.RTOL, atol=harness.ATOL)


def test_every_offloaded_function_calls_its_intrinsic_from_the_entry(built):
    _, artifact, _ = built
    source = artifact.path(f"{artifact.name}.c").read_text()
    calls = [line for line in source.splitlines() if "status = tir_byoc_ref_" in line]
    offloaded = [name for name in artifact.steps if name in artifact.model.intrinsics]
    # Each step of an offloaded PrimFunc (one intrinsic call) calls the intrinsic itself.
    assert len(calls) == artifact.intrinsic_steps == len(offloaded) > 0
    for name in (f"{artifact.name}.c", f"{artifact.name}_kernels.c", f"{artifact.name}.h"):
        assert RUNTIME.search(artifact.path(name).read_text()) is None, name


def test_the_model_calls_nothing_but_libm_no_allocator_no_loader(built):
    _, artifact, _ = built
    external = harness.external_symbols(artifact.path(f"lib{artifact.name}.a"))
    assert external, "expected the library to call libm"
    assert external <= LIBM | {"memcpy", "memset"}, external


def test_the_workspace_is_smaller_than_the_vm_storage(built):
    _, artifact, _ = built
    assert artifact.peak_live_bytes <= artifact.workspace_bytes < artifact.vm_storage_bytes
    assert artifact.workspace_bytes < artifact.intermediate_bytes


def test_reshapes_are_views_of_their_source(built):
    _, artifact, _ = built
    program = read_program(artifact.model.module, artifact.model.entry)
    views = [
        arg
        for step in program.steps
        for arg in step.args
        if isinstance(arg, TensorRef) and arg.shape != arg.buffer.shape
    ]
    # The attention's vm.builtin.reshape (one per layer) and the position ids' reshape.
    assert len({id(v.buffer) for v in views}) >= 2


#: What installs the second architecture's tools on Debian.
CROSS_PACKAGES = "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"


@functools.cache
def _cross_tools() -> str | None:
    """Why the aarch64 C compiler or qemu cannot build and run a C program here, or None."""
    missing = [tool for tool in (CROSS_CC, QEMU) if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed ({CROSS_PACKAGES})"
    with tempfile.TemporaryDirectory() as folder:
        source, program = Path(folder) / "probe.c", Path(folder) / "probe"
        source.write_text('#include <stdio.h>\nint main(void) { return puts("") < 0; }\n')
        for command in (
            [CROSS_CC, str(source), "-o", str(program)],
            [QEMU, "-L", AARCH64_SYSROOT, str(program)],
        ):
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
                return f"{command[0]} failed on a probe ({detail}; {CROSS_PACKAGES})"
    return None


@pytest.mark.skipif(_cross_tools() is not None, reason=str(_cross_tools()))
def test_the_same_c_cross_compiled_for_aarch64_agrees_under_qemu(builds, tmp_path):
    model, artifact, _ = builds("bert")
    runner = harness.make(
        artifact, f"CC={CROSS_CC}", "AR=aarch64-linux-gnu-ar", build_dir=tmp_path / "aarch64"
    )
    header = runner.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64
    assert harness.tvm_symbols(runner) == set()
    results, _ = harness.run(
        artifact,
        runner,
        harness.numpy_inputs(model.inputs),
        prefix=(QEMU, "-L", AARCH64_SYSROOT),
    )
    for result, expected in zip(results, _expected(model), strict=True):
        np.testing.assert_allclose(result, expected, rtol=harness.RTOL, atol=harness.ATOL)
