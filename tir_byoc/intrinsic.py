"""The records of what serves a match: an intrinsic (one extern C function) and its backend.

:class:`Intrinsic` is a frozen dataclass that checks itself when made (its name, pattern,
symbol, dtypes, source and epilogue ops, each with what was expected and what was found);
:class:`Backend` names the library a family of intrinsics links against and how to find it
(:class:`LinkSpec`).  :mod:`tir_byoc.registry` keeps them by name and chooses among them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .epilogues import OPS
from .match import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO, Match
from .match.conv_records import CONV_ENTRY, conv_ops, is_conv_pattern
from .patterns import CALL_PATTERNS, GEMM_ENTRY, PATTERNS, pattern
from .signature import DtypeSignature

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx")

#: ``relu_nan`` of an intrinsic that honours ``TIR_BYOC_RELU_KEEPS_NAN``: both behaviours.
RELU_NAN_BOTH = (RELU_NAN_TO_ZERO, RELU_KEEPS_NAN)


class BackendUnavailable(Exception):
    """Raised by :attr:`Backend.locate` when the backend's library is not installed."""


@dataclass(frozen=True)
class LinkSpec:
    """How to compile and link against a backend's library.

    ``archives`` are static libraries (paths) linked into the backend's code itself: its
    objects and the archive members they need become one object whose only global symbols are
    the intrinsics' (``tir_byoc_*``), so the backend's library and every exported model carry
    the library, and its symbols never meet another copy of it in the process (PyTorch exports
    an MKL of its own).
    """

    include_dirs: tuple[str, ...] = ()
    library_dirs: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    compile_flags: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = ()
    archives: tuple[str, ...] = ()


def no_library() -> LinkSpec:
    """The :class:`LinkSpec` of a backend with no library of its own to link."""
    return LinkSpec()


@dataclass(frozen=True)
class Backend:
    """A library that intrinsics call into.

    Parameters
    ----------
    name : str
        The first component of its intrinsics' names.
    locate : callable
        Returns the :class:`LinkSpec` for the installed library, or raises
        :class:`BackendUnavailable` saying what is missing.  Called once per process.
    description : str
        One line for listings.
    packs : bool
        Its library defines ``tir_byoc_<name>_pack`` and its gemm entry point takes a packed
        weight (``TIR_BYOC_PACKED_WEIGHT`` in ``tir_byoc.h``; see :mod:`tir_byoc.packing`).
    """

    name: str
    locate: Callable[[], LinkSpec] = no_library
    description: str = ""
    packs: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not _IDENTIFIER.match(self.name):
            raise ValueError(f"backend name: expected a C identifier, got {self.name!r}")
        if not callable(self.locate):
            raise ValueError(
                f"backend {self.name!r}: expected a callable locate, got {self.locate!r}"
            )


@dataclass(frozen=True)
class Intrinsic:
    """A registered extern function implementing one pattern.

    Parameters
    ----------
    name : str
        ``<backend>.<variant>``, e.g. ``ref.dense_bias_relu``.
    pattern : str
        The pattern it implements, a key of :data:`tir_byoc.patterns.CALL_PATTERNS` (a 2-D or
        a ``bmm_`` member), or ``"gemm"`` (:data:`~tir_byoc.patterns.GEMM_ENTRY`), the entry
        point that takes the layout, the batch and the epilogue as arguments, or ``"conv"``
        (:data:`~tir_byoc.match.conv_records.CONV_ENTRY`), the entry point of every
        convolution pattern (``conv2d_bias_relu``, ...) with the epilogue as data.  An intrinsic
        of a 2-D member also serves the member's ``batch_`` form, whose leading dims the call
        folds into M; a ``gemm`` one serves every member whose epilogue ops it declares.
    extern_symbol : str
        The C symbol, called as described in ``intrinsics/include/tir_byoc.h``.
    dtypes : tuple of DtypeSignature
        The dtype signatures it implements (strings such as ``"float32"`` or
        ``"uint8,int8->int32"`` are parsed).
    source : pathlib.Path
        The C or C++ file that defines ``extern_symbol``.
    priority : int
        Higher wins when several intrinsics can serve a match.
    check : callable, optional
        ``check(match) -> str | None``: a shape constraint; returns why the intrinsic cannot
        serve ``match``, or None if it can.
    relu_nan : tuple of str
        What its relu can make of a NaN: ``"zero"`` (``v > 0 ? v : 0``, TVM's ``max(z, 0)``,
        the default) and/or ``"keep"`` (``v < 0 ? 0 : v``, TVM's ``max(0, z)``).  An intrinsic
        declaring both is told which one a call needs by ``TIR_BYOC_RELU_KEEPS_NAN`` in its
        ``dtypes`` argument (see ``tir_byoc.h``); a relu spelled the other way is never
        handed to an intrinsic that did not declare it.  A ``gemm`` intrinsic is told by the
        relu's op code and takes both.
    ops : tuple of str
        A ``gemm`` or ``conv`` intrinsic: the epilogue ops of :data:`tir_byoc.epilogues.OPS` it
        implements.  A member with another op is served by it only up to that op, the rest
        staying TVM code.
    """

    name: str
    pattern: str
    extern_symbol: str
    dtypes: tuple[DtypeSignature, ...]
    source: Path
    priority: int = 0
    check: Callable[[Match], str | None] | None = field(default=None, compare=False)
    relu_nan: tuple[str, ...] = (RELU_NAN_TO_ZERO,)
    ops: tuple[str, ...] = ()

    def __post_init__(self):
        parts = self.name.split(".") if isinstance(self.name, str) else []
        if len(parts) != 2 or not all(_IDENTIFIER.match(p) for p in parts):
            raise ValueError(
                f"intrinsic name: expected '<backend>.<variant>' such as 'ref.dense', "
                f"got {self.name!r}"
            )
        if self.pattern in PATTERNS and self.pattern not in CALL_PATTERNS:
            served_by = PATTERNS[self.pattern].call_pattern
            raise ValueError(
                f"intrinsic {self.name!r}: pattern {self.pattern!r} is called through the "
                f"entry point of {served_by!r} (its leading dims fold into M); register "
                f"{served_by!r} instead"
            )
        ops = (self.ops,) if isinstance(self.ops, str) else tuple(self.ops)
        unknown = [op for op in ops if op not in OPS]
        if unknown or (ops and self.pattern not in (GEMM_ENTRY, CONV_ENTRY)):
            raise ValueError(
                f"intrinsic {self.name!r}: expected ops from {list(OPS)} for a {GEMM_ENTRY!r} "
                f"intrinsic (none for a fixed pattern), got {self.ops!r}"
            )
        object.__setattr__(self, "ops", ops)
        if self.pattern not in (GEMM_ENTRY, CONV_ENTRY) and self.pattern not in CALL_PATTERNS:
            raise ValueError(
                f"intrinsic {self.name!r}: expected {GEMM_ENTRY!r} or a pattern in "
                f"{sorted(CALL_PATTERNS)} (or {CONV_ENTRY!r} for the convolutions), "
                f"got {self.pattern!r}"
            )
        if not isinstance(self.extern_symbol, str) or not _IDENTIFIER.match(self.extern_symbol):
            raise ValueError(
                f"intrinsic {self.name!r}: expected a C identifier as extern_symbol, "
                f"got {self.extern_symbol!r}"
            )
        dtypes = (self.dtypes,) if isinstance(self.dtypes, (str, DtypeSignature)) else self.dtypes
        try:
            dtypes = tuple(DtypeSignature.parse(d) for d in dtypes)
        except (TypeError, ValueError) as err:
            raise ValueError(f"intrinsic {self.name!r}: {err}") from None
        if not dtypes:
            raise ValueError(f"intrinsic {self.name!r}: expected at least one dtype signature")
        object.__setattr__(self, "dtypes", dtypes)
        source = Path(self.source)
        if source.suffix not in _SOURCE_SUFFIXES or not source.is_file():
            raise ValueError(
                f"intrinsic {self.name!r}: expected an existing C/C++ source file "
                f"({', '.join(_SOURCE_SUFFIXES)}), got {str(self.source)!r}"
            )
        object.__setattr__(self, "source", source.resolve())
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise ValueError(
                f"intrinsic {self.name!r}: expected an int priority, got {self.priority!r}"
            )
        if self.check is not None and not callable(self.check):
            raise ValueError(
                f"intrinsic {self.name!r}: expected a callable check, got {self.check!r}"
            )
        relu_nan = (self.relu_nan,) if isinstance(self.relu_nan, str) else tuple(self.relu_nan)
        known = (RELU_NAN_TO_ZERO, RELU_KEEPS_NAN)
        if not relu_nan or any(r not in known for r in relu_nan):
            raise ValueError(
                f"intrinsic {self.name!r}: expected relu_nan made of {known}, got {self.relu_nan!r}"
            )
        if self.pattern in (GEMM_ENTRY, CONV_ENTRY):
            relu_nan = RELU_NAN_BOTH  # told by the op code
        object.__setattr__(self, "relu_nan", relu_nan)

    @property
    def backend(self) -> str:
        return self.name.split(".")[0]

    @property
    def takes_epilogue(self) -> bool:
        """True for a ``gemm`` intrinsic, called with the epilogue as data."""
        return self.pattern == GEMM_ENTRY

    @property
    def is_conv(self) -> bool:
        """True for a ``conv`` intrinsic: it serves the convolution patterns, and only them."""
        return self.pattern == CONV_ENTRY

    def serves(self, name: str) -> bool:
        """True if this intrinsic can be called for the matches of the pattern ``name``."""
        if is_conv_pattern(name) or self.is_conv:
            return (
                self.is_conv and is_conv_pattern(name) and set(conv_ops(name, OPS)) <= set(self.ops)
            )
        if self.takes_epilogue:
            return set(pattern(name).ops) <= set(self.ops)
        return pattern(name).call_pattern == self.pattern

    def unsupported(self, match: Match) -> str | None:
        """Why this intrinsic cannot serve ``match`` (ignoring availability), or None."""
        if self.is_conv and is_conv_pattern(match.pattern) and not self.serves(match.pattern):
            missing = [op for op in conv_ops(match.pattern, OPS) if op not in self.ops]
            return f"does not implement the epilogue op {', '.join(missing)}"
        if self.takes_epilogue and not self.serves(match.pattern):
            missing = [op for op in pattern(match.pattern).ops if op not in self.ops]
            return f"does not implement the epilogue op {', '.join(missing)}"
        if not self.serves(match.pattern):
            return f"implements {self.pattern}, not {match.pattern}"
        if match.dtype not in self.dtypes:
            supported = ", ".join(str(d) for d in self.dtypes)
            return f"dtype {match.dtype} not supported (supports {supported})"
        if match.relu_nan is not None and match.relu_nan not in self.relu_nan:
            return (
                f"the relu's spelling {'keeps' if match.relu_nan == RELU_KEEPS_NAN else 'zeroes'}"
                f" NaN (relu_nan={match.relu_nan!r}), the intrinsic declares {self.relu_nan}"
            )
        if self.check is not None:
            return self.check(match)
        return None


__all__ = [
    "RELU_NAN_BOTH",
    "Backend",
    "BackendUnavailable",
    "Intrinsic",
    "LinkSpec",
    "no_library",
]
