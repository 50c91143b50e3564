"""tir_byoc: bring your own codegen to TVM on lowered TIR.

Scan S-TIR PrimFuncs for dense / bias-add / relu loop nests, replace each match by a call to a
registered library kernel, and leave everything else to TVM's schedules.

Entry points
------------
plan(mod)            what each PrimFunc matches and which intrinsic serves each match, once
scan(mod)            the matches, with the intrinsic chosen for each (or why none)
explain(mod)         every candidate left as it was, and why: the matcher's and, for Relax,
                     the Relax rewrites' (``Decline`` records)
offload(mod)         the rewritten module (also the module pass ``Offload``)
export_library(ex, path)
                     a self-contained shared library of a ``tvm.compile`` result
register_intrinsic(...)
                     add your own C kernel
build_model(model, example_inputs)
                     a torch model, Relax or TIR module lowered, offloaded, scheduled and built
profile(model, *inputs)
                     each PrimFunc's time, calls and share in a built model
relax.get_pipeline("tir_byoc")
                     the whole Relax pipeline as one pass, for ``tvm.compile(mod, target,
                     relax_pipeline=...)``: registered with TVM on import (``tir_byoc.relax``)
"""

from . import threads as _threads

# Before TVM is imported: it imports PyTorch, which loads libgomp, which reads its idle spin
# only then.
_threads.configure_openmp_early()

from . import backends as _bundled_backends  # noqa: F401  (registers the bundled intrinsics)
from .built_model import Model, profile
from .decline import Decline
from .explanation import explain
from .export import export_library
from .frontend import UnsupportedModel
from .match import FunctionScan, Match
from .model import build_model
from .offload import Offload, OffloadReport, offload, offload_reported, scan
from .patterns import PATTERNS, Pattern, describe
from .planning import Plan, plan
from .profiling import FunctionTime, Profile
from .registry import (
    REGISTRY,
    Backend,
    BackendUnavailable,
    Choice,
    Intrinsic,
    LinkSpec,
    Registry,
    register_backend,
    register_intrinsic,
)
from .rewrite import RewriteError
from .signature import DtypeSignature
from .toolchain import ToolchainError

_threads.configure_tvm()  # before TVM's pool starts: it reads its idle spin only then

__all__ = [
    "PATTERNS",
    "REGISTRY",
    "Backend",
    "BackendUnavailable",
    "Choice",
    "Decline",
    "DtypeSignature",
    "FunctionScan",
    "FunctionTime",
    "Intrinsic",
    "LinkSpec",
    "Match",
    "Model",
    "Offload",
    "OffloadReport",
    "Pattern",
    "Plan",
    "Profile",
    "Registry",
    "RewriteError",
    "ToolchainError",
    "UnsupportedModel",
    "build_model",
    "describe",
    "explain",
    "export_library",
    "offload",
    "offload_reported",
    "plan",
    "profile",
    "register_backend",
    "register_intrinsic",
    "scan",
]

from . import aot as aot  # tir_byoc.aot.build: the model as plain C (docs/aot.md)
