"""The intrinsic registry: which extern C function implements which pattern, for which dtypes.

Entry points: :func:`register_intrinsic` (and :data:`REGISTRY`, a :class:`Registry`) to add
an intrinsic, :func:`register_backend` to describe the library a family of intrinsics links
against, and :func:`choose` to pick the intrinsic that serves a :class:`~tir_byoc.match.Match`.

An intrinsic is named ``<backend>.<variant>`` (``ref.dense_bias_relu``); every intrinsic of a
backend is compiled into one shared library and linked with the backend's libraries.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .epilogues import OPS
from .match import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO, Match
from .patterns import CALL_PATTERNS, GEMM_ENTRY, PATTERNS, pattern
from .signature import DtypeSignature

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx")

#: ``relu_nan`` of an intrinsic that honours ``TIR_BYOC_RELU_KEEPS_NAN``: both behaviours.
RELU_NAN_BOTH = (RELU_NAN_TO_ZERO, RELU_KEEPS_NAN)

#: Environment variable holding a comma-separated backend order, e.g. ``openblas,ref``.
BACKENDS_ENV = "TIR_BYOC_BACKENDS"


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


def _no_library() -> LinkSpec:
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
    locate: Callable[[], LinkSpec] = _no_library
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
        point that takes the layout, the batch and the epilogue as arguments.  An intrinsic
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
        A ``gemm`` intrinsic: the epilogue ops of :data:`tir_byoc.epilogues.OPS` it
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
        if unknown or (ops and self.pattern != GEMM_ENTRY):
            raise ValueError(
                f"intrinsic {self.name!r}: expected ops from {list(OPS)} for a {GEMM_ENTRY!r} "
                f"intrinsic (none for a fixed pattern), got {self.ops!r}"
            )
        object.__setattr__(self, "ops", ops)
        if self.pattern != GEMM_ENTRY and self.pattern not in CALL_PATTERNS:
            raise ValueError(
                f"intrinsic {self.name!r}: expected {GEMM_ENTRY!r} or a pattern in "
                f"{sorted(CALL_PATTERNS)}, "
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
        if self.pattern == GEMM_ENTRY:
            relu_nan = RELU_NAN_BOTH  # told by the op code
        object.__setattr__(self, "relu_nan", relu_nan)

    @property
    def backend(self) -> str:
        return self.name.split(".")[0]

    @property
    def takes_epilogue(self) -> bool:
        """True for a ``gemm`` intrinsic, called with the epilogue as data."""
        return self.pattern == GEMM_ENTRY

    def serves(self, name: str) -> bool:
        """True if this intrinsic can be called for the matches of the pattern ``name``."""
        if self.takes_epilogue:
            return set(pattern(name).ops) <= set(self.ops)
        return pattern(name).call_pattern == self.pattern

    def unsupported(self, match: Match) -> str | None:
        """Why this intrinsic cannot serve ``match`` (ignoring availability), or None."""
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


@dataclass(frozen=True)
class Choice:
    """A match and the intrinsic chosen to serve it.

    Made by :func:`choose`.  A Choice reads as its match too (``choice.pattern`` is
    ``choice.match.pattern``), so the records :func:`tir_byoc.scan` returns carry both what
    was found and what serves it.

    Attributes
    ----------
    match : Match
        What the matcher found.
    intrinsic : str or None
        The registered intrinsic that serves it, or None.
    reason : str or None
        Why no intrinsic serves it, when ``intrinsic`` is None; for a chain cut short, why
        none serves the whole chain.
    cut_from : Match or None
        For a chain cut short: the whole chain, whose blocks after ``match``'s stay TVM code.
    """

    match: Match
    intrinsic: str | None = None
    reason: str | None = None
    cut_from: Match | None = None

    def __getattr__(self, name):
        # Only called for names a Choice does not have: the match's fields.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.match, name)


class Registry:
    """Intrinsics and backends by name."""

    def __init__(self):
        self._intrinsics: dict[str, Intrinsic] = {}
        self._backends: dict[str, Backend] = {}

    # Step 1. Registration.
    def register(self, intrinsic: Intrinsic, *, override: bool = False) -> Intrinsic:
        """Add ``intrinsic``; a duplicate name or symbol is a ValueError unless ``override``."""
        if not isinstance(intrinsic, Intrinsic):
            raise ValueError(f"expected an Intrinsic, got {type(intrinsic).__name__}")
        if intrinsic.name in self._intrinsics and not override:
            raise ValueError(f"intrinsic {intrinsic.name!r} is already registered")
        for other in self._intrinsics.values():
            if other.extern_symbol == intrinsic.extern_symbol and other.name != intrinsic.name:
                raise ValueError(
                    f"intrinsic {intrinsic.name!r}: extern symbol {intrinsic.extern_symbol!r} "
                    f"is already used by {other.name!r}"
                )
        if intrinsic.backend not in self._backends:
            self._backends[intrinsic.backend] = Backend(intrinsic.backend)
        self._intrinsics[intrinsic.name] = intrinsic
        return intrinsic

    def register_backend(self, backend: Backend, *, override: bool = False) -> Backend:
        """Describe how a backend's intrinsics link; register it before its intrinsics."""
        if not isinstance(backend, Backend):
            raise ValueError(f"expected a Backend, got {type(backend).__name__}")
        existing = self._backends.get(backend.name)
        if existing is not None and existing.locate is not _no_library and not override:
            raise ValueError(f"backend {backend.name!r} is already registered")
        self._backends[backend.name] = backend
        return backend

    def register_family(
        self,
        backend: Backend,
        source: str | os.PathLike,
        dtypes: Sequence[str],
        priority: int,
        check: Callable[[Match], str | None] | None = None,
        relu_nan: Sequence[str] = (RELU_NAN_TO_ZERO,),
        gemm_dtypes: Sequence[str] = ("float32",),
        gemm_ops: Sequence[str] = tuple(OPS),
    ) -> list[Intrinsic]:
        """Register ``backend`` and one intrinsic per entry point of the family, from one source.

        The names follow the bundled convention: intrinsic ``<backend>.<pattern>``, C symbol
        ``tir_byoc_<backend>_<pattern>``, for each of :data:`CALL_PATTERNS` and for ``gemm``
        (which implements ``gemm_ops`` in ``gemm_dtypes``).  ``relu_nan`` as for
        :class:`Intrinsic`.
        """
        self.register_backend(backend)
        entries = [(p, tuple(dtypes), tuple(relu_nan), ()) for p in CALL_PATTERNS]
        entries.append((GEMM_ENTRY, tuple(gemm_dtypes), RELU_NAN_BOTH, tuple(gemm_ops)))
        return [
            self.register(
                Intrinsic(
                    name=f"{backend.name}.{pattern}",
                    pattern=pattern,
                    extern_symbol=f"tir_byoc_{backend.name}_{pattern}",
                    dtypes=entry_dtypes,
                    source=Path(source),
                    priority=priority,
                    check=check,
                    relu_nan=entry_relu_nan,
                    ops=ops,
                )
            )
            for pattern, entry_dtypes, entry_relu_nan, ops in entries
        ]

    def unregister(self, name: str) -> None:
        """Remove the intrinsic ``name`` (its backend stays)."""
        if name not in self._intrinsics:
            raise ValueError(f"no intrinsic named {name!r}")
        del self._intrinsics[name]

    # Step 2. Queries.
    def __iter__(self) -> Iterator[Intrinsic]:
        return iter(sorted(self._intrinsics.values(), key=lambda i: i.name))

    def __contains__(self, name: str) -> bool:
        return name in self._intrinsics

    def __getitem__(self, name: str) -> Intrinsic:
        if name not in self._intrinsics:
            raise KeyError(f"no intrinsic named {name!r}; registered: {sorted(self._intrinsics)}")
        return self._intrinsics[name]

    def backend(self, name: str) -> Backend:
        if name not in self._backends:
            raise KeyError(f"no backend named {name!r}; registered: {sorted(self._backends)}")
        return self._backends[name]

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(sorted(self._backends))

    def of_backend(self, backend: str) -> list[Intrinsic]:
        return [i for i in self if i.backend == backend]

    def by_symbol(self) -> dict[str, Intrinsic]:
        return {i.extern_symbol: i for i in self._intrinsics.values()}


#: The process-wide registry used by :func:`tir_byoc.scan` and :func:`tir_byoc.offload`.
REGISTRY = Registry()


def register_intrinsic(
    name: str,
    pattern: str,
    extern_symbol: str,
    source: str | os.PathLike,
    dtypes: Sequence[str] | str = ("float32",),
    *,
    priority: int = 0,
    check: Callable[[Match], str | None] | None = None,
    registry: Registry | None = None,
    override: bool = False,
    relu_nan: Sequence[str] | str = (RELU_NAN_TO_ZERO,),
    ops: Sequence[str] = (),
) -> Intrinsic:
    """Register an extern C function as the implementation of a pattern.

    Examples
    --------
    .. code-block:: python

        tir_byoc.register_intrinsic(
            "toy.dense_bias_relu", "dense_bias_relu", "toy_dense_bias_relu", "toy.c",
            priority=100,
        )
    """
    intrinsic = Intrinsic(
        name, pattern, extern_symbol, dtypes, Path(source), priority, check, relu_nan, ops
    )
    return (registry or REGISTRY).register(intrinsic, override=override)


def register_backend(backend: Backend, *, registry: Registry | None = None, override=False):
    """Register ``backend`` (see :class:`Backend`) in the process-wide registry."""
    return (registry or REGISTRY).register_backend(backend, override=override)


def backend_order(
    backends: Iterable[str] | str | None, registry: Registry
) -> tuple[str, ...] | None:
    """The backends allowed, in order: the argument, else ``$TIR_BYOC_BACKENDS``, else None.

    The environment variable applies to the process-wide :data:`REGISTRY` only; a custom
    registry is ordered by ``backends`` or by priority.
    """
    if backends is None:
        # The environment speaks for the process-wide registry only.
        backends = (os.environ.get(BACKENDS_ENV) or None) if registry is REGISTRY else None
        source = f"${BACKENDS_ENV}"
    else:
        source = "backends"
    if backends is None:
        return None
    if isinstance(backends, str):
        backends = [b.strip() for b in backends.split(",") if b.strip()]
    order = tuple(backends)
    unknown = [b for b in order if b not in registry.backends]
    if unknown or not order:
        raise ValueError(
            f"{source}: expected backend names from {list(registry.backends)}, got {list(order)}"
        )
    return order


def choose(
    match: Match,
    registry: Registry,
    unavailable: Callable[[str], str | None],
    order: tuple[str, ...] | None = None,
) -> Choice:
    """The best intrinsic for ``match`` or, failing that, for its longest prefix that has one.

    A chain cut short keeps the reason the whole chain could not be offloaded
    (:attr:`Choice.reason`); the blocks after the cut stay TVM code.
    """
    whole = choose_one(match, registry, unavailable, order)
    if whole.intrinsic is not None:
        return whole
    for prefix in match.shorter:
        choice = choose_one(prefix, registry, unavailable, order)
        if choice.intrinsic is not None:
            return Choice(prefix, choice.intrinsic, whole.reason, cut_from=match)
    return whole


def choose_one(
    match: Match,
    registry: Registry,
    unavailable: Callable[[str], str | None],
    order: tuple[str, ...] | None = None,
) -> Choice:
    """The best intrinsic for ``match`` itself, or the reason none can serve it.

    Parameters
    ----------
    unavailable : callable
        ``unavailable(backend) -> str | None``, from :mod:`tir_byoc.toolchain`.
    order : tuple of str, optional
        Allowed backends, most preferred first; None means all, by intrinsic priority.
    """
    candidates = [
        i for i in registry if i.serves(match.pattern) or (i.takes_epilogue and match.shorter)
    ]
    # A backend's gemm entry point stands in for its fixed ones only where it has none.
    fixed = {i.backend for i in candidates if not i.takes_epilogue}
    candidates = [i for i in candidates if not (i.takes_epilogue and i.backend in fixed)]
    if order is not None:
        rank = {b: r for r, b in enumerate(order)}
        candidates = [i for i in candidates if i.backend in rank]
        candidates.sort(key=lambda i: (rank[i.backend], -i.priority, i.takes_epilogue, i.name))
    else:
        candidates.sort(key=lambda i: (-i.priority, i.takes_epilogue, i.name))
    if not candidates:
        allowed = f" among backends {list(order)}" if order is not None else ""
        return Choice(match, None, f"no intrinsic registered for {match.pattern}{allowed}")
    reasons = []
    for intrinsic in candidates:
        reason = intrinsic.unsupported(match) or unavailable(intrinsic.backend)
        if reason is None:
            return Choice(match, intrinsic.name)
        reasons.append(f"{intrinsic.name}: {reason}")
    return Choice(match, None, "; ".join(reasons))
