"""The portable reference backend: every pattern in fp32, from ``intrinsics/ref/gemm.c``, and
every convolution from ``intrinsics/ref/conv.c``.

It needs nothing but a C compiler.  It is the fallback when no library backend serves a
match (lowest priority) and the oracle the library backends are tested against.
"""

from ..epilogues import OPS
from ..match.conv_records import CONV_ENTRY, prefer_tvm
from ..registry import REGISTRY, RELU_NAN_BOTH, Backend, Intrinsic
from ..toolchain import intrinsics_dir

PRIORITY = 0

REGISTRY.register_family(
    Backend("ref", description="portable C reference kernels (fp32)"),
    intrinsics_dir() / "ref" / "gemm.c",
    dtypes=("float32",),
    priority=PRIORITY,
    relu_nan=RELU_NAN_BOTH,
)
# Every convolution pattern, from ``intrinsics/ref/conv.c`` (the oracle of onednn.conv).
REGISTRY.register(
    Intrinsic(
        "ref.conv",
        CONV_ENTRY,
        "tir_byoc_ref_conv",
        ("float32",),
        intrinsics_dir() / "ref" / "conv.c",
        priority=PRIORITY,
        ops=tuple(OPS),
        check=prefer_tvm,
    )
)
