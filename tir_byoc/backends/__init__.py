"""The bundled backends; importing this package registers their intrinsics.

By priority: ``onednn`` (200), ``openblas`` (100), ``ref`` (0, the portable fallback).  A
backend whose library is not installed stays registered and is skipped, with the reason, when
intrinsics are chosen.
"""

from . import onednn, openblas, ref

__all__ = ["onednn", "openblas", "ref"]
