"""TVMScript files: loading what a file defines, one-line errors, and written files that load."""

import textwrap

import pytest
import tvm
import tvm_ffi

import tir_byoc
from tir_byoc import tvmscript
from tir_byoc.patterns import describe
from tir_byoc.tvmscript import Definition, ScriptError

TWO_DEFINITIONS = """
from tvm.script import ir as I
from tvm.script import tirx as T


@I.ir_module
class Layers:
    @T.prim_func(s_tir=True)
    def copy(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("copy"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi]


@T.prim_func(s_tir=True)
def scale(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32")):
    for i in range(4):
        with T.sblock("scale"):
            vi = T.axis.remap("S", [i])
            B[vi] = A[vi] * T.float32(2)


alias = scale
"""


def write(tmp_path, text, name="script.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def assert_one_line(err: pytest.ExceptionInfo, *parts):
    message = str(err.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, message


def test_load_returns_modules_and_functions_in_file_order(tmp_path):
    definitions = tvmscript.load(write(tmp_path, TWO_DEFINITIONS))
    assert [d.name for d in definitions] == ["Layers", "scale"]  # the alias is not repeated
    layers, scale = definitions
    assert isinstance(layers.value, tvm.IRModule) and layers.module.same_as(layers.value)
    assert isinstance(scale.value, tvm.tirx.PrimFunc)
    assert [g.name_hint for g in scale.module.get_global_vars()] == ["scale"]


def test_load_can_run_twice_and_leaves_no_module_behind(tmp_path):
    import sys

    path = write(tmp_path, TWO_DEFINITIONS)
    before = set(sys.modules)
    first, second = tvmscript.load(path), tvmscript.load(path)
    tvm.ir.assert_structural_equal(first[0].value, second[0].value)
    assert set(sys.modules) == before and str(tmp_path) not in sys.path


@pytest.mark.parametrize(
    "text, parts",
    [
        ("x = 1\n", ["defines no IRModule or PrimFunc", "@T.prim_func"]),
        ("def broken(:\n    pass\n", [":1: syntax error: invalid syntax"]),
        ("import a_module_that_does_not_exist\n", [":1: importing it raised Module"]),
        ("import sys\nsys.exit(3)\n", ["exited while being imported (status 3)"]),
        (
            TWO_DEFINITIONS.replace("B[vi] = A[vi] * T.float32(2)", "B[vi] = undefined_name"),
            [":21:", "TVMScript error: Undefined variable: undefined_name"],
        ),
    ],
    ids=["nothing", "syntax", "import", "exit", "tvmscript"],
)
def test_a_broken_file_is_one_line_naming_it(tmp_path, text, parts):
    path = write(tmp_path, text)
    with pytest.raises(ScriptError) as err:
        tvmscript.load(path)
    assert_one_line(err, str(path), *parts)


def test_missing_and_directory_paths(tmp_path):
    with pytest.raises(ScriptError) as err:
        tvmscript.load(tmp_path / "absent.py")
    assert_one_line(err, "absent.py: no such file")
    with pytest.raises(ScriptError) as err:
        tvmscript.load(tmp_path)
    assert_one_line(err, "not a file")


def test_printed_symbolic_shapes_without_future_annotations_get_a_hint(tmp_path):
    printed = describe("dense").script()
    text = "from typing import TypeVar\nfrom tvm.script import tirx as T\n" + "\n".join(
        line for line in printed.splitlines() if not line.startswith("#")
    )
    with pytest.raises(ScriptError) as err:
        tvmscript.load(write(tmp_path, text))
    assert_one_line(err, "from __future__ import annotations")


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


def round_trip(tmp_path, definitions):
    path = tvmscript.write(definitions, tmp_path / "written.py", header="a header\nin two lines")
    loaded = tvmscript.load(path)
    assert [d.name for d in loaded] == [d.name for d in definitions]
    for before, after in zip(definitions, loaded):
        tvm.ir.assert_structural_equal(after.value, before.value)
    return path.read_text()


def parsed(tmp_path, definitions) -> list[Definition]:
    """``definitions`` as TVMScript parses them (TE-built functions become canonical)."""
    path = tmp_path / "parsed.py"
    path.write_text(tvmscript.dumps(definitions))
    return tvmscript.load(path)


def test_static_shapes_round_trip(tmp_path):
    definitions = tvmscript.load(write(tmp_path, TWO_DEFINITIONS))
    text = round_trip(tmp_path, definitions)
    assert text.startswith("# a header\n# in two lines\nfrom __future__ import annotations\n")


def test_symbolic_int64_and_int32_shapes_round_trip_in_one_file(tmp_path):
    wide = describe("dense_bias_relu")  # M, N, K are int64: printed as TypeVars
    narrow = describe("matmul_relu", index_dtype="int32")  # int32: declared in the body
    definitions = parsed(tmp_path, [Definition("wide", wide), Definition("narrow", narrow)])
    assert [m.pattern for d in definitions for m in tir_byoc.scan(d.module)] == [
        "dense_bias_relu",
        "matmul_relu",
    ]
    text = round_trip(tmp_path, definitions)
    assert 'M = TypeVar("M")' in text and "del K, M, N" in text and "T.int32()" in text


def test_a_te_built_function_that_would_change_is_refused(tmp_path):
    # TE puts int32 literal 0s in int64 iterator domains; the printer does not show them.
    with pytest.raises(ScriptError) as err:
        tvmscript.write([Definition("wide", describe("dense"))], tmp_path / "out.py")
    assert_one_line(err, "does not reproduce wide exactly", "dom.min", "nothing was written")
    assert list(tmp_path.iterdir()) == []


def test_offloaded_symbolic_functions_round_trip(tmp_path):
    module = tvm.IRModule({"wide": describe("dense_bias_relu"), "plain": describe("matmul")})
    offloaded = tir_byoc.offload(module)  # the loop nests (and their literal 0s) are gone
    assert not tvm_ffi.structural_equal(offloaded, module)
    text = round_trip(tmp_path, [Definition("Offloaded", offloaded)])
    assert "T.call_extern" in text


@pytest.mark.parametrize(
    "definitions, part",
    [
        ([Definition("T", describe("dense"))], "cannot write a definition named 'T'"),
        (
            [Definition("a", describe("dense")), Definition("a", describe("matmul"))],
            "two definitions with the same name",
        ),
        ([Definition("M", describe("dense"))], "named like a symbolic shape variable: ['M']"),
    ],
    ids=["reserved", "duplicate", "shape-variable"],
)
def test_unwritable_names_are_refused(definitions, part):
    with pytest.raises(ScriptError) as err:
        tvmscript.dumps(definitions)
    assert_one_line(err, part)


def test_a_module_with_constants_is_refused():
    import numpy as np
    from tvm import relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2,), "float32"))
    with builder.function("f", [x]):
        y = builder.emit(relax.op.add(x, relax.const(np.ones(2, "float32"))))
        builder.emit_func_output(y)
    with pytest.raises(ScriptError) as err:
        tvmscript.dumps([Definition("Module", builder.get())])
    assert_one_line(err, "holds constants that TVMScript prints as metadata")


def test_write_into_a_missing_directory_is_one_line(tmp_path):
    with pytest.raises(ScriptError) as err:
        tvmscript.write([Definition("f", describe("dense"))], tmp_path / "no" / "out.py")
    assert_one_line(err, "does not exist")


def test_a_file_that_would_not_reproduce_is_not_written(tmp_path, monkeypatch):
    target = tmp_path / "out.py"
    target.write_text("# the previous content\n")
    monkeypatch.setattr(tvmscript, "dumps", lambda definitions, header="": "x = 1\n")
    with pytest.raises(ScriptError) as err:
        tvmscript.write([Definition("f", describe("dense"))], target)
    assert_one_line(err, "the written TVMScript does not load back", "defines no IRModule")
    assert target.read_text() == "# the previous content\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.py"]
