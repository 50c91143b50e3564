"""A dynamic build tuned at the sizes the user names (tir_byoc/meta_schedule/sizes.py,
specialize.py and dispatch.py): static copies tuned in one run, each symbolic function a
dispatcher.

The copy, the dispatcher and the choice of the copies to dispatch are checked alone first,
without tuning: the copy against the static function written out, the dispatcher's results
against NumPy at sizes it has a branch for and sizes it has not, a copy dispatched only where
it measured faster than the symbolic schedule (the measurement replaced).  Then one small
model (a Linear the library serves, a layer norm and a softmax left to TVM, dims batch and
seq) is tuned once with a tiny budget at two sizes: the dispatch in its functions, its
outputs against torch at the tuned sizes and others, a rebuild from the database against the
first build.  Each bad ``tune_sizes`` is a one-line error before anything is tuned.  No
timing is asserted.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from support.ms_workers import tiny_search
from tvm import relax, s_tir, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

import tir_byoc
from tir_byoc import meta_schedule as tms
from tir_byoc.meta_schedule import dispatch
from tir_byoc.meta_schedule import sizes as by_size
from tir_byoc.meta_schedule.specialize import (
    Specialization,
    dispatcher,
    function_dims,
    specializations,
    static_copy,
)
from tir_byoc.schedules import RULE_ATTR, ScheduleReport

torch = pytest.importorskip("torch")


@T.prim_func(s_tir=True)
def centre_rows(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(16)), "float32")
    B = T.match_buffer(b, (n, T.int64(16)), "float32")
    total = T.sblock_alloc_buffer((n,), "float32")
    for i, k in T.grid(n, T.int64(16)):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                total[vi] = T.float32(0)
            total[vi] = total[vi] + A[vi, vk]
    for i, k in T.grid(n, T.int64(16)):
        with T.sblock("centre"):
            vi, vk = T.axis.remap("SS", [i, k])
            B[vi, vk] = A[vi, vk] - total[vi] * T.float32(0.0625)


@T.prim_func(s_tir=True)
def centre_rows_at_3(
    A: T.Buffer((T.int64(3), T.int64(16)), "float32"),
    B: T.Buffer((T.int64(3), T.int64(16)), "float32"),
):
    total = T.sblock_alloc_buffer((T.int64(3),), "float32")
    for i, k in T.grid(T.int64(3), T.int64(16)):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                total[vi] = T.float32(0)
            total[vi] = total[vi] + A[vi, vk]
    for i, k in T.grid(T.int64(3), T.int64(16)):
        with T.sblock("centre"):
            vi, vk = T.axis.remap("SS", [i, k])
            B[vi, vk] = A[vi, vk] - total[vi] * T.float32(0.0625)


def _at(func, rows: int) -> Specialization:
    (dim,) = function_dims(func)
    return Specialization("centre_rows", ((dim, rows),))


def _walk(node, node_type) -> list:
    found = []
    tvm_ffi.structural_walk(node, (node_type, found.append))
    return found


def _branch_blocks(func) -> list[str]:
    """The names of the opaque blocks under the root's dispatch, in the order it tests them."""
    root = func.body.block
    names = []
    chain = root.body
    while isinstance(chain, tirx.IfThenElse):
        names.append(chain.then_case.block.name_hint)
        chain = chain.else_case
    return [*names, chain.block.name_hint] if isinstance(chain, s_tir.SBlockRealize) else names


def test_a_static_copy_is_the_function_written_at_that_size():
    copy = static_copy(centre_rows, _at(centre_rows, 3))
    assert copy.attrs["global_symbol"] == "centre_rows__n_3"
    expected = centre_rows_at_3.with_attr("global_symbol", "centre_rows__n_3")
    tvm.ir.assert_structural_equal(copy, expected)


def test_a_dispatcher_runs_its_copies_at_their_sizes_and_the_function_elsewhere():
    # The "tuned" copies: the static copies with their rows in parallel, so that the branch
    # taken is seen in the loops; the symbolic function runs every other size.
    branches = []
    for rows in (3, 8):
        sch = s_tir.Schedule(static_copy(centre_rows, _at(centre_rows, rows)))
        sch.parallel(sch.get_loops(sch.get_sblock("centre"))[0])
        branches.append((_at(centre_rows, rows), sch.mod["main"]))
    func = dispatcher(centre_rows, branches)
    assert _branch_blocks(func) == ["n_3", "n_8", "other_sizes"]
    assert (
        len([loop for loop in _walk(func.body, tirx.For) if loop.kind == tirx.ForKind.PARALLEL])
        == 2
    )
    ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    for rows in (1, 3, 5, 8, 13):
        a = np.random.default_rng(rows).standard_normal((rows, 16)).astype("float32")
        out = tvm.runtime.tensor(np.zeros_like(a))
        ex["main"](tvm.runtime.tensor(a), out)
        expected = a - a.sum(-1, keepdims=True) * np.float32(0.0625)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_function_whose_dims_are_not_the_entrys_gets_no_copy():
    mod = tvm.IRModule({"main": centre_rows_at_3, "centre_rows": centre_rows})
    found = specializations(mod, "main", ["main", "centre_rows"], ({"n": 3},))
    assert found["main"] == ()  # static: tuned as it is
    assert found["centre_rows"] == "a symbolic PrimFunc other than the entry main"
    (spec,) = specializations(mod, "centre_rows", ["centre_rows"], ({"n": 5},))["centre_rows"]
    assert spec.label == "n=5" and spec.name == "centre_rows__n_5"


def test_a_copy_is_dispatched_only_where_it_measures_faster(monkeypatch):
    # The measurement is replaced: at 3 rows the copy is faster, at 8 the symbolic schedule.
    specs = (_at(centre_rows, 3), _at(centre_rows, 8))
    tuned = {
        s.name: static_copy(centre_rows, s).with_attr("tirx.is_scheduled", True) for s in specs
    }
    target = tvm.target.Target("llvm")
    symbolic = {"centre_rows": dispatch.symbolic_schedule(centre_rows, target)}
    batches = []

    def measured(funcs, *args):
        batches.append(len(funcs))
        return [(1.0, ""), (2.0, ""), (3.0, ""), (2.0, "")]

    monkeypatch.setattr(dispatch, "measure", measured)
    copies = {"centre_rows": specs}
    kept, reports = dispatch.choose(symbolic, copies, tuned, {}, target, {}, {})
    assert batches == [4] and kept == {"centre_rows": [specs[0]]}
    assert reports["centre_rows__n_3"].best_ms == 1.0
    assert "dispatched: again 1.0000 ms against the symbolic schedule at this size 2.0000 ms" in (
        reports["centre_rows__n_3"].note
    )
    assert "not dispatched: the symbolic schedule at this size 2.0000 ms" in (
        reports["centre_rows__n_8"].note
    )
    func, line, _ = dispatch.write(
        "centre_rows",
        centre_rows,
        symbolic["centre_rows"],
        specs,
        kept["centre_rows"],
        tuned,
        reports,
        {},
    )
    assert _branch_blocks(func) == ["n_3", "other_sizes"]
    assert line.choice == "by-size" and line.sizes == ("centre_rows__n_3",)
    assert (
        func.attrs[RULE_ATTR]
        == "by size: MetaSchedule at n=3 (1.0000 ms); VectorRows at other sizes"
    )
    # None faster: the function stays symbolic, and says why.
    why, line, _ = dispatch.write(
        "centre_rows", centre_rows, symbolic["centre_rows"], specs, [], tuned, reports, {}
    )
    assert why == "no tuned copy measured faster than the symbolic schedule at its size"
    assert line.choice == "by-size" and line.sizes == ()
    # A rebuild takes the tuning run's choice again, measuring nothing.
    monkeypatch.setattr(dispatch, "measure", None)
    earlier = {"centre_rows": tms.FunctionReport("centre_rows", "by-size", sizes=(specs[1].name,))}
    kept, _ = dispatch.choose(symbolic, copies, tuned, reports, target, {}, earlier)
    assert kept == {"centre_rows": [specs[1]]}


def test_a_function_left_symbolic_says_why_after_its_rule():
    mod = tvm.IRModule({"centre_rows": centre_rows})
    schedule = ScheduleReport(mod, rules={"centre_rows": "VectorRows"})
    dispatch = by_size.SizeDispatch(mod, tms.TuningReport(()), {"centre_rows": "no call"})
    assert dispatch.reported(schedule).rules == {
        "centre_rows": "VectorRows; not tuned by size: no call"
    }


# -- through build_model ---------------------------------------------------------------------


class Block(torch.nn.Module):
    """A Linear (the library's), then a layer norm and a scaled softmax plus a residual, both
    left to TVM."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.norm(self.proj(x))
        return torch.softmax(h * 2.0, dim=-1) + h


DYNAMIC = {"x": {0: ("batch", 1, 4), 1: ("seq", 1, 16)}}
SIZES = [{"batch": 1, "seq": 8}, {"batch": 3, "seq": 5}]


def _build(module, work_dir, trials, tune_sizes=SIZES, **tune_options):
    return tir_byoc.build_model(
        module,
        (torch.randn(2, 4, 16),),
        backends="ref",
        dynamic=DYNAMIC,
        tune_trials=trials,
        work_dir=work_dir,
        tune_options=tiny_search(**tune_options),
        tune_sizes=tune_sizes,
    )


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The model tuned once: two trials for each of the two functions' two copies.

    Each tuned copy is measured against the symbolic schedule at its size for real (built and
    run), but the times are then replaced so that every copy wins: the dispatch, not the
    timing, is under test here (``test_a_copy_is_dispatched_only_where_it_measures_faster``
    takes the other way).  One runner serves the whole run, its worker started once.
    """
    work_dir = tmp_path_factory.mktemp("by_size")
    module = Block().eval()
    measured = dispatch.measure

    def copies_faster(funcs, *args):
        times = measured(funcs, *args)
        assert len(times) % 2 == 0 and all(ms is not None for ms, _ in times), times
        return [(1.0 + i % 2, "") for i in range(len(funcs))]  # (copy, symbolic) pairs

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dispatch, "measure", copies_faster)
        model = _build(module, work_dir, 8, runner=ms.runner.LocalRunner())
    return module, model, work_dir


def test_each_symbolic_function_dispatches_to_its_copies_tuned_at_each_size(tuned):
    _, model, work_dir = tuned
    report = tms.load_report(work_dir)
    dispatched = [f for f in report.functions if f.choice == "by-size"]
    assert len(dispatched) == 2, report
    for line in dispatched:
        assert line.sizes == (f"{line.name}__batch_1_seq_8", f"{line.name}__batch_3_seq_5")
        for copy in line.sizes:
            assert report[copy].choice in ("none", "default") and report[copy].best_ms > 0
        func = model.module[line.name]
        assert _branch_blocks(func) == ["batch_1_seq_8", "batch_3_seq_5", "other_sizes"]
        rule = model.rules[line.name]
        assert rule.startswith("by size: ") and rule.endswith(" at other sizes"), rule
        assert " at batch=1, seq=8 (" in rule and " at batch=3, seq=5 (" in rule
    # The Linear stays the library's, symbolic and untuned.
    assert [f.choice for f in report.functions if f.intrinsics] == ["offload-untuned"]
    assert list(model.intrinsics.values()) == [("ref.dense_bias",)]


@pytest.mark.parametrize("size", [(1, 8), (3, 5), (1, 1), (3, 7), (2, 13), (4, 16)])
def test_outputs_equal_torch_at_tuned_sizes_and_others(tuned, size):
    module, model, _ = tuned
    x = torch.randn(*size, 16, generator=torch.Generator().manual_seed(sum(size)))
    with torch.no_grad():
        expected = module(x)
    np.testing.assert_allclose(model(x).numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


def test_a_rebuild_from_the_database_is_the_same_module(tuned):
    module, model, work_dir = tuned
    records = len(ms.database.JSONDatabase(work_dir=str(work_dir)).get_all_tuning_records())
    saved = (work_dir / tms.REPORT_FILE).read_text()
    rebuilt = _build(module, work_dir, 0)
    tvm.ir.assert_structural_equal(rebuilt.module, model.module)
    assert dict(rebuilt.rules) == dict(model.rules)
    database = ms.database.JSONDatabase(work_dir=str(work_dir))
    assert len(database.get_all_tuning_records()) == records
    assert (work_dir / tms.REPORT_FILE).read_text() == saved


@pytest.mark.parametrize(
    ("tune_sizes", "message"),
    [
        (
            None,
            r"expected tune_sizes= with tune_trials= or work_dir= on a build with the symbolic "
            r"dims batch, seq \(MetaSchedule tunes static shapes\), such as "
            r"\[\{'batch': 1, 'seq': 1\}\]",
        ),
        ([{"batch": 1, "seq": 8, "sq": 2}], r"tune_sizes\[0\] names the dim 'sq'; expected "),
        ([{"batch": 1, "seq": 8}, {"batch": 2}], r"tune_sizes\[1\] gives no value for seq"),
        (
            [{"batch": 5, "seq": 8}],
            r"tune_sizes\[0\] gives batch=5, outside its bounds; expected batch in 1..4",
        ),
        ([{"batch": 1, "seq": 1.5}], r"tune_sizes\[0\]\['seq'\] is 1.5; expected an int"),
        ([{"batch": True, "seq": 2}], r"tune_sizes\[0\]\['batch'\] is True; expected an int"),
        ({"batch": 1, "seq": 8}, r"expected tune_sizes as a list of dicts of ints such as"),
        ([], r"expected tune_sizes as a list of dicts of ints such as"),
        ([(1, 8)], r"expected tune_sizes as a list of dicts of ints such as"),
    ],
)
def test_bad_tune_sizes_are_one_line_errors_before_anything_is_tuned(
    tmp_path, monkeypatch, tune_sizes, message
):
    # A Relax module with its own dims and bounds is checked as a torch model's are (the
    # message of a torch model without tune_sizes: tests/models/test_dynamic.py).
    def tuning(*args, **kwargs):
        raise AssertionError("tuned")

    monkeypatch.setattr(by_size, "tune_by_size", tuning)
    with pytest.raises(ValueError, match=f"^tir_byoc.build_model: {message}") as raised:
        tir_byoc.build_model(
            _softmax_module(), tune_trials=4, work_dir=tmp_path, tune_sizes=tune_sizes
        )
    assert "\n" not in str(raised.value)


def _softmax_module() -> tvm.IRModule:
    """A Relax softmax over (batch, seq, 16), batch in 1..4 and seq in 1..16."""
    bb = relax.BlockBuilder()
    batch, seq = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([batch, seq, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x))
        bb.emit_func_output(out)
    mod = bb.get()
    main = mod["main"].with_attr("tir_var_lower_bound", {"batch": 1, "seq": 1})
    mod["main"] = main.with_attr("tir_var_upper_bound", {"batch": 4, "seq": 16})
    return mod


def test_tune_sizes_are_refused_without_tuning_and_on_a_static_build(tmp_path):
    with pytest.raises(ValueError, match=r"tune_sizes= only with tune_trials= or work_dir="):
        tir_byoc.build_model(
            Block().eval(), (torch.randn(2, 4, 16),), dynamic=DYNAMIC, tune_sizes=SIZES
        )
    with pytest.raises(ValueError, match=r"tune_sizes= only on a build with symbolic dims"):
        tir_byoc.build_model(
            Block().eval(),
            (torch.randn(2, 4, 16),),
            tune_trials=4,
            work_dir=tmp_path,
            tune_sizes=SIZES,
        )
