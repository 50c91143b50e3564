"""The forum thread's story as plain C: the MLP's entry calls dense_bias_relu then dense_bias,
the intermediate in the workspace; the user's own toy_cg_thflow kernel; errors come back."""

import dataclasses
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from support import aot_harness as harness
from support.files import import_file

import tir_byoc.aot as aot
from tir_byoc import REGISTRY, toolchain
from tir_byoc.demo import lowered_mlp, mlp_reference, mlp_weights
from tir_byoc.testing import models

TOY = Path(__file__).resolve().parents[2] / "examples" / "toy_cg_thflow"


@pytest.fixture(scope="module")
def relax_mlp(tmp_path_factory):
    """The demo's Relax MLP (weights are inputs), reference kernels, made."""
    artifact = aot.build(
        lowered_mlp(), out_dir=tmp_path_factory.mktemp("mlp"), name="mlp", backends="ref"
    )
    return artifact, harness.make(artifact)


@pytest.fixture(scope="module")
def torch_mlp(tmp_path_factory):
    """The forum MLP as a torch model (weights are constants), reference kernels."""
    model = models.forum_mlp()
    artifact = aot.build(
        model.module,
        model.inputs,
        out_dir=tmp_path_factory.mktemp("forum_mlp"),
        name="forum_mlp",
        backends="ref",
    )
    return model, artifact, harness.make(artifact)


def test_the_entry_reads_like_the_forum_wish(relax_mlp):
    artifact, _ = relax_mlp
    source = artifact.path("mlp.c").read_text()
    calls = [line.strip() for line in source.splitlines() if "status = " in line]
    assert calls == [
        "status = tir_byoc_ref_dense_bias_relu(x, fc1_weight, fc1_bias, ws + 0, 64, 500, 800, "
        "65793);",
        "status = tir_byoc_ref_dense_bias(ws + 0, fc2_weight, fc2_bias, out, 64, 10, 500, 65793);",
    ]
    assert artifact.intrinsic_steps == 2 and len(artifact.steps) == 2
    header = artifact.path("mlp.h").read_text()
    assert "#define MLP_WORKSPACE_BYTES 128000" in header  # the (64, 500) intermediate, once
    assert "#define MLP_CONSTANTS_BYTES 0" in header
    assert "#define MLP_INPUT0_SHAPE {64, 800}" in header
    assert "int32_t mlp_run(const float *x, const float *fc1_weight" in header


def test_the_relax_mlp_runs_without_tvm_and_agrees(relax_mlp):
    artifact, runner = relax_mlp
    assert harness.tvm_symbols(runner) == set()
    assert harness.tvm_symbols(artifact.path("libmlp.a")) == set()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((64, 800)).astype("float32"), *mlp_weights(rng)]
    (result,), _ = harness.run(artifact, runner, inputs)
    np.testing.assert_allclose(result, mlp_reference(*inputs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(result, artifact.model(*inputs), rtol=1e-5, atol=1e-5)


def test_the_torch_mlp_links_its_weights_in_and_agrees_with_torch_and_the_vm(torch_mlp):
    model, artifact, runner = torch_mlp
    assert harness.tvm_symbols(runner) == set()
    source = artifact.path("forum_mlp.c").read_text()
    # The weights are named after the torch parameters they are.
    assert "tir_byoc_ref_dense_bias_relu(x, fc1_weight, fc1_bias, ws + 0," in source
    assert "int32_t forum_mlp_run(const float *x, float *out, void *workspace)" in source
    assert artifact.constants_bytes >= 4 * (500 * 800 + 500 + 10 * 500 + 10)
    inputs = harness.numpy_inputs(model.inputs)
    (result,), _ = harness.run(artifact, runner, inputs)
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    np.testing.assert_allclose(result, expected, rtol=harness.RTOL, atol=harness.ATOL)
    np.testing.assert_allclose(result, artifact.model(*inputs), rtol=1e-5, atol=1e-5)


def test_blob_constants_are_passed_in_and_give_the_same_result(torch_mlp, tmp_path):
    model, embedded, runner = torch_mlp
    artifact = aot.build(embedded.model, out_dir=tmp_path / "blob", name="blob_mlp",
                         constants=aot.BLOB)  # fmt: skip
    assert not artifact.path("blob_mlp_constants.c").exists()
    blob = artifact.path("blob_mlp_constants.bin")
    assert blob.stat().st_size == artifact.constants_bytes == embedded.constants_bytes
    assert "void *workspace, const void *constants)" in artifact.path("blob_mlp.h").read_text()
    inputs = harness.numpy_inputs(model.inputs)
    (expected,), _ = harness.run(embedded, runner, inputs)
    (result,), _ = harness.run(artifact, harness.make(artifact), inputs)
    np.testing.assert_array_equal(result, expected)


_OPENBLAS = toolchain.unavailable("openblas")


@pytest.mark.skipif(_OPENBLAS is not None, reason=str(_OPENBLAS))
def test_a_library_backend_links_its_library(tmp_path):
    artifact = aot.build(
        lowered_mlp(), out_dir=tmp_path / "openblas", name="mlp", backends="openblas"
    )
    assert artifact.backends == ("openblas",)
    flags = artifact.path("link_flags").read_text().split()
    assert any(f.startswith("-lscipy_openblas") for f in flags) and flags[-1] == "-lm"
    runner = harness.make(artifact)
    assert harness.tvm_symbols(runner) == set()
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((64, 800)).astype("float32"), *mlp_weights(rng)]
    (result,), _ = harness.run(artifact, runner, inputs)
    np.testing.assert_allclose(result, mlp_reference(*inputs), rtol=1e-4, atol=1e-4)


# -- the user's own kernel: seed 000 end to end -------------------------------------------


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy_cg_thflow example's MLP as C: the example's module registers the toy kernel,
    which is unregistered again afterwards (it would serve every later dense_bias_relu)."""
    try:
        import_file(TOY / "toy_intrinsic.py")  # run_mlp imports it by its bare name
        run_mlp = import_file(TOY / "run_mlp.py")  # registers toy_cg_thflow.dense_bias_relu

        return aot.build(
            run_mlp.lower_mlp(),
            out_dir=tmp_path_factory.mktemp("toy"),
            name="toy_mlp",
            backends="toy_cg_thflow,ref",
        )
    finally:
        for module in ("run_mlp", "toy_intrinsic"):
            sys.modules.pop(module, None)
        if "toy_cg_thflow.dense_bias_relu" in REGISTRY:
            REGISTRY.unregister("toy_cg_thflow.dense_bias_relu")


def test_toy_cg_thflow_serves_the_first_layer_of_the_c_model(toy):
    assert toy.backends == ("ref", "toy_cg_thflow")
    source = toy.path("toy_mlp.c").read_text()
    calls = [line.strip() for line in source.splitlines() if "status = " in line]
    assert calls == [
        "status = toy_cg_thflow_dense_bias_relu(x, fc1_weight, fc1_bias, ws + 0, 64, 500, 800, "
        "65793);",
        "status = tir_byoc_ref_dense_bias(ws + 0, fc2_weight, fc2_bias, out, 64, 10, 500, 65793);",
    ]
    runner = harness.make(toy)
    assert harness.tvm_symbols(runner) == set()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((64, 800)).astype("float32"), *mlp_weights(rng)]
    (result,), _ = harness.run(toy, runner, inputs)
    np.testing.assert_allclose(result, mlp_reference(*inputs), rtol=1e-4, atol=1e-4)


def test_a_failing_intrinsic_status_is_the_entry_s_return_value(toy, tmp_path):
    # The toy kernel made to refuse every shape: the entry returns its TIR_BYOC_ESHAPE (2)
    # instead of aborting, and the second layer never runs.
    build = tmp_path / "broken"
    shutil.copytree(toy.out_dir, build, ignore=shutil.ignore_patterns("*.o", "*.a", "io"))
    kernel = build / "intrinsics" / "toy_cg_thflow" / "toy_cg_thflow.c"
    source = kernel.read_text()
    refused = source.replace(
        "if (dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;", "return TIR_BYOC_ESHAPE;"
    )
    assert refused != source
    kernel.write_text(refused)
    broken = dataclasses.replace(toy, out_dir=build)
    runner = harness.make(broken)
    inputs = [np.ones(s.shape, s.dtype) for s in broken.inputs]
    with pytest.raises(AssertionError, match="toy_mlp_run returned 2"):
        harness.run(broken, runner, inputs)


_MISUSE = textwrap.dedent(
    """
    #include <stdio.h>
    #include <stdint.h>
    #include "mlp.h"
    static _Alignas(64) uint8_t workspace[MLP_WORKSPACE_BYTES + 64];
    static float x[64 * 800], w1[500 * 800], b1[500], w2[10 * 500], b2[10], out[64 * 10];
    int main(void) {
      printf("%d %d %d\\n",
             mlp_run(x, w1, b1, w2, b2, out, workspace + 8),  /* misaligned workspace */
             mlp_run(x, w1, b1, w2, b2, out, NULL),           /* no workspace */
             mlp_run(x, w1, b1, w2, b2, out, workspace));     /* fine */
      return 0;
    }
    """
)


def test_misaligned_and_null_pointers_are_status_codes(relax_mlp, tmp_path):
    artifact, _ = relax_mlp
    main = tmp_path / "misuse.c"
    main.write_text(_MISUSE)
    program = tmp_path / "misuse"
    flags = artifact.path("link_flags").read_text().split()
    subprocess.run(
        ["cc", "-O1", f"-I{artifact.out_dir}", str(main), str(artifact.path("libmlp.a")),
         *flags, "-o", str(program)],
        check=True,
    )  # fmt: skip
    result = subprocess.run([str(program)], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["101", "102", "0"]  # MLP_EALIGN, MLP_ENULL, MLP_OK
    header = artifact.path("mlp.h").read_text()
    assert "#define MLP_EALIGN 101" in header and "#define MLP_ENULL 102" in header
