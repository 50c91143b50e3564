"""Compiling and loading intrinsic libraries, and deciding whether a backend is available.

Entry points: :func:`unavailable` (the one place that decides whether a backend can be used
on this machine), :func:`load_backend` (compile on first use, then load so that
``tvm.compile(mod, "llvm")`` resolves the extern symbols), :func:`load_called` (the same for
every backend an offloaded module calls, read from its blocks), :func:`object_files` (what
:func:`tir_byoc.export_library` links into an exported module) and :func:`entry_point` (a
library's C entry points as ctypes functions, to call it without TVM).

Builds are cached under ``$TIR_BYOC_CACHE_DIR`` (default ``~/.cache/tir_byoc``), keyed by the
content of the sources and headers, the flags and the compiler, and written atomically so
concurrent processes (MetaSchedule workers, test runners) can share the cache.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .calls import intrinsic_calls
from .registry import REGISTRY, Backend, BackendUnavailable, LinkSpec, Registry

CACHE_ENV = "TIR_BYOC_CACHE_DIR"
# -O3: gcc vectorises the intrinsics' bias and relu passes only from -O3 (at -O2 the relu was a
# branch per element, mispredicted on outputs of mixed sign). No -ffast-math: results stay IEEE.
_BASE_FLAGS = ("-O3", "-fPIC", "-fvisibility=hidden")
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


class ToolchainError(RuntimeError):
    """A compiler is missing, or an intrinsic library failed to compile."""


def intrinsics_dir() -> Path:
    """Where the bundled intrinsic sources live (installed package, or the source tree)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "intrinsics", here.parent / "intrinsics"):
        if (candidate / "include" / "tir_byoc.h").is_file():
            return candidate
    raise ToolchainError(
        f"tir_byoc's intrinsic sources are missing: expected include/tir_byoc.h under "
        f"{here / 'intrinsics'} or {here.parent / 'intrinsics'}; reinstall tir-byoc"
    )


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tir_byoc"


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str


def _find(env: str, names: tuple[str, ...], language: str) -> Compiler:
    requested = os.environ.get(env)
    candidates = (requested,) if requested else names
    for name in candidates:
        path = shutil.which(name) if name else None
        if path:
            try:
                version = subprocess.run(
                    [path, "--version"], capture_output=True, text=True, timeout=30, check=False
                ).stdout.splitlines()
            except OSError:
                continue
            return Compiler(path, version[0] if version else "")
    looked = f"${env}={requested!r}" if requested else ", ".join(names)
    raise ToolchainError(
        f"no {language} compiler found (looked for {looked}): install gcc "
        f"(e.g. `apt-get install gcc g++`) or set {env}"
    )


@functools.cache
def c_compiler() -> Compiler:
    return _find("CC", ("cc", "gcc", "clang"), "C")


@functools.cache
def cxx_compiler() -> Compiler:
    return _find("CXX", ("c++", "g++", "clang++"), "C++")


def _compiler_for(sources) -> Compiler:
    if any(Path(s).suffix != ".c" for s in sources):
        return cxx_compiler()
    return c_compiler()


@functools.cache
def _locate(backend: Backend) -> LinkSpec | str:
    """The backend's LinkSpec, or why it is unavailable; asked once per process."""
    try:
        return backend.locate()
    except BackendUnavailable as missing:
        return f"backend {backend.name} unavailable: {missing}"


def unavailable(backend: str, registry: Registry = REGISTRY) -> str | None:
    """Why ``backend`` cannot be used on this machine (compiler or library missing), or None."""
    spec = _locate(registry.backend(backend))
    if isinstance(spec, str):
        return spec
    sources = [i.source for i in registry.of_backend(backend)]
    try:
        _compiler_for(sources)
    except ToolchainError as err:
        return str(err)
    if spec.archives and shutil.which("objcopy") is None:
        return (
            f"backend {backend} links static libraries and needs objcopy, which is not on PATH "
            "(install binutils)"
        )
    return None


def _require(backend: str, registry: Registry) -> tuple[LinkSpec, list[Path], Compiler]:
    reason = unavailable(backend, registry)
    if reason is not None:
        raise ToolchainError(reason)
    spec = _locate(registry.backend(backend))
    sources = sorted({i.source for i in registry.of_backend(backend)})
    if not sources:
        raise ToolchainError(f"backend {backend} has no registered intrinsics")
    return spec, sources, _compiler_for(sources)


def _fingerprint(compiler: Compiler, sources, flags) -> str:
    digest = hashlib.sha256()
    digest.update(f"{compiler.path}\0{compiler.version}\0{' '.join(flags)}".encode())
    include = intrinsics_dir() / "include"
    for path in [*sources, *sorted(include.glob("*.h"))]:
        digest.update(str(path).encode() + b"\0" + Path(path).read_bytes())
    return digest.hexdigest()[:16]


def _run(command: list[str], what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        first = next((line for line in result.stderr.splitlines() if "error" in line), None)
        detail = first or (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ToolchainError(f"compiling {what} failed: {detail}")


def _atomic_build(target: Path, build) -> Path:
    """Run ``build(tmp_path)`` and move the result to ``target`` unless it already exists."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=target.suffix)
    os.close(fd)
    try:
        build(Path(tmp))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _compile_flags(spec: LinkSpec) -> list[str]:
    include = [f"-I{intrinsics_dir() / 'include'}", *(f"-I{d}" for d in spec.include_dirs)]
    return [*_BASE_FLAGS, *include, *spec.compile_flags]


def link_flags(spec: LinkSpec) -> list[str]:
    """Linker flags for a backend's libraries, with an rpath so they are found at run time.

    The libraries are linked ``--no-as-needed``: ``export_library`` puts these flags before
    the objects that use them, where a linker defaulting to ``--as-needed`` (Debian, Ubuntu)
    would drop them and leave the symbols unresolved when the module loads.
    """
    flags = []
    for directory in spec.library_dirs:
        flags += [f"-L{directory}", f"-Wl,-rpath,{directory}"]
    # libm: the portable epilogue (tir_byoc_epilogue.h) calls erff, tanhf and expf.
    libraries = [f"-l{lib}" for lib in (*spec.libraries, "m")]
    flags += ["-Wl,--push-state,--no-as-needed", *libraries, "-Wl,--pop-state"]
    return [*flags, *spec.link_flags]


def object_files(backend: str, registry: Registry = REGISTRY) -> tuple[list[Path], list[str]]:
    """Compile ``backend``'s sources to position-independent objects.

    Returns
    -------
    objects, flags : list of Path, list of str
        The object files and the linker flags their library needs.
    """
    spec, sources, compiler = _require(backend, registry)
    flags = _compile_flags(spec)
    objects = []
    for source in sources:
        key = _fingerprint(compiler, [source], flags)
        target = cache_dir() / backend / f"{source.stem}-{key}.o"

        def build(tmp, source=source):
            _run([compiler.path, *flags, "-c", str(source), "-o", str(tmp)], str(source))

        objects.append(_atomic_build(target, build))
    if spec.archives:
        objects = [_prelink(backend, objects, spec.archives, compiler, registry)]
    return objects, link_flags(spec)


def _prelink(backend, objects, archives, compiler, registry) -> Path:
    """``objects`` and the members of ``archives`` they need, linked into one relocatable object
    whose only global symbols are the intrinsics' (see :class:`LinkSpec`)."""
    stamps = [f"{a}:{os.stat(a).st_size}:{os.stat(a).st_mtime_ns}" for a in archives]
    key = _fingerprint(compiler, [], [*map(str, objects), *stamps])
    target = cache_dir() / backend / f"{backend}-prelinked-{key}.o"
    keep = {"tir_byoc_*", *(i.extern_symbol for i in registry.of_backend(backend))}

    def build(tmp):
        whole = tmp.with_suffix(".whole.o")
        try:
            _run(
                [
                    compiler.path,
                    "-r",
                    "-nostdlib",
                    "-o",
                    str(whole),
                    *map(str, objects),
                    "-Wl,--start-group",
                    *archives,
                    "-Wl,--end-group",
                ],
                f"the {backend} intrinsics with their static libraries",
            )
            flags = [f"--keep-global-symbol={name}" for name in sorted(keep)]
            _run(["objcopy", "--wildcard", *flags, str(whole), str(tmp)], f"{backend}'s symbols")
        finally:
            whole.unlink(missing_ok=True)

    return _atomic_build(target, build)


def shared_library(backend: str, registry: Registry = REGISTRY) -> Path:
    """Build (or find in the cache) the shared library of ``backend``'s intrinsics."""
    spec, sources, compiler = _require(backend, registry)
    objects, libs = object_files(backend, registry)
    key = _fingerprint(compiler, sources, [*_compile_flags(spec), *libs])
    target = cache_dir() / backend / f"libtir_byoc_{backend}-{key}.so"

    def build(tmp):
        _run(
            [compiler.path, "-shared", *map(str, objects), "-o", str(tmp), *libs],
            f"the {backend} intrinsic library",
        )

    return _atomic_build(target, build)


def load_backend(backend: str, registry: Registry = REGISTRY) -> Path:
    """Compile ``backend`` if needed and load it with global symbol visibility.

    After this, code JIT-compiled by ``tvm.compile(..., "llvm")`` in this process resolves the
    backend's extern symbols.
    """
    with _lock:
        library = shared_library(backend, registry)
        if str(library) not in _loaded:
            loaded = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            _check_symbols(backend, loaded, registry)
            _loaded[str(library)] = loaded
    return library


def load_called(mod, registry: Registry = REGISTRY) -> list[str]:
    """Load the library of every backend whose intrinsics ``mod`` calls; the backends, sorted.

    ``mod`` is an offloaded module or PrimFunc (as :func:`tir_byoc.offload` returns it, or read
    back from the TVMScript ``tir-byoc offload`` writes): each offloaded block names its
    intrinsic in its annotations.  Call this before ``tvm.compile`` of such a module: code the
    JIT compiles calls the intrinsics' symbols, and a symbol no loaded library defines would
    only show when the call runs, as a crash.

    Raises
    ------
    ToolchainError
        An intrinsic that is not registered (a plugin's, not loaded here), or a backend whose
        library cannot be built or found; nothing is loaded then.
    """
    names = sorted({name for f in _prim_funcs(mod) for name in intrinsic_calls(f)})
    unknown = [name for name in names if name not in registry]
    if unknown:
        raise ToolchainError(
            f"the module calls intrinsic {unknown[0]}, which is not registered; register it "
            "(or load the plugin that does) before building the module"
        )
    backends = sorted({registry[name].backend for name in names})
    missing = [(b, why) for b in backends if (why := unavailable(b, registry)) is not None]
    if missing:
        backend, why = missing[0]
        raise ToolchainError(f"the module calls backend {backend}, which is unavailable: {why}")
    for backend in backends:
        load_backend(backend, registry)
    return backends


def _prim_funcs(mod) -> list:
    from tvm import tirx

    if isinstance(mod, tirx.PrimFunc):
        return [mod]
    return [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


def _check_symbols(backend: str, library: ctypes.CDLL, registry: Registry) -> None:
    """Every intrinsic of ``backend`` is defined by its library, so no call is left unresolved
    (which a JIT-compiled caller would only find out by crashing)."""
    for intrinsic in registry.of_backend(backend):
        if not hasattr(library, intrinsic.extern_symbol):
            raise ToolchainError(
                f"intrinsic {intrinsic.name}: {intrinsic.source.name} does not define "
                f"{intrinsic.extern_symbol} (with TIR_BYOC_EXPORT visibility); define it or "
                "unregister the intrinsic"
            )
    if registry.backend(backend).packs and not hasattr(library, f"tir_byoc_{backend}_pack"):
        raise ToolchainError(
            f"backend {backend}: registered with packs=True, but its library does not define "
            f"tir_byoc_{backend}_pack (with TIR_BYOC_EXPORT visibility); define it or register "
            "the backend with packs=False"
        )


_PTR, _I32, _I64, _F64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
_I32P, _I64P = ctypes.POINTER(_I32), ctypes.POINTER(_I64)
_F64P = ctypes.POINTER(_F64)

#: The C entry points besides the intrinsics that Python calls (the package, the tests, the
#: benchmarks), each ``int32_t tir_byoc_<backend>_<name>(...)``: their argument types, as
#: ``intrinsics/include/tir_byoc.h`` and ``tir_byoc_epilogue.h`` declare them.  ``pack`` is a
#: packing backend's, ``fuses`` oneDNN's and ``cut`` oneMKL's; the others every backend's built
#: on ``tir_byoc_epilogue.h``.  oneDNN's primitive-cache hooks, which only its tests call, are
#: not here (``cache_info`` returns nothing).
ENTRY_POINTS: dict[str, tuple[type, ...]] = {
    # x, w, y; m, n, k; dtypes, layout; batch counts, x strides, w strides, ops; c0..c5; t0..t3
    "gemm": (_PTR,) * 3 + (_I64,) * 3 + (_I32,) * 2 + (_I64,) * 7 + (_F64,) * 6 + (_PTR,) * 4,
    # w; m, n, k; dtypes, layout; ops; c0..c5; form (in, out), out, size (out)
    "pack": (_PTR, _I64, _I64, _I64, _I32, _I32, _I64) + (_F64,) * 6 + (_I32P, _PTR, _I64P),
    # y (in place); rows, n; ops; c0..c5; t0..t3
    "epilogue": (_PTR,) + (_I64,) * 3 + (_F64,) * 6 + (_PTR,) * 4,
    "epilogue_parts": (_I64,) * 3,  # ops, rows, n
    "vector_math": (),
    "fuses": (_I32,) + (_F64,) * 3,  # op code, c0..c2
    "cut": (_I64,) * 4 + (_I32, _I32P),  # m, n, k, count, packed; parts (out)
    # x, w, y; dtypes, layout, weight layout; n, c, o, groups, 6 x 3 geometry; ops; c0..c5;
    # t0..t3 (tir_byoc.h, the conv entry point)
    "conv": (_PTR,) * 3 + (_I32,) * 3 + (_I64,) * 23 + (_F64,) * 6 + (_PTR,) * 4,
    # w; dtypes, layout, weight layout; n, c, o, groups, 6 x 3 geometry; ops; c0..c5; form
    # (in, out), out, size (out)
    "conv_pack": (_PTR,) + (_I32,) * 3 + (_I64,) * 23 + (_F64,) * 6 + (_I32P, _PTR, _I64P),
    # wa, wb; dtypes; per convolution 25 int64 (layouts, geometry, ops) and 6 constants;
    # choice (in, out), out, size (in, out) (intrinsics/onednn/conv.cpp)
    "conv_pair_pack": (_PTR, _PTR, _I32, _I64P, _F64P, _I64P, _F64P, _I32P, _PTR, _I64P),
}


def entry_point(backend: str, name: str, registry: Registry = REGISTRY):
    """``tir_byoc_<backend>_<name>`` from ``backend``'s library as a ctypes function, its
    argument types those of :data:`ENTRY_POINTS`, returning an int32; None if the library does
    not export it.  Compiles and loads the library if needed."""
    if name not in ENTRY_POINTS:
        raise ValueError(f"{name!r} is not an entry point (expected one of {list(ENTRY_POINTS)})")
    library = _loaded[str(load_backend(backend, registry))]
    function = getattr(library, f"tir_byoc_{backend}_{name}", None)
    if function is not None:
        function.argtypes = ENTRY_POINTS[name]
        function.restype = ctypes.c_int32
    return function


#: The libm functions the C epilogue (``intrinsics/include/tir_byoc_epilogue.h``) can call
#: through glibc's vector math library, in the bit order of ``tir_byoc_<backend>_vector_math``.
VECTOR_FUNCTIONS = ("erff", "tanhf", "expf")


def vector_math(backend: str, registry: Registry = REGISTRY) -> tuple[str, ...]:
    """The functions of :data:`VECTOR_FUNCTIONS` that ``backend``'s C epilogue calls 8 values at
    a time on this machine (libmvec's AVX2 variants; the others are libm's scalar ones).  ``()``
    also for a backend whose library does not say (MKL computes them with its own VM)."""
    function = entry_point(backend, "vector_math", registry)
    if function is None:
        return ()
    bits = function()
    return tuple(name for i, name in enumerate(VECTOR_FUNCTIONS) if bits >> i & 1)
