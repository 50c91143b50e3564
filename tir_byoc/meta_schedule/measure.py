"""Candidates measured again once the search is over, as the search measured its own.

Entry point: :func:`measure`, which builds functions with the run's builder and times them with
a runner like the run's.  :func:`tir_byoc.meta_schedule.tune_relax` measures two kinds of
candidate this way:

- the offloaded variant with its constant weights packed.  MetaSchedule measures every
  candidate with random arguments, which a packed weight cannot be: a block is only valid as
  the backend's pack function wrote it (a random one fails with ``TIR_BYOC_EPACKED``).  So a
  function whose weights are Relax constants has its best offloaded record given its packed
  variant (:func:`tir_byoc.packing.packed_variant`), and measured by workers that allocate
  every argument at random, as MetaSchedule does, except the blocks, which they read from the
  files written here;
- a function left to TVM's code, as the default rules of :mod:`tir_byoc.schedules` schedule it,
  beside its best record measured again in the same batch.

Runners given blocks: ``"local"``, a ``LocalRunner`` or an ``RPCRunner`` (the blocks are copied
to the remote device); any other runner cannot be given them, and the function is then decided
on its plain offloaded time and left unpacked.  Without blocks, the run's runner measures.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import local_runner, rpc_runner
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod
from tvm.s_tir.meta_schedule.utils import remove_build_dir

from .builder import close_if_owned
from .progress import FAILED_RUN, mean_seconds
from .rule import logger
from .space import candidate_builder


def _with_blocks(args: list, blocks: dict[int, str], device) -> list:
    """``args`` (MetaSchedule's random arguments, per repeat) with the blocks read from disk."""
    for repeat in args:
        for index, path in blocks.items():
            array = np.load(path)
            block = tvm.runtime.empty(array.shape, "uint8", device)
            block.copyfrom(array)
            repeat[index] = block
    return args


def alloc_local(blocks: dict[int, str], device, args_info, alloc_repeat: int) -> list:
    """``f_alloc_argument`` of a ``LocalRunner``: random arguments, the blocks from disk."""
    args = local_runner.default_alloc_argument(device, args_info, alloc_repeat)
    return _with_blocks(args, blocks, device)


def alloc_rpc(blocks: dict[int, str], session, device, args_info, alloc_repeat: int) -> list:
    """``f_alloc_argument`` of an ``RPCRunner``: random arguments, the blocks copied over."""
    args = rpc_runner.default_alloc_argument(session, device, args_info, alloc_repeat)
    return _with_blocks(args, blocks, device)


@contextlib.contextmanager
def _runner(runner, blocks: dict[int, str]) -> Iterator:
    """``runner`` with workers that take the blocks, for as long as the measurement lasts;
    None if it cannot be given them.

    A ``LocalRunner`` or ``RPCRunner`` object is the run's own: its ``f_alloc_argument``
    (sent to a worker with each candidate) is swapped for one that reads the blocks, and put
    back after, so its workers go on serving the run.  ``"local"`` gets a ``LocalRunner`` of
    its own.  Without blocks, ``runner`` itself (a name: the runner MetaSchedule creates for
    it)."""
    if not blocks:
        yield runner if isinstance(runner, ms.Runner) else ms.Runner.create(runner)
        return
    if isinstance(runner, str) and runner == "local":
        yield ms.runner.LocalRunner(f_alloc_argument=functools.partial(alloc_local, blocks))
        return
    if not isinstance(runner, ms.runner.LocalRunner | ms.runner.RPCRunner):
        yield None
        return
    alloc = alloc_local if isinstance(runner, ms.runner.LocalRunner) else alloc_rpc
    saved = runner.f_alloc_argument
    runner.f_alloc_argument = functools.partial(alloc, blocks)
    try:
        yield runner
    finally:
        runner.f_alloc_argument = saved


def measure(
    funcs: list[tirx.PrimFunc],
    target,
    builder,
    runner,
    blocks: dict[int, tvm.runtime.Tensor] | None = None,
) -> list[tuple[float | None, str]]:
    """The latency (ms) of each of ``funcs``, built and run in one batch.

    Parameters
    ----------
    funcs : list of tvm.tirx.PrimFunc
        Scheduled candidates.
    target : tvm.target.Target
    builder, runner
        The tuning run's (``builder`` None: :func:`candidate_builder`).
    blocks : dict of int to tvm.runtime.Tensor, optional
        Packed weights, by parameter index, given to every function.

    Returns
    -------
    list of (float or None, str)
        Per function, the mean latency in ms and ``""``, or None and why it was not measured.
    """
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="tir_byoc_measure_"))
        # Step 1. The blocks as files, for the runner's workers.
        paths = {}
        for index, block in (blocks or {}).items():
            paths[index] = str(Path(scratch) / f"block_{index}.npy")
            np.save(paths[index], block.numpy())
        measuring = stack.enter_context(_runner(runner, paths))
        if measuring is None:
            why = f"the runner {type(runner).__name__} cannot be given packed weights"
            return [(None, why)] * len(funcs)
        # Step 2. Built as the search built its candidates.
        given = builder
        if builder is None:
            builder = candidate_builder()
        elif isinstance(builder, str):
            builder = ms.Builder.create(builder)
        workloads = [_normalize_mod(func) for func in funcs]
        try:
            built = builder.build([ms.builder.BuilderInput(w, target) for w in workloads])
        finally:
            close_if_owned(builder, given)
        # Step 3. Measured as the search measured its candidates.
        results: list = [None] * len(funcs)
        inputs, indices = [], []
        for i, (workload, artifact) in enumerate(zip(workloads, built)):
            if artifact.error_msg:
                first = artifact.error_msg.splitlines()[0]
                results[i] = (None, f"the candidate did not build: {first}")
                continue
            inputs.append(
                ms.runner.RunnerInput(
                    artifact.artifact_path,
                    device_type="cpu",  # cpu_target: llvm only
                    args_info=ms.arg_info.ArgInfo.from_prim_func(workload["main"]),
                )
            )
            indices.append(i)
        try:
            futures = measuring.run(inputs) if inputs else []
            for i, future in zip(indices, futures):
                results[i] = _latency(future.result())
        finally:
            for artifact in built:
                if artifact.artifact_path:  # as the task scheduler removes its candidates'
                    remove_build_dir(artifact.artifact_path)
    return results


def _latency(result) -> tuple[float | None, str]:
    if result.error_msg:
        message = result.error_msg.strip().splitlines()
        return None, f"the candidate failed to run: {message[-1] if message else '?'}"
    seconds = mean_seconds(result.run_secs)
    if seconds >= FAILED_RUN:
        return None, "the candidate failed to run"
    logger.debug("candidate measured again: %.4f ms", seconds * 1e3)
    return seconds * 1e3, ""
