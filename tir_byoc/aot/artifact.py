"""The AOT folder on disk: the constants, the intrinsic sources, a Makefile, a runner.

Entry points: :func:`link_plan` (which backends the C calls into, their sources and their
compile and link flags, as :mod:`tir_byoc.toolchain` compiles them for ``export_library``),
:func:`constants_c` / :func:`constants_blob` (the weights as one aligned ``static const`` byte
array, or the bytes a caller loads), :func:`makefile` and :func:`runner_source` (a ``main``
that reads inputs from files, runs the model, writes outputs, and times repeated runs), and
:func:`write_files`.

The folder builds with ``make`` alone: the intrinsic sources are copied into ``intrinsics/``
(the library backends still link their library: oneDNN's, OpenBLAS's, MKL's archives, found
where they are installed now; the reference kernels need nothing but libm).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..conv_pairs import UNREGISTERED
from ..registry import REGISTRY, Registry
from .errors import Unsupported

#: Bytes of constants per line of the C array.
_BYTES_PER_LINE = 32


@dataclass(frozen=True)
class IntrinsicSource:
    """An intrinsic source file, its place in the folder (``intrinsics/ref/gemm.c``) and the
    flags its backend compiles it with (beyond ``-Iintrinsics/include``)."""

    path: Path
    relative: str
    flags: tuple[str, ...]

    @property
    def cxx(self) -> bool:
        return self.path.suffix != ".c"


@dataclass(frozen=True)
class LinkPlan:
    """What the C links: the backends, their sources (copied), the flags.

    Attributes
    ----------
    backends : tuple of str
    sources : tuple of IntrinsicSource
    link_flags : tuple of str
        The one line of libraries the model links, last on the link line.
    """

    backends: tuple[str, ...]
    sources: tuple[IntrinsicSource, ...]
    link_flags: tuple[str, ...]

    @property
    def cxx(self) -> bool:
        """Whether a source is C++ (the model then links with the C++ compiler)."""
        return any(source.cxx for source in self.sources)


def link_plan(symbols: Iterable[str], function: str, registry: Registry = REGISTRY) -> LinkPlan:
    """The backends that define ``symbols``; an unknown symbol or an unavailable backend raises
    :class:`~tir_byoc.aot.errors.Unsupported` (``function`` names the model)."""
    by_symbol = registry.by_symbol()
    backends = set()
    for symbol in symbols:
        sibling = UNREGISTERED.get(symbol, ("", ""))[1]  # defined in another's library
        intrinsic = by_symbol.get(symbol) or by_symbol.get(sibling)
        if intrinsic is None:
            raise Unsupported(f"the external function {symbol} (no registered intrinsic)", function)
        backends.add(intrinsic.backend)
    sources, link_flags, archives = [], [], []
    for backend in sorted(backends):
        reason = toolchain.unavailable(backend, registry)
        if reason is not None:
            raise Unsupported(f"the {backend} intrinsics ({reason})", function)
        spec = registry.backend(backend).locate()
        flags = (*(f"-I{d}" for d in spec.include_dirs), *spec.compile_flags)
        for source in sorted({Path(i.source) for i in registry.of_backend(backend)}):
            sources.append(IntrinsicSource(source, f"intrinsics/{backend}/{source.name}", flags))
        archives += spec.archives
        for directory in spec.library_dirs:
            link_flags += [f"-L{directory}", f"-Wl,-rpath,{directory}"]
        link_flags += [f"-l{library}" for library in spec.libraries]
        link_flags += spec.link_flags
    if archives:
        link_flags = ["-Wl,--start-group", *archives, "-Wl,--end-group", *link_flags]
    # libm last: the kernels and the portable epilogue call expf, erff, tanhf...
    link_flags = [*dict.fromkeys(link_flags), "-lm"]
    return LinkPlan(tuple(sorted(backends)), tuple(sources), tuple(link_flags))


# -- constants -----------------------------------------------------------------------------


def constants_blob(constants, offsets: Mapping, nbytes: int) -> bytes:
    """The constants' bytes (little-endian, as NumPy holds them), each at its offset."""
    blob = bytearray(nbytes)
    for buffer in constants:
        data = buffer.array.astype(buffer.array.dtype.newbyteorder("<"), copy=False).tobytes()
        start = offsets[buffer]
        blob[start : start + len(data)] = data
    return bytes(blob)


def constants_c(name: str, blob: bytes, described: Iterable[str], alignment: int) -> str:
    """``<name>_constants.c``: ``blob`` as one aligned ``const uint8_t`` array."""
    lines = [
        f"/* {name}_constants.c - the model's constants, {len(blob)} bytes, little-endian. */",
        "#include <stdint.h>",
        "",
        "#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__",
        '#error "these constants are little-endian; rebuild the model for this target"',
        "#endif",
        "",
        *(f"/* {line} */" for line in described),
        "",
        f"_Alignas({alignment}) const uint8_t {name}_constants[{len(blob)}] =",
    ]
    for start in range(0, len(blob), _BYTES_PER_LINE):
        chunk = blob[start : start + _BYTES_PER_LINE]
        lines.append('    "' + "".join(f"\\{byte:03o}" for byte in chunk) + '"')
    lines[-1] += ";"
    lines.append("")
    return "\n".join(lines)


# -- the Makefile and the runner -----------------------------------------------------------


def makefile(name: str, plan: LinkPlan, constants_c: bool) -> str:
    """A Makefile building ``lib<name>.a`` and the runner ``<name>``; ``constants_c``: the
    constants are linked in (``<name>_constants.c``)."""
    model_objects = [f"{name}.o", f"{name}_kernels.o"]
    if constants_c:
        model_objects.append(f"{name}_constants.o")
    intrinsic_objects = [str(Path(s.relative).with_suffix(".o")) for s in plan.sources]
    linker = "$(CXX)" if plan.cxx else "$(CC)"
    lines = [
        f"# Makefile for {name}, generated by tir_byoc.aot.  `make` builds lib{name}.a (the model",
        f"# and its intrinsics) and {name} (a runner: {name} -h).  Cross-compile with",
        "# `make CC=aarch64-linux-gnu-gcc` (reference kernels); add -fopenmp to CFLAGS and",
        "# LDFLAGS to run the parallel loops on OpenMP threads.",
        "CFLAGS ?= -O3",
        "CXXFLAGS ?= -O3",
        "INTRINSIC_FLAGS = -DTIR_BYOC_STANDALONE -Iintrinsics/include",
        "LDLIBS = " + " ".join(plan.link_flags),
        "",
        f"MODEL_OBJECTS = {' '.join(model_objects)}",
        f"INTRINSIC_OBJECTS = {' '.join(intrinsic_objects)}",
        "",
        f"all: lib{name}.a {name}",
        "",
        f"lib{name}.a: $(MODEL_OBJECTS) $(INTRINSIC_OBJECTS)",
        "\trm -f $@",
        "\t$(AR) rcs $@ $^",
        "",
        f"{name}: {name}_main.o lib{name}.a",
        f"\t{linker} $(CFLAGS) $(LDFLAGS) -o $@ $^ $(LDLIBS)",
        "",
        f"$(MODEL_OBJECTS) {name}_main.o: %.o: %.c {name}.h {name}_kernels.h",
        "\t$(CC) $(CFLAGS) -c $< -o $@",
        "",
        *_intrinsic_rules(plan),
        "clean:",
        f"\trm -f $(MODEL_OBJECTS) $(INTRINSIC_OBJECTS) {name}_main.o lib{name}.a {name}",
        "",
        ".PHONY: all clean",
        "",
    ]
    return "\n".join(lines)


def _intrinsic_rules(plan: LinkPlan) -> list[str]:
    lines = []
    for source in plan.sources:
        compiler = "$(CXX) $(CXXFLAGS)" if source.cxx else "$(CC) $(CFLAGS)"
        flags = " ".join(("$(INTRINSIC_FLAGS)", *source.flags))
        lines += [
            f"{Path(source.relative).with_suffix('.o')}: {source.relative} intrinsics/include/*.h",
            f"\t{compiler} {flags} -c $< -o $@",
            "",
        ]
    return lines


def runner_source(name: str, inputs: int, outputs: int, blob: bool) -> str:
    """``<name>_main.c``: ``<name> [-n RUNS] [-c CONSTANTS] INPUTS... OUTPUTS...``."""
    m = name.upper()
    constants_arg = " -c CONSTANTS" if blob else ""
    tensors = [("input", i) for i in range(inputs)] + [("output", i) for i in range(outputs)]
    declare = [
        f"static _Alignas({m}_ALIGNMENT) uint8_t {kind}{i}[{m}_{kind.upper()}{i}_BYTES + 1];"
        for kind, i in tensors
    ]
    read = [
        f"  if (read_file(argv[first + {i}], input{i}, {m}_INPUT{i}_BYTES)) return 2;"
        for i in range(inputs)
    ]
    write = [
        f"  if (write_file(argv[first + {inputs + i}], output{i}, {m}_OUTPUT{i}_BYTES)) return 2;"
        for i in range(outputs)
    ]
    call = [f"(void *)input{i}" for i in range(inputs)] + [
        f"(void *)output{i}" for i in range(outputs)
    ]
    call.append("workspace")
    if blob:
        call.append("constants")
    lines = [
        f"/* {name}_main.c - run {name} on inputs read from files; write its outputs.",
        f" *   {name} [-n RUNS]{constants_arg} INPUT_FILES... OUTPUT_FILES...",
        " * Each file holds a tensor's raw bytes (C order).  With -n, the model runs RUNS times",
        " * more and the median time of a run is printed in nanoseconds.  Nothing is allocated:",
        " * the tensors and the workspace are static. */",
        "#define _POSIX_C_SOURCE 199309L",
        "#include <stdint.h>",
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        "#include <time.h>",
        "",
        f'#include "{name}.h"',
        "",
        *declare,
        f"static _Alignas({m}_ALIGNMENT) uint8_t workspace[{m}_WORKSPACE_BYTES + 1];",
    ]
    if blob:
        lines.append(f"static _Alignas({m}_ALIGNMENT) uint8_t constants[{m}_CONSTANTS_BYTES + 1];")
    lines += [
        "",
        "static int read_file(const char *path, void *data, size_t size) {",
        '  FILE *file = fopen(path, "rb");',
        "  size_t got = file ? fread(data, 1, size + 1, file) : 0;",
        "  if (file) fclose(file);",
        "  if (!file || got != size) {",
        '    fprintf(stderr, "%s: expected %zu bytes\\n", path, size);',
        "    return 1;",
        "  }",
        "  return 0;",
        "}",
        "",
        "static int write_file(const char *path, const void *data, size_t size) {",
        '  FILE *file = fopen(path, "wb");',
        "  int failed = !file || fwrite(data, 1, size, file) != size;",
        "  if (file) failed |= fclose(file) != 0;",
        '  if (failed) fprintf(stderr, "%s: cannot write it\\n", path);',
        "  return failed;",
        "}",
        "",
        "static int compare(const void *a, const void *b) {",
        "  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;",
        "  return (x > y) - (x < y);",
        "}",
        "",
        "static int64_t now(void) {",
        "  struct timespec t;",
        "  clock_gettime(CLOCK_MONOTONIC, &t);",
        "  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;",
        "}",
        "",
        "#define MAX_RUNS 100000",
        "static int64_t times[MAX_RUNS];",
        "",
        "int main(int argc, char **argv) {",
        "  int first = 1, runs = 0, status;",
        f"  const int tensors = {m}_NUM_INPUTS + {m}_NUM_OUTPUTS;",
        '  if (first + 1 < argc && strcmp(argv[first], "-n") == 0) {',
        "    runs = atoi(argv[first + 1]);",
        "    first += 2;",
        "  }",
    ]
    if blob:
        lines += [
            '  if (first + 1 < argc && strcmp(argv[first], "-c") == 0) {',
            f"    if (read_file(argv[first + 1], constants, {m}_CONSTANTS_BYTES)) return 2;",
            "    first += 2;",
            "  } else {",
            '    fprintf(stderr, "-c CONSTANTS is required\\n");',
            "    return 2;",
            "  }",
        ]
    lines += [
        "  if (argc - first != tensors || runs < 0 || runs > MAX_RUNS) {",
        f'    fprintf(stderr, "usage: %s [-n RUNS]{constants_arg} '
        f'(%d input files) (%d output files)\\n", argv[0], {m}_NUM_INPUTS, {m}_NUM_OUTPUTS);',
        "    return 2;",
        "  }",
        *read,
        f"  status = {name}_run({', '.join(call)});",
        "  if (status != 0) {",
        f'    fprintf(stderr, "{name}_run returned %d\\n", status);',
        "    return 1;",
        "  }",
        "  for (int run = 0; run < runs; ++run) {",
        "    int64_t start = now();",
        f"    status |= {name}_run({', '.join(call)});",
        "    times[run] = now() - start;",
        "  }",
        "  if (runs > 0) {",
        "    qsort(times, (size_t)runs, sizeof times[0], compare);",
        '    printf("median_ns %lld\\n", (long long)times[runs / 2]);',
        "  }",
        *write,
        "  return status != 0;",
        "}",
        "",
    ]
    return "\n".join(lines)


def write_files(out_dir: Path, files: Mapping[str, str | bytes], sources) -> list[Path]:
    """Write ``files`` (relative path -> text or bytes), the intrinsic headers and ``sources``
    (:class:`IntrinsicSource`) into ``out_dir``, each file atomically; returns the paths
    written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for relative, content in files.items():
        written.append(_write(out_dir / relative, content))
    include = toolchain.intrinsics_dir() / "include"
    copies = [(p, f"intrinsics/include/{p.name}") for p in sorted(include.glob("*.h"))]
    copies += [(s.path, s.relative) for s in sources]
    for source, relative in copies:
        written.append(_write(out_dir / relative, Path(source).read_bytes()))
    return written


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode() if isinstance(content, str) else content
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
