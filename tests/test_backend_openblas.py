"""The OpenBLAS backend: every pattern against NumPy (fp32), selection, fallbacks, export."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest
from backend_checks import (
    call_intrinsic,
    check_pattern,
    describe,
    library,
    run_exported_mlp_in_fresh_process,
)

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.backends import openblas
from tir_byoc.patterns import FIXED_EPILOGUES, PATTERNS
from tir_byoc.registry import BackendUnavailable
from tir_byoc.signature import DtypeSignature

#: The members with entry points of their own; the gemm entry point's epilogues are
#: checked op by op in test_epilogue_c.py and through TVM in test_match_epilogues.py.
FIXED = [n for n, p in PATTERNS.items() if p.ops in FIXED_EPILOGUES]

F32 = DtypeSignature.parse("float32").code


@pytest.fixture(scope="module", autouse=True)
def _openblas_installed():
    reason = toolchain.unavailable("openblas")
    if reason is not None:
        pytest.fail(f"the OpenBLAS backend must be available in the test environment: {reason}")


@pytest.mark.parametrize("pattern", FIXED)
def test_every_pattern_matches_numpy(pattern):
    check_pattern(pattern, "float32", "openblas")


def test_registered_below_onednn_and_above_ref():
    priorities = {
        backend: tir_byoc.REGISTRY[f"{backend}.dense_bias_relu"].priority
        for backend in ("onednn", "openblas", "ref")
    }
    assert priorities["onednn"] > priorities["openblas"] > priorities["ref"]
    func = describe("matmul_bias", "float32")
    (match,) = tir_byoc.scan(func, backends=["openblas", "ref"])
    assert match.intrinsic == "openblas.matmul_bias"


def test_only_fp32_is_claimed():
    func = describe("dense", "bfloat16,bfloat16->float32")
    (match,) = tir_byoc.scan(func, backends=["openblas"])
    assert match.intrinsic is None
    assert match.reason == (
        "openblas.dense: dtype bfloat16,bfloat16->float32 not supported (supports float32)"
    )


def test_locate_says_what_to_install_when_the_wheel_is_missing(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(
        BackendUnavailable, match=r"scipy-openblas32 is not installed .*pip install"
    ):
        openblas.locate()


def test_status_codes_at_entry():
    lib = library("openblas")
    x = np.ones((2, 3), "float32")
    w = np.ones((4, 3), "float32")
    bias = np.arange(4, dtype="float32")
    y = np.zeros((2, 4), "float32")
    f64 = DtypeSignature.parse("float64").code
    symbol = "tir_byoc_openblas_dense_bias_relu"
    assert call_intrinsic(lib, symbol, x, w, bias, y, m=2, n=4, k=3, signature=F32) == 0
    np.testing.assert_array_equal(y, np.broadcast_to(3 + bias, (2, 4)))
    assert call_intrinsic(lib, symbol, x, w, bias, y, m=2, n=4, k=3, signature=f64) == 1
    # BLAS indexes with 32-bit ints: larger extents are refused before anything is touched.
    assert call_intrinsic(lib, symbol, x, w, bias, y, m=2**31, n=4, k=3, signature=F32) == 2
    assert call_intrinsic(lib, symbol, x, w, None, y, m=2, n=4, k=3, signature=F32) == 3


def test_exported_library_runs_in_a_fresh_process(tmp_path):
    report = run_exported_mlp_in_fresh_process("openblas", tmp_path)
    assert "libscipy_openblas" in report
