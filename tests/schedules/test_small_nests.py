"""A parallel nest with little work runs on one thread (tir_byoc/schedules/small_nests.py).

On symbolic extents the nest is written twice behind a test of its iteration count; the serial
copy gets its own intermediates, so that each branch still allocates one row per iteration.
Each form is checked on the scheduled or lowered function, and its results at sizes on both
sides of the threshold.
"""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.script import tirx as T

import tir_byoc
from tir_byoc.schedules.loops import MIN_PARALLEL_WORK
from tir_byoc.schedules.small_nests import nest_work, serial_when_small

ROWS = tirx.Var("rows", "int64")


def _build(shape, emit):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(emit(x))
        bb.emit_func_output(out)
    return tir_byoc.build_model(bb.get())


def _scheduled(built, rule) -> tuple[str, tirx.PrimFunc]:
    (name,) = [n for n, r in built.rules.items() if r == rule]
    return name, built.module[name]


def _walk(node, node_type) -> list:
    found = []
    tvm_ffi.structural_walk(node, (node_type, found.append))
    return found


def _loops(node, kind) -> list:
    return [loop for loop in _walk(node, tirx.For) if loop.kind == kind]


def _branches(func) -> tirx.IfThenElse:
    """The one test of ``func``, which must be well formed (each variable defined once)."""
    s_tir.analysis.verify_well_formed(func, True)
    (branch,) = _walk(func.body, tirx.IfThenElse)
    return branch


def _softmax(x):
    return relax.op.nn.softmax(x, axis=-1)


def _reference_softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# Rows of 256: a nest of rows * 256 iterations, on one thread below 64 rows.
SMALL_ROWS = MIN_PARALLEL_WORK // 256


def test_a_symbolic_elementwise_nest_runs_serially_below_the_threshold_and_in_parallel_above():
    built = _build([ROWS, 256], lambda x: relax.op.add(x, relax.const(1.0, "float32")))
    name, func = _scheduled(built, "Elementwise")
    branch = _branches(func)
    # The test is on the nest's iterations, rows * 256; serial below, parallel from there.
    assert "rows" in str(branch.condition) and str(MIN_PARALLEL_WORK) in str(branch.condition)
    assert _loops(branch.then_case, tirx.ForKind.SERIAL)
    assert not _loops(branch.then_case, tirx.ForKind.PARALLEL)
    assert len(_loops(branch.else_case, tirx.ForKind.PARALLEL)) == 1
    # The copy defines its own loop variables.
    serial_vars = {loop.loop_var for loop in _walk(branch.then_case, tirx.For)}
    assert not any(
        v.same_as(loop.loop_var) for v in serial_vars for loop in _walk(branch.else_case, tirx.For)
    )
    why = built.serial_blocks[name]
    for reason in why.values():
        assert "below 16384 iterations" in reason and "in parallel from there" in reason
    rng = np.random.default_rng(0)
    for rows in [1, SMALL_ROWS - 1, SMALL_ROWS, SMALL_ROWS + 1, 300]:
        a = rng.standard_normal((rows, 256)).astype("float32")
        np.testing.assert_array_equal(built(a), a + np.float32(1))


def test_a_symbolic_row_nest_gives_its_serial_copy_rows_of_its_own():
    built = _build([ROWS, 64], _softmax)
    _, func = _scheduled(built, "VectorRows")
    branch = _branches(func)
    (serial,) = [b for b in _walk(branch.then_case, s_tir.SBlock) if b.name_hint == "serial_nest"]
    (parallel,) = [b for b in _walk(branch.else_case, s_tir.SBlock) if b.name_hint == "nest"]
    assert serial.alloc_buffers and len(serial.alloc_buffers) == len(parallel.alloc_buffers)
    for a in serial.alloc_buffers:
        assert not any(a.same_as(b) for b in parallel.alloc_buffers)
    # TVM still allocates one row per iteration in each branch, not one for every row.
    lowered = tvm.s_tir.transform.LowerOpaqueBlock()(
        tvm.s_tir.transform.CompactBufferAllocation()(
            tvm.s_tir.transform.ConvertBlocksToOpaque()(
                tvm.s_tir.transform.PlanAndUpdateBufferAllocationLocation()(
                    tvm.s_tir.transform.LowerInitBlock()(tvm.IRModule({"main": func}))
                )
            )
        )
    )
    allocations = _walk(lowered["main"].body, tirx.AllocBuffer)
    assert len(allocations) == 2 * len(serial.alloc_buffers)
    for allocation in allocations:
        assert int(allocation.buffer.ty.shape[0]) == 1, str(allocation)
    rng = np.random.default_rng(1)
    small_rows = MIN_PARALLEL_WORK // nest_rows_work(branch)
    for rows in [1, small_rows, small_rows + 1, 500]:
        a = rng.standard_normal((rows, 64)).astype("float32")
        np.testing.assert_allclose(built(a), _reference_softmax(a), rtol=1e-5, atol=1e-6)


def nest_rows_work(branch) -> int:
    """The iterations of one row of the parallel copy's nest."""
    (loop,) = _loops(branch.else_case, tirx.ForKind.PARALLEL)
    return int(nest_work(loop.body))


# A softmax row of 256 is five passes over it: 4 rows are about 5,000 iterations, 64 about 80,000.
@pytest.mark.parametrize(("rows", "parallel"), [(4, False), (64, True)])
def test_a_static_row_nest_takes_its_threads_from_its_work(rows, parallel):
    built = _build([rows, 256], _softmax)
    name, func = _scheduled(built, "VectorRows")
    assert not _walk(func.body, tirx.IfThenElse)
    assert bool(_loops(func.body, tirx.ForKind.PARALLEL)) == parallel
    if not parallel:
        assert all("runs on one thread" in w for w in built.serial_blocks[name].values())
    a = np.random.default_rng(2).standard_normal((rows, 256)).astype("float32")
    np.testing.assert_allclose(built(a), _reference_softmax(a), rtol=1e-5, atol=1e-6)


@T.prim_func(s_tir=True)
def _two_nests(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(64)), "float32")
    B = T.match_buffer(b, (n, T.int64(64)), "float32")
    total = T.sblock_alloc_buffer((n,), "float32")
    for i in T.parallel(n):
        for k in range(T.int64(64)):
            with T.sblock("sum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    total[vi] = T.float32(0)
                total[vi] = total[vi] + A[vi, vk]
    for i in T.parallel(n):
        for k in range(T.int64(64)):
            with T.sblock("centre"):
                vi, vk = T.axis.remap("SS", [i, k])
                B[vi, vk] = A[vi, vk] - total[vi] * T.float32(0.015625)


def test_an_intermediate_two_nests_share_stays_one_buffer_for_both_copies():
    func, notes = serial_when_small(_two_nests)
    assert set(notes) == {"sum", "centre"}
    s_tir.analysis.verify_well_formed(func, True)  # each copy defines its own variables
    (root,) = [b for b in _walk(func.body, s_tir.SBlock) if b.name_hint == "root"]
    assert [b.name for b in root.alloc_buffers] == ["total"]
    for block in _walk(func.body, s_tir.SBlock):
        if block.name_hint != "root":
            assert not block.alloc_buffers, block.name_hint
    ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    for rows in [3, 500]:
        a = np.random.default_rng(rows).standard_normal((rows, 64)).astype("float32")
        out = tvm.runtime.tensor(np.zeros_like(a))
        ex["main"](tvm.runtime.tensor(a), out)
        np.testing.assert_allclose(
            out.numpy(), a - a.sum(-1, keepdims=True) * np.float32(0.015625), rtol=1e-5, atol=1e-5
        )


@T.prim_func(s_tir=True)
def _triangle(a: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, n), "float32")
    for i in T.parallel(n):
        for j in range(i):
            with T.sblock("lower"):
                vi, vj = T.axis.remap("SS", [i, j])
                A[vi, vj] = T.float32(0)


def test_a_nest_whose_extent_reads_its_own_iterator_is_not_weighed():
    assert nest_work(_triangle.body.block.body) is None
    func, notes = serial_when_small(_triangle)
    assert func.same_as(_triangle) and notes == {}


def test_a_nest_above_the_threshold_is_left_as_it_is():
    @T.prim_func(s_tir=True)
    def wide(A: T.Buffer((T.int64(128), T.int64(256)), "float32")):
        for i in T.parallel(T.int64(128)):
            for j in range(T.int64(256)):
                with T.sblock("zero"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    A[vi, vj] = T.float32(0)

    func, notes = serial_when_small(wide)
    assert func.same_as(wide) and notes == {}
