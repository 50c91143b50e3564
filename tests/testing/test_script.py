"""tir_byoc.testing.script: printed functions parse back, also with symbolic shapes."""

import importlib.util

import pytest
import tvm_ffi

from tir_byoc.testing.programs import ChainSpec, ProgramSpec, build_program
from tir_byoc.testing.script import to_tvmscript


def _parse(source, tmp_path):
    path = tmp_path / "counterexample.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("counterexample", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("symbolic", [False, True])
def test_printed_function_parses_back_equal(tmp_path, index_dtype, symbolic):
    chains = (ChainSpec(bias="row", relu="select(z < 0, 0, z)", alloc="stmt"),)
    program = build_program(
        ProgramSpec(chains=chains, symbolic_m=symbolic, index_dtype=index_dtype)
    )
    source = to_tvmscript(program.func)
    assert ("T.match_buffer" in source) == symbolic
    parsed = _parse(source, tmp_path)
    assert tvm_ffi.structural_equal(parsed, program.func, map_free_vars=True)


def test_the_plain_printer_output_does_not_parse_with_symbolic_shapes(tmp_path):
    program = build_program(ProgramSpec(symbolic_m=True, index_dtype="int64"))
    plain = "from typing import TypeVar\nfrom tvm.script import tirx as T\n"
    plain += program.func.script()
    with pytest.raises(Exception, match="data must be int or Expr"):
        _parse(plain, tmp_path)
