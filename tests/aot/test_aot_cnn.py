"""A small CNN as plain C (im2col GEMMs, batch norm, pooling kernels), and the same C built
with AddressSanitizer and UndefinedBehaviorSanitizer: no report."""

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from support import aot_harness as harness

import tir_byoc.aot as aot
from tir_byoc.testing import models

SANITIZE = "-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    model = models.small_cnn()
    artifact = aot.build(
        model.module,
        model.inputs,
        out_dir=tmp_path_factory.mktemp("cnn"),
        name="cnn",
        backends="ref",
    )
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    return model, artifact, expected


def test_the_cnn_runs_without_tvm_and_agrees_with_torch_and_the_vm(cnn):
    model, artifact, expected = cnn
    runner = harness.make(artifact)
    assert harness.tvm_symbols(runner) == set()
    inputs = harness.numpy_inputs(model.inputs)
    (result,), _ = harness.run(artifact, runner, inputs)
    np.testing.assert_allclose(result, expected, rtol=harness.RTOL, atol=harness.ATOL)
    np.testing.assert_allclose(result, artifact.model(*inputs), rtol=1e-5, atol=1e-5)
    # The convolutions and the classifier are GEMMs of the reference kernels.
    assert artifact.intrinsic_steps == 3


def _sanitizers_missing() -> str | None:
    """Why this machine's C compiler cannot build with the sanitizers, or None."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "probe.c"
        source.write_text("int main(void) { return 0; }\n")
        result = subprocess.run(
            ["cc", *SANITIZE.split(), str(source), "-o", str(Path(folder) / "probe")],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        return f"cc cannot link -fsanitize=address,undefined here: {result.stderr.strip()[-200:]}"
    return None


@pytest.mark.skipif(_sanitizers_missing() is not None, reason=str(_sanitizers_missing()))
def test_under_address_and_undefined_behaviour_sanitizers_nothing_is_reported(cnn, tmp_path):
    model, artifact, expected = cnn
    runner = harness.make(
        artifact, f"CFLAGS={SANITIZE}", f"LDFLAGS={SANITIZE}", build_dir=tmp_path / "asan"
    )
    (result,), process = harness.run(
        artifact,
        runner,
        harness.numpy_inputs(model.inputs),
        env={
            "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
            "UBSAN_OPTIONS": "print_stacktrace=1",
        },
    )
    assert process.stderr == ""
    np.testing.assert_allclose(result, expected, rtol=harness.RTOL, atol=harness.ATOL)
