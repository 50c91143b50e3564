"""The intrinsic registry: which extern C function implements which pattern, for which dtypes.

Entry points: :func:`register_intrinsic` (and :data:`REGISTRY`, a :class:`Registry`) to add
an intrinsic, :func:`register_backend` to describe the library a family of intrinsics links
against, and :func:`choose` to pick the intrinsic that serves a :class:`~tir_byoc.match.Match`.

An intrinsic is named ``<backend>.<variant>`` (``ref.dense_bias_relu``); every intrinsic of a
backend is compiled into one shared library and linked with the backend's libraries.  The
records themselves (:class:`Intrinsic`, :class:`Backend`, :class:`LinkSpec`) are defined in
:mod:`tir_byoc.intrinsic` and exported here too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .epilogues import OPS
from .intrinsic import (
    RELU_NAN_BOTH,
    Backend,
    BackendUnavailable,
    Intrinsic,
    LinkSpec,
    no_library,
)
from .match import RELU_NAN_TO_ZERO, Match
from .match.conv_records import is_conv_pattern
from .patterns import CALL_PATTERNS, GEMM_ENTRY

#: Environment variable holding a comma-separated backend order, e.g. ``openblas,ref``.
BACKENDS_ENV = "TIR_BYOC_BACKENDS"


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
        if existing is not None and existing.locate is not no_library and not override:
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
    conv = is_conv_pattern(match.pattern)  # convolutions go to conv intrinsics only
    candidates = [
        i
        for i in registry
        if i.is_conv == conv
        and (i.serves(match.pattern) or ((i.takes_epilogue or i.is_conv) and match.shorter))
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


__all__ = [
    "BACKENDS_ENV",
    "REGISTRY",
    "RELU_NAN_BOTH",
    "Backend",
    "BackendUnavailable",
    "Choice",
    "Intrinsic",
    "LinkSpec",
    "Registry",
    "backend_order",
    "choose",
    "choose_one",
    "register_backend",
    "register_intrinsic",
]
