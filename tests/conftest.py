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


#: The longest test files, longest first (seconds in a CI run of 2026-12-03 on the 2-vCPU AMD
#: EPYC Zen 3 VM: 121 down to 19).  They start first, and the Makefile turns off xdist's own
#: order (files with the most tests first, which left the long one-test property files to the
#: end, each alone on one worker while the other idled).  Only the order changes: a file not
#: listed runs in collection order after these.
SLOWEST_FIRST = (
    "tests/meta_schedule/test_meta_schedule.py",
    "tests/models/test_real_models.py",
    "tests/properties/test_equivalence.py",
    "tests/meta_schedule/test_packing.py",
    "tests/models/test_frontend_ops.py",
    "tests/properties/test_packed_weights.py",
    "tests/cli/test_cli.py",
    "tests/core/test_patterns.py",
    "tests/models/test_conv_pairs.py",
    "tests/properties/test_real_model_sizes.py",
    "tests/models/test_cnn_models.py",
    "tests/models/test_dynamic.py",
    "tests/core/test_packing.py",
    "tests/meta_schedule/test_sizes.py",
    "tests/cli/test_golden.py",
    "tests/properties/test_model_layers.py",
    "tests/backends/test_threads.py",
    "tests/relax/test_channels_last.py",
    "tests/models/test_end_to_end.py",
    "tests/properties/test_non_interference.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
