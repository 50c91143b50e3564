"""S-TIR facts (tir_byoc.match.stir): the buffer uses the index counts, buffer sets by identity.

:class:`FunctionIndex` counts which nests use which buffers on the first question, by handle;
each function here is checked against the uses a plain structural walk of every nest finds.
"""

import tvm_ffi
from tvm import ir, tirx
from tvm.script import tirx as T

from tir_byoc.demo import lowered_mlp
from tir_byoc.match.stir import BufferSet, Extents, FunctionIndex
from tir_byoc.patterns import describe


@T.prim_func(s_tir=True)
def read_only_in_a_region(
    X: T.Buffer((4, 3), "float32"),
    W: T.Buffer((5, 3), "float32"),
    S: T.Buffer((4, 5), "float32"),
    Y: T.Buffer((4, 5), "float32"),
):
    D = T.sblock_alloc_buffer((4, 5))
    for i, j, k in T.grid(4, 5, 3):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                D[vi, vj] = T.float32(0)
            D[vi, vj] = D[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(4, 5):
        with T.sblock("copy"):
            vi, vj = T.axis.remap("SS", [i, j])
            T.reads(D[vi, vj], S[vi, vj])  # S is named here only
            T.writes(Y[vi, vj])
            Y[vi, vj] = D[vi, vj]


@T.prim_func
def plain_loops(
    X: T.Buffer((4, 3), "float32"), W: T.Buffer((5, 3), "float32"), Y: T.Buffer((4, 5), "float32")
):
    for i, j, k in T.grid(4, 5, 3):
        if k == 0:
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[j, k]


@T.prim_func
def plain_loops_over_uint32(
    X: T.Buffer((4, 3), "float32"), W: T.Buffer((5, 3), "float32"), Y: T.Buffer((4, 5), "float32")
):
    for i, j, k in T.grid(T.uint32(4), T.uint32(5), T.uint32(3)):
        if k == T.uint32(0):
            Y[i, j] = T.float32(0)
        Y[i, j] = Y[i, j] + X[i, k] * W[j, k]


def _functions():
    mlp = [f for _, f in lowered_mlp().functions_items() if isinstance(f, tirx.PrimFunc)]
    return [*mlp, describe("batch_dense_bias_gelu"), read_only_in_a_region, plain_loops]


def _walked_uses(stmt) -> set[str]:
    found = set()
    tvm_ffi.structural_walk(
        stmt, (ir.Var, lambda v: found.add(v.name) if tirx.is_buffer_var(v) else None)
    )
    return found


def test_each_nest_uses_the_buffers_a_walk_of_it_finds():
    for func in _functions():
        index = FunctionIndex(func)
        assert index.nests
        for position, nest in enumerate(index.nests):
            assert {b.name for b in index.uses.get(position, ())} == _walked_uses(nest.stmt)
            for buffer in index.uses.get(position, ()):
                assert position in index.owners_of(buffer)
                assert index.owners_of(buffer) is index.owners[buffer]


def test_a_buffer_named_only_in_a_region_is_used_by_its_block():
    index = FunctionIndex(read_only_in_a_region)
    copy = next(p for p, n in enumerate(index.nests) if n.name == "copy")
    assert "S" in {b.name for b in index.uses[copy]}
    assert index.other_users(read_only_in_a_region.params[2]) == ["block copy"]


def test_a_buffer_nothing_uses_has_no_owners():
    index = FunctionIndex(read_only_in_a_region)
    unused = tirx.Var("S", read_only_in_a_region.params[2].ty)  # same name and type, not S
    assert index.owners_of(unused) == {}
    assert index.other_users(unused) == []


def test_a_buffer_set_holds_buffers_by_identity():
    X, W, S, Y = read_only_in_a_region.params
    params = BufferSet([X, W, S, Y])
    assert all(p in params for p in read_only_in_a_region.params)  # new Python objects
    assert tirx.Var("X", X.ty) not in params
    assert None not in params
    assert len(params) == 4 and [b.name for b in params] == ["X", "W", "S", "Y"]


def test_extents_read_a_buffer_shape_once_and_the_same_each_time():
    X = read_only_in_a_region.params[0]
    extents = Extents()
    first = extents.shape(X)
    assert [int(d) for d in first] == [4, 3]
    assert extents.shape(read_only_in_a_region.params[0]) is first


def test_a_nest_over_uint32_loops_is_unread_and_its_buffers_used_by_other_code():
    index = FunctionIndex(plain_loops_over_uint32)
    assert index.nests == []
    (unread,) = index.unread
    assert unread.name == "Y" and unread.reduces
    assert unread.reason == "loop i runs over uint32; the matcher reads int32 and int64 loops only"
    for buffer in plain_loops_over_uint32.params:
        assert index.other_users(buffer) == ["other code"]
