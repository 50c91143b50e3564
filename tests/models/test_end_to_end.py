"""The real flows: Relax lowering, tvm.compile, export, a fresh process, a non-editable install."""

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tvm
from support.byoc_testing import intrinsic_calls
from support.fresh_process import run_python
from support.tir_programs import two_layers
from tvm import relax

import tir_byoc
from tir_byoc import demo

pytestmark = pytest.mark.usefixtures("reference_backend")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mlp():
    return demo.lowered_mlp()


def _fresh_python(script: str, cwd: Path) -> str:
    """Run ``script`` in a new interpreter that must not import tir_byoc; return its stdout."""
    guard = "import sys\nassert 'tir_byoc' not in sys.modules\n"
    check = "\nassert 'tir_byoc' not in sys.modules, 'the library needed tir_byoc'\n"
    return run_python(guard + textwrap.dedent(script) + check, cwd)


def test_the_lowered_mlp_is_fully_offloaded(mlp):
    matches = {m.func: m for m in tir_byoc.scan(mlp)}
    assert {f: (m.pattern, m.blocks) for f, m in matches.items()} == {
        "fused_matmul_add_relu": ("dense_bias_relu", ("matmul", "T_add", "compute")),
        "fused_matmul1_add1": ("dense_bias", ("matmul", "T_add")),
    }
    offloaded = tir_byoc.offload(mlp)
    assert intrinsic_calls(offloaded["fused_matmul_add_relu"]) == {"ref.dense_bias_relu": 1}
    assert intrinsic_calls(offloaded["fused_matmul1_add1"]) == {"ref.dense_bias": 1}
    assert offloaded["transpose"].same_as(mlp["transpose"])


def test_demo_runs_and_agrees_with_numpy():
    out = io.StringIO()
    error = demo.run(out=out)
    text = out.getvalue()
    assert error < 1e-3
    assert "fused_matmul_add_relu: blocks matmul, T_add, compute = dense_bias_relu" in text
    assert "agree with NumPy" in text


def test_relax_executable_exports_and_runs_in_a_fresh_process(mlp, tmp_path):
    target = tvm.target.Target("llvm")
    executable = tvm.compile(demo.default_schedule(tir_byoc.offload(mlp), target), target)
    library = tir_byoc.export_library(executable, tmp_path / "mlp.so")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((demo.BATCH, demo.IN_FEATURES)).astype("float32")
    params = demo.mlp_weights(rng)
    np.savez(tmp_path / "io.npz", x=x, *params)
    expected = demo.mlp_reference(x, *params)
    out = _fresh_python(
        f"""
        import numpy as np, tvm
        from tvm import relax
        data = np.load("io.npz")
        vm = relax.VirtualMachine(tvm.runtime.load_module("{library}"), tvm.cpu())
        args = [data["x"]] + [data[f"arr_{{i}}"] for i in range(4)]
        out = vm["forward"](*[tvm.runtime.tensor(a) for a in args]).numpy()
        np.save("out.npy", out)
        """,
        tmp_path,
    )
    assert out == ""
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-4, atol=1e-4)
    # Same in-process, through the Relax VM, without export.
    vm = relax.VirtualMachine(executable, tvm.cpu())
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, *params)]).numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_tir_executable_exports_and_runs_in_a_fresh_process(tmp_path):
    func = tir_byoc.offload(two_layers.with_attr("global_symbol", "main"))
    executable = tvm.compile(tvm.IRModule({"main": func}), "llvm")
    library = tir_byoc.export_library(executable, tmp_path / "layers.so")
    assert tir_byoc.export.used_backends(executable) == ["ref"]
    rng = np.random.default_rng(4)
    x, w1, b1, w2 = (
        rng.standard_normal(s).astype("float32") for s in [(4, 6), (5, 6), (5,), (3, 5)]
    )
    np.savez(tmp_path / "io.npz", x=x, w1=w1, b1=b1, w2=w2)
    _fresh_python(
        f"""
        import numpy as np, tvm
        data = np.load("io.npz")
        lib = tvm.runtime.load_module("{library}")
        out = tvm.runtime.tensor(np.zeros((4, 3), "float32"))
        lib["main"](*[tvm.runtime.tensor(data[k]) for k in ("x", "w1", "b1", "w2")], out)
        np.save("out.npy", out.numpy())
        """,
        tmp_path,
    )
    expected = np.maximum(x @ w1.T + b1, 0) @ w2.T
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, rtol=1e-4, atol=1e-4)


def test_export_rejects_what_is_not_a_built_module(tmp_path):
    with pytest.raises(TypeError, match=r"expected the result of tvm\.compile"):
        tir_byoc.export_library(two_layers, tmp_path / "x.so")


def test_a_non_editable_install_builds_and_runs_its_intrinsics(tmp_path):
    """``pip install .`` ships the C sources; the installed copy compiles them on first use."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    script = textwrap.dedent(
        """
        import numpy as np, tvm, tir_byoc
        assert tir_byoc.__file__.startswith(SITE), tir_byoc.__file__
        func = tir_byoc.describe("dense_relu", index_dtype="int32")
        func = tir_byoc.offload(func.with_attr("global_symbol", "main"), strict=True)
        lib = tvm.compile(tvm.IRModule({"main": func}), "llvm")
        x = np.random.rand(3, 4).astype("float32") - 0.5
        w = np.random.rand(5, 4).astype("float32") - 0.5
        y = tvm.runtime.tensor(np.zeros((3, 5), "float32"))
        lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), y)
        np.testing.assert_allclose(y.numpy(), np.maximum(x @ w.T, 0), rtol=1e-5, atol=1e-5)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(target), "TIR_BYOC_CACHE_DIR": str(tmp_path / "c")}
    result = subprocess.run(
        [sys.executable, "-c", f"SITE = {str(target)!r}\n" + script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert list((tmp_path / "c" / "ref").glob("libtir_byoc_ref-*.so"))
