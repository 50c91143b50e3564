"""The portable reference backend: every pattern in fp32, from ``intrinsics/ref/gemm.c``.

It needs nothing but a C compiler.  It is the fallback when no library backend serves a
match (lowest priority) and the oracle the library backends are tested against.
"""

from ..patterns import PATTERNS
from ..registry import REGISTRY, Backend, Intrinsic
from ..toolchain import intrinsics_dir

PRIORITY = 0

REGISTRY.register_backend(Backend("ref", description="portable C reference kernels (fp32)"))

for _pattern in PATTERNS:
    REGISTRY.register(
        Intrinsic(
            name=f"ref.{_pattern}",
            pattern=_pattern,
            extern_symbol=f"tir_byoc_ref_{_pattern}",
            dtypes=("float32",),
            source=intrinsics_dir() / "ref" / "gemm.c",
            priority=PRIORITY,
        )
    )
