"""One static workspace: every intermediate at an offset computed from liveness.

Entry point: :func:`plan_workspace`, which returns a :class:`WorkspacePlan` for a
:class:`~tir_byoc.aot.program.Program` and the scratch bytes each PrimFunc needs for its own
allocations (:mod:`tir_byoc.aot.kernels`).

Liveness.  A buffer is live from the first step that touches it (through any view) to the
last, both included: a step reads its inputs while it writes its outputs, so the two never
share bytes.  A PrimFunc's scratch is live during its call only.  The returned tensors are not
in the workspace: an intermediate that is returned is computed in the caller's output buffer
directly, and an output that is an input, a constant, or a second view of one buffer is copied
there at the end.

Placement (:func:`greedy_by_size`) is USMP's greedy-by-size: the largest buffer first, each at
the lowest aligned offset that overlaps no live-at-the-same-time buffer placed before.  On the
straight-line programs here it reaches the lower bound (the most bytes live at one step) or
comes within a few percent of it; it is deterministic and O(n^2) in the number of buffers,
which stays in the hundreds.  Greedy-by-conflicts orders by the number of overlapping
lifetimes instead, which helps graphs with many small, widely shared buffers, and hill
climbing searches orders at random: neither is needed to approach the bound here, and the
random search would make builds differ from run to run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .program import INTERMEDIATE, Buffer, Program, TensorRef

#: Alignment of the workspace, the constants and every offset in them, in bytes (a cache line;
#: what TVM aligns its allocations to).
ALIGNMENT = 64


@dataclass(frozen=True)
class Interval:
    """``nbytes`` live from step ``start`` to step ``end`` (both included)."""

    key: object
    nbytes: int
    start: int
    end: int

    def overlaps(self, other: Interval) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class WorkspacePlan:
    """Where every tensor of a program lives.

    Attributes
    ----------
    offsets : Mapping[Buffer, int]
        Each intermediate in the workspace, at its byte offset.
    scratch : tuple of (int or None)
        Per step, the offset of its PrimFunc's scratch (None: it needs none).
    returned : Mapping[Buffer, int]
        Intermediates computed in the caller's output buffer, with the output's index.
    copies : tuple of (int, TensorRef)
        Outputs filled at the end by copying a tensor (an input, a constant, a second view).
    workspace_bytes : int
        The workspace's size (a multiple of :data:`ALIGNMENT`).
    intermediate_bytes : int
        All intermediates and scratch side by side: what a workspace without reuse needs.
    peak_live_bytes : int
        The most bytes live at one step, aligned: no placement needs less.
    """

    offsets: Mapping[Buffer, int]
    scratch: tuple[int | None, ...]
    returned: Mapping[Buffer, int]
    copies: tuple[tuple[int, TensorRef], ...]
    workspace_bytes: int
    intermediate_bytes: int
    peak_live_bytes: int


def align(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


def plan_workspace(
    program: Program, scratch_bytes: Mapping[str, int], alignment: int = ALIGNMENT
) -> WorkspacePlan:
    """Plan the workspace of ``program``; ``scratch_bytes[callee]`` is what each PrimFunc
    needs for its own allocations (absent or 0: none)."""
    # Step 1. The outputs: computed in place where possible, copied otherwise.
    returned, copies = {}, []
    for index, ref in enumerate(program.outputs):
        buffer = ref.buffer
        same_bytes = ref.dtype == buffer.dtype and _elements(ref.shape) == _elements(buffer.shape)
        if buffer.kind == INTERMEDIATE and buffer not in returned and same_bytes:
            returned[buffer] = index
        else:
            copies.append((index, ref))
    # Step 2. Lifetimes of what the workspace holds.
    intervals = _lifetimes(program, returned)
    for step_index, step in enumerate(program.steps):
        nbytes = scratch_bytes.get(step.callee, 0)
        if nbytes:
            intervals.append(Interval(("scratch", step_index), nbytes, step_index, step_index))
    # Step 3. Offsets.
    offsets, total = greedy_by_size(intervals, alignment)
    scratch = tuple(offsets.get(("scratch", i)) for i in range(len(program.steps)))
    return WorkspacePlan(
        offsets={k: v for k, v in offsets.items() if isinstance(k, Buffer)},
        scratch=scratch,
        returned=returned,
        copies=tuple(copies),
        workspace_bytes=total,
        intermediate_bytes=sum(align(i.nbytes, alignment) for i in intervals),
        peak_live_bytes=peak_live_bytes(intervals, alignment),
    )


def _elements(shape) -> int:
    return math.prod(shape)


def _lifetimes(program: Program, returned: Mapping[Buffer, int]) -> list[Interval]:
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    for index, step in enumerate(program.steps):
        for arg in step.args:
            if isinstance(arg, TensorRef) and arg.buffer.kind == INTERMEDIATE:
                first.setdefault(arg.buffer, index)
                last[arg.buffer] = index
    # An intermediate copied to an output is read after the last step.
    end = len(program.steps)
    for ref in program.outputs:
        if ref.buffer.kind == INTERMEDIATE and ref.buffer not in returned:
            first.setdefault(ref.buffer, end)
            last[ref.buffer] = end
    return [
        Interval(buffer, buffer.nbytes, first[buffer], last[buffer])
        for buffer in program.intermediates
        if buffer in first and buffer not in returned and buffer.nbytes > 0
    ]


def greedy_by_size(intervals, alignment: int = ALIGNMENT) -> tuple[dict, int]:
    """Offsets for ``intervals`` (largest first, each at the lowest aligned offset free of every
    overlapping interval placed before) and the total size."""
    order = sorted(
        range(len(intervals)), key=lambda i: (-intervals[i].nbytes, intervals[i].start, i)
    )
    placed: list[tuple[Interval, int]] = []
    offsets: dict = {}
    total = 0
    for i in order:
        interval = intervals[i]
        size = align(interval.nbytes, alignment)
        conflicts = sorted(
            (offset, offset + align(other.nbytes, alignment))
            for other, offset in placed
            if other.overlaps(interval)
        )
        offset = 0
        for start, stop in conflicts:
            if offset + size <= start:
                break
            offset = max(offset, stop)
        placed.append((interval, offset))
        offsets[interval.key] = offset
        total = max(total, offset + size)
    return offsets, total


def peak_live_bytes(intervals, alignment: int = ALIGNMENT) -> int:
    """The most (aligned) bytes live at one step: a lower bound of any placement."""
    steps = {s for i in intervals for s in (i.start, i.end)}
    return max(
        (
            sum(align(i.nbytes, alignment) for i in intervals if i.start <= step <= i.end)
            for step in steps
        ),
        default=0,
    )
