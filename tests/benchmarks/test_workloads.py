"""benchmarks/workloads.py and the implementation table of benchmarks/implementations.py.

The workloads are tir_byoc's own pattern descriptions with static shapes, so the matcher must
recognise each one as its pattern; the batch forms are the shapes issue 11 names, each served
by the intrinsic it names, and the epilogue workloads those of issue 12; the table is what
``run.py`` checks ``--only`` against and runs from, in the order the layer and MLP runs always
had.  Every implementation checks its result on an epilogue workload against the float64
oracle before timing it; here on small shapes, where the timing is a few calls.
"""

import re
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import tvm
import tvm_ffi
from support.benchmark_modules import benchmark_modules
from tvm import ir, relax, tirx

import tir_byoc
from tir_byoc.backends import onednn
from tir_byoc.offload import apply
from tir_byoc.patterns import BATCH_FORMS


@pytest.fixture(scope="module")
def bench():
    with benchmark_modules("workloads", "implementations", "direct") as modules:
        workloads, implementations, direct = modules
        yield SimpleNamespace(workloads=workloads, implementations=implementations, direct=direct)


#: The batch workloads as issue 11 states them (8 x 12 attention heads flattened into a batch
#: of 96): parameter shapes (X, W, Y), FLOPs, the reference intrinsic that serves each, the
#: extents and batch arguments of its call, and the direct harnesses' LAYER argument.
BATCH_WORKLOADS = {
    "attn Q.K^T 96x128x64->128": (
        [(96, 128, 64), (96, 64, 128), (96, 128, 128)],
        2 * 96 * 128 * 64 * 128,
        "ref.bmm_matmul",
        [128, 128, 64, 1, 96, 0, 128 * 64, 0, 64 * 128],
        "128:128:64:f32:matmul:0:0:96",
    ),
    "attn P.V 96x128x128->64": (
        [(96, 128, 128), (96, 128, 64), (96, 128, 64)],
        2 * 96 * 128 * 128 * 64,
        "ref.bmm_matmul",
        [128, 64, 128, 1, 96, 0, 128 * 128, 0, 128 * 64],
        "128:64:128:f32:matmul:0:0:96",
    ),
    "Linear 8x128x768->3072": (  # the 2-D dense, with the batch folded into M = 1024
        [(8, 128, 768), (3072, 768), (8, 128, 3072)],
        2 * 8 * 128 * 768 * 3072,
        "ref.dense",
        [1024, 3072, 768],
        "1024:3072:768:f32:dense:0:0",
    ),
}


#: The epilogue workloads as issue 12 states them: the parameter shapes of ``arrays`` (the gated
#: MLP's: X, the gate weight, the up weight), FLOPs (both GEMMs of the gated MLP), the
#: reference backend's intrinsic for each PrimFunc, and the direct harness's LAYER arguments.
EPILOGUE_WORKLOADS = {
    "Linear+GELU 256x768->3072": (
        [(256, 768), (3072, 768), (3072,)],
        2 * 256 * 768 * 3072,
        [("main", "dense_bias_gelu", "ref.gemm")],
        ["256:3072:768:f32:dense:1:gelu"],
    ),
    "Linear+GELU(tanh) 128x768->3072": (
        [(128, 768), (3072, 768), (3072,)],
        2 * 128 * 768 * 3072,
        [("main", "dense_bias_gelu_tanh", "ref.gemm")],
        ["128:3072:768:f32:dense:1:gelu_tanh"],
    ),
    "gated MLP 256x768->2x2048": (
        [(256, 768), (2048, 768), (2048, 768)],
        2 * 2 * 256 * 768 * 2048,
        [("dense", "dense", "ref.dense"), ("dense_silu_mul", "dense_silu_mul", "ref.gemm")],
        ["256:2048:768:f32:dense:0:0", "256:2048:768:f32:dense:0:silu+mul"],
    ),
    "Linear+residual 256x768->768": (
        [(256, 768), (768, 768), (768,), (256, 768)],
        2 * 256 * 768 * 768,
        [("main", "dense_bias_add", "ref.gemm")],
        ["256:768:768:f32:dense:1:add"],
    ),
}


def _expected_shapes(workload):
    if workload.batch is not None:
        return BATCH_WORKLOADS[workload.name][0]
    m, n, k = workload.m, workload.n, workload.k
    weight = (n, k) if workload.dense else (k, n)
    return [(m, k), weight, *([(n,)] if workload.has_bias else []), (m, n)]


def _cases():
    with benchmark_modules("workloads") as (workloads,):
        return [(w, d) for w in workloads.WORKLOADS if w.group != "epilogue" for d in w.dtypes]


@pytest.mark.parametrize("workload, dtype", _cases(), ids=lambda case: getattr(case, "name", case))
def test_a_workload_is_its_pattern_with_static_shapes(bench, workload, dtype):
    signature = bench.workloads.DTYPES[dtype]
    func = bench.workloads.prim_func(workload, signature)
    expected = _expected_shapes(workload)
    shapes = [tuple(int(e) for e in p.ty.shape) for p in func.params]
    assert shapes == expected
    assert all(isinstance(e, tirx.IntImm) for p in func.params for e in p.ty.shape)
    (choice,) = tir_byoc.scan(func)
    assert (choice.pattern, str(choice.dtype)) == (workload.pattern, signature)
    operands, out = bench.workloads.arrays(workload, signature)
    assert [(a.shape, str(a.dtype)) for a in (*operands, out)] == [
        (shape, str(p.ty.dtype.dtype)) for shape, p in zip(expected, func.params)
    ]


def _extern_calls(func) -> list[tuple[str, list[int]]]:
    """(symbol, integer arguments) of every ``call_extern`` in ``func``."""
    calls = []

    def on_call(call):
        if call.op.same_as(ir.Op.get("tirx.call_extern")):
            integers = [int(a.value) for a in call.args[1:] if isinstance(a, tirx.IntImm)]
            calls.append((call.args[0].value, integers))

    tvm_ffi.structural_walk(func.body, (ir.Call, on_call))
    return calls


def test_the_batch_workloads_are_the_issues_shapes_and_flops(bench):
    workloads = bench.workloads.select(["batch"])
    assert [w.name for w in workloads] == list(BATCH_WORKLOADS)
    for workload in workloads:
        _, flops, _, _, spec = BATCH_WORKLOADS[workload.name]
        assert workload.flops == bench.workloads.FLOPS[workload.name] == flops
        assert bench.direct.layer_spec(workload, "fp32") == spec


@pytest.mark.parametrize("name", list(BATCH_WORKLOADS))
def test_a_batch_workload_is_served_as_the_issue_says_and_builds(bench, name):
    (workload,) = bench.workloads.select([name])
    _, _, intrinsic, arguments, _ = BATCH_WORKLOADS[name]
    mod = bench.workloads.ir_module(workload, "float32")
    planned = tir_byoc.plan(mod, backends=["ref"])
    (choice,) = planned.choices
    assert (choice.pattern, choice.intrinsic) == (workload.pattern, intrinsic)
    assert [int(c) for c in choice.match.batch.counts] == [workload.batch]
    offloaded = apply(planned)
    symbol = "tir_byoc_" + intrinsic.replace(".", "_")
    signature = 1 | 1 << 8 | 1 << 16  # TIR_BYOC_SIGNATURE(FLOAT32, FLOAT32, FLOAT32)
    expected = [*arguments[:3], signature, *arguments[3:]]
    assert _extern_calls(offloaded["main"]) == [(symbol, expected)]
    assert tvm.compile(offloaded, target="llvm") is not None


def test_a_workload_has_a_batch_exactly_when_its_pattern_has_a_batch_form(bench):
    workload = bench.workloads.Workload
    assert set(bench.workloads.BATCH_PREFIXES) == {p for p in BATCH_FORMS.values() if p}
    assert workload("3-D", 2, 3, 4, "batch_dense", batch=5).flops == 2 * 5 * 2 * 3 * 4
    with pytest.raises(ValueError, match=r"'bmm_matmul' expected a batch, got batch=None"):
        workload("bmm", 2, 3, 4, "bmm_matmul")
    with pytest.raises(ValueError, match=r"'dense' expected no batch, got batch=8"):
        workload("2-D", 2, 3, 4, "dense", batch=8)


def test_select_takes_workloads_and_groups_in_table_order(bench):
    select, names = bench.workloads.select, [w.name for w in bench.workloads.WORKLOADS]
    assert [w.name for w in select(None)] == names
    assert [w.name for w in select(["batch", "epilogue", "1x4096->4096", "2d"])] == names
    assert not set(bench.workloads.GROUPS["2d"]) & set(EPILOGUE_WORKLOADS)
    assert [w.name for w in select(["Linear 8x128x768->3072", "128x1024->1024"])] == [
        "128x1024->1024",
        "Linear 8x128x768->3072",
    ]
    with pytest.raises(
        ValueError, match=r"'3d' is not a workload; .* or a group: '2d', 'batch', 'epilogue'"
    ):
        select(["3d"])


def test_static_shapes_names_an_extent_it_was_not_given(bench):
    func = tir_byoc.describe("dense")
    with pytest.raises(ValueError, match="neither a constant nor a variable given"):
        bench.workloads.static_shapes(func, {"M": 2, "N": 3})


def test_the_table_runs_in_the_order_the_runs_always_had(bench):
    running = bench.implementations.running
    assert [i.name for i in running("layer")] == [
        "tir_byoc+onednn",
        "tir_byoc+onednn, constant weight",
        "tir_byoc+mkl",
        "tir_byoc+mkl, constant weight",
        "tir_byoc+openblas",
        "tir_byoc+ref",
        "oneDNN direct (C)",
        "oneDNN direct, prepacked weight (C)",
        "OpenBLAS direct (C)",
        "NumPy",
        "PyTorch eager",
        "ONNX Runtime",
        "TVM unscheduled",
        "TVM dlight default",
        "TVM MetaSchedule",
    ]
    assert [i.name for i in running("mlp")] == [
        "tir_byoc+onednn",
        "tir_byoc+onednn (transposes kept)",
        "tir_byoc+mkl",
        "tir_byoc+openblas",
        "oneDNN direct (C)",
        "OpenBLAS direct (C)",
        "NumPy",
        "PyTorch eager",
        "Relax unscheduled",
        "Relax + dlight",
    ]
    table = bench.implementations.IMPLEMENTATIONS
    assert {n for n, i in table.items() if len(i.dtypes) > 1} == {
        "tir_byoc+onednn",
        "oneDNN direct (C)",
    }
    assert all(i.direct in table for i in table.values())


def test_an_implementation_without_a_measure_or_with_an_unknown_dtype_is_refused(bench):
    implementation = bench.implementations.Implementation
    with pytest.raises(ValueError, match="expected a layer or mlp measure"):
        implementation("nothing")
    with pytest.raises(ValueError, match=r"expected dtypes among .* got \['fp8'\]"):
        implementation("fp8 only", layer=lambda *a: (None, ""), dtypes=("fp8",))


def test_skip_reasons_come_before_any_measuring(bench):
    table, settings = bench.implementations.IMPLEMENTATIONS, bench.implementations.Settings
    big = bench.workloads.WORKLOADS[3]  # 512x4096->4096
    ms, note = table["tir_byoc+ref"].measure_layer(big, "fp32", settings(1.0, 64, 5.0))
    assert ms is None and "reference kernel" in note
    ms, note = table["TVM MetaSchedule"].measure_layer(big, "fp32", settings(1.0, 0, 5.0))
    assert (ms, note) == (None, "skipped (--trials 0)")
    ms, note = table["TVM MetaSchedule"].measure_layer(big, "fp32", settings(1.0, 64, 5.0))
    assert ms is None and "above --ms-max-gflop 5.0" in note
    attention = bench.workloads.select(["attn Q.K^T 96x128x64->128"])[0]
    prepacked = table["oneDNN direct, prepacked weight (C)"]
    ms, note = prepacked.measure_layer(attention, "fp32", settings(1.0, 64, 5.0))
    assert ms is None and "weight is an activation" in note
    assert prepacked.skip(bench.workloads.select(["Linear 8x128x768->3072"])[0], None) is None
    metaschedule = table["TVM MetaSchedule"]
    ms, note = metaschedule.measure_layer(attention, "fp32", settings(1.0, 64, 5.0))
    assert ms is None and note.endswith("too long to tune (36 min for Q.K^T here); --ms-batch")
    assert metaschedule.skip(attention, settings(1.0, 64, 5.0, ms_batch=True)) is None


def test_the_epilogue_workloads_are_the_issues_shapes_and_flops(bench):
    workloads = bench.workloads.select(["epilogue"])
    assert [w.name for w in workloads] == list(EPILOGUE_WORKLOADS)
    for workload in workloads:
        shapes, flops, _, specs = EPILOGUE_WORKLOADS[workload.name]
        operands, out = bench.workloads.arrays(workload, "float32")
        assert [a.shape for a in operands] == shapes and out.shape == (workload.m, workload.n)
        assert all(a.dtype == np.float32 for a in (*operands, out))
        assert workload.flops == bench.workloads.FLOPS[workload.name] == flops
        assert bench.direct.layer_specs(workload, "fp32") == specs
        assert workload.dtypes == ("fp32",)


@pytest.mark.parametrize("name", list(EPILOGUE_WORKLOADS))
def test_an_epilogue_workload_is_served_as_the_issue_says_and_builds(bench, name):
    (workload,) = bench.workloads.select([name])
    mod = bench.workloads.ir_module(workload, "float32")
    planned = tir_byoc.plan(mod, backends=["ref"])
    served = [(c.func, c.pattern, c.intrinsic) for c in planned.choices]
    assert served == EPILOGUE_WORKLOADS[name][2]
    assert all(c.cut_from is None for c in planned.choices)
    offloaded = apply(planned)
    if workload.tail_from:  # Relax's two PrimFuncs, the up projection first
        assert isinstance(offloaded["main"], relax.Function)
        calls = offloaded["main"].script().count("R.call_tir(")
        assert calls == 2 and [f for f, _, _ in served] == ["dense", "dense_silu_mul"]
    assert tvm.compile(offloaded, target="llvm") is not None


def test_an_epilogue_workload_has_a_tail_call_only_before_an_add_or_mul(bench):
    workload = bench.workloads.Workload
    assert workload("g", 2, 3, 4, "dense_silu_mul", tail_from="dense").calls == (
        "dense",
        "dense_silu_mul",
    )
    for pattern, tail in [("dense_bias_gelu", "dense"), ("dense_mul", "dense_bias")]:
        with pytest.raises(ValueError, match="tail_from expected a plain 2-D dense or matmul"):
            workload("bad", 2, 3, 4, pattern, tail_from=tail)
    assert workload("l", 2, 3, 4, "dense_bias_relu").group == "2d"
    assert workload("g", 2, 3, 4, "matmul_gelu").group == "epilogue"


def _small(bench, name):
    """The epilogue workload ``name`` at M, N, K = 4, 6, 5: every implementation runs it in
    milliseconds."""
    (workload,) = bench.workloads.select([name])
    return replace(workload, name=f"small {workload.pattern}", m=4, n=6, k=5)


@pytest.mark.parametrize("name", list(EPILOGUE_WORKLOADS))
@pytest.mark.parametrize(
    "implementation",
    ["tir_byoc+onednn", "tir_byoc+ref", "oneDNN direct (C)", "NumPy", "PyTorch eager"],
)
def test_every_implementation_checks_its_epilogue_result_before_timing_it(
    bench, implementation, name
):
    measure = bench.implementations.IMPLEMENTATIONS[implementation].layer
    settings = bench.implementations.Settings(0.001, 0, 0.0)
    ms, note = measure(_small(bench, name), "fp32", settings)
    if "torch not installed" in note:
        pytest.skip(note)
    assert ms is not None and ms > 0, note
    assert "error " in note and "of the largest magnitude" in note and "WRONG" not in note
    if implementation == "tir_byoc+onednn":  # the whole epilogue fused, as the direct harness
        fused = {  # the kernels oneDNN's verbose log names, with their post-ops
            "Linear+GELU 256x768->3072": r"\S+ \+bias \+eltwise_gelu_erf",
            "gated MLP 256x768->2x2048": r"\S+, \S+ \+eltwise_swish \+binary_mul",
            "Linear+residual 256x768->768": r"\S+ \+bias \+binary_add",
            # fused where oneDNN is faster at it than the C epilogue (FasterInC in matmul.cpp)
            "Linear+GELU(tanh) 128x768->3072": r"\S+ \+bias"
            + (r" \+eltwise_gelu_tanh" if onednn.fuses("gelu_tanh") else ""),
        }[name]
        assert re.search(f"oneDNN ran {fused}(;|$)", note), note


def test_a_wrong_result_is_reported_and_the_oracle_is_float64(bench):
    workload = _small(bench, "gated MLP 256x768->2x2048")
    operands, _ = bench.workloads.arrays(workload, "float32")
    x, w_gate, w_up = (a.astype(np.float64) for a in operands)
    gate, up = x @ w_gate.T, x @ w_up.T
    oracle = bench.workloads.expected(workload, operands)
    np.testing.assert_allclose(oracle, gate / (1 + np.exp(-gate)) * up, rtol=1e-12)
    check = bench.implementations.check
    assert check(workload, operands, oracle.astype(np.float32))[0]
    for wrong in (oracle * (1 + 1e-3), np.where(oracle == oracle.max(), np.nan, oracle)):
        agrees, note = check(workload, operands, wrong)
        assert not agrees and note.startswith("WRONG RESULT: error")


def test_the_constant_weight_column_passes_the_weight_as_a_relax_constant(bench):
    (workload,) = bench.workloads.select(["64x800->500 +bias+relu"])
    operands, _ = bench.workloads.arrays(workload, "float32")
    mod, given = bench.implementations._constant_weight_module(workload, "float32", operands)
    assert len(given) == len(operands) - 1
    main = mod["main"]
    assert [p.name for p in main.params] == ["X", "b"]
    (call,) = [b.value for b in main.body.blocks[0].bindings]
    x, w, b = call.args[1].fields
    assert type(w).__name__ == "GenericConst" and w.value.shape == (500, 800)  # R.const
    assert (x, b) == tuple(main.params)


def test_onnx_runtime_runs_only_the_2d_dense_layers_it_builds(bench):
    skip = bench.implementations._not_one_gemm
    by_name = {w.name: w for w in bench.workloads.WORKLOADS}
    assert skip(by_name["64x800->500 +bias+relu"], None) is None
    assert skip(by_name["1x4096->4096"], None) is None
    for name in ("Linear 8x128x768->3072", "attn P.V 96x128x128->64", "Linear+GELU 256x768->3072"):
        assert "ONNX Runtime harness builds 2-D dense layers" in skip(by_name[name], None)
