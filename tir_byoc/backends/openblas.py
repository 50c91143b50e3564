"""The OpenBLAS backend (fp32): cblas sgemm with the bias fused as beta = 1, then a relu pass.

Source ``intrinsics/openblas/gemm.c``; registry keys ``openblas.<pattern>``, symbols
``tir_byoc_openblas_<pattern>``.  Library: the ``scipy-openblas32`` wheel (headers and
library inside; 32-bit BLAS integers, symbols prefixed ``scipy_``).
"""

from __future__ import annotations

from pathlib import Path

from .. import threads
from ..registry import REGISTRY, RELU_NAN_BOTH, Backend, BackendUnavailable, LinkSpec
from ..toolchain import intrinsics_dir
from .wheels import installed_file

PRIORITY = 100
INSTALL = "pip install scipy-openblas32==0.3.34.481.3"


def locate() -> LinkSpec:
    """Header and library of the installed scipy-openblas32 wheel; applies thread defaults."""
    header = installed_file("scipy-openblas32", "scipy_openblas32/include/cblas.h", INSTALL)
    library_dir = Path(header).parents[1] / "lib"
    libraries = sorted(library_dir.glob("libscipy_openblas*.so"))
    if not libraries:
        raise BackendUnavailable(
            f"scipy-openblas32 is installed but {library_dir} holds no libscipy_openblas*.so; "
            f"reinstall it (`{INSTALL}`)"
        )
    threads.configure("openblas")
    return LinkSpec(
        include_dirs=(str(header.parent),),
        library_dirs=(str(library_dir),),
        libraries=(libraries[0].name[3 : -len(".so")],),
    )


def _register() -> None:
    REGISTRY.register_family(
        Backend("openblas", locate, "OpenBLAS sgemm from the scipy-openblas32 wheel (fp32)"),
        intrinsics_dir() / "openblas" / "gemm.c",
        dtypes=("float32",),
        priority=PRIORITY,
        relu_nan=RELU_NAN_BOTH,
    )


_register()

__all__ = ["INSTALL", "PRIORITY", "locate"]
