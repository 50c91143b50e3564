"""The per-PrimFunc profile: every PrimFunc main calls, as often as main calls it, flagged right.

No timing is asserted: only what is counted (calls, which functions, which are offloaded) and
what follows from the definitions (shares sum to 1).  Call counts are checked against
:func:`built_models.prim_func_calls`, which reads them from the built module without tir_byoc;
offloaded functions against :func:`tir_byoc.rewrite.intrinsic_calls`.
"""

import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from support import built_models
from support.tir_programs import two_layers

import tir_byoc
from tir_byoc.rewrite import intrinsic_calls

REPEAT = 3


@pytest.fixture(scope="module")
def encoder_profile():
    built = built_models.encoder_layer()
    return built.model, built.model.profile(*built.inputs, repeat=REPEAT, warmup=1)


def test_every_called_prim_func_is_listed_with_its_call_count(encoder_profile):
    model, profile = encoder_profile
    assert {f.name: f.calls for f in profile.functions} == built_models.prim_func_calls(
        model.module
    )
    assert profile.repeat == REPEAT
    assert profile.calls_per_run > sum(f.calls for f in profile.functions)  # builtins too


def test_shares_sum_to_one_and_offloaded_functions_are_flagged(encoder_profile):
    model, profile = encoder_profile
    assert sum(f.share for f in profile.functions) == pytest.approx(1.0)
    assert all(f.time_ms >= 0 for f in profile.functions)
    offloaded = {f.name for f in profile.functions if f.offloaded}
    assert offloaded == {f.name for f in profile.functions if intrinsic_calls(model.module[f.name])}
    # The FFN's relu and the residual add join their GEMMs (the Linear reshapes are folded);
    # q @ k^T reads K untransposed (NT_matmul), the other attention product is matmul1.
    assert offloaded == {"fused_matmul_add", "fused_matmul2_add1", "fused_matmul3_add3_relu",
                         "fused_matmul4_add4_add2", "matmul1", "NT_matmul"}  # fmt: skip
    for f in profile.functions:
        assert f.intrinsics == tuple(sorted(intrinsic_calls(model.module[f.name])))
        assert f.schedule == model.schedules[f.name]
    assert profile.offloaded_share == pytest.approx(
        sum(f.share for f in profile.functions if f.offloaded)
    )


def test_the_table_has_a_row_per_function_and_a_summary(encoder_profile):
    _, profile = encoder_profile
    lines = profile.table().splitlines()
    assert lines[0].split() == ["PrimFunc", "calls", "ms/run", "us/call", "share", "code"]
    assert [line.split()[0] for line in lines[1:-1]] == [f.name for f in profile.functions]
    assert "tir_byoc: ref.bmm_matmul" in profile.table()
    assert lines[-1].startswith("PrimFuncs ")
    assert lines[-1].endswith(f"medians of {REPEAT} runs")
    top = profile.table(top=3).splitlines()
    assert len(top) == 1 + 3 + 1 + 1
    assert top[4].startswith(f"({len(profile.functions) - 3} more)")


def test_without_offload_nothing_is_flagged():
    built = built_models.mlp_native()
    profile = tir_byoc.profile(built.model, *built.inputs, repeat=REPEAT)
    assert [f.name for f in profile.functions if f.offloaded] == []
    assert profile.offloaded_share == 0
    offloaded = tir_byoc.profile(built_models.mlp().model, built.inputs[0].numpy(), repeat=REPEAT)
    assert offloaded.offloaded_share == pytest.approx(1.0)
    assert {f.name: f.calls for f in offloaded.functions} == {
        "fused_matmul_add_relu": 1,
        "fused_matmul1_add1": 1,
    }


def test_a_prim_func_model_is_one_row():
    model = tir_byoc.build_model(two_layers, backends="ref")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in [(4, 6), (5, 6), (5,), (3, 5)]]
    profile = model.profile(*inputs, repeat=REPEAT)
    assert [(f.name, f.calls, f.share, f.offloaded) for f in profile.functions] == [
        ("two_layers", 1, 1.0, True)
    ]
    assert profile.overhead_us is None


def test_bad_arguments_are_one_line_value_errors():
    built = built_models.mlp()
    with pytest.raises(ValueError, match=r"expected a tir_byoc\.Model"):
        tir_byoc.profile(built.module, *built.inputs)
    with pytest.raises(ValueError, match="expected repeat >= 1"):
        built.model.profile(*built.inputs, repeat=0)
    with pytest.raises(ValueError, match="expected 1 inputs"):
        built.model.profile()


def test_the_chart_needs_matplotlib(encoder_profile, monkeypatch, tmp_path):
    _, profile = encoder_profile
    loaded = [name for name in sys.modules if name.split(".")[0] == "matplotlib"]
    for name in {"matplotlib", "matplotlib.backends.backend_agg", *loaded}:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it raises ImportError
    with pytest.raises(ImportError, match="expected matplotlib to be installed") as error:
        profile.chart(tmp_path / "profile.png")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "profile.png").exists()


def test_the_chart_is_a_png(encoder_profile, tmp_path):
    pytest.importorskip("matplotlib")
    _, profile = encoder_profile
    path = profile.chart(tmp_path / "charts" / "profile.png", top=5)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
