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


#: The longest test files, longest first (seconds in the CI run of 2026-12-03 on the 2-vCPU AMD
#: EPYC Zen 3 VM: 113, 109, 83, 66, 65, 58, 56, and about 50 for the pairs since then).  They
#: start first: under ``--dist=loadfile`` a long file handed out last runs alone on one worker
#: while the other idles.  Only the order changes; a file missing here runs where collected.
SLOWEST_FIRST = (
    "tests/meta_schedule/test_meta_schedule.py",
    "tests/models/test_real_models.py",
    "tests/properties/test_equivalence.py",
    "tests/meta_schedule/test_packing.py",
    "tests/models/test_frontend_ops.py",
    "tests/properties/test_packed_weights.py",
    "tests/cli/test_cli.py",
    "tests/models/test_conv_pairs.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
