"""The registry: validation of registrations, and which intrinsic serves a match."""

import re
import textwrap

import pytest
from support.byoc_testing import assert_equivalent
from support.tir_programs import dense_bias_relu_blocks, reordered_loops_and_operands

import tir_byoc
from tir_byoc.patterns import CALL_PATTERNS
from tir_byoc.registry import Backend, BackendUnavailable, Intrinsic, Registry

DENSE_BIAS_RELU_C = textwrap.dedent(
    """
    #include "tir_byoc.h"
    TIR_BYOC_EXPORT int32_t {symbol}(const float *x, const float *w, const float *b, float *y,
                                      int64_t m, int64_t n, int64_t k, int32_t dtypes) {{
      if (dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {{
          float acc = b[j];
          for (int64_t r = 0; r < k; ++r) acc += x[i * k + r] * w[j * k + r];
          y[i * n + j] = acc > 0.0f ? acc : 0.0f;
        }}
      return TIR_BYOC_OK;
    }}
    """
)


@pytest.fixture
def user_source(tmp_path):
    def write(symbol):
        path = tmp_path / f"{symbol}.c"
        path.write_text(DENSE_BIAS_RELU_C.format(symbol=symbol))
        return path

    return write


def test_a_user_intrinsic_takes_a_few_lines_and_wins_by_priority(user_source):
    registry = Registry()
    tir_byoc.register_intrinsic(
        "ref.dense_bias_relu",
        "dense_bias_relu",
        "tir_byoc_ref_dense_bias_relu",
        tir_byoc.REGISTRY["ref.dense_bias_relu"].source,
        registry=registry,
    )
    tir_byoc.register_intrinsic(
        "toy.dense_bias_relu",
        "dense_bias_relu",
        "toy_dense_bias_relu",
        user_source("toy_dense_bias_relu"),
        priority=10,
        registry=registry,
    )
    assert tir_byoc.scan(dense_bias_relu_blocks, registry=registry)[0].intrinsic == (
        "toy.dense_bias_relu"
    )
    assert_equivalent(
        dense_bias_relu_blocks, registry=registry, expect_calls={"toy.dense_bias_relu": 1}
    )
    # Per call, and through the environment, the order can be overridden.
    chosen = tir_byoc.scan(dense_bias_relu_blocks, registry=registry, backends=["ref", "toy"])
    assert chosen[0].intrinsic == "ref.dense_bias_relu"


def test_backend_order_from_the_environment(monkeypatch, user_source):
    monkeypatch.setenv("TIR_BYOC_BACKENDS", "ref")
    assert tir_byoc.scan(dense_bias_relu_blocks)[0].intrinsic == "ref.dense_bias_relu"
    monkeypatch.setenv("TIR_BYOC_BACKENDS", "nonexistent")
    with pytest.raises(ValueError, match=r"\$TIR_BYOC_BACKENDS: expected backend names"):
        tir_byoc.scan(dense_bias_relu_blocks)
    # A custom registry is not ordered by the environment, only by priority or backends=.
    registry = Registry()
    tir_byoc.register_intrinsic(
        "toy.dense_bias_relu",
        "dense_bias_relu",
        "toy_dense_bias_relu",
        user_source("toy_dense_bias_relu"),
        registry=registry,
    )
    assert tir_byoc.scan(dense_bias_relu_blocks, registry=registry)[0].intrinsic == (
        "toy.dense_bias_relu"
    )


def test_an_unavailable_backend_is_skipped_with_its_reason(user_source):
    def locate():
        raise BackendUnavailable("libtoy.so not found; pip install toy-kernels")

    registry = Registry()
    registry.register_backend(Backend("toy", locate))
    tir_byoc.register_intrinsic(
        "toy.dense_bias_relu",
        "dense_bias_relu",
        "toy_dense_bias_relu",
        user_source("toy_dense_bias_relu"),
        priority=10,
        registry=registry,
    )
    tir_byoc.register_intrinsic(
        "ref.dense_bias_relu",
        "dense_bias_relu",
        "tir_byoc_ref_dense_bias_relu",
        tir_byoc.REGISTRY["ref.dense_bias_relu"].source,
        registry=registry,
    )
    assert tir_byoc.scan(dense_bias_relu_blocks, registry=registry)[0].intrinsic == (
        "ref.dense_bias_relu"
    )
    match = tir_byoc.scan(dense_bias_relu_blocks, registry=registry, backends=["toy"])[0]
    assert match.intrinsic is None
    assert "backend toy unavailable: libtoy.so not found" in match.reason
    assert_equivalent(
        dense_bias_relu_blocks, registry=registry, expect_calls={"ref.dense_bias_relu": 1}
    )


def test_a_shape_constraint_refuses_with_its_reason(user_source):
    registry = Registry()
    tir_byoc.register_intrinsic(
        "toy.dense_bias_relu",
        "dense_bias_relu",
        "toy_dense_bias_relu",
        user_source("toy_dense_bias_relu"),
        registry=registry,
        check=lambda match: None if match.m.value % 16 == 0 else "needs M divisible by 16",
    )
    match = tir_byoc.scan(dense_bias_relu_blocks, registry=registry)[0]
    assert match.intrinsic is None and "needs M divisible by 16" in match.reason


def test_patterns_without_an_intrinsic_say_so():
    registry = Registry()
    match = tir_byoc.scan(reordered_loops_and_operands, registry=registry)[0]
    assert match.intrinsic is None
    assert match.reason == "no intrinsic registered for matmul_bias_relu"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"name": "toy"}, "expected '<backend>.<variant>'"),
        ({"pattern": "conv2d"}, "expected 'gemm' or a pattern in"),
        ({"ops": ("gelu",)}, "expected ops from"),
        ({"pattern": "gemm", "ops": ("mish",)}, "expected ops from"),
        ({"extern_symbol": "not a symbol"}, "expected a C identifier as extern_symbol"),
        ({"dtypes": ("float99",)}, "expected x dtype in"),
        ({"dtypes": ("float32,float32",)}, "expected 'x_dtype,w_dtype->out_dtype'"),
        ({"dtypes": ()}, "expected at least one dtype signature"),
        ({"source": "/nonexistent/toy.c"}, "expected an existing C/C++ source file"),
        ({"priority": "high"}, "expected an int priority"),
    ],
)
def test_invalid_intrinsics_are_value_errors(user_source, changes, message):
    fields = {
        "name": "toy.dense_bias_relu",
        "pattern": "dense_bias_relu",
        "extern_symbol": "toy_dense_bias_relu",
        "dtypes": ("float32",),
        "source": user_source("toy_dense_bias_relu"),
    }
    fields.update(changes)
    with pytest.raises(ValueError, match=re.escape(message)):
        Intrinsic(**fields)


def test_duplicate_names_and_symbols_are_value_errors(user_source):
    registry = Registry()
    source = user_source("toy_dense_bias_relu")
    tir_byoc.register_intrinsic(
        "toy.dense_bias_relu", "dense_bias_relu", "toy_dense_bias_relu", source, registry=registry
    )
    with pytest.raises(ValueError, match=r"'toy\.dense_bias_relu' is already registered"):
        tir_byoc.register_intrinsic(
            "toy.dense_bias_relu", "dense_bias_relu", "toy_other", source, registry=registry
        )
    with pytest.raises(ValueError, match="'toy_dense_bias_relu' is already used by"):
        tir_byoc.register_intrinsic(
            "toy.second", "dense_bias_relu", "toy_dense_bias_relu", source, registry=registry
        )
    assert [i.name for i in registry] == ["toy.dense_bias_relu"]


def test_the_bundled_reference_backend_covers_every_pattern():
    ref = tir_byoc.REGISTRY.of_backend("ref")
    assert sorted(i.pattern for i in ref) == sorted([*CALL_PATTERNS, "gemm", "conv"])
    for name in tir_byoc.PATTERNS:
        assert any(i.serves(name) for i in ref), name
    assert all(i.extern_symbol == f"tir_byoc_ref_{i.pattern}" for i in ref)
