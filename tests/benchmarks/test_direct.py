"""The direct-call harnesses of benchmarks/direct.py: the LAYER specs they take and refuse.

Each harness is compiled once (cached under benchmarks/results/bin, as the benchmark does) and
run for one untimed repeat on tiny layers: 2-D and batched, plain, prepacked, and interleaved
with tir_byoc's oneDNN intrinsics, where the harness first checks that the intrinsic computes
what the primitive does.  Only the output's form is checked, never a time; the oneDNN
harness's outputs on given inputs (its check mode) are compared with NumPy.
"""

import subprocess

import numpy as np
import pytest
from support.benchmark_modules import benchmark_modules

from tir_byoc import toolchain

#: LAYER specs both harnesses take: 2-D, batched (the trailing count), with bias and relu.
SPECS = ["4:3:5:f32:dense:1:1", "4:3:5:f32:matmul:0:0:2", "4:3:5:f32:dense:1:1:3"]
#: Specs both refuse: a batch of 0, a batch that is not a number, a field too many, an
#: unknown post-op, post-ops on an integer layer, two tensor post-ops.
BAD_SPECS = [
    "4:3:5:f32:matmul:0:0:0",
    "4:3:5:f32:matmul:0:0:x",
    "4:3:5:f32:dense:0:0:2:2",
    "4:3:5:f32:dense:0:erf",
    "4:3:5:u8s8:dense:1:gelu",
    "4:3:5:f32:dense:1:add+mul",
]
#: Layers with post-ops beyond relu (the oneDNN harness only; interleaved through the gemm
#: entry point), and a chain of two: the gated MLP's up projection, then the gate GEMM whose
#: SiLU output it multiplies.
EPILOGUE_SPECS = [
    ["4:3:5:f32:dense:1:gelu"],
    ["4:3:5:f32:matmul:1:gelu_tanh+add:2"],
    ["4:3:5:f32:dense:0:sigmoid", "4:3:5:f32:dense:1:tanh+mul"],
    ["4:3:5:f32:dense:0:0", "4:3:5:f32:dense:0:silu+mul"],
]


@pytest.fixture(scope="module")
def harness():
    with benchmark_modules("direct") as (direct,):
        yield {library: direct._direct_binary(library) for library in direct.SOURCES}


def _run(binary, *argv):
    return subprocess.run(
        [str(binary), "0", "1", *argv], capture_output=True, text=True, timeout=120
    )


def _check_output(stdout: str, times: int, layers: int = 1) -> None:
    """The harness printed ``times`` times in ms, then the kernel that ran each layer."""
    fields = stdout.split()
    assert len(fields) == times + layers
    assert all(float(f) >= 0 for f in fields[:times])


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("mode", ["plain", "prepacked", "interleaved"])
def test_the_onednn_harness_runs_2d_and_batched_layers(harness, mode, spec):
    if mode == "interleaved":
        mode = f"interleaved:{toolchain.shared_library('onednn')}"
    result = _run(harness["onednn"], mode, spec)
    assert result.returncode == 0, result.stderr
    _check_output(result.stdout, 2 if mode.startswith("interleaved") else 1)


@pytest.mark.parametrize("spec", SPECS)
def test_the_openblas_harness_runs_2d_and_batched_layers(harness, spec):
    result = _run(harness["openblas"], spec)
    assert result.returncode == 0, result.stderr
    _check_output(result.stdout, 1)


@pytest.mark.parametrize("spec", BAD_SPECS)
@pytest.mark.parametrize("library", ["onednn", "openblas"])
def test_a_bad_layer_is_refused_with_the_format(harness, library, spec):
    argv = ["plain", spec] if library == "onednn" else [spec]
    result = _run(harness[library], *argv)
    assert result.returncode == 2 and result.stdout == ""
    assert f"bad layer {spec}: expected M:N:K:" in result.stderr and "[:BATCH]" in result.stderr


@pytest.mark.parametrize("specs", EPILOGUE_SPECS, ids="|".join)
@pytest.mark.parametrize("mode", ["plain", "prepacked", "interleaved"])
def test_the_onednn_harness_runs_epilogue_layers(harness, mode, specs):
    if mode == "interleaved":
        mode = f"interleaved:{toolchain.shared_library('onednn')}"
    result = _run(harness["onednn"], mode, *specs)
    assert result.returncode == 0, result.stderr
    _check_output(result.stdout, 2 if mode.startswith("interleaved") else 1, len(specs))


def _random(*shape, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("prepacked", [False, True], ids=["plain", "prepacked"])
def test_the_onednn_harness_computes_the_epilogue_on_given_inputs(harness, prepacked):
    import direct

    x, w, b, r = _random(4, 5), _random(6, 5), _random(6), _random(4, 6, seed=1)
    (y,) = direct.compute_direct(["4:6:5:f32:dense:1:gelu_tanh+add"], [[x, w, b, r]], prepacked)
    z = x.astype(np.float64) @ w.T + b
    gelu = 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))
    np.testing.assert_allclose(y.reshape(4, 6), gelu + r, rtol=1e-5, atol=1e-5)
    # The gated MLP: the second layer reads the first one's X, and multiplies by its output.
    w_up = _random(6, 5, seed=2)
    specs = ["4:6:5:f32:dense:0:0", "4:6:5:f32:dense:0:silu+mul"]
    up, out = direct.compute_direct(specs, [[x, w_up, None, None], [None, w, None, None]])
    gate = x.astype(np.float64) @ w.T
    np.testing.assert_allclose(up.reshape(4, 6), x @ w_up.T, rtol=1e-5, atol=1e-5)
    expected = gate / (1 + np.exp(-gate)) * (x.astype(np.float64) @ w_up.T)
    np.testing.assert_allclose(out.reshape(4, 6), expected, rtol=1e-5, atol=1e-5)


def test_the_onednn_harness_refuses_an_input_a_layer_does_not_own(harness):
    import direct

    x, w = _random(4, 5), _random(6, 5)
    specs = ["4:6:5:f32:dense:0:0", "4:6:5:f32:dense:0:silu+mul"]
    with pytest.raises(subprocess.CalledProcessError) as error:
        direct.compute_direct(specs, [[x, w, None, None], [x, w, None, None]])
    assert "expected 0 bytes of float32 that layer 1 owns" in error.value.stderr
    with pytest.raises(subprocess.CalledProcessError) as error:
        direct.compute_direct(["4:6:5:f32:dense:0:0"], [[x[:2], w, None, None]])
    assert "expected 80 bytes of float32 that layer 0 owns" in error.value.stderr
