"""The oneDNN backend: every pattern as one oneDNN matmul primitive, bias and relu fused, and
every convolution pattern as one oneDNN convolution primitive (``onednn.conv``).

Source ``intrinsics/onednn/matmul.cpp``; registry keys ``onednn.<pattern>``, symbols
``tir_byoc_onednn_<pattern>``.  Library: the CPU-only GNU-OpenMP build of oneDNN 3.2 from PyPI
(``pip install onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0``).

Dtypes: fp32 everywhere; bf16 and fp16 inputs accumulated in fp32, and u8/s8 x s8 into int32,
on CPUs whose instructions make oneDNN exact for them (see :func:`cpu_supports`).
"""

from __future__ import annotations

import functools

from .. import threads
from ..epilogues import OPS
from ..match import Match
from ..match.conv_records import CONV_ENTRY, prefer_tvm
from ..registry import REGISTRY, RELU_NAN_BOTH, Backend, Intrinsic, LinkSpec
from ..signature import DtypeSignature
from ..toolchain import entry_point, intrinsics_dir
from .cpu import cpuinfo_field
from .wheels import installed_file

PRIORITY = 200
INSTALL = "pip install onednn-cpu-gomp==2023.2.0 onednn-devel-cpu-gomp==2023.2.0"

#: The dtype signatures, and the CPU flags (any of) oneDNN needs to run each natively and
#: exactly: without VNNI, int8 products are summed pairwise in saturating int16.
DTYPE_CPU_FLAGS = {
    "float32": (),
    "bfloat16,bfloat16->float32": ("avx512_bf16", "amx_bf16"),
    "float16,float16->float32": ("avx512_fp16",),
    "uint8,int8->int32": ("avx512_vnni", "avx_vnni", "amx_int8"),
    "int8,int8->int32": ("avx512_vnni", "avx_vnni", "amx_int8"),
}


def locate() -> LinkSpec:
    """Headers and library of the installed oneDNN wheels; applies the OpenMP thread defaults."""
    library = installed_file("onednn-cpu-gomp", "libdnnl.so", INSTALL)
    header = installed_file("onednn-devel-cpu-gomp", "oneapi/dnnl/dnnl.hpp", INSTALL)
    threads.configure("openmp")
    return LinkSpec(
        include_dirs=(str(header.parents[2]),),
        library_dirs=(str(library.parent),),
        # libgomp: the intrinsics key their primitives by omp_get_max_threads() (the wheel's
        # libdnnl runs on it, so this adds no library at run time).
        libraries=("dnnl", "gomp"),
        compile_flags=("-std=c++17",),
    )


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of this CPU (``/proc/cpuinfo``); empty where unreadable."""
    return frozenset(cpuinfo_field("flags").split())


def cpu_supports(signature: DtypeSignature) -> str | None:
    """Why oneDNN cannot serve ``signature`` exactly on this CPU, or None if it can."""
    needed = DTYPE_CPU_FLAGS.get(str(signature))
    if needed is None:
        return f"dtype {signature} is not implemented by the oneDNN intrinsics"
    if needed and not cpu_flags() & set(needed):
        return f"dtype {signature} needs a CPU with one of {', '.join(needed)}; this one has none"
    return None


def fuses(op: str, constants: tuple[float, ...] | None = None) -> bool:
    """Whether the gemm entry point computes the epilogue op ``op`` inside oneDNN's primitive
    on this machine (else it runs in C after the primitive, with the same result).

    An op is fused when oneDNN computes it as TVM's TIR does (the table in
    ``intrinsics/onednn/matmul.cpp``) and this machine's kernels pass the library's check of
    it on NaN, infinities, huge values and a sweep of [-10, 10].  An op that agrees wherever
    its value is finite is fused and guarded: on AVX-512 oneDNN's erf GELU gives NaN for +inf
    and overflows past 1.7e38, so a call whose output holds an infinity or a NaN is computed
    again with the GELU in C.  tanh and gelu_tanh run in C on CPUs without AVX-512 when the C
    epilogue has glibc's vector tanhf: there oneDNN's took 3-4x as long.  ``constants`` default
    to the op's example (:data:`tir_byoc.epilogues.OPS`).  Compiles and loads the library if
    needed.
    """
    if op not in OPS:
        raise ValueError(f"{op!r} is not an epilogue op (expected one of {list(OPS)})")
    values = [*(OPS[op].example if constants is None else constants), 0.0, 0.0, 0.0][:3]
    return entry_point("onednn", "fuses")(OPS[op].code, *values) in (1, 2)  # 2: fused and guarded


def _check(match: Match) -> str | None:
    return cpu_supports(match.dtype)


def _register() -> None:
    REGISTRY.register_family(
        Backend(
            "onednn", locate, "oneDNN 3.2 matmul primitives (fp32, bf16, fp16, int8)", packs=True
        ),
        intrinsics_dir() / "onednn" / "matmul.cpp",
        dtypes=tuple(DTYPE_CPU_FLAGS),
        priority=PRIORITY,
        check=_check,
        relu_nan=RELU_NAN_BOTH,
    )
    # Every convolution pattern, through tir_byoc_onednn_conv (intrinsics/onednn/conv.cpp).
    REGISTRY.register(
        Intrinsic(
            "onednn.conv",
            CONV_ENTRY,
            "tir_byoc_onednn_conv",
            ("float32",),
            intrinsics_dir() / "onednn" / "conv.cpp",
            priority=PRIORITY,
            ops=tuple(OPS),
            check=prefer_tvm,
        )
    )


_register()

__all__ = ["DTYPE_CPU_FLAGS", "INSTALL", "PRIORITY", "cpu_flags", "cpu_supports", "fuses", "locate"]
