"""The bundled backends; importing this package registers their intrinsics."""

from . import ref

__all__ = ["ref"]
