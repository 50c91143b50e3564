"""A Python script run in a fresh interpreter, as a user's process that loads an export runs."""

import ctypes
import os
import subprocess
import sys
import textwrap


def openmp_threads() -> int | None:
    """The thread count of this process's next OpenMP region, where libgomp is loaded.

    oneDNN's kernels split some reductions by thread count (a product of one row over its K),
    so the same export gives other last bits at another count.  That count is libgomp's, not the
    environment's: ``torch.set_num_threads`` changes it for every library on the process's
    libgomp, oneDNN too (a benchmark's code run in a test's process does that).
    """
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None
    return gomp.omp_get_max_threads()


def run_python(script: str, cwd) -> str:
    """Run ``script`` (dedented) with this interpreter in ``cwd``; its stdout.  A non-zero exit
    fails the test with the end of its stderr.  The script's OpenMP runs at this process's
    count (:func:`openmp_threads`), so that its results can be compared to this process's bit
    for bit."""
    env = dict(os.environ)
    threads = openmp_threads()
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
