"""Thread settings that keep TVM's thread pool and the libraries' pools off each other's cores.

Entry point: :func:`configure`, which a library backend's ``locate`` calls before its library
is loaded (OpenMP and OpenBLAS read their environment once, when they load).  It only fills in
variables the user has not set, and :func:`applied` lists what it set.

What it sets, and why (measured on a 2-core machine, see ``docs/backends.md``):

* thread count: a library follows ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` when set,
  else ``TVM_NUM_THREADS`` when set, else its own default (one thread per core);
* ``TIR_BYOC_THREAD_DEFAULTS=0`` turns all of this off (the benchmark uses it to measure
  the libraries' own defaults);
* idle threads: pools that keep spinning after their kernel ends steal the cores from the
  next kernel of another pool (TVM, OpenMP and OpenBLAS kernels alternate in an offloaded
  model).  The libraries' idle spin is cut to a short time (``GOMP_SPINCOUNT``,
  ``OPENBLAS_THREAD_TIMEOUT``) and TVM's (``TVM_THREAD_POOL_SPIN_COUNT``) likewise, unless
  the user set them or ``OMP_WAIT_POLICY``.  When libgomp is already loaded as oneDNN is
  located (PyTorch loads it, and ``import tvm`` imports PyTorch when it is installed), it has
  read its environment and keeps its long spin; TVM's pool is then told not to spin at all
  (``TVM_THREAD_POOL_SPIN_COUNT=0``), so that the two do not fight over the cores.  Only
  locating oneDNN does that: MKL's and OpenBLAS's kernels never wake libgomp's workers, and a
  pool that never spins wakes late for every parallel loop.
  That is not enough at two threads or more: libgomp's spinning worker still holds a core
  that TVM's parallel loops need, so ``import tir_byoc`` sets ``GOMP_SPINCOUNT`` before it
  imports TVM (:func:`configure_openmp_early`), and warns once when it comes too late.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

logger = logging.getLogger("tir_byoc")

#: The variables each library reads: (thread count, idle spin) and the idle default we set.
LIBRARY_VARIABLES = {
    "openmp": ("OMP_NUM_THREADS", "GOMP_SPINCOUNT"),
    "openblas": ("OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT"),
}
#: Idle spin before sleeping: long enough to keep a pool hot between the back-to-back calls of
#: one model run (a few microseconds apart), short enough not to hold a core another pool needs.
#: libgomp counts PAUSE iterations (~15-30 ns here; its default 300000 is 5-9 ms); OpenBLAS
#: waits 2**n cycles (default n = 28, ~0.1 s); TVM counts yields (default 300000).
IDLE_DEFAULTS = {
    "GOMP_SPINCOUNT": "1000",
    "OPENBLAS_THREAD_TIMEOUT": "16",
    "TVM_THREAD_POOL_SPIN_COUNT": "1000",
}
# Variables that also decide idle behaviour: if the user set one, we leave that library alone.
_USER_IDLE_CHOICE = {"GOMP_SPINCOUNT": ("OMP_WAIT_POLICY",)}

#: Set to ``0`` to keep the libraries' own defaults.
OPT_OUT_ENV = "TIR_BYOC_THREAD_DEFAULTS"

_lock = threading.Lock()
_applied: dict[str, str] = {}


def _loaded(library_fragment: str) -> bool:
    """True if a shared library whose file name contains ``library_fragment`` is mapped."""
    try:
        return library_fragment in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _set_default(name: str, value: str) -> None:
    if name in os.environ:
        return
    os.environ[name] = value
    _applied[name] = value


def _follow_tvm_threads(count_var: str) -> None:
    """The user's thread count for TVM, if set, as a library's (unless it has its own)."""
    tvm_threads = os.environ.get("TVM_NUM_THREADS")
    if tvm_threads:
        _set_default(count_var, tvm_threads)


def configure(library: str) -> dict[str, str]:
    """Fill in the thread settings of ``library`` (``"openmp"`` or ``"openblas"``).

    Returns
    -------
    dict
        The variables set by this call (empty if the user set them all, or on a second call).
    """
    if library not in LIBRARY_VARIABLES:
        raise ValueError(f"expected a library in {sorted(LIBRARY_VARIABLES)}, got {library!r}")
    count_var, idle_var = LIBRARY_VARIABLES[library]
    if os.environ.get(OPT_OUT_ENV) == "0":
        return {}
    with _lock:
        before = dict(_applied)
        # Step 1. Thread count: the user's choice for TVM applies to the library too.
        _follow_tvm_threads(count_var)
        # Step 2. Idle spin, for the library and for TVM's pool.
        tvm_spin = IDLE_DEFAULTS["TVM_THREAD_POOL_SPIN_COUNT"]
        if not any(v in os.environ for v in _USER_IDLE_CHOICE.get(idle_var, ())):
            if library == "openmp" and idle_var not in os.environ and _loaded("libgomp"):
                # libgomp read its environment when it loaded (PyTorch loads it, and tvm_ffi
                # imports PyTorch whenever it is installed), so its workers keep spinning ~5-9
                # ms after each oneDNN call.  TVM's pool spinning against them made a oneDNN
                # call alternating with a TVM-parallel kernel 3x slower (bench-threads); a TVM
                # pool that sleeps at once does not.
                tvm_spin = "0"
                _warn_long_spin()
            else:
                _set_default(idle_var, IDLE_DEFAULTS[idle_var])
        if tvm_spin == "0" and _applied.get("TVM_THREAD_POOL_SPIN_COUNT"):
            os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = _applied["TVM_THREAD_POOL_SPIN_COUNT"] = "0"
        _set_default("TVM_THREAD_POOL_SPIN_COUNT", tvm_spin)
        new = {k: v for k, v in _applied.items() if before.get(k) != v}
    fragment = {"openmp": "libgomp", "openblas": "libscipy_openblas"}[library]
    if any(k in LIBRARY_VARIABLES[library] for k in new) and _loaded(fragment):
        logger.info(
            "%s is already loaded, so its thread settings %s take effect only in new processes",
            fragment,
            new,
        )
    return new


#: Why a long OpenMP spin matters; the figures are in ``docs/backends.md``.
LONG_SPIN_WARNING = (
    "tir_byoc: libgomp was loaded before tir_byoc (PyTorch loads it) with its default idle "
    "spin, so after each oneDNN call an OpenMP worker holds a core that TVM's parallel loops "
    "need (docs/backends.md, Threads); set GOMP_SPINCOUNT=1000 in the environment, or "
    "import tir_byoc before torch"
)
_warned = False


def _openmp_threads() -> int:
    try:
        return int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0])
    except ValueError:
        return len(os.sched_getaffinity(0))


def _warn_long_spin() -> None:
    """Warn, once per process, that libgomp keeps its long spin, unless it runs on one thread
    (then it has no worker to spin)."""
    global _warned
    if not _warned and _openmp_threads() > 1:
        _warned = True
        logger.warning(LONG_SPIN_WARNING)


def _user_chose_openmp_idle() -> bool:
    return any(v in os.environ for v in ("GOMP_SPINCOUNT", *_USER_IDLE_CHOICE["GOMP_SPINCOUNT"]))


def configure_openmp_early() -> dict[str, str]:
    """Fill in libgomp's idle spin and thread count before anything loads libgomp (``import
    tir_byoc`` calls it before importing TVM, which imports PyTorch, which loads libgomp).

    What :func:`configure` sets for OpenMP, set earlier: that one runs when the oneDNN
    backend is located, after ``import tvm`` has loaded libgomp whenever PyTorch is installed,
    so it could never apply there.  Until this set the thread count too, ``TVM_NUM_THREADS=1``
    left oneDNN's calls on every core.  Nothing is set when libgomp is loaded already or
    under ``TIR_BYOC_THREAD_DEFAULTS=0``; the spin is left alone when the user chose it
    (``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY``), the count when ``OMP_NUM_THREADS`` is set
    (docs/backends.md, Threads, has what the spin saves at two threads).

    Returns
    -------
    dict
        The variables set by this call.
    """
    if os.environ.get(OPT_OUT_ENV) == "0":
        return {}
    with _lock:
        before = dict(_applied)
        if not _loaded("libgomp"):
            _follow_tvm_threads(LIBRARY_VARIABLES["openmp"][0])
            if not _user_chose_openmp_idle():
                _set_default("GOMP_SPINCOUNT", IDLE_DEFAULTS["GOMP_SPINCOUNT"])
        return {k: v for k, v in _applied.items() if before.get(k) != v}


def configure_tvm() -> dict[str, str]:
    """Fill in TVM's pool idle spin now, before TVM's pool starts (``import tir_byoc`` calls it).

    TVM's pool reads ``TVM_THREAD_POOL_SPIN_COUNT`` once, when it starts (the first parallel
    loop of a process), so a value :func:`configure` sets when a library is located after that
    is never read.  A model whose TVM pool had started before oneDNN was located (another TVM
    model had run first) ran about twice as long: the pool's workers kept spinning (TVM's
    default: 300,000 yields) on the core oneDNN's next call needed.  The value is the short
    spin, also when libgomp is loaded already (PyTorch imported first): only the oneDNN
    backend's calls run on libgomp's pool, and locating it (:func:`configure` for OpenMP) sets
    ``0`` then, before the model's first run starts the pool.  Setting ``0`` here instead slowed
    the default backend (MKL, on TVM's pool), whose workers then wake late for every call
    (docs/backends.md, Threads, has both measurements).

    Returns
    -------
    dict
        The variables set by this call (empty if the user set it, or it was set already).
    """
    if os.environ.get(OPT_OUT_ENV) == "0":
        return {}
    with _lock:
        before = dict(_applied)
        _set_default("TVM_THREAD_POOL_SPIN_COUNT", IDLE_DEFAULTS["TVM_THREAD_POOL_SPIN_COUNT"])
        return {k: v for k, v in _applied.items() if before.get(k) != v}


def applied() -> dict[str, str]:
    """Every variable :func:`configure` set in this process, with its value."""
    with _lock:
        return dict(_applied)
