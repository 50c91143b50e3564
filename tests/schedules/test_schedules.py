"""The default CPU rules of tir_byoc.schedules: where each applies, what it does to the loops,
and that a scheduled function computes exactly what the unscheduled one computes."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from support.byoc_testing import lowered, vector_loads
from tvm import s_tir, tirx
from tvm.script import tirx as T

from tir_byoc import schedules
from tir_byoc.schedules import Elementwise, RowReduction, SlidingWindow, loops

TARGET = tvm.target.Target("llvm")


@T.prim_func(s_tir=True)
def add_transpose(A: T.Buffer((256, 128), "float32"), B: T.Buffer((128, 256), "float32")):
    C = T.sblock_alloc_buffer((256, 128))
    for i, j in T.grid(256, 128):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            C[vi, vj] = A[vi, vj] + T.float32(1)
    for j, i in T.grid(128, 256):
        with T.sblock("transpose"):
            vj, vi = T.axis.remap("SS", [j, i])
            B[vj, vi] = C[vi, vj]


@T.prim_func(s_tir=True)
def transpose_uneven(A: T.Buffer((100, 64), "float32"), B: T.Buffer((64, 100), "float32")):
    """A transpose whose written rows (100) the vector width does not divide."""
    for j, i in T.grid(64, 100):
        with T.sblock("transpose"):
            vj, vi = T.axis.remap("SS", [j, i])
            B[vj, vi] = A[vi, vj]


@T.prim_func(s_tir=True)
def small_add(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4, 8), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] + T.float32(1)


@T.prim_func(s_tir=True)
def row_sum(A: T.Buffer((512, 300), "float32"), S: T.Buffer((512,), "float32")):
    for i, k in T.grid(512, 300):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + A[vi, vk]


@T.prim_func(s_tir=True)
def total_sum(A: T.Buffer((65536,), "float32"), S: T.Buffer((1,), "float32")):
    for k in range(65536):
        with T.sblock("sum"):
            vk = T.axis.remap("R", [k])
            with T.init():
                S[0] = T.float32(0)
            S[0] = S[0] + A[vk]


@T.prim_func(s_tir=True)
def rotate_half(A: T.Buffer((512, 64), "float32"), B: T.Buffer((512, 64), "float32")):
    """A concatenation on the last axis, as TVM's ``concatenate`` writes LLaMA's rotary
    embedding: the condition as ``32 <= j``, which TVM's simplifier does not fold per vector."""
    for i, j in T.grid(512, 64):
        with T.sblock("concat"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.if_then_else(32 <= vj, A[vi, vj - 32], A[vi, vj + 32] * T.float32(-1))


@T.prim_func(s_tir=True)
def uneven_concat(A: T.Buffer((512, 64), "float32"), B: T.Buffer((512, 64), "float32")):
    """The parts meet inside a vector (at 30): no partition keeps every lane's branch fixed."""
    for i, j in T.grid(512, 64):
        with T.sblock("concat"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.if_then_else(30 <= vj, A[vi, vj - 30], A[vi, vj + 34])


@T.prim_func(s_tir=True)
def data_dependent_select(A: T.Buffer((512, 64), "float32"), B: T.Buffer((512, 64), "float32")):
    for i, j in T.grid(512, 64):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = T.Select(A[vi, vj] > T.float32(0), A[vi, vj], T.float32(0))


@T.prim_func
def plain_loops(A: T.Buffer((64,), "float32"), B: T.Buffer((64,), "float32")):
    for i in range(64):
        B[i] = A[i] * T.float32(2)


def _loop_kinds(func: tirx.PrimFunc) -> list[tirx.ForKind]:
    kinds = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, lambda loop: kinds.append(loop.kind))])
    return kinds


def _run(func: tirx.PrimFunc, arrays):
    built = tvm.compile(tvm.IRModule({"main": func}), target=TARGET)
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    built["main"](*tensors)
    return [t.numpy() for t in tensors]


def _schedule(func: tirx.PrimFunc) -> schedules.ScheduleReport:
    return schedules.default_schedule(tvm.IRModule({"main": func}), TARGET)


def _random(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype("float32") for s in shapes]


def test_an_elementwise_function_is_inlined_parallel_outside_and_vectorised_inside():
    report = _schedule(add_transpose)
    assert dict(report.rules) == {"main": "Elementwise"}
    scheduled = report.module["main"]
    kinds = _loop_kinds(scheduled)
    assert kinds.count(tirx.ForKind.PARALLEL) == 1
    assert kinds.count(tirx.ForKind.VECTORIZED) == 1
    # The add is inlined into the transpose: one loop nest, no intermediate buffer.
    assert "alloc_buffer" not in scheduled.script()
    arrays = _random([(256, 128), (128, 256)])
    np.testing.assert_array_equal(_run(scheduled, arrays)[1], _run(add_transpose, arrays)[1])
    assert dict(report.serial_blocks) == {}


def _loop_extents(func: tirx.PrimFunc) -> list[int]:
    extents = []
    tvm_ffi.structural_walk(func.body, [(tirx.For, lambda loop: extents.append(loop.extent))])
    return [int(e) for e in reversed(extents)]  # post-order: innermost last, outermost first


def test_a_transpose_is_tiled_so_that_each_tile_reuses_the_cache_lines_it_reads():
    """Along the written row a transpose reads one element per cache line: in tiles of the
    vector width on both axes, the lines one tile reads serve all of it."""
    lanes = loops.vector_lanes(TARGET, 32)
    scheduled = _schedule(add_transpose).module["main"]
    assert _loop_extents(scheduled)[-2:] == [lanes, lanes], scheduled.script()
    arrays = _random([(256, 128), (128, 256)])
    np.testing.assert_array_equal(_run(scheduled, arrays)[1], _run(add_transpose, arrays)[1])


def test_a_transpose_whose_rows_the_vector_width_does_not_divide_reads_vectors():
    lanes = loops.vector_lanes(TARGET, 32)
    report = _schedule(transpose_uneven)
    scheduled = report.module["main"]
    assert _loop_extents(scheduled)[-2:] == [lanes, lanes], scheduled.script()
    # The read's tile is the vector: A's rows, contiguous; the write's tile checks the bound.
    assert vector_loads(scheduled), scheduled.script()
    arrays = _random([(100, 64), (64, 100)])
    np.testing.assert_array_equal(_run(scheduled, arrays)[1], _run(transpose_uneven, arrays)[1])


def test_a_concatenation_on_the_vector_axis_is_partitioned_where_its_parts_meet():
    """Each vector's lanes all on one side of the boundary: TVM's simplifier folds the branch
    and the loop stays vector (with the branch varying between lanes, TVM's vectoriser turns
    the whole loop back into scalar code)."""
    lanes = loops.vector_lanes(TARGET, 32)
    scheduled = _schedule(rotate_half).module["main"]
    kinds = _loop_kinds(scheduled)
    assert kinds.count(tirx.ForKind.PARALLEL) == 1
    assert kinds.count(tirx.ForKind.VECTORIZED) == 2  # one vector loop per part
    assert vector_loads(scheduled) and all(
        load.ty.dtype.lanes == lanes for load in vector_loads(scheduled)
    )
    # Without the partition the same split is scalar code again.
    assert vector_loads(_split_only(rotate_half, lanes)) == []
    arrays = _random([(512, 64), (512, 64)])
    np.testing.assert_array_equal(_run(scheduled, arrays)[1], _run(rotate_half, arrays)[1])


def _split_only(func: tirx.PrimFunc, lanes: int) -> tirx.PrimFunc:
    """The schedule without the partition: the vectors' loop fused into the parallel one."""
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("concat")
    outer, inner = sch.get_loops(block)
    rest, vector = sch.split(inner, factors=[None, lanes])
    sch.parallel(sch.fuse(outer, rest))
    sch.vectorize(vector)
    return sch.mod["main"]


@pytest.mark.parametrize(
    "func",
    [uneven_concat, data_dependent_select],
    ids=["boundary inside a vector", "select on data"],
)
def test_a_branch_not_fixed_per_vector_keeps_the_plain_split(func):
    scheduled = _schedule(func).module["main"]
    kinds = _loop_kinds(scheduled)
    assert kinds.count(tirx.ForKind.VECTORIZED) == 1
    arrays = _random([(512, 64), (512, 64)])
    np.testing.assert_array_equal(_run(scheduled, arrays)[1], _run(func, arrays)[1])


def test_a_small_block_stays_on_one_thread_and_says_why():
    report = _schedule(small_add)
    assert dict(report.rules) == {"main": "Elementwise"}
    assert tirx.ForKind.PARALLEL not in _loop_kinds(report.module["main"])
    assert dict(report.serial_blocks["main"]) == {
        "add": f"32 iterations, below {loops.MIN_PARALLEL_WORK}: runs on one thread"
    }


def test_a_lone_row_reduction_runs_its_rows_in_parallel():
    # dlight's Reduction needs two blocks or more; RowReduction takes a lone one.
    assert tvm.s_tir.dlight.cpu.Reduction().apply(row_sum, TARGET, False) is None
    report = _schedule(row_sum)
    assert dict(report.rules) == {"main": "RowReduction"}
    assert tirx.ForKind.PARALLEL in _loop_kinds(report.module["main"])
    arrays = _random([(512, 300), (512,)])
    np.testing.assert_allclose(
        _run(report.module["main"], arrays)[1], _run(row_sum, arrays)[1], rtol=2e-6, atol=1e-5
    )


@T.prim_func(s_tir=True)
def row_sum_512(A: T.Buffer((256, 512), "float32"), S: T.Buffer((256,), "float32")):
    for i, k in T.grid(256, 512):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                S[vi] = T.float32(0)
            S[vi] = S[vi] + A[vi, vk]


def test_a_lone_row_reduction_the_vector_width_divides_sums_in_vector_lanes():
    report = _schedule(row_sum_512)
    assert dict(report.rules) == {"main": "RowReduction"}
    assert dict(report.serial_blocks) == {}
    scheduled = report.module["main"]
    assert _vector_loops_in(scheduled, "sum_rf_update") == 1
    # The partial sums in parallel; combining them (256 x 16 adds) is too little work for it.
    assert _loop_kinds(scheduled).count(tirx.ForKind.PARALLEL) == 1
    arrays = _random([(256, 512), (256,)])
    np.testing.assert_allclose(
        _run(scheduled, arrays)[1], arrays[0].astype(np.float64).sum(1), rtol=1e-5, atol=1e-5
    )


def test_a_reduction_over_every_loop_is_scheduled_serially_with_its_reason():
    report = _schedule(total_sum)
    assert dict(report.rules) == {"main": "RowReduction"}
    assert dict(report.serial_blocks["main"]) == {
        "sum": "its spatial loops have extent 1: runs on one thread"
    }


def test_each_rule_declines_what_it_does_not_schedule():
    assert Elementwise().apply(row_sum, TARGET, False) is None
    assert RowReduction().apply(add_transpose, TARGET, False) is None
    assert Elementwise().apply(add_transpose, tvm.target.Target("c"), False) is None


def test_a_function_no_rule_reads_is_left_as_it_was_with_a_reason():
    report = _schedule(plain_loops)
    assert dict(report.rules) == {}
    assert report.unscheduled["main"].startswith("has no block to schedule") or (
        "not in dlight's normal form" in report.unscheduled["main"]
    )
    tvm.ir.assert_structural_equal(report.module["main"], plain_loops)


def _single_element_sum() -> tirx.PrimFunc:
    """``exp(sum(x[i, j, r] for r in range(1)))``: a reduction over one element, as a 1 x 1
    average pooling or a mean over an axis of 1 is, then an elementwise op."""
    from tvm import te

    x = te.placeholder((4, 8, 1), name="x")
    r = te.reduce_axis((0, 1), name="r")
    total = te.compute((4, 8), lambda i, j: te.sum(x[i, j, r], axis=r), name="total")
    out = te.compute((4, 8), lambda i, j: te.exp(total[i, j]), name="out")
    return te.create_prim_func([x, out])


def test_a_reduction_over_one_element_is_left_to_tvm_with_a_reason():
    """dlight's normal form drops the reduction's one-element iterator but not its init, and
    inlining ``exp`` into that block computed ``exp(1 + x)``: ``exp(0)`` in the init, then
    ``exp`` again of the init's value plus ``x``."""
    func = _single_element_sum()
    report = _schedule(func)
    assert dict(report.rules) == {}
    assert "block total reduces over a single element" in report.unscheduled["main"]
    (x,) = _random([(4, 8, 1)])
    _, out = _run(report.module["main"], [x, np.zeros((4, 8), "float32")])
    np.testing.assert_allclose(out, np.exp(x[..., 0]), rtol=1e-6)


def test_a_rule_that_raises_leaves_the_function_and_records_the_error(monkeypatch):
    class Broken(tvm.s_tir.dlight.ScheduleRule):
        def apply(self, func, target, tunable):
            raise RuntimeError("rule broke\nsecond line")

    monkeypatch.setattr(schedules, "RULES", (Broken,))
    report = _schedule(add_transpose)
    assert dict(report.failures) == {"main": "RuntimeError: rule broke"}
    assert dict(report.unscheduled) == {"main": "RuntimeError: rule broke"}
    tvm.ir.assert_structural_equal(report.module["main"], add_transpose)


def _rms_norm(rows: int, width: int = 768) -> tirx.PrimFunc:
    """LLaMA's RMSNorm as torch.export decomposes it (mean of the squares, + eps, rsqrt, times
    x, times the weight), lowered as build_model lowers it: the PrimFunc with the reduction."""
    from tvm import relax
    from tvm.script import relax as R

    from tir_byoc.relax import pipeline

    x = relax.Var("x", R.Tensor((1, rows, width), "float32"))
    square = relax.Var("square", R.Tensor((1, rows, width), "float32"))
    weight = relax.Var("weight", R.Tensor((width,), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, square, weight]):
        with builder.dataflow():
            mean = builder.emit(R.mean(square, axis=[-1], keepdims=True))
            scale = builder.emit(R.rsqrt(R.add(mean, R.const(1e-6, "float32"))))
            out = builder.emit_output(R.multiply(weight, R.multiply(x, scale)))
        builder.emit_func_output(out)
    mod = pipeline.lower(builder.get())
    (func,) = [f for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    assert [p.name for p in func.params][:3] == ["square", "x", "weight"]
    return func.with_attr("global_symbol", "main")


def test_a_schedule_that_repeats_a_whole_reduction_is_declined():
    """dlight's Reduction schedules a one-token RMSNorm so that the sum over the row runs again
    for each output element; the default schedule takes the next rule instead."""
    func = _rms_norm(rows=1)
    with TARGET:
        by_dlight = tvm.s_tir.dlight.cpu.Reduction().apply(func, TARGET, False)
    assert by_dlight is not None
    assert "runs whole for each of the 768 iterations" in schedules.recomputed_reduction(
        by_dlight.mod["main"]
    )
    report = schedules.default_schedule(tvm.IRModule({"main": func}), TARGET)
    assert report.rules["main"] == "RowReduction"
    assert schedules.recomputed_reduction(report.module["main"]) is None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 768)).astype("float32")
    weight = rng.standard_normal(768).astype("float32")
    args = [x * x, x, weight]  # the fused function's parameter order
    expected = weight * (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6))
    out = tvm.runtime.tensor(np.zeros_like(x))
    built = tvm.compile(report.module, target=TARGET)
    built["main"](*[tvm.runtime.tensor(a) for a in args], out)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_schedule_that_reduces_each_row_once_is_kept():
    report = schedules.default_schedule(tvm.IRModule({"main": _rms_norm(rows=128)}), TARGET)
    assert report.rules["main"] == "VectorRows"
    assert schedules.recomputed_reduction(report.module["main"]) is None


def _vector_loops_in(func: tirx.PrimFunc, block_suffix: str) -> int:
    """How many vectorised loops directly hold a block whose name ends with ``block_suffix``."""
    found = []

    def on_loop(loop):
        body = loop.body
        if loop.kind == tirx.ForKind.VECTORIZED and isinstance(body, tvm.s_tir.SBlockRealize):
            found.append(body.block.name_hint.endswith(block_suffix))

    tvm_ffi.structural_walk(func.body, [(tirx.For, on_loop)])
    return sum(found)


def test_a_softmax_reduces_its_rows_in_vector_registers_and_stays_within_rounding():
    from tvm.script import relax as R

    func = lowered(lambda x: R.nn.softmax(x, axis=-1), (4, 96, 128))
    report = _schedule(func)
    assert report.rules["main"] == "VectorRows"
    assert dict(report.serial_blocks) == {}
    scheduled = report.module["main"]
    # The max and the sum each have a block of partial results, vectorised.
    assert _vector_loops_in(scheduled, "maxelem_rf_update") == 1
    assert _vector_loops_in(scheduled, "expsum_rf_update") == 1
    assert tirx.ForKind.PARALLEL in _loop_kinds(scheduled)
    x = _random([(4, 96, 128)])[0] * 8
    got = _run(scheduled, [x, np.zeros_like(x)])[1]
    expected = np.exp(x - x.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


@T.prim_func(s_tir=True)
def minus_row_max(A: T.Buffer((64, 512), "float32"), B: T.Buffer((64, 512), "float32")):
    M = T.sblock_alloc_buffer((64,))
    for i, k in T.grid(64, 512):
        with T.sblock("max"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                M[vi] = T.min_value("float32")
            M[vi] = T.max(M[vi], A[vi, vk])
    for i, j in T.grid(64, 512):
        with T.sblock("minus"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] - M[vi]


def test_a_row_maximum_vectorised_is_the_serial_one_bit_for_bit():
    func = minus_row_max
    report = _schedule(func)
    assert report.rules["main"] == "VectorRows"
    assert _vector_loops_in(report.module["main"], "_rf_update") == 1
    x = _random([(64, 512)])[0]
    x[3, 100] = np.inf
    x[5, :] = -np.inf  # -inf - -inf: NaN in both
    arrays = [x, np.zeros_like(x)]
    np.testing.assert_array_equal(_run(report.module["main"], arrays)[1], _run(func, arrays)[1])


def _poisoned_rows(shape):
    """Random rows, every odd one starting with 1e30: a row's reduction that reads one element
    past its end takes the next row's 1e30 in (a maximum, or a sum of it or of its exp)."""
    x = _random([shape])[0]
    x[1::2, 0] = 1e30
    return x


@pytest.mark.parametrize("rows", [(64, 100), (8, 8207)], ids=["softmax 100", "softmax 8207"])
def test_a_row_the_vector_width_does_not_divide_is_reduced_in_vectors_up_to_its_last(rows):
    from tvm.script import relax as R

    func = lowered(lambda x: R.nn.softmax(x, axis=-1), rows)
    report = _schedule(func)
    assert report.rules["main"] == "VectorRows" and "main" not in report.serial_blocks
    lanes = loops.vector_lanes(TARGET, 32)
    assert lanes in [load.ty.dtype.lanes for load in vector_loads(report.module["main"])]
    x = _poisoned_rows(rows)
    arrays = [x, np.zeros_like(x)]
    np.testing.assert_allclose(
        _run(report.module["main"], arrays)[1], _run(func, arrays)[1], rtol=2e-6, atol=1e-7
    )


def test_a_sum_the_vector_width_does_not_divide_is_reduced_in_vectors_up_to_its_last():
    from tvm.script import relax as R

    func = lowered(lambda x: R.sum(x, axis=-1), (256, 100))
    report = _schedule(func)
    assert report.rules["main"] == "RowReduction" and "main" not in report.serial_blocks
    lanes = loops.vector_lanes(TARGET, 32)
    assert lanes in [load.ty.dtype.lanes for load in vector_loads(report.module["main"])]
    x = _poisoned_rows((256, 100))
    arrays = [x, np.zeros(256, "float32")]
    np.testing.assert_allclose(
        _run(report.module["main"], arrays)[1], _run(func, arrays)[1], rtol=2e-6, atol=1e-5
    )


def _window(
    width: int, kernel: int = 3, stride: int = 1, op: str = "conv", channels: int = 8, batch=1
) -> tirx.PrimFunc:
    """A depthwise convolution (``op="conv"``: pad, window sum, bias) or a max pooling
    (``"max"``) of ``kernel`` x ``kernel`` over (batch, channels, 12, width), as TOPI writes
    them (``batch`` an int or a variable)."""
    from tvm import te

    x = te.placeholder((batch, channels, 12, width), name="x")
    pad = kernel // 2
    padded = te.compute(
        (batch, channels, 12 + 2 * pad, width + 2 * pad),
        lambda n, c, h, w: tirx.if_then_else(
            tirx.all(h >= pad, h < 12 + pad, w >= pad, w < width + pad),
            x[n, c, h - pad, w - pad],
            tirx.const(0.0, "float32"),
        ),
        name="pad_temp",
    )
    rows, cols = (12 + 2 * pad - kernel) // stride + 1, (width + 2 * pad - kernel) // stride + 1
    r = te.reduce_axis((0, kernel), name="r")
    s = te.reduce_axis((0, kernel), name="s")
    shape = (batch, channels, rows, cols)

    def tap(n, c, h, w):
        return padded[n, c, h * stride + r, w * stride + s]

    if op == "max":
        pooled = te.compute(shape, lambda *i: te.max(tap(*i), axis=[r, s]), name="pool")
        return te.create_prim_func([x, pooled])
    weight = te.placeholder((channels, 1, kernel, kernel), name="w")
    bias = te.placeholder((1, channels, 1, 1), name="b")
    conv = te.compute(
        shape,
        lambda n, c, h, w: te.sum(tap(n, c, h, w) * weight[c, 0, r, s], axis=[r, s]),
        name="depthwise",
    )
    out = te.compute(shape, lambda n, c, h, w: conv[n, c, h, w] + bias[0, c, 0, 0], name="bias")
    return te.create_prim_func([x, weight, bias, out])


def _params(func: tirx.PrimFunc, seed=0):
    return _random([[int(d) for d in p.ty.shape] for p in func.params], seed)


@pytest.mark.parametrize("width", [56, 64, 7], ids=["8 lanes", "16 lanes", "narrow"])
def test_a_depthwise_convolution_sums_its_window_over_vectors_of_its_rows(width):
    func = _window(width, kernel=7)
    report = _schedule(func)
    assert dict(report.rules) == {"main": "SlidingWindow"}
    assert "depthwise" not in report.serial_blocks.get("main", {})
    scheduled = report.module["main"]
    # The init and the update each run along the row in vectors, the window's taps outside.
    assert _vector_loops_in(scheduled, "depthwise_init") == 1
    assert _vector_loops_in(scheduled, "depthwise_update") == 1
    assert tirx.ForKind.PARALLEL in _loop_kinds(scheduled)
    assert tirx.ForKind.UNROLLED in _loop_kinds(scheduled)
    arrays = _params(func)
    # Each output adds its products in the unscheduled order; only a fused multiply-add may
    # round differently.
    np.testing.assert_allclose(
        _run(scheduled, arrays)[-1], _run(func, arrays)[-1], rtol=1e-6, atol=1e-6
    )


def test_a_max_pooling_window_is_the_unscheduled_one_bit_for_bit():
    func = _window(32, kernel=3, op="max")
    report = _schedule(func)
    assert dict(report.rules) == {"main": "SlidingWindow"}
    arrays = _params(func)
    np.testing.assert_array_equal(_run(report.module["main"], arrays)[-1], _run(func, arrays)[-1])


def test_a_window_whose_rows_take_no_vector_stays_serial_along_them_and_says_why():
    func = _window(30, kernel=3)  # 30: no multiple of 4
    report = _schedule(func)
    assert dict(report.rules) == {"main": "SlidingWindow"}
    assert report.serial_blocks["main"]["depthwise"] == (
        "its rows of 30 are no multiple of 4: not vectorised"
    )
    arrays = _params(func)
    np.testing.assert_allclose(
        _run(report.module["main"], arrays)[-1], _run(func, arrays)[-1], rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("op", ["max", "conv"])
def test_a_stride_2_window_gathers_every_other_input_into_its_vectors(op):
    """VGG's 2 x 2 max pooling and MobileNetV2's stride-2 depthwise convolutions in NCHW: the
    rows still run in vectors, each lane reading every other input; a max is the unscheduled
    one bit for bit, a sum within a fused multiply-add's rounding."""
    kernel, width = (2, 62) if op == "max" else (3, 64)  # output rows of 32 either way
    func = _window(width, kernel=kernel, stride=2, op=op)
    report = _schedule(func)
    assert dict(report.rules) == {"main": "SlidingWindow"}
    notes = report.serial_blocks.get("main", {}).values()
    assert not [n for n in notes if "vectorised" in n], notes  # (too small for two threads)
    scheduled = report.module["main"]
    assert vector_loads(scheduled)
    arrays = _params(func)
    got, want = _run(scheduled, arrays)[-1], _run(func, arrays)[-1]
    if op == "max":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _global_mean(batch) -> tirx.PrimFunc:
    """MobileNetV2's last pooling in NHWC, a mean over (batch, 7, 7, 1280) as TOPI writes it."""
    from tvm import te

    x = te.placeholder((batch, 7, 7, 1280), name="x")
    r = te.reduce_axis((0, 7), name="r")
    s = te.reduce_axis((0, 7), name="s")
    total = te.compute(
        (batch, 1, 1, 1280), lambda n, i, j, c: te.sum(x[n, r, s, c], axis=[r, s]), name="x_red"
    )
    mean = te.compute(total.shape, lambda *i: total(*i) / tirx.const(49.0, "float32"))
    return te.create_prim_func([x, mean])


@pytest.mark.parametrize(
    "func",
    [_window(64, kernel=3, batch=tirx.Var("n", "int64")), _global_mean(tirx.Var("n", "int64"))],
    ids=["depthwise", "global mean"],
)
def test_a_window_over_a_symbolic_batch_runs_in_vectors_along_its_rows(func):
    """A dynamic batch leaves the rows' and taps' extents static: the window rule still takes
    the function, as it does the static one, rather than reducing each element in lanes."""
    report = _schedule(func)
    assert dict(report.rules) == {"main": "SlidingWindow"}
    scheduled = report.module["main"]
    assert vector_loads(scheduled)
    assert tirx.ForKind.PARALLEL in _loop_kinds(scheduled)
    for batch in (1, 3):
        shapes = [
            [batch if isinstance(d, tirx.Var) else int(d) for d in p.ty.shape] for p in func.params
        ]
        arrays = _random(shapes, seed=batch)
        np.testing.assert_allclose(
            _run(scheduled, arrays)[-1], _run(func, arrays)[-1], rtol=1e-6, atol=1e-6
        )


@pytest.mark.parametrize(
    "func",
    [_window(36, kernel=3, stride=3), row_sum, row_sum_512, total_sum, _rms_norm(4)],
    ids=["stride 3", "row sum", "row sum 512", "total sum", "two reductions"],
)
def test_the_window_rule_declines_reductions_that_do_not_read_along_their_rows(func):
    assert SlidingWindow().apply(func, TARGET, False) is None
