"""tir_byoc.threads: thread settings filled in before a library loads, never over the user's."""

from __future__ import annotations

import os

import pytest

from tir_byoc import threads

VARIABLES = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_THREAD_TIMEOUT",
    "TVM_NUM_THREADS",
    "TVM_THREAD_POOL_SPIN_COUNT",
    threads.OPT_OUT_ENV,
)


@pytest.fixture
def clean_env(monkeypatch):
    """No thread variables set; whatever configure() sets is undone after the test."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_applied", {})
    monkeypatch.setattr(threads, "_loaded", lambda fragment: False)  # libraries not loaded yet
    return monkeypatch


def test_defaults_fill_in_unset_variables(clean_env):
    import os

    applied = threads.configure("openmp")
    assert applied == {
        "GOMP_SPINCOUNT": threads.IDLE_DEFAULTS["GOMP_SPINCOUNT"],
        "TVM_THREAD_POOL_SPIN_COUNT": threads.IDLE_DEFAULTS["TVM_THREAD_POOL_SPIN_COUNT"],
    }
    assert os.environ["GOMP_SPINCOUNT"] == threads.IDLE_DEFAULTS["GOMP_SPINCOUNT"]
    assert threads.configure("openmp") == {}  # a second call changes nothing
    assert threads.applied() == applied


def test_user_settings_win(clean_env):
    import os

    clean_env.setenv("OMP_WAIT_POLICY", "ACTIVE")
    clean_env.setenv("TVM_THREAD_POOL_SPIN_COUNT", "123")
    clean_env.setenv("OPENBLAS_THREAD_TIMEOUT", "28")
    assert threads.configure("openmp") == {}
    assert threads.configure("openblas") == {}
    assert "GOMP_SPINCOUNT" not in os.environ
    assert os.environ["TVM_THREAD_POOL_SPIN_COUNT"] == "123"


def test_library_thread_count_follows_tvm_num_threads(clean_env):
    clean_env.setenv("TVM_NUM_THREADS", "1")
    clean_env.setenv("OPENBLAS_NUM_THREADS", "2")
    assert threads.configure("openmp")["OMP_NUM_THREADS"] == "1"
    assert "OPENBLAS_NUM_THREADS" not in threads.configure("openblas")


def test_opt_out_keeps_library_defaults(clean_env):
    clean_env.setenv(threads.OPT_OUT_ENV, "0")
    assert threads.configure("openmp") == {}
    assert threads.applied() == {}


def test_unknown_library_is_an_error(clean_env):
    with pytest.raises(
        ValueError, match=r"expected a library in \['openblas', 'openmp'\], got 'mkl'"
    ):
        threads.configure("mkl")


def test_tvm_pool_sleeps_at_once_when_libgomp_loaded_too_early(clean_env):
    import os

    threads.configure("openblas")  # TVM's spin default set first, as when OpenBLAS loads first
    clean_env.setattr(threads, "_loaded", lambda fragment: fragment == "libgomp")
    applied = threads.configure("openmp")
    assert "GOMP_SPINCOUNT" not in os.environ  # it would no longer apply
    assert applied["TVM_THREAD_POOL_SPIN_COUNT"] == os.environ["TVM_THREAD_POOL_SPIN_COUNT"] == "0"


def test_tvm_spin_set_by_the_user_is_kept_when_libgomp_loaded_too_early(clean_env):
    import os

    clean_env.setenv("TVM_THREAD_POOL_SPIN_COUNT", "500")
    clean_env.setattr(threads, "_loaded", lambda fragment: fragment == "libgomp")
    assert threads.configure("openmp") == {}
    assert os.environ["TVM_THREAD_POOL_SPIN_COUNT"] == "500"


def test_tvm_pool_spin_is_set_short_before_the_pool_starts_even_with_libgomp_loaded(clean_env):
    """Only a oneDNN backend needs TVM's pool asleep beside an early libgomp: MKL and OpenBLAS
    kernels run on TVM's pool or their own, and a pool told never to spin woke late for each
    parallel loop (BERT b1, 2 threads: 11.27 against 10.34 ms)."""
    import os

    assert threads.configure_tvm() == {"TVM_THREAD_POOL_SPIN_COUNT": "1000"}
    assert threads.configure_tvm() == {}  # once
    clean_env.delenv("TVM_THREAD_POOL_SPIN_COUNT")
    clean_env.setattr(threads, "_applied", {})
    clean_env.setattr(threads, "_loaded", lambda fragment: fragment == "libgomp")
    assert threads.configure_tvm() == {"TVM_THREAD_POOL_SPIN_COUNT": "1000"}
    # Locating oneDNN then tells the pool (not started yet) to sleep at once.
    assert threads.configure("openmp") == {"TVM_THREAD_POOL_SPIN_COUNT": "0"}
    clean_env.setenv("TVM_THREAD_POOL_SPIN_COUNT", "7")
    clean_env.setattr(threads, "_applied", {})
    assert threads.configure_tvm() == {}
    assert os.environ["TVM_THREAD_POOL_SPIN_COUNT"] == "7"


def test_torch_imported_first_leaves_tvm_pool_spinning_until_onednn_is_located():
    """The flow of a torch user: ``import torch`` (libgomp loaded with its own spin), then
    tir_byoc; the default backend's build keeps the short spin, a oneDNN one sets none."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    code = (
        "import os, torch, tir_byoc; from tir_byoc import threads; "
        "spin = lambda: os.environ.get('TVM_THREAD_POOL_SPIN_COUNT'); "
        "before = spin(); threads.configure('openblas'); after_openblas = spin(); "
        "threads.configure('openmp'); print(before, after_openblas, spin())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[-3:] == ["1000", "1000", "0"], out.stderr


def test_importing_tir_byoc_sets_tvm_pool_spin_before_any_model_runs():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    code = "import os, tir_byoc; print(os.environ.get('TVM_THREAD_POOL_SPIN_COUNT'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "1000", out.stderr


def test_openmp_spin_is_set_before_libgomp_loads_and_never_after(clean_env):
    import os

    assert threads.configure_openmp_early() == {"GOMP_SPINCOUNT": "1000"}
    assert threads.configure_openmp_early() == {}  # once
    # A oneDNN backend located later keeps it, and TVM's pool spins briefly too.
    clean_env.setattr(threads, "_loaded", lambda fragment: fragment == "libgomp")
    assert threads.configure("openmp") == {"TVM_THREAD_POOL_SPIN_COUNT": "1000"}
    # Too late: libgomp has read its environment already.
    clean_env.delenv("GOMP_SPINCOUNT")
    clean_env.setattr(threads, "_applied", {})
    assert threads.configure_openmp_early() == {}
    assert "GOMP_SPINCOUNT" not in os.environ


def test_openmp_thread_count_follows_tvm_num_threads_before_libgomp_loads(clean_env):
    import os

    clean_env.setenv("OMP_NUM_THREADS", "")  # so that the test's end unsets it again
    clean_env.delenv("OMP_NUM_THREADS")
    clean_env.setenv("TVM_NUM_THREADS", "3")
    clean_env.setenv("GOMP_SPINCOUNT", "99")
    assert threads.configure_openmp_early() == {"OMP_NUM_THREADS": "3"}
    assert os.environ["OMP_NUM_THREADS"] == "3"
    # Set by the user, or too late: left alone.
    clean_env.setenv("OMP_NUM_THREADS", "2")
    clean_env.setattr(threads, "_applied", {})
    assert threads.configure_openmp_early() == {}
    clean_env.delenv("OMP_NUM_THREADS")
    clean_env.setattr(threads, "_loaded", lambda fragment: fragment == "libgomp")
    assert threads.configure_openmp_early() == {}
    assert "OMP_NUM_THREADS" not in os.environ


@pytest.mark.parametrize("choice", ["GOMP_SPINCOUNT", "OMP_WAIT_POLICY", threads.OPT_OUT_ENV])
def test_openmp_spin_chosen_by_the_user_is_kept(clean_env, choice):
    import os

    value = {"OMP_WAIT_POLICY": "ACTIVE", threads.OPT_OUT_ENV: "0"}.get(choice, "99")
    clean_env.setenv(choice, value)
    assert threads.configure_openmp_early() == {}
    assert os.environ.get("GOMP_SPINCOUNT") == (value if choice == "GOMP_SPINCOUNT" else None)


@pytest.mark.parametrize(("omp_threads", "warns"), [("2", True), ("1", False)])
def test_libgomp_loaded_too_early_is_reported_once_when_it_has_workers(
    clean_env, caplog, omp_threads, warns
):
    clean_env.setattr(threads, "_warned", False)
    clean_env.setattr(threads, "_loaded", lambda fragment: fragment == "libgomp")
    clean_env.setenv("OMP_NUM_THREADS", omp_threads)
    with caplog.at_level("WARNING", logger="tir_byoc"):
        threads.configure("openmp")
        threads.configure("openmp")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ([threads.LONG_SPIN_WARNING] if warns else [])
    assert "GOMP_SPINCOUNT=1000" in threads.LONG_SPIN_WARNING


def test_importing_tir_byoc_sets_the_openmp_spin_before_libgomp_loads():
    """Importing tir_byoc loads libgomp (through TVM and PyTorch) with its spin already set."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    code = (
        "import os, tir_byoc; "
        "print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('TVM_THREAD_POOL_SPIN_COUNT'), "
        "'libgomp' in open('/proc/self/maps').read())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[-3:] == ["1000", "1000", "True"], out.stderr


def test_importing_tir_byoc_gives_openmp_the_tvm_thread_count_before_libgomp_loads():
    """libgomp reads ``OMP_NUM_THREADS`` once, as PyTorch loads it during ``import tir_byoc``;
    a count set later, when oneDNN is located, left oneDNN on every core."""
    import subprocess
    import sys

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: libgomp's own default is one thread too")
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env["TVM_NUM_THREADS"] = "1"  # PyTorch caps the count at the cores, so not more
    code = (
        "import ctypes, tir_byoc; "
        "gomp = [l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l][0]; "
        "print(ctypes.CDLL(gomp).omp_get_max_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[-1:] == ["1"], out.stderr
