"""Exporting a built module with its intrinsic code linked in.

Entry point: :func:`export_library`.  The exported shared library loads with
``tvm.runtime.load_module`` in a process that never imported tir_byoc: the objects of every
backend the module calls are linked into it, and backend libraries (oneDNN, OpenBLAS, ...) are
linked with an rpath to where they were found at export time.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import tvm

from . import toolchain
from .registry import REGISTRY, Registry

_DECLARE = re.compile(r"^declare\b[^@]*@\"?([A-Za-z_][A-Za-z0-9_.]*)\"?\(", re.MULTILINE)


def _runtime_module(executable) -> tvm.runtime.Module:
    if isinstance(executable, tvm.runtime.Module):
        return executable
    module = getattr(executable, "mod", None)
    if isinstance(module, tvm.runtime.Module):
        return module
    raise TypeError(
        "tir_byoc.export_library: expected the result of tvm.compile (a "
        f"tvm.runtime.Executable) or a tvm.runtime.Module, got {type(executable).__name__}"
    )


def extern_symbols(executable) -> set[str]:
    """The external functions the compiled host code of ``executable`` declares."""
    symbols = set()
    for module in _runtime_module(executable)._collect_dso_modules():
        if module.kind != "llvm":
            continue
        symbols.update(_DECLARE.findall(module.inspect_source("ll")))
    return symbols


def used_backends(executable, registry: Registry = REGISTRY) -> list[str]:
    """Backends whose intrinsics the compiled module calls."""
    by_symbol = registry.by_symbol()
    return sorted({by_symbol[s].backend for s in extern_symbols(executable) if s in by_symbol})


def export_library(
    executable, path: str | os.PathLike, *, registry: Registry = REGISTRY, **kwargs
) -> Path:
    """Export a ``tvm.compile`` result (TIR or Relax) as a self-contained shared library.

    Parameters
    ----------
    executable : tvm.runtime.Executable or tvm.runtime.Module
        What ``tvm.compile`` returned, for a module offloaded by :func:`tir_byoc.offload`.
    path : str or os.PathLike
        The ``.so`` file to write.
    registry : Registry, optional
        Where intrinsics are looked up.
    **kwargs
        Passed on to ``export_library`` (e.g. ``workspace_dir``).

    Returns
    -------
    pathlib.Path
        ``path``; load it with ``tvm.runtime.load_module``.
    """
    module = _runtime_module(executable)
    addons, options = [], []
    for backend in used_backends(module, registry):
        objects, flags = toolchain.object_files(backend, registry)
        addons += [str(o) for o in objects]
        options += flags
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    extra = {"options": options} if options else {}
    (executable if module is not executable else module).export_library(
        str(target), addons=addons or None, **extra, **kwargs
    )
    return target
