"""Compile and run what ``tir_byoc.aot.build`` writes, as a user would: make, then the runner.

Entry points: :func:`make` (``make`` in the folder, with extra variables), :func:`run` (the
runner in a fresh process on NumPy inputs; returns NumPy outputs), :func:`undefined_symbols`
(``nm -u``) and :func:`tvm_symbols` (those that belong to TVM or its FFI).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: A symbol of TVM's runtime or FFI (TVMBackendAllocWorkspace, TVMFFIFunctionCall, ...).
TVM_SYMBOL = re.compile(r"tvm|ffi", re.IGNORECASE)
#: Intrinsic objects compiled by earlier makes, by source, headers and make variables.
_OBJECT_CACHE = Path(tempfile.gettempdir()) / f"tir_byoc_aot_tests_{os.getuid()}"
_pending: list[tuple[Path, Path]] = []
#: float32 tolerances of the comparisons with torch and with the Relax VM.
RTOL, ATOL = 1e-4, 1e-4


def make(artifact, *variables: str, build_dir: Path | None = None, timeout=300) -> Path:
    """``make`` the artifact (in a copy of its sources at ``build_dir`` if given); returns the
    runner."""
    folder = artifact.out_dir
    if build_dir is not None:
        built = shutil.ignore_patterns("*.o", "*.a", artifact.name, "io")
        shutil.copytree(folder, build_dir, ignore=built)
        folder = build_dir
    _reuse_intrinsic_objects(folder, variables)
    result = subprocess.run(
        ["make", "-s", "-j2", *variables],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    _remember_intrinsic_objects()
    return folder / artifact.name


def _reuse_intrinsic_objects(folder: Path, variables) -> None:
    """Put the objects of intrinsic sources this session already compiled with the same
    variables into ``folder``, newer than their sources, so that make does not compile them
    again (the reference kernels take longer to compile than a small model)."""
    for source in sorted((folder / "intrinsics").glob("*/*.c*")):
        digest = hashlib.sha256(source.read_bytes() + repr(variables).encode())
        for header in sorted((folder / "intrinsics" / "include").glob("*.h")):
            digest.update(header.read_bytes())
        cached = _OBJECT_CACHE / f"{digest.hexdigest()[:24]}.o"
        target = source.with_suffix(".o")
        if cached.exists():
            shutil.copyfile(cached, target)
        else:
            _pending.append((target, cached))


def _remember_intrinsic_objects() -> None:
    while _pending:
        target, cached = _pending.pop()
        if target.exists() and not cached.exists():
            _OBJECT_CACHE.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=_OBJECT_CACHE)
            os.close(fd)
            shutil.copyfile(target, tmp)
            os.replace(tmp, cached)


def run(
    artifact,
    runner: Path,
    inputs: Sequence[np.ndarray],
    *,
    prefix: Sequence[str] = (),
    env=None,
    timeout=120,
) -> tuple[list[np.ndarray], subprocess.CompletedProcess]:
    """Run ``runner`` (prefixed by an emulator, say) on ``inputs``; returns the outputs and
    the finished process."""
    folder = runner.parent / "io"
    folder.mkdir(exist_ok=True)
    paths = []
    for index, (spec, value) in enumerate(zip(artifact.inputs, inputs, strict=True)):
        array = np.ascontiguousarray(np.asarray(value), dtype=spec.dtype)
        assert array.shape == spec.shape, (spec, array.shape)
        path = folder / f"input{index}.bin"
        array.tofile(path)
        paths.append(str(path))
    outputs = [str(folder / f"output{i}.bin") for i in range(len(artifact.outputs))]
    constants = (
        ["-c", str(artifact.path(f"{artifact.name}_constants.bin"))] if artifact.blob else []
    )
    result = subprocess.run(
        [*prefix, str(runner), *constants, *paths, *outputs],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    values = [
        np.fromfile(path, dtype=spec.dtype).reshape(spec.shape)
        for spec, path in zip(artifact.outputs, outputs, strict=True)
    ]
    return values, result


def undefined_symbols(path: Path) -> set[str]:
    """The undefined symbols of an executable or archive (``nm -u``), without versions."""
    result = subprocess.run(["nm", "-u", str(path)], capture_output=True, text=True, check=True)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    # An archive lists its members as "member.o:" headers.
    return {line.split()[-1].split("@")[0] for line in lines if not line.endswith(":")}


def external_symbols(archive: Path) -> set[str]:
    """What an archive's members call that none of them defines (``_``-prefixed linker
    symbols left out)."""
    result = subprocess.run(
        ["nm", "-g", "--defined-only", str(archive)], capture_output=True, text=True, check=True
    )
    defined = {line.split()[-1] for line in result.stdout.splitlines() if len(line.split()) == 3}
    return {s for s in undefined_symbols(archive) - defined if not s.startswith("_")}


def tvm_symbols(path: Path) -> set[str]:
    """The symbols of TVM's runtime or FFI that ``path`` references."""
    return {s for s in undefined_symbols(path) if TVM_SYMBOL.search(s)}


def numpy_inputs(inputs) -> list[np.ndarray]:
    return [x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x) for x in inputs]


def as_list(result) -> list[np.ndarray]:
    """A model's result (a tensor, or a tuple/list of them) as a list of NumPy arrays."""
    if isinstance(result, tuple | list):
        return [v for item in result for v in as_list(item)]
    return numpy_inputs([result])
