"""The bridge of a convolution: tir_byoc's oneDNN conv entry point against oneDNN's primitive
called directly, on every convolution shape of ResNet-50 and MobileNetV2, interleaved.

Usage: ``python benchmarks/conv_bridge.py [--repeats N] [--models resnet50,mobilenet_v2]
[--batch N]`` (run with ``OMP_NUM_THREADS=1`` for one thread).  The shapes are those the
models' torch ``Conv2d`` layers see on 224 x 224 images, ``--batch`` of them (default 1)
(transformers' ``ResNetConfig`` and ``MobileNetV2Config`` defaults, random weights), each
distinct shape once, with a bias and, as the layers that are followed by one have, a relu.
``conv_bridge_onednn.cpp`` (compiled here into a shared library) times both calls on the same
buffers in one process, alternating which runs first: oneDNN as its user writes it (the weight
reordered once into the primitive's layout, bias and relu fused) and ``tir_byoc_onednn_conv``
with the weight packed by ``tir_byoc_onednn_conv_pack`` as ``build_model`` packs a constant
weight.  The direct call runs oneDNN's first implementation for the shape; the pack may have
chosen another (it times each one oneDNN offers), so a ratio well under 1 is that choice, not
the bridge.  Prints a table of the median milliseconds and their ratio, and per model the sum
over its layers (each shape times how often the model runs it).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections import Counter
from pathlib import Path

from timing import Parser

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "conv_bridge_onednn.cpp"
LIBRARY = HERE / "results" / "bin" / "conv_bridge_onednn.so"


def conv_shapes(name: str, layout: str = "nhwc", batch: int = 1) -> Counter:
    """The distinct shapes of ``name``'s Conv2d layers on ``batch`` 224 x 224 images, with how
    often each runs: (geometry of the conv entry point, relu) -> count; in ``layout`` ``nhwc`` (HWIO
    weights, as :mod:`tir_byoc.relax.channels_last` hands them to the library) or ``nchw``
    (OIHW weights)."""
    import torch

    from tir_byoc.testing import cnns

    real = {"resnet50": cnns.resnet50, "mobilenet_v2": cnns.mobilenet_v2}[name](batch=batch)
    seen: Counter = Counter()

    def hook(module, args, _output):
        x = args[0]
        n, c, h, w = x.shape
        out_h = h + 2 * module.padding[0] - module.dilation[0] * (module.kernel_size[0] - 1) - 1
        out_w = w + 2 * module.padding[1] - module.dilation[1] * (module.kernel_size[1] - 1) - 1
        last = 1 if layout == "nhwc" else 0
        geometry = (
            last,
            last,
            n,
            c,
            module.out_channels,
            module.groups,
            h,
            w,
            1,
            out_h // module.stride[0] + 1,
            out_w // module.stride[1] + 1,
            1,
            *module.kernel_size,
            1,
            *module.stride,
            1,
            *module.dilation,
            1,
            *module.padding,
            0,
        )
        seen[geometry] += 1

    handles = [
        m.register_forward_hook(hook)
        for m in real.module.modules()
        if isinstance(m, torch.nn.Conv2d)
    ]
    with torch.no_grad():
        real.module(*real.inputs)
    for handle in handles:
        handle.remove()
    return seen


def onednn_library(source: Path, library: Path, include_dirs=()) -> Path:
    """``source`` compiled against the project's oneDNN into the shared library ``library``
    (again only when the source is newer), with ``include_dirs`` besides oneDNN's."""
    import tir_byoc
    from tir_byoc import toolchain

    spec = tir_byoc.REGISTRY.backend("onednn").locate()
    if not library.exists() or library.stat().st_mtime < source.stat().st_mtime:
        library.parent.mkdir(parents=True, exist_ok=True)
        include = [*spec.include_dirs, *map(str, include_dirs)]
        command = [
            toolchain.cxx_compiler().path,
            "-O3",
            "-shared",
            "-fPIC",
            *(f"-I{d}" for d in include),
            *spec.compile_flags,
            str(source),
            "-o",
            str(library),
            *toolchain.link_flags(spec),
        ]
        subprocess.run(command, check=True)
    return library


def _library() -> Path:
    return onednn_library(SOURCE, LIBRARY, [HERE.parent / "intrinsics" / "include"])


def main(argv=None) -> int:
    parser = Parser(prog="conv_bridge.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--models", default="resnet50,mobilenet_v2")
    parser.add_argument(
        "--layout",
        choices=("nhwc", "nchw"),
        default="nhwc",
        help="the activations' layout (build_model hands CNNs over in nhwc)",
    )
    parser.add_argument("--batch", type=int, default=1, help="images per call")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch {args.batch}: expected 1 or more images per call")
    import tir_byoc  # noqa: F401  (registers the backends)
    from tir_byoc import toolchain

    bridge = ctypes.CDLL(str(_library()))
    bridge.conv_bridge.restype = ctypes.c_int
    bridge.conv_bridge.argtypes = [
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_double),
    ]
    conv = toolchain.entry_point("onednn", "conv")
    pack = toolchain.entry_point("onednn", "conv_pack")
    addresses = [ctypes.cast(f, ctypes.c_void_p) for f in (conv, pack)]
    print(
        "| model | shape (n, c, h, w, out, kernel/stride, pad, groups) | runs | oneDNN direct ms | "
        "tir_byoc ms | tir_byoc / direct | weight |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    failed = 0
    for name in args.models.split(","):
        totals = [0.0, 0.0]
        for geometry, count in conv_shapes(name, args.layout, args.batch).items():
            relu = 1
            out = (ctypes.c_double * 3)()
            shape = (ctypes.c_int64 * 24)(*geometry)
            status = bridge.conv_bridge(shape, relu, *addresses, 5, args.repeats, out)
            n, c, o, g = geometry[2:6]
            text = (
                f"{n}x{c}x{geometry[6]}x{geometry[7]} -> {o}, {geometry[12]}x{geometry[13]}"
                f"/{geometry[15]}, p{geometry[21]}, g{g}"
            )
            if status != 0:
                failed += 1
                print(f"| {name} | {text} | {count} | - | - | failed ({status}) | - |")
                continue
            direct, bridged, form = out[0], out[1], int(out[2])
            totals[0] += count * direct
            totals[1] += count * bridged
            weight = {0: "plain", 1: "packed", 3: "packed, blocked"}[form]
            print(
                f"| {name} | {text} | {count} | {direct:.4f} | {bridged:.4f} | "
                f"{bridged / direct:.3f} | {weight} |"
            )
        print(
            f"| {name} | all layers | - | {totals[0]:.3f} | {totals[1]:.3f} | "
            f"{totals[1] / totals[0]:.3f} | - |"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
