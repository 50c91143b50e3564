"""The bundled backends; importing this package registers their intrinsics.

By priority: ``mkl`` (250 on Intel CPUs, fp32 only), ``onednn`` (200), ``mkl`` (150 on other
CPUs), ``openblas`` (100), ``ref`` (0, the portable fallback).  A backend whose library is not
installed stays registered and is skipped, with the reason, when intrinsics are chosen.
"""

from . import mkl, onednn, openblas, ref

__all__ = ["mkl", "onednn", "openblas", "ref"]
