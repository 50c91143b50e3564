"""The command line: every subcommand, the JSON schema, and one-line errors with status 2."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tvm

import tir_byoc
from tir_byoc import cli, toolchain, tvmscript
from tir_byoc.demo import lowered_mlp

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp_lowered.py"
NEAR_MISSES = ROOT / "examples" / "near_misses.py"
TOY_PLUGIN = ROOT / "examples" / "toy_cg_thflow" / "toy_intrinsic.py"

pytestmark = pytest.mark.usefixtures("reference_backend")

SYMBOLIC = """
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def dense_relu(x: T.handle, w: T.handle, y: T.handle):
    M, N, K = T.int64(), T.int64(), T.int64()
    X = T.match_buffer(x, (M, K), "float32")
    W = T.match_buffer(w, (N, K), "float32")
    Y = T.match_buffer(y, (M, N), "float32")
    C = T.sblock_alloc_buffer((M, N))
    for i, j, k in T.grid(M, N, K):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(M, N):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = T.max(C[vi, vj], T.float32(0))


@T.prim_func
def no_blocks(A: T.Buffer((4,), "float32")):
    for i in range(4):
        A[i] = T.float32(0)
"""

MATCH_KEYS = {
    "schema_version",
    "definition",
    "function",
    "blocks",
    "pattern",
    "dtype",
    "dtypes",
    "batch",
    "m",
    "n",
    "k",
    "buffers",
    "intermediates",
    "intrinsic",
    "backend",
    "extern_symbol",
    "reason",
}
REJECTION_KEYS = {"schema_version", "definition", "function", "blocks", "nearest", "reason"}
INTRINSIC_KEYS = {
    "schema_version",
    "intrinsic",
    "pattern",
    "dtypes",
    "backend",
    "extern_symbol",
    "priority",
    "source",
    "available",
    "unavailable_reason",
}


def run(capsys, *argv):
    """(status, stdout, stderr) of ``tir-byoc argv`` run in this process."""
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture
def symbolic_file(tmp_path):
    path = tmp_path / "symbolic.py"
    path.write_text(SYMBOLIC)
    return path


# --------------------------------------------------------------------------------------
# scan
# --------------------------------------------------------------------------------------


def test_scan_prints_only_the_table_on_stdout(capsys):
    status, out, err = run(capsys, "scan", MLP)
    assert status == 0
    header, *rows = out.splitlines()
    assert header.split() == [
        "FUNCTION", "BLOCKS", "PATTERN", "DTYPE", "BATCH", "M", "N", "K", "BACKEND", "INTRINSIC",
    ]  # fmt: skip
    assert [row.split() for row in rows] == [
        ["fused_matmul1_add1", "matmul,", "T_add", "dense_bias", "float32", "-",
         "64", "10", "500", "ref", "ref.dense_bias"],
        ["fused_matmul_add_relu", "matmul,", "T_add,", "compute", "dense_bias_relu", "float32",
         "-", "64", "500", "800", "ref", "ref.dense_bias_relu"],
    ]  # fmt: skip
    assert rows[0].index("dense_bias") == header.index("PATTERN")  # aligned columns
    assert "\033[" not in out  # no colour when stdout is not a terminal
    assert err == "2 chain(s) in 4 PrimFunc(s), 2 with an intrinsic\n"


def test_scan_shows_why_no_intrinsic_was_chosen_and_points_to_explain(capsys):
    status, out, err = run(capsys, "scan", NEAR_MISSES)
    assert status == 0
    fp16 = next(line for line in out.splitlines() if line.startswith("fp16_dense"))
    assert "float16,float16->float32" in fp16
    assert fp16.endswith("none: ref.dense: dtype float16,float16->float32 not supported "
                         "(supports float32)")  # fmt: skip
    assert "7 candidate block(s) refused: tir-byoc explain" in err


def test_scan_json_follows_the_schema(capsys, symbolic_file):
    status, out, _ = run(capsys, "scan", MLP, "--json")
    assert status == 0
    records = json.loads(out)
    assert [set(r) for r in records] == [MATCH_KEYS, MATCH_KEYS]
    first = records[1]
    assert first == {
        "schema_version": 1,
        "definition": "Module",
        "function": "fused_matmul_add_relu",
        "blocks": ["matmul", "T_add", "compute"],
        "pattern": "dense_bias_relu",
        "dtype": "float32",
        "dtypes": {"x": "float32", "w": "float32", "out": "float32"},
        "batch": None,
        "m": 64,
        "n": 500,
        "k": 800,
        "buffers": {
            "x": "x",
            "w": "permute_dims",
            "bias": "fc1_bias",
            "out": "compute_intermediate",
        },
        "intermediates": ["matmul_intermediate", "T_add_intermediate"],
        "intrinsic": "ref.dense_bias_relu",
        "backend": "ref",
        "extern_symbol": "tir_byoc_ref_dense_bias_relu",
        "reason": None,
    }
    _, out, _ = run(capsys, "scan", symbolic_file, "--json")
    (record,) = json.loads(out)
    assert (record["m"], record["n"], record["k"]) == ("M", "N", "K")
    assert record["pattern"] == "dense_relu" and record["definition"] == "dense_relu"


def test_scan_json_of_an_unserved_match_has_a_reason(capsys):
    _, out, _ = run(capsys, "scan", NEAR_MISSES, "--json", "--func", "fp16_dense")
    (record,) = json.loads(out)
    assert record["intrinsic"] is None and record["backend"] is None
    assert record["extern_symbol"] is None and "not supported" in record["reason"]


def test_scan_notes_functions_without_blocks(capsys, symbolic_file):
    status, out, err = run(capsys, "scan", symbolic_file)
    assert status == 0 and len(out.splitlines()) == 2
    assert "note: no_blocks has no SBlocks; its loop nests were read as plain loops" in err


def test_scan_qualifies_functions_of_modules_when_a_file_has_several(capsys, tmp_path):
    path = tmp_path / "two.py"
    path.write_text(
        SYMBOLIC + "\n\nimport tvm\n\nModule = tvm.IRModule({'dense_relu': dense_relu})\n"
    )
    status, out, _ = run(capsys, "scan", path)
    assert status == 0
    assert [row.split()[0] for row in out.splitlines()[1:]] == ["dense_relu", "Module.dense_relu"]
    _, out, _ = run(capsys, "scan", path, "--json")
    assert [(r["definition"], r["function"]) for r in json.loads(out)] == [
        ("dense_relu", "dense_relu"),
        ("Module", "dense_relu"),
    ]


def test_scan_with_backends(capsys):
    status, out, _ = run(capsys, "scan", MLP, "--backends", "ref")
    assert status == 0 and out.count("ref.dense_bias") == 2
    status, out, err = run(capsys, "scan", MLP, "--backends", "cublas")
    assert status == 2 and out == ""
    assert err.startswith("tir-byoc: error: backends: expected backend names from [")


# --------------------------------------------------------------------------------------
# explain
# --------------------------------------------------------------------------------------


def test_explain_gives_the_nearest_pattern_and_the_reason(capsys):
    status, out, err = run(capsys, "explain", NEAR_MISSES)
    assert status == 0 and err == ""
    header, *rows = out.splitlines()
    assert header.split() == ["FUNCTION", "BLOCKS", "NEAREST", "WHY", "NOT"]
    table = {(row.split()[0], row.split()[1]): row for row in rows}
    assert set(table) == {
        ("bias_by_row", "T_add"),
        ("init_one", "dense"),
        ("init_one", "T_add"),
        ("half_k", "dense"),
        ("leaky", "leaky_relu"),
        ("split_k", "dense"),
        ("batched_first_weight_only", "bmm"),
    }
    assert table["bias_by_row", "T_add"].split()[2] == "dense_bias"
    assert table["bias_by_row", "T_add"].endswith(
        "bias b is indexed by the row vi; the pattern needs the column vj"
    )
    assert table["init_one", "dense"].endswith(
        "the reduction is initialised to 1.0, not 0 or a bias b[j]"
    )
    assert table["init_one", "T_add"].split()[2] == "-"
    assert "k runs over 0..399 of 800" in table["half_k", "dense"]


def test_explain_one_function(capsys):
    status, out, _ = run(capsys, "explain", NEAR_MISSES, "--func", "half_k")
    assert status == 0 and len(out.splitlines()) == 2 and "half_k" in out.splitlines()[1]


def test_explain_json_follows_the_schema(capsys):
    status, out, _ = run(capsys, "explain", NEAR_MISSES, "--func", "init_one", "--json")
    assert status == 0
    assert json.loads(out) == [
        {
            "schema_version": 1,
            "definition": "init_one",
            "function": "init_one",
            "blocks": ["dense"],
            "nearest": "dense",
            "reason": "the reduction is initialised to 1.0, not 0 or a bias b[j]",
        },
        {
            "schema_version": 1,
            "definition": "init_one",
            "function": "init_one",
            "blocks": ["T_add"],
            "nearest": None,
            "reason": "it reads C, the output of block dense, which is not offloaded",
        },
    ]
    _, out, _ = run(capsys, "explain", NEAR_MISSES, "--json")
    assert {frozenset(r) for r in json.loads(out)} == {frozenset(REJECTION_KEYS)}


def test_explain_with_nothing_to_explain(capsys):
    status, out, err = run(capsys, "explain", MLP)
    assert status == 0 and out == ""
    assert err.startswith("nothing to explain: no candidate block was refused")


def test_an_unknown_function_is_a_usage_error(capsys):
    status, out, err = run(capsys, "explain", NEAR_MISSES, "--func", "nope")
    assert status == 2 and out == ""
    assert err.startswith("tir-byoc: error: ") and err.count("\n") == 1
    assert "no PrimFunc named 'nope'; it defines batched_first_weight_only, bias_by_row" in err


# --------------------------------------------------------------------------------------
# offload
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["static", "symbolic"])
def test_offload_writes_tvmscript_that_loads_as_the_offloaded_module(
    capsys, tmp_path, symbolic_file, source
):
    source = MLP if source == "static" else symbolic_file
    output = tmp_path / "offloaded.py"
    status, out, err = run(capsys, "offload", source, "-o", output)
    assert status == 0
    assert out.splitlines()[0].startswith("FUNCTION")
    assert err.startswith(f"wrote {output}: ") and "0 left to TVM" in err
    written = tvmscript.load(output)
    expected = [tir_byoc.offload(d.module) for d in tvmscript.load(source)]
    assert len(written) == len(expected)
    for definition, module in zip(written, expected):
        tvm.ir.assert_structural_equal(definition.module, module)
    assert "T.call_extern" in output.read_text()
    # In a fresh interpreter too, with nothing but TVM imported.
    check = "import runpy, sys; runpy.run_path(sys.argv[1]); print('loaded')"
    fresh = subprocess.run(
        [sys.executable, "-c", check, str(output)], capture_output=True, text=True, check=False
    )
    assert fresh.returncode == 0 and fresh.stdout == "loaded\n", fresh.stderr[-2000:]


def test_offload_refuses_to_overwrite_its_input(capsys, tmp_path):
    copy = tmp_path / "mlp.py"
    copy.write_text(MLP.read_text())
    status, _, err = run(capsys, "offload", copy, "-o", copy)
    assert status == 2 and "refusing to overwrite the input file" in err
    assert copy.read_text() == MLP.read_text()


def test_offload_into_a_missing_directory(capsys, tmp_path):
    status, _, err = run(capsys, "offload", MLP, "-o", tmp_path / "missing" / "out.py")
    assert status == 2 and err.count("\n") == 1 and "does not exist" in err


def test_offload_strict_fails_when_a_chain_has_no_intrinsic(capsys, tmp_path):
    output = tmp_path / "out.py"
    status, out, err = run(capsys, "offload", NEAR_MISSES, "-o", output, "--strict")
    assert status == 1 and out == "" and not output.exists()
    assert err.startswith("tir-byoc: error: tir_byoc: 1 match(es) have no intrinsic; first: ")
    assert err.count("\n") == 1


# --------------------------------------------------------------------------------------
# intrinsics, plugins, demo
# --------------------------------------------------------------------------------------


def test_intrinsics_lists_every_registered_intrinsic(capsys):
    status, out, _ = run(capsys, "intrinsics")
    assert status == 0
    header, *rows = out.splitlines()
    assert header.split() == [
        "INTRINSIC", "PATTERN", "DTYPES", "BACKEND", "PRIORITY", "SYMBOL", "AVAILABLE",
    ]  # fmt: skip
    names = [row.split()[0] for row in rows]
    assert names == [i.name for i in tir_byoc.REGISTRY]
    dense = rows[names.index("ref.dense_bias_relu")].split()
    assert dense[1:] == ["dense_bias_relu", "float32", "ref", "0", "tir_byoc_ref_dense_bias_relu",
                         "yes"]  # fmt: skip
    status, out, _ = run(capsys, "intrinsics", "--json")
    records = json.loads(out)
    assert status == 0 and {frozenset(r) for r in records} == {frozenset(INTRINSIC_KEYS)}
    assert all(r["available"] and r["unavailable_reason"] is None for r in records)


@pytest.fixture
def no_compiler(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    toolchain.c_compiler.cache_clear()
    toolchain.cxx_compiler.cache_clear()
    yield
    toolchain.c_compiler.cache_clear()
    toolchain.cxx_compiler.cache_clear()


def test_intrinsics_says_when_a_library_cannot_be_built_here(capsys, no_compiler):
    status, out, _ = run(capsys, "intrinsics", "--json")
    assert status == 0
    for record in json.loads(out):
        assert record["available"] is False
        assert re.search("no C(\\+\\+)? compiler found", record["unavailable_reason"])
    _, out, _ = run(capsys, "intrinsics")
    for line in out.splitlines()[1:]:
        assert re.search(r" no: no C(\+\+)? compiler found", line), line


@pytest.fixture
def restore_registry():
    before = {i.name for i in tir_byoc.REGISTRY}
    yield
    for intrinsic in list(tir_byoc.REGISTRY):
        if intrinsic.name not in before:
            tir_byoc.REGISTRY.unregister(intrinsic.name)


def test_a_plugin_registers_intrinsics_for_the_command(capsys, tmp_path, restore_registry):
    status, out, _ = run(capsys, "intrinsics", "--plugin", TOY_PLUGIN)
    assert status == 0
    toy = next(row for row in out.splitlines() if row.startswith("toy_cg_thflow."))
    assert toy.split()[1:5] == ["dense_bias_relu", "float32", "toy_cg_thflow", "1000"]


@pytest.mark.parametrize(
    "plugin, message",
    [
        ("missing_plugin.py", "missing_plugin.py: no such file"),
        ("a_module_that_does_not_exist", "plugin a_module_that_does_not_exist: cannot import"),
    ],
)
def test_a_broken_plugin_is_a_usage_error(capsys, plugin, message):
    status, out, err = run(capsys, "intrinsics", "--plugin", plugin)
    assert status == 2 and out == "" and err.count("\n") == 1 and message in err


def test_demo_runs_the_forum_mlp(capsys):
    status, out, _ = run(capsys, "demo")
    assert status == 0
    assert "fused_matmul_add_relu: blocks matmul, T_add, compute = dense_bias_relu" in out
    assert "Relax VM results agree with NumPy" in out


# --------------------------------------------------------------------------------------
# Errors: one line on stderr, status 2, no traceback unless --debug
# --------------------------------------------------------------------------------------

BROKEN = {
    "missing": (None, "missing.py: no such file"),
    "syntax": ("def f(:\n", "broken.py:1: syntax error: "),
    "no-tvmscript": ("x = 1\n", "broken.py: defines no IRModule or PrimFunc"),
    "tvmscript": (
        SYMBOLIC.replace("T.max(C[vi, vj], T.float32(0))", "T.max(D[vi, vj], T.float32(0))"),
        "broken.py:21:13: TVMScript error: Undefined variable: D",
    ),
    "import": ("import not_a_module_anywhere\n", "broken.py:1: importing it raised Module"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.parametrize("command", ["scan", "explain", "offload"])
def test_bad_input_is_one_line_and_status_2(capsys, tmp_path, case, command):
    text, message = BROKEN[case]
    path = tmp_path / ("missing.py" if text is None else "broken.py")
    if text is not None:
        path.write_text(text)
    extra = ["-o", tmp_path / "out.py"] if command == "offload" else []
    status, out, err = run(capsys, command, path, *extra)
    assert status == 2 and out == ""
    assert err.startswith("tir-byoc: error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err


def test_debug_shows_the_traceback(capsys, tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import not_a_module_anywhere\n")
    status, _, err = run(capsys, "scan", path, "--debug")
    assert status == 2 and "Traceback" in err
    assert err.splitlines()[-1].startswith("tir-byoc: error: ")


def test_a_usage_mistake_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["scan"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith("tir-byoc scan: error: the following arguments are required: FILE.py")


def test_an_internal_error_is_one_line_without_debug(capsys, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(cli, "offload_plan", broken)
    status, out, err = run(capsys, "scan", MLP)
    assert status == 1 and out == ""
    assert err == (
        "tir-byoc: internal error: RuntimeError: something inside broke; second line "
        "(run with --debug for the traceback)\n"
    )
    with pytest.raises(RuntimeError):
        cli.main(["scan", str(MLP), "--debug"])


# --------------------------------------------------------------------------------------
# Output details, entry points, the committed example
# --------------------------------------------------------------------------------------


def test_colour_only_when_asked_or_on_a_terminal(capsys):
    _, out, _ = run(capsys, "scan", MLP, "--color", "always")
    assert "\033[1mFUNCTION\033[0m" in out and "\033[32mref.dense_bias\033[0m" in out
    _, out, _ = run(capsys, "--color", "never", "scan", MLP)
    assert "\033[" not in out


def test_the_last_column_wraps_to_the_terminal_width():
    table = cli.Table(["NAME", "WHY NOT"])
    table.add("half_k", "k runs over 0..399 of 800 (axis 1 of input X): the loops do not cover")
    lines = table.render(width=40).splitlines()
    assert all(len(line) < 40 for line in lines) and len(lines) > 2
    assert lines[2].startswith(" " * len("half_k  ")) and lines[1].startswith("half_k  k runs")


def test_the_committed_lowered_mlp_is_what_the_demo_lowers():
    (definition,) = tvmscript.load(MLP)
    tvm.ir.assert_structural_equal(definition.value, lowered_mlp())


def test_the_installed_command_and_python_dash_m(tmp_path):
    script = Path(sys.executable).parent / "tir-byoc"
    assert script.is_file(), "reinstall the package (make install) to get the tir-byoc script"
    installed = subprocess.run(
        [str(script), "scan", str(MLP)], capture_output=True, text=True, check=False
    )
    assert installed.returncode == 0 and installed.stdout.startswith("FUNCTION")
    module = subprocess.run(
        [sys.executable, "-m", "tir_byoc", "scan", str(tmp_path / "absent.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert module.returncode == 2 and module.stdout == ""
    assert module.stderr == f"tir-byoc: error: {tmp_path / 'absent.py'}: no such file\n"


# --------------------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------------------


def test_profile_times_each_primfunc_of_a_module(capsys):
    status, out, _ = run(capsys, "profile", MLP, "--repeat", "2", "--backends", "ref")
    assert status == 0
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert set(rows) == {"fused_matmul_add_relu", "fused_matmul1_add1"}
    assert "tir_byoc: ref.dense_bias_relu" in rows["fused_matmul_add_relu"]
    assert "100.0% of it offloaded" in out.splitlines()[-1]
    status, out, _ = run(capsys, "profile", MLP, "--repeat", "2", "--no-offload")
    assert status == 0 and "0.0% of it offloaded" in out.splitlines()[-1]


def test_profile_needs_one_module(capsys):
    status, _, err = run(capsys, "profile", NEAR_MISSES)
    assert status == 2 and "profile needs one module, the file defines bias_by_row" in err
