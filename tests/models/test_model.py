"""build_model: from a torch model, a Relax module or a TIR function to something that runs.

Results are compared with torch (or NumPy) on the models of :mod:`built_models`; the export is
loaded in a fresh process that imports neither tir_byoc nor torch.
"""

import numpy as np
import pytest

pytest.importorskip("torch")

import torch
import tvm
from support import built_models
from support.fresh_process import run_python
from support.tir_programs import two_layers
from tvm import relax

import tir_byoc
from tir_byoc import built_model, demo
from tir_byoc.offload import OffloadReport
from tir_byoc.rewrite import intrinsic_calls

FP32 = {"rtol": 1e-4, "atol": 1e-5}


def test_an_mlp_equals_torch_called_with_torch_or_numpy():
    built = built_models.mlp()
    (x,) = built.inputs
    from_torch = built.model(x)
    from_numpy = built.model(x.numpy())
    assert isinstance(from_torch, torch.Tensor)
    assert isinstance(from_numpy, np.ndarray)
    np.testing.assert_allclose(from_torch.numpy(), built.expected, **FP32)
    np.testing.assert_allclose(from_numpy, built.expected, **FP32)
    assert dict(built.model.intrinsics) == {
        "fused_matmul_add_relu": ("ref.dense_bias_relu",),
        "fused_matmul1_add1": ("ref.dense_bias",),
    }
    # The weight transposes the offload folded away are not built at all.
    assert dict(built.model.schedules) == {
        "fused_matmul_add_relu": built_model.OFFLOADED,
        "fused_matmul1_add1": built_model.OFFLOADED,
    }


def test_without_offload_nothing_calls_an_intrinsic_and_the_result_is_the_same():
    built = built_models.mlp_native()
    assert dict(built.model.intrinsics) == {}
    assert built_model.OFFLOADED not in built.model.schedules.values()
    np.testing.assert_allclose(built.model(built.inputs[0]).numpy(), built.expected, **FP32)


def test_a_transformer_encoder_layer_equals_torch_and_the_rest_gets_dlight():
    built = built_models.encoder_layer()
    np.testing.assert_allclose(built.model(*built.inputs).numpy(), built.expected, **FP32)
    # Both attention products and the four projections (the fused q/k/v one, the output one,
    # the two of the feed-forward) run in the library, once per call site of their PrimFunc;
    # q @ k^T reads K untransposed (relax.untranspose), as a bmm_dense.
    # (Whether the output projection is a dense_bias or a bmm_matmul_bias depends on whether
    # the Relax fold serves its broadcast weight; either way it is one call.)
    fired = {}
    for name, sites in built_models.prim_func_calls(built.model.module).items():
        for intrinsic, n in intrinsic_calls(built.model.module[name]).items():
            fired[intrinsic] = fired.get(intrinsic, 0) + n * sites
    assert fired["ref.bmm_dense"] == 1 and fired["ref.bmm_matmul"] == 1
    assert sum(fired.values()) == 6
    assert set(fired) <= {
        "ref.bmm_dense",
        "ref.bmm_matmul",
        "ref.dense_bias",
        "ref.bmm_matmul_bias",
        "ref.dense_bias_relu",
        "ref.gemm",
    }
    assert set(built.model.intrinsics) == {
        name for name, way in built.model.schedules.items() if way == built_model.OFFLOADED
    }
    # ...the softmax and the layer norms get dlight's Reduction rule.
    dlight_scheduled = [n for n, s in built.model.schedules.items() if s == built_model.DLIGHT]
    assert any("softmax" in n for n in dlight_scheduled)
    assert any("layer_norm" in n for n in dlight_scheduled)
    assert dict(built.model.dlight_failures) == {}


def test_a_relax_module_is_lowered_offloaded_and_runs_its_only_function():
    built = tir_byoc.build_model(demo.lowered_mlp(), backends="ref")
    assert built.entry == "forward"
    assert sorted(built.intrinsics) == [
        "fused_matmul1_add1",
        "fused_matmul_add_relu",
    ]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((demo.BATCH, demo.IN_FEATURES)).astype("float32")
    params = demo.mlp_weights(rng)
    np.testing.assert_allclose(built(x, *params), demo.mlp_reference(x, *params), **FP32)


def test_a_prim_func_takes_its_inputs_or_every_buffer_and_returns_what_it_writes():
    built = tir_byoc.build_model(two_layers, backends="ref")
    assert dict(built.intrinsics) == {"two_layers": ("ref.dense", "ref.dense_bias_relu")}
    rng = np.random.default_rng(4)
    x, w1, b1, w2 = (
        rng.standard_normal(s).astype("float32") for s in [(4, 6), (5, 6), (5,), (3, 5)]
    )
    expected = np.maximum(x @ w1.T + b1, 0) @ w2.T
    np.testing.assert_allclose(built(x, w1, b1, w2), expected, **FP32)
    out = np.full((4, 3), np.nan, "float32")
    np.testing.assert_allclose(built(x, w1, b1, w2, out), expected, **FP32)


def test_a_failing_dlight_rule_leaves_its_function_unscheduled_and_is_recorded(monkeypatch):
    class Broken(tvm.s_tir.dlight.ScheduleRule):
        def apply(self, func, target, tunable):
            raise RuntimeError("rule broke\nsecond line")

    monkeypatch.setattr(tir_byoc.schedules, "RULES", (Broken,))
    built = tir_byoc.build_model(demo.lowered_mlp(), offload=False)
    assert dict(built.dlight_failures) == {
        "fused_matmul_add_relu": "RuntimeError: rule broke",
        "fused_matmul1_add1": "RuntimeError: rule broke",
        "transpose": "RuntimeError: rule broke",
        "transpose1": "RuntimeError: rule broke",
    }
    assert set(built.schedules.values()) == {built_model.UNSCHEDULED}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((demo.BATCH, demo.IN_FEATURES)).astype("float32")
    params = demo.mlp_weights(rng)
    np.testing.assert_allclose(built(x, *params), demo.mlp_reference(x, *params), **FP32)


class PositionIds(torch.nn.Module):
    """RoBERTa's position ids: a cumulative sum over the tokens that are not padding."""

    def forward(self, ids, x):
        positions = torch.cumsum(ids.ne(1).int(), dim=1)
        return x * positions.unsqueeze(-1)


def test_a_function_tvms_pipeline_adds_after_the_rules_says_how_it_runs():
    """TVM's Relax build pipeline writes cumsum as TOPI's scan after the default rules ran:
    it is in ``unscheduled`` with why, not a function with no account of itself."""
    ids = torch.randint(0, 5, (2, 16), generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 16, 8, generator=torch.Generator().manual_seed(1))
    built = tir_byoc.build_model(PositionIds().eval(), (ids, x))
    assert set(built.rules) | set(built.unscheduled) == set(built.schedules)
    assert dict(built.unscheduled) == {
        "cumsum": "added by TVM's Relax build pipeline after the default rules ran (a scan or "
        "sort it writes with TOPI): runs as TOPI wrote it, with its own parallel loops"
    }
    with torch.no_grad():
        expected = PositionIds()(ids, x).numpy()
    np.testing.assert_array_equal(built(ids, x).numpy(), expected)


def test_the_export_runs_in_a_fresh_process_without_tir_byoc_or_torch(tmp_path):
    built = built_models.encoder_layer()
    library = built.model.export_library(tmp_path / "layer.so")
    np.save(tmp_path / "x.npy", built.inputs[0].numpy())
    script = f"""
        import sys
        sys.modules["torch"] = None  # the exported library must not need torch
        import numpy as np, tvm
        from tvm import relax
        vm = relax.VirtualMachine(tvm.runtime.load_module("{library}"), tvm.cpu())
        (out,) = vm["main"](tvm.runtime.tensor(np.load("x.npy")))
        np.save("out.npy", out.numpy())
        assert "tir_byoc" not in sys.modules, "the library needed tir_byoc"
        # tir_byoc itself imports without torch.
        import tir_byoc
        print(tir_byoc.build_model.__name__)
    """
    assert run_python(script, tmp_path) == "build_model\n"
    np.testing.assert_allclose(
        np.load(tmp_path / "out.npy"), built.model(*built.inputs).numpy(), rtol=0, atol=0
    )


def test_a_fresh_process_runs_openmp_at_the_count_of_the_process_it_is_compared_with(tmp_path):
    # oneDNN's last bits follow OpenMP's thread count, which torch.set_num_threads changes in
    # this process's libgomp whatever the environment says; the bitwise comparisons above
    # need the fresh process at the same count.
    script = """
        import ctypes, os
        gomp = ctypes.CDLL("libgomp.so.1")
        print(gomp.omp_get_max_threads())
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert run_python(script, tmp_path) == "1\n"
    finally:
        torch.set_num_threads(threads)


def _one_line_value_error(call, *fragments):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


def test_bad_models_and_options_are_one_line_value_errors():
    mlp = built_models.mlp()
    _one_line_value_error(lambda: tir_byoc.build_model(42), "expected a torch.nn.Module", "int")
    _one_line_value_error(
        lambda: tir_byoc.build_model(mlp.module), "needs example_inputs", "got None"
    )
    _one_line_value_error(
        lambda: tir_byoc.build_model(mlp.module, [1, 2]), "expected example_inputs", "int"
    )
    _one_line_value_error(
        lambda: tir_byoc.build_model(demo.lowered_mlp(), mlp.inputs),
        "example_inputs are only for a torch model",
    )
    _one_line_value_error(
        lambda: tir_byoc.build_model(two_layers, target="c"), "expected an llvm (CPU) target"
    )
    _one_line_value_error(
        lambda: tir_byoc.build_model(two_layers, target="no-such-target"),
        "expected an llvm (CPU) target, got 'no-such-target'",
    )
    _one_line_value_error(
        lambda: tir_byoc.build_model(demo.lowered_mlp(), entry="backward"),
        "expected entry= naming one of ['forward']",
    )
    training = torch.nn.Linear(4, 4).train()
    _one_line_value_error(
        lambda: tir_byoc.build_model(training, torch.ones(1, 4)), "call model.eval() first"
    )
    empty = tvm.IRModule({})
    _one_line_value_error(lambda: tir_byoc.build_model(empty), "expected an IRModule")


def test_bad_call_arguments_are_one_line_value_errors():
    built = built_models.mlp().model
    x = np.zeros((8, 32), "float32")
    _one_line_value_error(lambda: built(), "expected 1 inputs (input), got 0")
    _one_line_value_error(lambda: built(x, x), "expected 1 inputs")
    _one_line_value_error(
        lambda: built(np.zeros((8, 31), "float32")), "expected shape (8, 32) float32, got (8, 31)"
    )
    _one_line_value_error(lambda: built(x.astype("float64")), "float32, got (8, 32) float64")
    _one_line_value_error(lambda: built(x.tolist()), "expected input 0 as a NumPy array", "list")
    # The good call, next to them.
    assert built(x).shape == (8, 10)


def test_vm_is_only_for_relax_models():
    built = tir_byoc.build_model(two_layers, backends="ref")
    _one_line_value_error(built.vm, "expected a Relax model")
    assert isinstance(built_models.mlp().model.vm(), relax.VirtualMachine)


def test_tuning_hands_the_lowered_module_to_tune_relax_and_builds_what_it_returns(
    tmp_path, monkeypatch
):
    # tune_relax itself is tested in test_meta_schedule.py (minutes of MetaSchedule); here, that
    # build_model calls it on the lowered module with the budget and options, and builds its result.
    from tir_byoc import meta_schedule

    calls = []

    def tune_relax_reported(mod, target, work_dir, trials, **options):
        calls.append((work_dir, trials, options))
        tuned, report = tir_byoc.offload_reported(mod, backends="ref", fold_transposes=False)
        for gvar, func in tuned.functions_items():
            if isinstance(func, tvm.tirx.PrimFunc) and not intrinsic_calls(func):
                tuned.update_func(gvar, func.with_attr("tirx.is_scheduled", True))
        return tuned, report

    monkeypatch.setattr(meta_schedule, "tune_relax_reported", tune_relax_reported)
    built = tir_byoc.build_model(
        demo.lowered_mlp(),
        backends="ref",
        tune_trials=16,
        work_dir=tmp_path,
        tune_options={"seed": 0},
    )
    assert calls == [
        (str(tmp_path), 16, {"progress": True, "seed": 0, "offload": "choice", "backends": "ref"})
    ]
    assert sorted(built.intrinsics) == ["fused_matmul1_add1", "fused_matmul_add_relu"]
    assert dict(built.unscheduled) == {}
    assert set(built.rules.values()) == {"MetaSchedule"}
    rng = np.random.default_rng(2)
    x = rng.standard_normal((demo.BATCH, demo.IN_FEATURES)).astype("float32")
    params = demo.mlp_weights(rng)
    np.testing.assert_allclose(built(x, *params), demo.mlp_reference(x, *params), **FP32)


def test_tuning_without_a_work_dir_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"expected work_dir= .* with tune_trials=8, got none"):
        tir_byoc.build_model(demo.lowered_mlp(), tune_trials=8)


def test_zero_trials_with_a_work_dir_builds_its_database_and_refuses_one_without(
    tmp_path, monkeypatch
):
    from tir_byoc import meta_schedule

    calls = []

    def tune_relax_reported(mod, target, work_dir, trials, **options):
        calls.append((work_dir, trials))
        return mod, OffloadReport()

    monkeypatch.setattr(meta_schedule, "tune_relax_reported", tune_relax_reported)
    message = r"tune_trials=0 builds from the database of an earlier tuning, but .* has no "
    with pytest.raises(ValueError, match=message + r"database_workload\.json; expected") as error:
        tir_byoc.build_model(demo.lowered_mlp(), work_dir=tmp_path)
    assert "\n" not in str(error.value) and calls == []
    for name in ("database_workload.json", "database_tuning_record.json"):
        (tmp_path / name).write_text("")
    tir_byoc.build_model(demo.lowered_mlp(), work_dir=tmp_path)
    assert calls == [(str(tmp_path), 0)]


@pytest.mark.parametrize("trials", [-1, 2.5, "8"])
def test_a_tuning_budget_that_is_not_a_count_is_refused_in_one_line(trials, tmp_path):
    with pytest.raises(ValueError, match=r"expected tune_trials to be an int >= 0, got") as error:
        tir_byoc.build_model(demo.lowered_mlp(), tune_trials=trials, work_dir=tmp_path)
    assert "\n" not in str(error.value)


def test_an_intrinsic_called_from_inside_a_parallel_loop_is_refused_before_the_build():
    """The intrinsics share their work among TVM's threads, so a schedule that moved a call
    into a parallel loop would make a parallel launch within one: refused, in one line."""
    from tvm import tirx

    from tir_byoc.rewrite import calls_in_parallel_loops

    offloaded = tir_byoc.offload(two_layers, backends="ref")
    assert intrinsic_calls(offloaded) and calls_in_parallel_loops(offloaded) == []
    root = offloaded.body.block
    wrapped = tirx.For(tirx.Var("p", "int32"), 0, 1, tirx.ForKind.PARALLEL, root.body)
    moved = offloaded.with_body(
        tvm.s_tir.SBlockRealize([], True, root.__class__(
            root.iter_vars, root.reads, root.writes, root.name_hint, wrapped, root.init,
            root.alloc_buffers, root.match_buffers, root.annotations,
        ))
    )  # fmt: skip
    blocks = calls_in_parallel_loops(moved)
    assert len(blocks) == sum(intrinsic_calls(offloaded).values()) == 2
    _one_line_value_error(
        lambda: tir_byoc.build_model(moved, offload=False),
        "calls an intrinsic from inside a parallel loop",
        f"(block {blocks[0]})",
    )
