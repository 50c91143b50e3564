"""Fixtures shared by the test suite."""

import pytest

import tir_byoc


@pytest.fixture
def reference_backend(monkeypatch):
    """Serve every match with the portable reference kernels, whatever libraries are installed.

    Tests of the core use it (``pytestmark``) so that what they expect does not depend on
    whether oneDNN or OpenBLAS is present; the backend tests choose backends explicitly.
    """
    monkeypatch.setenv(tir_byoc.registry.BACKENDS_ENV, "ref")


@pytest.fixture(autouse=True)
def _no_backend_override(monkeypatch):
    """Tests choose backends explicitly; a developer's TIR_BYOC_BACKENDS must not leak in."""
    monkeypatch.delenv(tir_byoc.registry.BACKENDS_ENV, raising=False)
