"""The OpenBLAS backend: every pattern against NumPy (fp32), selection, fallbacks, export."""

from __future__ import annotations

import pytest
from support.backend_checks import (
    FIXED,
    check_pattern,
    check_status_codes_of_a_32_bit_blas,
    describe,
    require_available,
    run_exported_mlp_in_fresh_process,
    uninstall_every_wheel,
)

import tir_byoc
from tir_byoc.backends import openblas
from tir_byoc.registry import BackendUnavailable


@pytest.fixture(scope="module", autouse=True)
def _openblas_installed():
    require_available("openblas")


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
    uninstall_every_wheel(monkeypatch)
    with pytest.raises(
        BackendUnavailable, match=r"scipy-openblas32 is not installed .*pip install"
    ):
        openblas.locate()


def test_status_codes_at_entry():
    # BLAS indexes with 32-bit ints: larger extents are refused before anything is touched.
    check_status_codes_of_a_32_bit_blas("openblas")


def test_exported_library_runs_in_a_fresh_process(tmp_path):
    report = run_exported_mlp_in_fresh_process("openblas", tmp_path)
    assert "libscipy_openblas" in report
