"""MetaSchedule integration: the rule, the postproc, and tuning through LocalRunner and RPC.

Trial counts are tiny and the search strategy small so that the file stays within a few
minutes on a 2-core machine; longer tuning runs belong in benchmarks/.  No timing is asserted.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import tvm
import tvm_ffi
from support.ms_workers import one_worker_builder, rpc_runner, tiny_search
from tvm import relax, s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

import tir_byoc
from tir_byoc import demo
from tir_byoc import meta_schedule as tms
from tir_byoc.rewrite import intrinsic_calls
from tir_byoc.schedules import RULE_ATTR, default_schedule, first_rule, vector_math

pytestmark = pytest.mark.usefixtures("reference_backend")

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


@T.prim_func(s_tir=True)
def dense_relu_exp(
    X: T.Buffer((32, 64), "float32"),
    W: T.Buffer((48, 64), "float32"),
    B: T.Buffer((48,), "float32"),
    Out: T.Buffer((32, 48), "float32"),
):
    Y = T.sblock_alloc_buffer((32, 48))
    Z = T.sblock_alloc_buffer((32, 48))
    R = T.sblock_alloc_buffer((32, 48))
    for i, j, k in T.grid(32, 48, 64):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(32, 48):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            Z[vi, vj] = Y[vi, vj] + B[vj]
    for i, j in T.grid(32, 48):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            R[vi, vj] = T.max(Z[vi, vj], T.float32(0))
    for i, j in T.grid(32, 48):
        with T.sblock("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.exp(R[vi, vj])


CHAIN = ("dense", "bias", "relu")


def small_strategy():
    """An evolutionary search small enough for tests (the default population is 512)."""
    return ms.search_strategy.EvolutionarySearch(
        population_size=16, init_min_unmeasured=8, genetic_num_iters=1
    )


def as_module(func: tirx.PrimFunc) -> tvm.IRModule:
    """``func`` as ``main`` of a module of its own, on a fresh copy of its IR.

    A Schedule whose IRModule nobody else references edits the IR in place (TVM 0.27 checks
    that the module, the function and the blocks are unique, not the SBlockRealize around
    the root block), which would leak annotations into ``dense_relu_exp`` itself.
    """
    copy = tvm.script.from_source(func.script())
    return tvm.IRModule({"main": copy.with_attr("global_symbol", "main")})


def marked(choice: str) -> s_tir.Schedule:
    """A schedule of ``dense_relu_exp`` with the chain marked as OffloadRule marks it."""
    sch = s_tir.Schedule(as_module(dense_relu_exp))
    for name in CHAIN:
        sch.annotate(sch.get_sblock(name), tms.CHOICE_ATTR, choice)
    return sch


def loop_annotations(func: tirx.PrimFunc, around=CHAIN) -> list:
    """Annotations of the loops around the blocks named in ``around``."""
    found = []

    def on_loop(loop):
        names = []
        tvm_ffi.structural_walk(loop.body, (s_tir.SBlock, lambda b: names.append(b.name_hint)))
        if set(names) <= set(around):
            found.append(loop.annotations)

    tvm_ffi.structural_walk(func.body, (tirx.For, on_loop))
    return found


def loop_kinds(func: tirx.PrimFunc) -> set:
    kinds = set()
    tvm_ffi.structural_walk(func.body, (tirx.For, lambda loop: kinds.add(loop.kind)))
    return kinds


def run_dense_relu_exp(func: tirx.PrimFunc) -> tuple[np.ndarray, np.ndarray]:
    """(result, NumPy reference) of ``func`` on small random inputs."""
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal((32, 64))).astype("float32")
    w = (0.1 * rng.standard_normal((48, 64))).astype("float32")
    b = (0.1 * rng.standard_normal(48)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((32, 48), "float32"))
    built = tvm.compile(as_module(func), TARGET)
    built["main"](*[tvm.runtime.tensor(a) for a in (x, w, b)], out)
    return out.numpy(), np.exp(np.maximum(x @ w.T + b, 0))


# --------------------------------------------------------------------------------------
# The postproc
# --------------------------------------------------------------------------------------


def test_postproc_offloads_like_the_module_pass():
    for sch in (s_tir.Schedule(as_module(dense_relu_exp)), marked("offload")):
        assert tms.OffloadPostproc().apply(sch)
        expected = tir_byoc.offload(as_module(dense_relu_exp))["main"]
        tvm.ir.assert_structural_equal(sch.mod["main"], expected)
        assert intrinsic_calls(sch.mod["main"]) == {"ref.dense_bias_relu": 1}


def test_postproc_leaves_native_chains_to_tvm():
    sch = marked("native")
    before = sch.mod["main"]
    assert tms.OffloadPostproc().apply(sch)
    assert sch.mod["main"].same_as(before)


def test_postproc_rejects_a_scrambled_chain_with_the_reason(caplog):
    sch = marked("offload")
    i, _, _ = sch.get_loops(sch.get_sblock("dense"))
    sch.split(i, factors=[4, 8])
    before = sch.mod["main"]
    with caplog.at_level(logging.WARNING, logger="tir_byoc.meta_schedule"):
        assert not tms.OffloadPostproc().apply(sch)
    assert sch.mod["main"].same_as(before)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "candidate rejected: blocks bias, dense, relu were chosen for offload" in message
    assert "iterators but 4 loops around it" in message


def test_postproc_rejects_a_chosen_chain_no_intrinsic_serves(caplog):
    with caplog.at_level(logging.WARNING, logger="tir_byoc.meta_schedule"):
        assert not tms.OffloadPostproc(registry=tir_byoc.Registry()).apply(marked("offload"))
    (message,) = [r.getMessage() for r in caplog.records]
    assert "no intrinsic serves them: no intrinsic registered for dense_bias_relu" in message


# --------------------------------------------------------------------------------------
# The rule and the space
# --------------------------------------------------------------------------------------


def design_spaces(offload: str) -> list[s_tir.Schedule]:
    context = ms.TuneContext(
        mod=as_module(dense_relu_exp),
        target=TARGET,
        space_generator=tms.offload_space(TARGET, offload=offload),
        search_strategy="replay-trace",
        task_name="dense_relu_exp",
    ).clone()
    return list(context.generate_design_space())


@pytest.mark.parametrize(
    ("offload", "expected"),
    [("choice", {"offload", "native"}), ("always", {"offload"}), ("never", {"native"})],
)
def test_rule_puts_the_requested_variants_in_the_space(offload, expected):
    spaces = design_spaces(offload)
    assert {tms.recorded_choice(s.trace) for s in spaces} == expected
    for sch in spaces:
        func = sch.mod["main"]
        if tms.recorded_choice(sch.trace) == "offload":
            # No rule touched the chain: it still matches as it did before tuning, and its
            # loops are marked so that the default postprocs leave them alone too.
            (match,) = tir_byoc.scan(func)
            assert match.blocks == CHAIN
            assert {int(a[tms.KEEP_LOOP_ATTR]) for a in loop_annotations(func)} == {1}
            assert tms.OffloadPostproc().apply(sch.copy())
        else:
            assert tir_byoc.scan(func) == []  # tiled or inlined by the native rules


def test_rule_registers_the_custom_rule_for_the_target_keys():
    tms.offload_space(TARGET)
    keep = tvm.get_global_func(f"s_tir.meta_schedule.cpu.{tms.CUSTOM_RULE}")
    sch = s_tir.Schedule(as_module(dense_relu_exp))
    assert list(keep(sch, sch.get_sblock("dense"))) == [sch]


def test_bad_options_say_what_was_expected(tmp_path):
    with pytest.raises(ValueError, match="expected offload in"):
        tms.offload_space(TARGET, offload="sometimes")
    with pytest.raises(ValueError, match="expected a CPU target of kind"):
        tms.offload_space("cuda")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['trials'\]"):
        tms.tune_tir(dense_relu_exp, TARGET, str(tmp_path), 4, trials=4)
    with pytest.raises(TypeError, match=r"expected a tvm\.IRModule with Relax functions"):
        tms.tune_relax(as_module(dense_relu_exp), TARGET, str(tmp_path), 4)
    with pytest.raises(FileNotFoundError, match="expected a report at"):
        tms.load_report(tmp_path)


# --------------------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def large_dense(
    X: T.Buffer((128, 256), "float32"),
    W: T.Buffer((256, 256), "float32"),
    Z: T.Buffer((128, 256), "float32"),
):
    for i, j, k in T.grid(128, 256, 256):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Z[vi, vj] = T.float32(0)
            Z[vi, vj] = Z[vi, vj] + X[vi, vk] * W[vj, vk]


def test_cost_model_scores_every_candidate_when_some_are_wholly_offloaded():
    # A wholly offloaded candidate stores nothing, so PerStoreFeature gives it no row; once
    # the XGBoost model was trained, MetaSchedule's own extractor made predict raise
    # TypeError (float ids in PackSum) on a batch of such candidates, and return too few
    # scores for a batch ending with one.
    from tir_byoc.meta_schedule.features import cost_model

    native = as_module(large_dense)
    offloaded = tvm.IRModule({"main": tir_byoc.offload(native["main"], backends="ref")})
    context = ms.TuneContext(mod=native, target=TARGET, task_name="large_dense").clone()

    def candidate(mod):
        return ms.MeasureCandidate(
            s_tir.Schedule(mod), ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        )

    model = cost_model(1)
    model.num_warmup_samples = 0  # use the trained model from the first update on
    batch = [candidate(native), candidate(offloaded)] * 4
    results = [ms.runner.RunnerResult([1e-3 * (i + 1)], None) for i in range(len(batch))]
    model.update(context, batch, results)
    for candidates in ([offloaded], [native, offloaded], [offloaded, native, offloaded]):
        scores = model.predict(context, [candidate(m) for m in candidates])
        assert scores.shape == (len(candidates),)
        assert np.isfinite(scores).all()


# --------------------------------------------------------------------------------------
# Tuning
# --------------------------------------------------------------------------------------


def test_mixed_function_chain_offloaded_rest_tuned_with_local_runner(tmp_path, capsys):
    tuned = tms.tune_tir(
        dense_relu_exp,
        TARGET,
        str(tmp_path),
        4,
        offload="always",
        fold_transposes=False,  # the transposes are then the only functions left to tune
        num_trials_per_iter=2,
        strategy=small_strategy(),
        cost_model="random",
        builder=one_worker_builder(),
        runner=ms.runner.LocalRunner(),
        seed=0,
    )
    # The chain calls its intrinsic; the exp block was scheduled (parallel / vectorized).
    assert intrinsic_calls(tuned) == {"ref.dense_bias_relu": 1}
    assert loop_kinds(tuned) & {tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED}
    result, expected = run_dense_relu_exp(tuned)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)
    # The report and the database agree: the offloaded candidate ran in the runner's process.
    report = tms.load_report(tmp_path)["dense_relu_exp"]
    assert report.choice == "offload" and report.trials >= 1
    assert report.best_offload_ms is not None and report.best_native_ms is None
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))  # reloads by replaying
    records = database.get_all_tuning_records()
    assert records and {tms.recorded_choice(r.trace) for r in records} == {"offload"}
    # MetaSchedule's own query replays the best record; the postproc turns it into the result.
    sch = database.query_schedule(records[0].workload.mod, TARGET, "main")
    assert tms.OffloadPostproc().apply(sch)
    replayed = sch.mod["main"]
    tvm.ir.assert_structural_equal(
        tirx.PrimFunc(replayed.params, replayed.body, replayed.ret_type, attrs=tuned.attrs), tuned
    )
    progress = capsys.readouterr().err
    assert "[tir_byoc] dense_relu_exp@offload: 1 trials (0 failed), best " in progress


def test_an_offload_record_that_no_longer_offloads_leaves_the_native_one(tmp_path, monkeypatch):
    # A database tuned where a backend served the chain, replayed where none does: the
    # offloaded record, though faster, cannot be rebuilt as measured, so the native record
    # is built, with why.
    from tir_byoc.meta_schedule import decide, search

    replay = decide.replay_best

    def replay_without_the_backend(database, func, *args):
        if str(func["main"].attrs[tms.VARIANT_ATTR]) == "offload":
            raise RuntimeError("the best record of main does not offload any more: gone")
        return replay(database, func, *args)

    best_ms = search.best_ms

    def offload_measured_faster(database, task, target):
        measured = best_ms(database, task, target)
        return measured if task.variant != "offload" or measured is None else 1e-6

    monkeypatch.setattr(decide, "replay_best", replay_without_the_backend)
    monkeypatch.setattr(search, "best_ms", offload_measured_faster)
    tuned = tms.tune_tir(
        dense_relu_exp,
        TARGET,
        str(tmp_path),
        4,
        **tiny_search(),
    )
    report = tms.load_report(tmp_path)["dense_relu_exp"]
    assert report.best_offload_ms is not None and report.best_native_ms is not None
    assert report.choice == "native" and "does not offload any more: gone" in report.note
    assert intrinsic_calls(tuned) == {}
    result, expected = run_dense_relu_exp(tuned)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)


@T.prim_func(s_tir=True)
def exp_only(A: T.Buffer((128, 256), "float32"), B: T.Buffer((128, 256), "float32")):
    for i, j in T.grid(128, 256):
        with T.sblock("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.exp(A[vi, vj])


def test_a_native_variant_far_behind_gets_no_more_trials_and_the_rest_gets_the_budget(
    tmp_path, capsys, monkeypatch
):
    # The native variant is made 10x slower than the offloaded one whatever the machine
    # measures (the decision, not the timing, is under test): after its first round of two
    # trials (first_round_trials, below a search iteration's four) it stops, the wholly
    # offloaded variant too, and the other trials go to exp_only.
    from tir_byoc.meta_schedule import search

    best_ms = search.best_ms

    def native_far_behind(database, task, target):
        measured = best_ms(database, task, target)
        if measured is None or task.name.split("@")[0] != "large_dense":
            return measured
        return 10.0 if task.variant == "native" else 1.0

    monkeypatch.setattr(search, "best_ms", native_far_behind)
    module = tvm.IRModule(
        {
            "large_dense": large_dense.with_attr("global_symbol", "large_dense"),
            "exp_only": exp_only.with_attr("global_symbol", "exp_only"),
        }
    )
    options = dict(
        backends="onednn",
        num_trials_per_iter=4,
        strategy=ms.search_strategy.ReplayTrace(),
        cost_model="random",
        builder=one_worker_builder(),
        default_rules=False,  # exp_only's rule schedule is not measured: not under test
        seed=0,
    )
    tms.tune_tir(module, TARGET, str(tmp_path), 8, first_round_trials=2, **options)
    progress = capsys.readouterr().err
    report = tms.load_report(tmp_path)
    assert "large_dense@native: no more trials, 10.0000 ms after 2 against 1.0000 ms" in progress
    assert "large_dense@native: 4 trials" not in progress
    assert "large_dense@offload: 4 trials" not in progress
    assert report["large_dense"].choice == "offload"
    assert report["exp_only"].trials == 4  # 8 - 2 - 2
    # native_cutoff=None: no first round, MetaSchedule's scheduler shares the whole budget.
    tms.tune_tir(module, TARGET, str(tmp_path / "none"), 4, native_cutoff=None, **options)
    assert "no more trials" not in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"native_cutoff=0\.5; expected a number >= 1"):
        tms.tune_tir(module, TARGET, str(tmp_path), 4, native_cutoff=0.5)
    with pytest.raises(ValueError, match=r"first_round_trials=0; expected an int >= 1"):
        tms.tune_tir(module, TARGET, str(tmp_path), 4, first_round_trials=0)


@T.prim_func(s_tir=True)
def attention_then_exp(
    Q: T.Buffer((4, 16, 8), "float32"),
    K: T.Buffer((4, 16, 8), "float32"),
    Out: T.Buffer((4, 16, 16), "float32"),
):
    S = T.sblock_alloc_buffer((4, 16, 16))
    for b, i, j, k in T.grid(4, 16, 16, 8):
        with T.sblock("scores"):
            vb, vi, vj, vk = T.axis.remap("SSSR", [b, i, j, k])
            with T.init():
                S[vb, vi, vj] = T.float32(0)
            S[vb, vi, vj] = S[vb, vi, vj] + Q[vb, vi, vk] * K[vb, vj, vk]
    for b, i, j in T.grid(4, 16, 16):
        with T.sblock("exp"):
            vb, vi, vj = T.axis.remap("SSS", [b, i, j])
            Out[vb, vi, vj] = T.exp(S[vb, vi, vj] * T.float32(0.1))


def test_a_batched_chain_is_offloaded_and_measured_in_the_runner_process(tmp_path):
    """The bmm_ entry point is resolved in LocalRunner's worker process too."""
    tuned = tms.tune_tir(
        attention_then_exp,
        TARGET,
        str(tmp_path),
        2,
        offload="always",
        num_trials_per_iter=2,
        strategy=small_strategy(),
        cost_model="random",
        builder=one_worker_builder(),
        runner=ms.runner.LocalRunner(),
        seed=0,
    )
    assert intrinsic_calls(tuned) == {"ref.bmm_dense": 1}
    report = tms.load_report(tmp_path)["attention_then_exp"]
    assert report.choice == "offload" and report.best_offload_ms is not None
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((4, 16, 8)).astype("float32") for _ in range(2))
    out = tvm.runtime.tensor(np.zeros((4, 16, 16), "float32"))
    built = tvm.compile(as_module(tuned), TARGET)
    built["main"](tvm.runtime.tensor(q), tvm.runtime.tensor(k), out)
    expected = np.exp(0.1 * (q @ np.swapaxes(k, -1, -2)))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_rpc_runner_measures_both_variants_on_localhost(tmp_path, capsys):
    with rpc_runner("tir_byoc_test") as runner:
        tuned = tms.tune_tir(
            dense_relu_exp,
            TARGET,
            str(tmp_path),
            4,  # a round of two trials for each variant
            num_trials_per_iter=2,
            strategy=small_strategy(),
            cost_model="random",
            builder=one_worker_builder(),
            runner=runner,
            progress=False,
            seed=0,
        )
    # Both variants were built with their code and measured on the server; the faster won.
    report = tms.load_report(tmp_path)["dense_relu_exp"]
    assert report.best_offload_ms is not None and report.best_native_ms is not None
    faster = min(("offload", "native"), key=lambda v: getattr(report, f"best_{v}_ms"))
    assert report.choice == faster
    assert bool(intrinsic_calls(tuned)) == (faster == "offload")
    result, expected = run_dense_relu_exp(tuned)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)
    # The database reloads (records replay) and tells the two variants apart.
    records = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    assert {tms.recorded_choice(r.trace) for r in records} == {"offload", "native"}
    # progress=False prints nothing, not even the final report.
    assert "[tir_byoc]" not in capsys.readouterr().err


def run_mlp(module: tvm.IRModule) -> tuple[np.ndarray, np.ndarray]:
    vm = relax.VirtualMachine(tvm.compile(module, TARGET), tvm.cpu())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((demo.BATCH, demo.IN_FEATURES)).astype("float32")
    params = demo.mlp_weights(rng)
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, *params)]).numpy()
    return result, demo.mlp_reference(x, *params)


LAYERS = {"fused_matmul_add_relu": "ref.matmul_bias_relu", "fused_matmul1_add1": "ref.matmul_bias"}


def test_mlp_relax_flow_keeps_the_faster_variant_per_layer_and_zero_trials_rebuilds_it(tmp_path):
    options = dict(
        num_trials_per_iter=2,
        strategy=small_strategy(),
        cost_model="random",
        builder=one_worker_builder(),
        progress=False,
        seed=0,
    )
    # Eight trials: the scheduler's first rounds go to each task in turn, two layers x two
    # variants of two trials each.
    tuned = tms.tune_relax(demo.lowered_mlp(), TARGET, str(tmp_path), 8, **options)
    report = tms.load_report(tmp_path)
    for name, intrinsic in LAYERS.items():
        layer = report[name]
        measured = {
            v: getattr(layer, f"best_{v}_ms")
            for v in ("offload", "native")
            if getattr(layer, f"best_{v}_ms") is not None
        }
        assert measured and layer.choice == min(measured, key=measured.get)
        calls = intrinsic_calls(tuned[name])
        # The folded layer reads the weight as given, (N, K): a dense, not LAYERS' matmul on
        # the transposed copy.  (Native usually wins against the reference kernels; CI once
        # measured the offload faster and reached this branch.)
        dense = intrinsic.replace("ref.matmul_", "ref.dense_")
        assert calls == ({dense: 1} if layer.choice == "offload" else {}), calls
        assert tuned[name].attrs["tirx.is_scheduled"]
    # The layers read the weights as given: the transposes were folded, so not tuned.
    assert not [n for n in report.functions if n.name.startswith("transpose")]
    assert "transpose" not in str(tuned["forward"])
    result, expected = run_mlp(tuned)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)
    # Zero trials: the same module from the database, which gains no record; the tuning run's
    # report stays.
    records = len(ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records())
    saved = (tmp_path / tms.REPORT_FILE).read_text()
    rebuilt = tms.tune_relax(demo.lowered_mlp(), TARGET, str(tmp_path), 0, **options)
    tvm.ir.assert_structural_equal(rebuilt, tuned)
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(database.get_all_tuning_records()) == records
    assert (tmp_path / tms.REPORT_FILE).read_text() == saved
    with pytest.raises(ValueError, match=r"max_trials_global=0 builds from the database"):
        tms.tune_relax(demo.lowered_mlp(), TARGET, str(tmp_path / "none"), 0, **options)
    with pytest.raises(ValueError, match=r"expected max_trials_global to be an int >= 0"):
        tms.tune_relax(demo.lowered_mlp(), TARGET, str(tmp_path), -1, **options)


def test_mlp_layers_offloaded_whole_are_not_tuned(tmp_path):
    tuned = tms.tune_relax(
        demo.lowered_mlp(),
        TARGET,
        str(tmp_path),
        4,
        offload="always",
        fold_transposes=False,  # the transposes are then the only functions left to tune
        num_trials_per_iter=2,
        strategy=small_strategy(),
        cost_model="random",
        builder=one_worker_builder(),
        progress=False,
        seed=0,
    )
    report = tms.load_report(tmp_path)
    for name, intrinsic in LAYERS.items():
        assert report[name].choice == "offload-untuned" and report[name].trials == 0
        assert intrinsic_calls(tuned[name]) == {intrinsic: 1}
    # Zero trials spent on them: the database holds only the transposes.
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    tuned_names = {
        str(r.workload.mod["main"].attrs["global_symbol"])
        for r in database.get_all_tuning_records()
    }
    assert tuned_names and tuned_names <= {"transpose", "transpose1"}
    # Each transpose's best record was measured again beside the default rule's schedule,
    # and the faster one is in the module.
    for name in ("transpose", "transpose1"):
        transpose = report[name]
        assert transpose.default_rule == "Elementwise" and transpose.best_default_ms > 0
        assert transpose.choice in ("default", "none"), transpose
        kept = (tuned[name].attrs or {}).get(RULE_ATTR)
        assert kept == ("Elementwise" if transpose.choice == "default" else None)
    result, expected = run_mlp(tuned)
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("faster", ["rule", "record"])
def test_a_function_left_to_tvm_keeps_the_default_rule_schedule_if_it_measures_faster(
    tmp_path, monkeypatch, faster
):
    # The measurement is replaced (the decision, not the timing, is under test): the best
    # record and the rule's schedule come in one batch, the record first.
    from tir_byoc.meta_schedule import decide

    batches = []

    def measured(funcs, target, builder, runner):
        batches.append(funcs)
        return [(2.0, ""), (1.0, "")] if faster == "rule" else [(1.0, ""), (2.0, "")]

    monkeypatch.setattr(decide, "measure", measured)
    tuned = tms.tune_tir(as_module(exp_only), TARGET, str(tmp_path), 2, **EXP_OPTIONS)
    report = tms.load_report(tmp_path)["main"]
    ((record, rule),) = batches
    rule_name, scheduled, _ = first_rule(as_module(exp_only)["main"], TARGET)
    built = (
        vector_math.expand(scheduled) if vector_math.applies(TARGET) else scheduled
    )  # as measured
    tvm.ir.assert_structural_equal(rule.body, built.body)
    assert report.default_rule == rule_name == "Elementwise" and report.best_default_ms == 2.0 - (
        faster == "rule"
    )
    if faster == "rule":
        assert report.choice == "default" and report.best_ms == 1.0
        assert "the default rule Elementwise kept: 1.0000 ms against" in report.note
        tvm.ir.assert_structural_equal(tuned["main"].body, scheduled.body)
        assert tuned["main"].attrs[RULE_ATTR] == "Elementwise"
    else:
        assert report.choice == "none" and report.best_ms != 2.0
        assert "the default rule Elementwise: 2.0000 ms, the best record again 1.0000" in (
            report.note
        )
        tvm.ir.assert_structural_equal(tuned["main"].body, record.body)
        assert RULE_ATTR not in tuned["main"].attrs
    assert tuned["main"].attrs["tirx.is_scheduled"]
    # build_model names the rule that scheduled the function, or the tuner.
    schedule = default_schedule(tuned, TARGET, scheduled_by="MetaSchedule")
    assert schedule.rules["main"] == ("Elementwise" if faster == "rule" else "MetaSchedule")
    data = np.random.default_rng(0).standard_normal((128, 256)).astype("float32")
    out = tvm.runtime.tensor(np.zeros_like(data))
    tvm.compile(tuned, TARGET)["main"](tvm.runtime.tensor(data), out)
    np.testing.assert_allclose(out.numpy(), np.exp(data), rtol=1e-5)
    # A rebuild from the database takes the tuning run's choice again, measuring nothing.
    monkeypatch.setattr(decide, "measure", None)
    rebuilt = tms.tune_tir(as_module(exp_only), TARGET, str(tmp_path), 0, **EXP_OPTIONS)
    tvm.ir.assert_structural_equal(rebuilt, tuned)


@pytest.mark.parametrize("offload", ["never", "choice"])
def test_a_function_without_a_record_is_offloaded_only_if_offload_is_allowed(tmp_path, offload):
    # An empty database: no function has a valid record.  offload="never" is the TVM-only
    # build (build_model(offload=False)), whose chains must stay TVM code all the same.
    tuned = tms.tune_tir(
        as_module(dense_relu_exp),
        TARGET,
        str(tmp_path),
        0,
        offload=offload,
        database="memory",
        progress=False,
    )
    offloaded = intrinsic_calls(tuned["main"])
    assert offloaded == ({} if offload == "never" else {"ref.dense_bias_relu": 1}), offloaded
    result, expected = run_dense_relu_exp(tuned["main"])
    np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-5)


def test_report_durations_keep_a_small_function_readable():
    from tir_byoc.meta_schedule.progress import Progress
    from tir_byoc.meta_schedule.report import duration

    assert duration(0.0133) == "0.0133 ms" and duration(2.5) == "2.5000 ms"
    assert duration(0.0000312) == "0.03 us" and duration(0.0042) == "4.20 us"
    # The progress lines print the same way.
    stream = io.StringIO()
    progress = Progress(stream=stream)
    progress.trials["small"], progress.best["small"] = 3, (3.2e-6, "native")
    progress._print("small")
    assert "small: 3 trials (0 failed), best 3.20 us (native)" in stream.getvalue()


def test_a_report_line_compares_the_packed_offload_and_gives_the_plain_time_beside_it():
    from tir_byoc.meta_schedule.report import FunctionReport

    measured = dict(best_native_ms=3.0, best_packed_ms=1.5, packed=("W",))
    line = str(FunctionReport("f", "offload", best_ms=1.5, best_offload_ms=2.0, **measured))
    assert line == (
        "f: offload; best 1.5000 ms; measured offload 1.5000 ms vs native 3.0000 ms; "
        "offload measured packed (W, 2.0000 ms plain)"
    )
    # No plain time: nothing to compare the native one with, the packed one named alone.
    line = str(FunctionReport("f", "native", best_ms=3.0, **measured))
    assert line == "f: native; best 3.0000 ms; offload measured packed (W)"


def test_default_rules_false_measures_no_rule_schedule(tmp_path, monkeypatch):
    from tir_byoc.meta_schedule import decide

    def measured(*args):
        raise AssertionError("measured with default_rules=False")

    monkeypatch.setattr(decide, "measure", measured)
    tuned = tms.tune_tir(
        as_module(exp_only), TARGET, str(tmp_path), 2, default_rules=False, **EXP_OPTIONS
    )
    report = tms.load_report(tmp_path)["main"]
    assert report.choice == "none" and report.default_rule == "" and report.best_default_ms is None
    assert RULE_ATTR not in tuned["main"].attrs


EXP_OPTIONS = tiny_search()


def test_the_fast_stack_for_tensor_intrinsics_is_inspect_stack_without_its_module_scan():
    import inspect

    from tir_byoc.meta_schedule import intrinsics_import

    def both(context):
        return inspect.stack(context), intrinsics_import._stack(context)

    for context in (1, 3):
        slow, fast = both(context)
        assert [tuple(f) for f in fast] == [tuple(f) for f in slow]
    intrinsics_import.import_tensor_intrinsics()
    assert inspect.stack is not intrinsics_import._stack
