"""Shared pieces of the property suite: the registry it offloads with, and failure reports.

The registry holds the bundled intrinsics plus test-only ones (``widening_gemm.c`` beside
this file) for the widening dtype signatures no bundled backend serves, so the equivalence
property runs real numerics for every dtype the generators build.  It is a separate
``Registry``: the process-wide one, which the other test directories use, is left alone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from hypothesis import note, settings

import tir_byoc
from tir_byoc.patterns import CALL_PATTERNS
from tir_byoc.registry import REGISTRY, RELU_NAN_BOTH, Backend, Intrinsic, Registry
from tir_byoc.testing.programs import SIGNATURES, Program

#: Signatures the test-only backend serves: every widening one the generators draw.
WIDENING = tuple(",".join(s[:2]) + "->" + s[2] for s in SIGNATURES if s[0] != s[2])


def _registry() -> Registry:
    registry = Registry()
    for name in REGISTRY.backends:
        registry.register_backend(REGISTRY.backend(name))
    for intrinsic in REGISTRY:
        registry.register(intrinsic)
    registry.register_backend(Backend("proptest", description="test-only widening kernels"))
    source = Path(__file__).with_name("widening_gemm.c")
    for pattern in CALL_PATTERNS:
        registry.register(
            Intrinsic(
                f"proptest.{pattern}",
                pattern,
                f"tir_byoc_proptest_{pattern}",
                WIDENING,
                source,
                relu_nan=RELU_NAN_BOTH,
            )
        )
    return registry


#: The bundled intrinsics plus the widening test-only ones.
PROPERTY_REGISTRY = _registry()


def offload(func):
    """Offload with :data:`PROPERTY_REGISTRY` (every generated dtype has an intrinsic)."""
    return tir_byoc.offload(func, registry=PROPERTY_REGISTRY)


#: A chain whose scale multiplies the product's rounding errors by more than this (a factor
#: of 1000, a divisor of 0.001: ChainSpec.gain) is compared normwise, as large inputs are.
GAIN_LIMIT = 16.0


def normwise(program: Program, magnitude: float = 1.0) -> bool:
    """Whether ``program``'s results are compared normwise (see
    :mod:`tir_byoc.testing.equivalence`): its inputs are drawn large, or a chain's scale
    multiplies the rounding errors of its sum beyond :data:`GAIN_LIMIT`."""
    return magnitude > 1 or any(c.gain > GAIN_LIMIT for c in program.spec.chains)


#: The active profile's name (registered in conftest.py): ``$HYPOTHESIS_PROFILE``, else ``ci``.
PROFILE_NAME = os.environ.get("HYPOTHESIS_PROFILE", "ci")
PROFILE = settings.get_profile(PROFILE_NAME)


#: What the equivalence properties compile both functions for.  Under ``ci``, LLVM's -O1: its
#: scalar passes (which act on the ``noalias`` of every buffer parameter, so an intermediate a
#: rewrite aliased would still show) without the vectorizers, for half the build time of -O3.
#: Every other profile compiles at TVM's default -O3, as every model test (the real flow) does.
TARGET = {"kind": "llvm", "opt-level": 1} if PROFILE_NAME == "ci" else "llvm"


def profile(share: float = 1.0, *, ci_share: float | None = None) -> settings:
    """The active profile with ``share`` of its ``max_examples`` (at least 10); under the
    ``ci`` profile with ``ci_share`` of them, where given."""
    if PROFILE_NAME == "ci" and ci_share is not None:
        share = ci_share
    return settings(PROFILE, max_examples=max(10, int(PROFILE.max_examples * share)))


@contextlib.contextmanager
def reported(program: Program):
    """On failure, attach the program as paste-ready TVMScript to hypothesis' report."""
    try:
        yield
    except Exception:
        note(f"counterexample as TVMScript:\n{program.script()}")
        note(f"expected chains: {program.chains}")
        raise
