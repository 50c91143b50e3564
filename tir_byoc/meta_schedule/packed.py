"""The offloaded variant measured with its constant weights packed, as the built model runs it.

Entry point: :func:`measure_packed`.  MetaSchedule measures every candidate with random
arguments, which a packed weight cannot be: a block is only valid as the backend's pack
function wrote it (a random one fails with ``TIR_BYOC_EPACKED``).  So once the search is over,
:func:`tir_byoc.meta_schedule.tune_relax` gives the best offloaded record of a function whose
weights are Relax constants its packed variant (:func:`tir_byoc.packing.packed_variant`),
builds it with the run's builder and measures it with a runner like the run's, whose workers
allocate every argument at random as MetaSchedule does except the blocks, which they read from
the files written here.  The time it gives is the offloaded variant's in the
offload-or-native choice.

Runners: ``"local"``, a ``LocalRunner`` or an ``RPCRunner`` (the blocks are copied to the
remote device); any other runner cannot be given the blocks, and the function is then decided
on its plain offloaded time and left unpacked.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import local_runner, rpc_runner
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

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


def _runner(runner, blocks: dict[int, str]):
    """A runner configured like ``runner`` whose workers take the blocks; None if none can."""
    if isinstance(runner, str) and runner == "local":
        return ms.runner.LocalRunner(f_alloc_argument=functools.partial(alloc_local, blocks))
    if isinstance(runner, ms.runner.LocalRunner):
        return ms.runner.LocalRunner(
            timeout_sec=runner.timeout_sec,
            evaluator_config=runner.evaluator_config,
            cooldown_sec=runner.cooldown_sec,
            alloc_repeat=runner.alloc_repeat,
            f_alloc_argument=functools.partial(alloc_local, blocks),
        )
    if isinstance(runner, ms.runner.RPCRunner):
        return ms.runner.RPCRunner(
            rpc_config=runner.rpc_config,
            evaluator_config=runner.evaluator_config,
            cooldown_sec=runner.cooldown_sec,
            alloc_repeat=runner.alloc_repeat,
            f_alloc_argument=functools.partial(alloc_rpc, blocks),
            max_workers=1,
        )
    return None


def measure_packed(
    func: tirx.PrimFunc, blocks: dict[int, tvm.runtime.Tensor], target, builder, runner
) -> tuple[float | None, str]:
    """The latency (ms) of the packed candidate ``func`` given ``blocks`` for its parameters.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        The packed variant of a scheduled, offloaded function.
    blocks : dict of int to tvm.runtime.Tensor
        The packed weights, by parameter index.
    target : tvm.target.Target
    builder, runner
        The tuning run's (``builder`` None: :func:`candidate_builder`).

    Returns
    -------
    (float or None, str)
        The mean latency in ms and ``""``, or None and why it was not measured.
    """
    measuring = None
    with tempfile.TemporaryDirectory(prefix="tir_byoc_packed_") as scratch:
        # Step 1. The blocks as files, for the runner's workers.
        paths = {}
        for index, block in blocks.items():
            paths[index] = str(Path(scratch) / f"block_{index}.npy")
            np.save(paths[index], block.numpy())
        measuring = _runner(runner, paths)
        if measuring is None:
            return None, f"the runner {type(runner).__name__} cannot be given packed weights"
        # Step 2. Built as the search built its candidates.
        if builder is None:
            builder = candidate_builder()
        elif isinstance(builder, str):
            builder = ms.Builder.create(builder)
        workload = _normalize_mod(func)
        built = builder.build([ms.builder.BuilderInput(workload, target)])[0]
        if built.error_msg:
            return None, f"the packed candidate did not build: {built.error_msg.splitlines()[0]}"
        # Step 3. Measured as the search measured its candidates.
        try:
            runner_input = ms.runner.RunnerInput(
                built.artifact_path,
                device_type="cpu",  # cpu_target: llvm only
                args_info=ms.arg_info.ArgInfo.from_prim_func(workload["main"]),
            )
            result = measuring.run([runner_input])[0].result()
        finally:
            Path(built.artifact_path).unlink(missing_ok=True)
    if result.error_msg:
        message = result.error_msg.strip().splitlines()
        return None, f"the packed candidate failed to run: {message[-1] if message else '?'}"
    seconds = mean_seconds(result.run_secs)
    if seconds >= FAILED_RUN:
        return None, "the packed candidate failed to run"
    logger.debug("packed candidate measured: %.4f ms", seconds * 1e3)
    return seconds * 1e3, ""
