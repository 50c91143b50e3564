"""The oneMKL backend (fp32): cblas sgemm, strided batches, constant weights in MKL's packed
storage, the epilogue after the product with MKL's vector math for erf, exp and tanh.

Source ``intrinsics/mkl/gemm.c``; registry keys ``mkl.<pattern>``, symbols
``tir_byoc_mkl_<pattern>``.  Library: the ``mkl-static`` and ``mkl-include`` wheels, linked
statically with MKL's symbols hidden, so that PyTorch's own MKL in the same process is left
alone.  MKL is linked sequential: a call shares its work among the threads of TVM's own pool,
the one TVM's parallel loops run on, so no second pool competes with them for the cores.

Its weights are packed at run time, by the first call (MKL's packed storage may not move, so
it cannot be stored in a model): see ``intrinsics/mkl/gemm.c``.
"""

from __future__ import annotations

from ..registry import REGISTRY, RELU_NAN_BOTH, Backend, LinkSpec
from ..toolchain import intrinsics_dir
from .cpu import cpuinfo_field
from .wheels import installed_file

#: On Intel CPUs above oneDNN's (200): on the models of benchmarks/models.py MKL's packed sgemm
#: ran their fp32 GEMMs faster than oneDNN 3.2's matmul on an AVX-512 Xeon; on other CPUs below
#: it: on an AMD EPYC (Zen 3, AVX2) oneDNN's took less time on most of them (benchmarks/HISTORY.md,
#: 2026-11-26, night).  oneDNN keeps bf16, fp16 and int8 either way.
INTEL_PRIORITY, OTHER_PRIORITY = 250, 150
PRIORITY = INTEL_PRIORITY if cpuinfo_field("vendor_id") in ("GenuineIntel", "") else OTHER_PRIORITY
INSTALL = "pip install mkl-static==2026.2.0 mkl-include==2026.2.0"
#: The static libraries, in link order: LP64 interface, sequential threading layer, core.
ARCHIVES = ("libmkl_intel_lp64.a", "libmkl_sequential.a", "libmkl_core.a")


def locate() -> LinkSpec:
    """Headers and static libraries of the installed MKL wheels."""
    header = installed_file("mkl-include", "mkl_cblas.h", INSTALL)
    archives = [str(installed_file("mkl-static", name, INSTALL)) for name in ARCHIVES]
    return LinkSpec(
        include_dirs=(str(header.parent),),
        # Linked into the intrinsics, MKL's symbols made local: a PyTorch loaded beside them
        # exports an MKL of its own.
        archives=tuple(archives),
        libraries=("pthread", "dl"),
    )


def _register() -> None:
    REGISTRY.register_family(
        Backend("mkl", locate, "oneMKL 2026.2 sgemm, packed at run time (fp32)", packs=True),
        intrinsics_dir() / "mkl" / "gemm.c",
        dtypes=("float32",),
        priority=PRIORITY,
        relu_nan=RELU_NAN_BOTH,
    )


_register()

__all__ = ["ARCHIVES", "INSTALL", "INTEL_PRIORITY", "OTHER_PRIORITY", "PRIORITY", "locate"]
