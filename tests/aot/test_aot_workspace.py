"""The workspace plan: greedy by size over lifetimes, outputs in place, copies, the bound."""

import numpy as np
import pytest

from tir_byoc.aot.program import CONSTANT, INPUT, INTERMEDIATE, Buffer, Program, Step, TensorRef
from tir_byoc.aot.workspace import (
    ALIGNMENT,
    Interval,
    greedy_by_size,
    peak_live_bytes,
    plan_workspace,
)


def _buffer(name, elements, kind=INTERMEDIATE):
    return Buffer(name, kind, (elements,), "float32")


def _ref(buffer, shape=None):
    return TensorRef(buffer, shape or buffer.shape, buffer.dtype)


def _chain(sizes):
    """x -> t0 -> t1 -> ... -> out: step i reads t(i-1) and writes t(i); the last is returned."""
    x = _buffer("x", 16, INPUT)
    tensors = [_buffer(f"t{i}", n) for i, n in enumerate(sizes)]
    steps = [
        Step(f"f{i}", (_ref(a), _ref(b))) for i, (a, b) in enumerate(zip([x, *tensors], tensors))
    ]
    return Program("main", (x,), (), tuple(tensors), tuple(steps), (_ref(tensors[-1]),), 0)


def _overlapping(plan, program):
    """Pairs of workspace buffers live at one step whose bytes overlap (must be none)."""
    live = {}
    for index, step in enumerate(program.steps):
        for arg in step.args:
            first, _ = live.get(arg.buffer, (index, index))
            live[arg.buffer] = (first, index)
    placed = list(plan.offsets.items())
    clashes = []
    for i, (a, offset_a) in enumerate(placed):
        for b, offset_b in placed[i + 1 :]:
            (sa, ea), (sb, eb) = live[a], live[b]
            in_time = sa <= eb and sb <= ea
            in_space = offset_a < offset_b + b.nbytes and offset_b < offset_a + a.nbytes
            if in_time and in_space:
                clashes.append((a.name, b.name))
    return clashes


def test_a_chain_ping_pongs_between_two_buffers():
    program = _chain([1000, 1000, 1000, 1000, 1000])
    plan = plan_workspace(program, {})
    # t4 is returned: computed in the caller's output, not in the workspace.
    assert set(plan.returned) == {program.intermediates[-1]} and plan.copies == ()
    size = -(-4000 // ALIGNMENT) * ALIGNMENT
    assert plan.workspace_bytes == 2 * size == plan.peak_live_bytes
    assert plan.intermediate_bytes == 4 * size
    assert sorted(set(plan.offsets.values())) == [0, size]
    assert _overlapping(plan, program) == []


def test_a_buffer_read_at_a_step_never_shares_bytes_with_one_written_there():
    # Negative case of the reuse above: f1 reads t0 and writes t1, so they must not overlap
    # even though t0 dies at the step where t1 is born.
    program = _chain([64, 64, 64])
    plan = plan_workspace(program, {})
    t0, t1 = program.intermediates[:2]
    assert plan.offsets[t0] != plan.offsets[t1]


def test_largest_first_packs_small_buffers_into_the_gap_of_a_dead_large_one():
    intervals = [
        Interval("big", 4096, 0, 1),
        Interval("small_a", 1024, 2, 3),
        Interval("small_b", 1024, 2, 3),
        Interval("long", 512, 0, 3),
    ]
    offsets, total = greedy_by_size(intervals)
    assert offsets["big"] == 0 and offsets["long"] == 4096
    assert {offsets["small_a"], offsets["small_b"]} == {0, 1024}
    assert total == 4096 + 512 == peak_live_bytes(intervals)


def test_scratch_is_live_during_its_step_only():
    program = _chain([256, 256])
    plan = plan_workspace(program, {"f0": 5000, "f1": 100})
    assert plan.scratch[0] is not None and plan.scratch[1] is not None
    # f0's scratch lives with t0 at step 0; f1's with t0 and t1 at step 1 (t1 is returned).
    assert plan.workspace_bytes == 1024 + 5056
    assert _overlapping(plan, program) == []


def test_outputs_that_cannot_be_computed_in_place_are_copied():
    x = _buffer("x", 8, INPUT)
    weight = Buffer("w", CONSTANT, (8,), "float32", np.zeros(8, "float32"))
    t = _buffer("t", 8)
    program = Program(
        "main",
        (x,),
        (weight,),
        (t,),
        (Step("f", (_ref(x), _ref(t))),),
        # t twice (a second view is a copy), the input and the constant as they are.
        (_ref(t), _ref(t, (2, 4)), _ref(x), _ref(weight)),
        0,
    )
    plan = plan_workspace(program, {})
    assert plan.returned == {t: 0}
    assert [index for index, _ in plan.copies] == [1, 2, 3]
    assert plan.workspace_bytes == 0


def test_a_view_with_another_element_count_is_not_computed_in_place():
    t = _buffer("t", 8)
    x = _buffer("x", 8, INPUT)
    program = Program("main", (x,), (), (t,), (Step("f", (_ref(x), _ref(t))),), (_ref(t, (4,)),), 0)
    plan = plan_workspace(program, {})
    assert plan.returned == {} and len(plan.copies) == 1
    # Copied after the last step: t stays in the workspace until then.
    assert plan.offsets == {t: 0}


@pytest.mark.parametrize("seed", range(5))
def test_random_lifetimes_never_overlap_and_stay_near_the_bound(seed):
    rng = np.random.default_rng(seed)
    intervals = []
    for i in range(60):
        start = int(rng.integers(0, 40))
        intervals.append(
            Interval(i, int(rng.integers(1, 5000)), start, start + int(rng.integers(0, 8)))
        )
    offsets, total = greedy_by_size(intervals)
    for i, a in enumerate(intervals):
        for b in intervals[i + 1 :]:
            if a.overlaps(b):
                end_a = offsets[a.key] + a.nbytes
                end_b = offsets[b.key] + b.nbytes
                assert end_a <= offsets[b.key] or end_b <= offsets[a.key]
            assert offsets[a.key] % ALIGNMENT == 0
    assert peak_live_bytes(intervals) <= total <= 1.5 * peak_live_bytes(intervals)
