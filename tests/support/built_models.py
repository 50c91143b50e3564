"""Small torch models built once per test session with :func:`tir_byoc.build_model`.

Shared by ``models/test_model.py`` and ``models/test_profiling.py``: building costs seconds, so
each model is exported and built once (``functools.cache``), with the reference kernels
(``backends="ref"``) so that what the tests expect does not depend on the libraries installed.

Entry points: :func:`mlp` (a 2-layer MLP, offloaded), :func:`mlp_native` (the same, built
without tir_byoc), :func:`encoder_layer` (``nn.TransformerEncoderLayer(64, 4, 128)`` at batch
2, sequence 16), each returning a :class:`Built`; :func:`prim_func_calls`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import tvm
import tvm_ffi
from tvm import relax, tirx

import tir_byoc


@dataclass(frozen=True)
class Built:
    """A torch model in eval mode, its input, torch's output and the built model."""

    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    expected: np.ndarray
    model: tir_byoc.Model


def _build(module: torch.nn.Module, inputs: tuple, **options) -> Built:
    with torch.no_grad():
        expected = module(*inputs).numpy()
    return Built(module, inputs, expected, tir_byoc.build_model(module, inputs, **options))


def _mlp_module() -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
        ).eval()


def _mlp_input() -> torch.Tensor:
    return torch.randn(8, 32, generator=torch.Generator().manual_seed(1))


@functools.cache
def mlp() -> Built:
    """Linear(32, 64) -> ReLU -> Linear(64, 10) on an (8, 32) input, offloaded."""
    return _build(_mlp_module(), (_mlp_input(),), backends="ref")


@functools.cache
def mlp_native() -> Built:
    """The same MLP built without tir_byoc."""
    return _build(_mlp_module(), (_mlp_input(),), offload=False)


@functools.cache
def encoder_layer() -> Built:
    """``nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)``, (2, 16, 64)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(3))
    return _build(layer, (x,), backends="ref")


def prim_func_calls(mod: tvm.IRModule, entry: str = "main") -> dict[str, int]:
    """PrimFunc -> number of call sites in the Relax function ``entry`` (after the build
    pipeline, where PrimFuncs are called directly), read from the IR without tir_byoc."""
    counts: dict[str, int] = {}

    def on_call(call):
        if isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], tirx.PrimFunc):
            counts[call.op.name_hint] = counts.get(call.op.name_hint, 0) + 1

    tvm_ffi.structural_walk(mod[entry].body, (relax.Call, on_call))
    return counts
