"""The toolchain: compile on first use, a content-keyed cache, clear errors when it cannot."""

import textwrap

import pytest
import tvm
from support.tir_programs import dense_bias_relu_blocks

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.registry import Backend, Registry


@pytest.fixture
def no_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    toolchain.c_compiler.cache_clear()
    toolchain.cxx_compiler.cache_clear()
    yield
    toolchain.c_compiler.cache_clear()
    toolchain.cxx_compiler.cache_clear()


def test_a_missing_compiler_is_reported_before_anything_changes(no_compiler):
    match = tir_byoc.scan(dense_bias_relu_blocks)[0]
    assert match.intrinsic is None
    assert "no C compiler found (looked for $CC='/nonexistent/cc')" in match.reason
    tvm.ir.assert_structural_equal(tir_byoc.offload(dense_bias_relu_blocks), dense_bias_relu_blocks)
    with pytest.raises(ValueError, match="no C compiler found"):
        tir_byoc.offload(dense_bias_relu_blocks, strict=True)
    with pytest.raises(toolchain.ToolchainError, match="no C compiler found"):
        toolchain.load_backend("ref")


def test_a_compile_error_names_the_file_and_nothing_is_rewritten(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    source = tmp_path / "broken.c"
    source.write_text("int32_t broken_dense(void) { return undeclared_name; }\n")
    registry = Registry()
    tir_byoc.register_intrinsic(
        "broken.dense_bias_relu", "dense_bias_relu", "broken_dense", source, registry=registry
    )
    with pytest.raises(toolchain.ToolchainError, match=r"compiling .*broken\.c failed: .*error"):
        tir_byoc.offload(dense_bias_relu_blocks, registry=registry)


def test_builds_are_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    source = tmp_path / "cached.c"
    body = textwrap.dedent(
        """
        #include "tir_byoc.h"
        TIR_BYOC_EXPORT int32_t cached_dense(const float *x, const float *w, float *y,
                                             int64_t m, int64_t n, int64_t k, int32_t d) {
          (void)x; (void)w; (void)y; (void)m; (void)n; (void)k; (void)d; return %d;
        }
        """
    )
    source.write_text(body % 0)
    registry = Registry()
    tir_byoc.register_intrinsic("cached.dense", "dense", "cached_dense", source, registry=registry)
    first = toolchain.shared_library("cached", registry)
    assert toolchain.shared_library("cached", registry) == first
    assert first.is_relative_to(tmp_path / "cache")
    source.write_text(body % 1)
    assert toolchain.shared_library("cached", registry) != first


def refusing_dense(directory, name: str):
    """``name``.c defining only ``name``_dense, a dense intrinsic that refuses every call."""
    source = directory / f"{name}.c"
    source.write_text(
        '#include "tir_byoc.h"\n'
        f"TIR_BYOC_EXPORT int32_t {name}_dense(const void *x, const void *w, void *y, int64_t m,\n"
        "                                int64_t n, int64_t k, int32_t dtypes) {\n"
        "  return TIR_BYOC_EDTYPE;\n"
        "}\n"
    )
    return source


def test_an_intrinsic_its_source_does_not_define_is_reported_before_anything_runs(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    source = refusing_dense(tmp_path, "partial")
    registry = Registry()
    for name, symbol in (("dense", "partial_dense"), ("bmm_dense", "partial_bmm_dense")):
        tir_byoc.register_intrinsic(f"partial.{name}", name, symbol, source, registry=registry)
    dense = tir_byoc.describe("dense")
    with pytest.raises(toolchain.ToolchainError) as error:
        tir_byoc.offload(dense, registry=registry)
    assert str(error.value) == (
        "intrinsic partial.bmm_dense: partial.c does not define partial_bmm_dense (with "
        "TIR_BYOC_EXPORT visibility); define it or unregister the intrinsic"
    )


def test_a_packing_backend_whose_library_defines_no_pack_function_is_refused_when_loaded(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    source = refusing_dense(tmp_path, "nopack")
    registry = Registry()
    tir_byoc.register_backend(Backend("nopack", packs=True), registry=registry)
    tir_byoc.register_intrinsic("nopack.dense", "dense", "nopack_dense", source, registry=registry)
    with pytest.raises(toolchain.ToolchainError) as error:
        toolchain.load_backend("nopack", registry)
    assert str(error.value) == (
        "backend nopack: registered with packs=True, but its library does not define "
        "tir_byoc_nopack_pack (with TIR_BYOC_EXPORT visibility); define it or register the "
        "backend with packs=False"
    )


def test_entry_points_come_with_their_argument_types_and_a_missing_one_is_none():
    parts = toolchain.entry_point("ref", "epilogue_parts")
    assert parts.argtypes == toolchain.ENTRY_POINTS["epilogue_parts"]
    assert parts(0, 1, 1) == 1  # no ops: one block
    assert parts(0xFF, 1, 1) < 0  # an op code the decoder refuses, negated
    assert toolchain.entry_point("ref", "cut") is None  # oneMKL's alone
    with pytest.raises(ValueError, match=r"^'gem' is not an entry point \(expected one of "):
        toolchain.entry_point("ref", "gem")


def test_load_called_loads_what_a_module_read_back_from_tvmscript_calls():
    offloaded = tir_byoc.offload(dense_bias_relu_blocks, backends="ref")
    read_back = tvm.script.from_source(offloaded.script())
    assert toolchain.load_called(read_back) == ["ref"]
    assert toolchain.load_called(dense_bias_relu_blocks) == []


def test_load_called_refuses_an_unregistered_intrinsic_before_anything_is_built(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    source = refusing_dense(tmp_path, "plugin")
    registry = Registry()
    tir_byoc.register_intrinsic("plugin.dense", "dense", "plugin_dense", source, registry=registry)
    offloaded = tir_byoc.offload(tir_byoc.describe("dense"), registry=registry)
    with pytest.raises(toolchain.ToolchainError) as error:
        toolchain.load_called(offloaded)
    assert str(error.value) == (
        "the module calls intrinsic plugin.dense, which is not registered; register it (or "
        "load the plugin that does) before building the module"
    )
    assert toolchain.load_called(offloaded, registry) == ["plugin"]


def test_load_called_names_a_backend_that_cannot_be_had(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.CACHE_ENV, str(tmp_path / "cache"))
    source = refusing_dense(tmp_path, "gone")
    registry = Registry()
    tir_byoc.register_intrinsic("gone.dense", "dense", "gone_dense", source, registry=registry)
    offloaded = tir_byoc.offload(tir_byoc.describe("dense"), registry=registry)

    def missing():
        raise toolchain.BackendUnavailable("libgone.so is not installed")

    registry.register_backend(Backend("gone", locate=missing), override=True)
    with pytest.raises(
        toolchain.ToolchainError, match=r"backend gone, which is unavailable: .*libgone"
    ):
        toolchain.load_called(offloaded, registry)
