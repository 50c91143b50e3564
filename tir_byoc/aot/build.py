"""``tir_byoc.aot.build``: a model as a folder of plain C that needs no TVM runtime.

Entry point: :func:`build`, which returns an :class:`Artifact`.  The steps:

1. :func:`tir_byoc.build_model` lowers, offloads and schedules the model exactly as for the
   Relax VM (or a built :class:`tir_byoc.Model` is taken as it is);
2. :mod:`~tir_byoc.aot.program` reads its entry as a straight-line program;
3. :mod:`~tir_byoc.aot.kernels` makes each PrimFunc it calls a plain C function;
4. :mod:`~tir_byoc.aot.workspace` places every intermediate in one workspace;
5. :mod:`~tir_byoc.aot.entry` and :mod:`~tir_byoc.aot.artifact` write the files.

Everything that can be refused is refused in steps 1 to 4, so a model the C build cannot
express leaves no folder behind, only a one-line :class:`~tir_byoc.aot.errors.Unsupported`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..built_model import Model
from ..conv_pairs import UNREGISTERED
from ..model import build_model
from ..registry import REGISTRY
from . import artifact
from .c_spelling import Names, identifier
from .entry import EntryLayout, entry_source, kernels_header, public_header
from .errors import Unsupported
from .kernels import compile_kernels
from .program import OUTPUT, Program, TensorRef, read_program
from .workspace import ALIGNMENT, align, plan_workspace

#: Where the constants go: linked in as a C array, or a file the caller loads and passes.
EMBEDDED, BLOB = "embedded", "blob"


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of the C entry: its parameter name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Artifact:
    """The written folder and what it holds.

    Attributes
    ----------
    out_dir : pathlib.Path
    name : str
        The C prefix: ``<name>_run``, ``<name>.h``, ``lib<name>.a``.
    files : tuple of pathlib.Path
        Every file written.
    inputs, outputs : tuple of TensorSpec
        The entry's tensors, in the order of its parameters.
    steps : tuple of str
        The PrimFunc each step calls, in order.
    intrinsic_steps : int
        The steps that call an intrinsic directly.
    workspace_bytes : int
        ``<NAME>_WORKSPACE_BYTES``.
    constants_bytes : int
        ``<NAME>_CONSTANTS_BYTES``.
    intermediate_bytes : int
        Every intermediate and scratch side by side (a workspace without reuse).
    peak_live_bytes : int
        The most bytes live at one step (no workspace can be smaller).
    vm_storage_bytes : int
        What the Relax VM allocates as storage for the same program (0 for a TIR model).
    backends : tuple of str
        The intrinsic backends linked.
    link_flags : tuple of str
        The libraries to link after ``lib<name>.a``.
    blob : bool
        The constants are in ``<name>_constants.bin``, passed to the entry.
    model : tir_byoc.Model
        The build the C was made from (runs on the Relax VM, for comparing).
    """

    out_dir: Path
    name: str
    files: tuple[Path, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    steps: tuple[str, ...]
    intrinsic_steps: int
    workspace_bytes: int
    constants_bytes: int
    intermediate_bytes: int
    peak_live_bytes: int
    vm_storage_bytes: int
    backends: tuple[str, ...]
    link_flags: tuple[str, ...]
    blob: bool
    model: Model

    def path(self, relative: str) -> Path:
        return self.out_dir / relative

    def summary(self) -> list[str]:
        """What was written, in a few lines (the command line prints them)."""
        calls = f"{self.intrinsic_steps} of them intrinsic calls"
        backends = f" ({', '.join(self.backends)})" if self.backends else ""
        vm = f", the Relax VM's storage {self.vm_storage_bytes}" if self.vm_storage_bytes else ""
        return [
            f"wrote {self.out_dir}: {self.name}_run() in {self.name}.c, {len(self.steps)} steps, "
            f"{calls}{backends}",
            f"workspace {self.workspace_bytes} bytes (all intermediates side by side "
            f"{self.intermediate_bytes}{vm}); constants {self.constants_bytes} bytes"
            + (f" in {self.name}_constants.bin" if self.blob else ""),
            f"build: make -C {self.out_dir}; link lib{self.name}.a {' '.join(self.link_flags)}",
        ]


def build(
    model,
    example_inputs=None,
    *,
    out_dir: str | os.PathLike,
    name: str = "model",
    backends=None,
    constants: str = EMBEDDED,
    target=None,
    entry: str | None = None,
) -> Artifact:
    """Build ``model`` as plain C in ``out_dir``.

    Parameters
    ----------
    model : torch.nn.Module, tvm.IRModule, tvm.tirx.PrimFunc or tir_byoc.Model
        What :func:`tir_byoc.build_model` takes, or what it returned.
    example_inputs : torch.Tensor or tuple of torch.Tensor, optional
        For a torch model, as for :func:`tir_byoc.build_model`.
    out_dir : str or os.PathLike
        The folder to write (created; files of the same names are replaced).
    name : str
        The C prefix of everything the folder defines.
    backends : str or iterable of str, optional
        The intrinsic backends, as for :func:`tir_byoc.build_model` (``"ref"`` for the
        portable reference kernels, which cross-compile anywhere).
    constants : str
        ``"embedded"`` (the weights linked in, ``<name>_constants.c``) or ``"blob"``
        (``<name>_constants.bin``, which the caller loads and passes to the entry).
    target : optional
        The llvm target the default schedules are chosen for, as for
        :func:`tir_byoc.build_model`.
    entry : str, optional
        The function to build (default: ``main``, or the module's only function), as for
        :func:`tir_byoc.build_model`.

    Returns
    -------
    Artifact

    Raises
    ------
    tir_byoc.aot.Unsupported
        A construct without a C form here (symbolic shapes, control flow, a packed call other
        than the intrinsics and the VM's own shape checks and reshapes), before any file is
        written.
    """
    # Step 1. The build, exactly as for the VM.
    if constants not in (EMBEDDED, BLOB):
        raise ValueError(
            f"tir_byoc.aot.build: expected constants='embedded' or 'blob', got {constants!r}"
        )
    if identifier(name) != name or name != name.lower():
        raise ValueError(
            f"tir_byoc.aot.build: expected a lower-case C identifier as name, got {name!r}"
        )
    built = _built(model, example_inputs, backends, target, entry)
    # Step 2. The program, its kernels, its workspace.
    program = read_program(built.module, built.entry)
    kernels = compile_kernels(built.module, {s.callee for s in program.steps}, name)
    externs = {}
    for kernel in kernels.values():
        for symbol, signature in kernel.source.externs.items():
            known = externs.get(symbol)
            externs[symbol] = known.merge(signature, symbol, kernel.name) if known else signature
    link = artifact.link_plan(externs, program.function)
    plan = plan_workspace(program, {k.name: k.scratch_bytes for k in kernels.values()})
    # Step 3. The layout of the entry and of the constants, the files' contents.
    blob = constants == BLOB
    layout = _layout(name, program, plan, blob, _torch_names(model, program))
    files = _files(layout, program, plan, kernels, externs, link)
    # Step 4. The folder.
    written = artifact.write_files(Path(out_dir), files, link.sources)
    return Artifact(
        out_dir=Path(out_dir),
        name=name,
        files=tuple(written),
        inputs=tuple(TensorSpec(n, r.shape, r.dtype) for n, r in layout.inputs),
        outputs=tuple(TensorSpec(n, r.shape, r.dtype) for n, r in layout.outputs),
        steps=tuple(s.callee for s in program.steps),
        intrinsic_steps=sum(kernels[s.callee].call is not None for s in program.steps),
        workspace_bytes=plan.workspace_bytes,
        constants_bytes=layout.constants_bytes,
        intermediate_bytes=plan.intermediate_bytes,
        peak_live_bytes=plan.peak_live_bytes,
        vm_storage_bytes=program.vm_storage_bytes,
        backends=link.backends,
        link_flags=link.link_flags,
        blob=blob,
        model=built,
    )


def _files(layout: EntryLayout, program, plan, kernels, externs, link) -> dict[str, str | bytes]:
    """Every file of the folder but the copied intrinsic sources, by relative path."""
    name, blob = layout.name, layout.blob
    by_symbol = REGISTRY.by_symbol()
    intrinsic_names = {
        s: by_symbol[s].name if s in by_symbol else UNREGISTERED[s][0] for s in externs
    }
    emitted = {n: k for n, k in kernels.items() if k.call is None}
    description = f"{name}, generated by tir_byoc.aot ({len(program.steps)} steps; " + (
        f"intrinsics: {', '.join(link.backends)})" if link.backends else "no intrinsics)"
    )
    files: dict[str, str | bytes] = {
        f"{name}.h": public_header(layout, plan, description),
        f"{name}_kernels.h": kernels_header(layout, emitted, externs),
        f"{name}.c": entry_source(layout, program, plan, kernels, intrinsic_names),
        f"{name}_kernels.c": _kernels_source(name, emitted),
        f"{name}_main.c": artifact.runner_source(
            name, len(layout.inputs), len(layout.outputs), blob
        ),
        "Makefile": artifact.makefile(name, link, layout.constants_bytes > 0 and not blob),
        "link_flags": " ".join(link.link_flags) + "\n",
    }
    contents = artifact.constants_blob(
        program.constants, layout.constant_offsets, layout.constants_bytes
    )
    if blob:
        files[f"{name}_constants.bin"] = contents
    elif contents:
        described = [
            f"{layout.constant_names[b]} at {layout.constant_offsets[b]}: {b.dtype} {b.shape}"
            for b in program.constants
        ]
        files[f"{name}_constants.c"] = artifact.constants_c(name, contents, described, ALIGNMENT)
    return files


def _built(model, example_inputs, backends, target, entry) -> Model:
    if isinstance(model, Model):
        given = (example_inputs, backends, target, entry)
        if any(value is not None for value in given):
            raise ValueError(
                "tir_byoc.aot.build: a built tir_byoc.Model is taken as it is; expected no "
                "example_inputs, backends, target or entry with it"
            )
        return model
    return build_model(model, example_inputs, backends=backends, target=target, entry=entry)


def _layout(name, program: Program, plan, blob: bool, preferred) -> EntryLayout:
    names = Names(["ws", "cs", "status", "workspace", "constants", "misaligned", "memcpy"])
    inputs = tuple((names.fresh(b.name), _ref(b)) for b in program.inputs)
    outputs = []
    for index, ref in enumerate(program.outputs):
        if ref.buffer.kind == OUTPUT:
            wanted = ref.buffer.name
        else:
            wanted = "out" if len(program.outputs) == 1 else f"out{index}"
        outputs.append((names.fresh(wanted), ref))
    constant_names = {b: names.fresh(preferred.get(b, b.name)) for b in program.constants}
    offsets, total = {}, 0
    for buffer in program.constants:
        offsets[buffer] = total
        total += align(max(buffer.nbytes, 1), ALIGNMENT)
    return EntryLayout(
        name=name,
        inputs=inputs,
        outputs=tuple(outputs),
        constant_names=constant_names,
        constant_offsets=offsets,
        constants_bytes=total,
        blob=blob,
    )


def _ref(buffer) -> TensorRef:
    return TensorRef(buffer, buffer.shape, buffer.dtype)


def _kernels_source(name: str, kernels) -> str:
    helpers = {}
    for kernel in kernels.values():
        helpers.update(kernel.source.helpers)
    lines = [
        f"/* {name}_kernels.c - the PrimFuncs of {name} that are more than one intrinsic call,",
        " * lowered by TVM and printed as plain C (no TVM header, no TVM runtime call). */",
        "#include <math.h>",
        "#include <stdbool.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <string.h>",
        "",
        f'#include "{name}_kernels.h"',
        "",
        "/* A parallel loop runs on OpenMP's threads when compiled with -fopenmp, serially",
        " * otherwise. */",
        "#ifdef _OPENMP",
        '#define TIR_BYOC_PARALLEL_FOR _Pragma("omp parallel for")',
        "#else",
        "#define TIR_BYOC_PARALLEL_FOR",
        "#endif",
        "",
    ]
    if helpers:
        lines += [*helpers.values(), ""]
    for kernel in sorted(kernels.values(), key=lambda k: k.c_name):
        lines += [f"/* {kernel.name} */", kernel.source.text, ""]
    return "\n".join(lines)


def _torch_names(model, program: Program) -> dict:
    """Constants that are one torch parameter or buffer as it is, named after it; a constant
    equal to several (zero biases) keeps its own name."""
    if not callable(getattr(model, "state_dict", None)):
        return {}
    named = {}
    for key, tensor in model.state_dict().items():
        array = tensor.detach().cpu().numpy()
        named.setdefault((array.shape, str(array.dtype)), []).append((key, array))
    found = {}
    for buffer in program.constants:
        candidates = named.get((buffer.shape, buffer.dtype), [])
        equal = [key for key, array in candidates if np.array_equal(array, buffer.array)]
        if len(equal) == 1 and math.prod(buffer.shape):
            found[buffer] = identifier(equal[0].replace(".", "_"))
    return found


__all__ = ["BLOB", "EMBEDDED", "Artifact", "TensorSpec", "Unsupported", "build"]
