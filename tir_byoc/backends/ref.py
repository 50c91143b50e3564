"""The portable reference backend: every pattern in fp32, from ``intrinsics/ref/gemm.c``.

It needs nothing but a C compiler.  It is the fallback when no library backend serves a
match (lowest priority) and the oracle the library backends are tested against.
"""

from ..registry import REGISTRY, RELU_NAN_BOTH, Backend
from ..toolchain import intrinsics_dir

PRIORITY = 0

REGISTRY.register_family(
    Backend("ref", description="portable C reference kernels (fp32)"),
    intrinsics_dir() / "ref" / "gemm.c",
    dtypes=("float32",),
    priority=PRIORITY,
    relu_nan=RELU_NAN_BOTH,
)
