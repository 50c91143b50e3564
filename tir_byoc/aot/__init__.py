"""A built model as plain C: one entry function, one static workspace, no TVM runtime.

Entry point: :func:`build` (``tir_byoc.aot.build(model, example_inputs, out_dir=..., name=...)``),
which writes a folder that ``make`` turns into ``lib<name>.a`` and a runner, and returns an
:class:`Artifact`.  The modules, in the order the build uses them: :mod:`.program` (the Relax
entry as a straight-line program), :mod:`.kernels` and :mod:`.c_kernel` (each PrimFunc as a C
function), :mod:`.workspace` (the workspace plan), :mod:`.entry` (the entry and headers),
:mod:`.artifact` (constants, Makefile, runner, sources).  A model the C build cannot express
raises :class:`Unsupported` before anything is written.
"""

from .build import BLOB, EMBEDDED, Artifact, TensorSpec, build
from .errors import Unsupported

__all__ = ["BLOB", "EMBEDDED", "Artifact", "TensorSpec", "Unsupported", "build"]
