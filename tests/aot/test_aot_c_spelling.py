"""C spellings: exact literals, identifiers that clash with nothing, wrapped lists."""

import math
import subprocess

import numpy as np
import pytest

from tir_byoc.aot.c_spelling import Names, c_type, identifier, literal, wrap
from tir_byoc.aot.errors import Unsupported

FLOATS = [0.044715, 0.7978845608, 1e-5, -3.4028234663852886e38, 1.401298464324817e-45, 2.0**-126]


def test_float32_literals_read_back_as_the_same_float(tmp_path):
    # Through the C compiler itself: each literal must parse to the bits NumPy holds.
    values = [np.float32(v) for v in FLOATS]
    source = tmp_path / "floats.c"
    lines = ["#include <stdio.h>", "#include <string.h>", "#include <stdint.h>"]
    lines.append("int main(void) {")
    lines.append(f"  float v[] = {{{', '.join(literal(v, 'float32', 'f') for v in values)}}};")
    lines += [
        "  for (unsigned i = 0; i < sizeof v / sizeof v[0]; ++i) {",
        '    uint32_t bits; memcpy(&bits, &v[i], 4); printf("%u\\n", bits);',
        "  }",
        "  return 0;",
        "}",
    ]
    source.write_text("\n".join(lines))
    subprocess.run(["cc", str(source), "-o", str(tmp_path / "floats")], check=True)
    printed = subprocess.run([str(tmp_path / "floats")], capture_output=True, text=True)
    expected = [int(np.array(v).view(np.uint32)) for v in values]
    assert [int(line) for line in printed.stdout.split()] == expected


def test_special_values_and_integers_are_spelled_for_c():
    assert literal(math.inf, "float32", "f") == "INFINITY"
    assert literal(-math.inf, "float32", "f") == "(-INFINITY)"
    assert literal(math.nan, "float64", "f") == "NAN"
    assert literal(2.0, "float32", "f") == "2.0f" and literal(0.5, "float64", "f") == "0.5"
    assert literal(-(2**31), "int32", "f") == "(-2147483647 - 1)"
    assert literal(2**40, "int64", "f") == "INT64_C(1099511627776)"
    assert literal(7, "uint8", "f") == "7u" and literal(True, "bool", "f") == "true"


def test_dtypes_without_a_c_type_are_refused_with_the_function():
    assert c_type("int64", "f") == "int64_t"
    with pytest.raises(Unsupported, match=r"dtype bfloat16 in fused_gelu is not supported"):
        c_type("bfloat16", "fused_gelu")


def test_identifiers_avoid_keywords_and_stay_unique():
    assert identifier("fc1.weight") == "fc1_weight"
    assert identifier("float") == "float_" and identifier("0x") == "_0x"
    names = Names(["ws"])
    assert [names.fresh(n) for n in ("x", "x", "ws", "int")] == ["x", "x_1", "ws_1", "int_"]


def test_long_lists_wrap_under_the_line_length():
    items = [f"argument_{i}" for i in range(12)]
    lines = wrap("status = function(", items, ");", "  ")
    assert len(lines) > 1 and all(len(line) <= 100 for line in lines)
    assert " ".join(line.strip() for line in lines) == f"status = function({', '.join(items)});"
    assert wrap("f(", ["a", "b"], ");") == ["f(a, b);"]
