"""MetaSchedule in the tests: a one-worker builder, the options of a tiny random search, and a
TVM RPC tracker and server on 127.0.0.1 for ``RPCRunner``."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import tvm
from tvm.s_tir import meta_schedule as ms

from tir_byoc import meta_schedule as tms


def one_worker_builder():
    """:func:`tir_byoc.meta_schedule.candidate_builder` with one worker process.

    Each worker imports TVM (and torch, through tvm_ffi): about 5 s of CPU on the 2-vCPU VM,
    where the tests' small candidates build in milliseconds.  The default (a worker per core)
    doubles that cost, and under pytest-xdist the two test processes compete for the same
    cores.
    """
    return tms.candidate_builder(max_workers=1)


def tiny_search(**overrides) -> dict:
    """The tuning options of the tests: two candidates a round, replayed traces, a random cost
    model, one builder worker, no progress on stderr, seed 0 (``overrides`` replace them)."""
    options = dict(
        num_trials_per_iter=2,
        strategy=ms.search_strategy.ReplayTrace(),
        cost_model="random",
        builder=one_worker_builder(),
        progress=False,
        seed=0,
    )
    return {**options, **overrides}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """Stop a process started by this test, with its own process group (server workers)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _wait_for_server(tracker_port: int, key: str, processes, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args} exited with {process.returncode}")
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", tracker_port), timeout=1).close()
            summary = tvm.rpc.connect_tracker("127.0.0.1", tracker_port).summary()
            if summary["queue_info"].get(key, {}).get("free", 0) > 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"no RPC server registered as {key!r} within {timeout} s")


@contextlib.contextmanager
def rpc_tracker_and_server(key: str):
    """A TVM RPC tracker and one server on 127.0.0.1, stopped on exit; yields the port."""
    processes = []

    def start(*args):
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", *args, "--host", "127.0.0.1", "--silent"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    try:
        tracker_port, server_port = _free_port(), _free_port()
        start(
            "tvm.exec.rpc_tracker", "--port", str(tracker_port), "--port-end", str(tracker_port + 1)
        )
        start(
            "tvm.exec.rpc_server",
            "--port",
            str(server_port),
            "--port-end",
            str(server_port + 1),
            "--tracker",
            f"127.0.0.1:{tracker_port}",
            "--key",
            key,
        )
        _wait_for_server(tracker_port, key, processes)
        yield tracker_port
    finally:
        for process in reversed(processes):
            _stop(process)


@contextlib.contextmanager
def rpc_runner(key: str):
    """A one-worker ``RPCRunner`` on a tracker and server of :func:`rpc_tracker_and_server`."""
    with rpc_tracker_and_server(key) as tracker_port:
        config = ms.runner.RPCConfig(
            tracker_host="127.0.0.1",
            tracker_port=tracker_port,
            tracker_key=key,
            session_timeout_sec=60,
        )
        yield ms.runner.RPCRunner(config, max_workers=1)
