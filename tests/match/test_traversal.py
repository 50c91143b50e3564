"""The matcher's ways into the FFI (tir_byoc.match.traversal) do what the public API does.

:func:`walk`, :func:`contains` and :func:`mutate` call the FFI's structural walk and mutation
with callback tables built once, and :func:`elements` reads an FFI array; each is compared
with ``tvm_ffi.structural_walk`` / ``structural_mutate`` / ``tuple(array)`` on the same IR.
"""

import tvm_ffi
from tvm import ir, relax, s_tir, tirx
from tvm.script import tirx as T

from tir_byoc.match.traversal import contains, elements, mutate, walk
from tir_byoc.patterns import describe


@T.prim_func(s_tir=True)
def dense_bias(
    X: T.Buffer((4, 3), "float32"),
    W: T.Buffer((5, 3), "float32"),
    b: T.Buffer((5,), "float32"),
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
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = D[vi, vj] + b[vj]


@T.prim_func
def plain_loops(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
    for i in range(4):
        Y[i] = X[i] + T.float32(1)


def _functions():
    return [dense_bias, describe("batch_dense_bias_gelu_tanh"), plain_loops]


def test_walk_visits_what_the_public_walk_visits_in_the_same_order():
    for func in _functions():
        for node_type in (ir.Var, ir.TensorLoad, tirx.Mul, s_tir.SBlock):
            mine, public = [], []
            walk(func.body, node_type, mine.append)
            tvm_ffi.structural_walk(func.body, (node_type, public.append))
            assert [n.__chandle__() for n in mine] == [n.__chandle__() for n in public]


def test_walk_of_an_absent_node_type_calls_nothing():
    found = []
    walk(dense_bias.body, relax.Function, found.append)
    assert found == []


def test_contains_finds_a_node_type_and_only_one_that_is_there():
    assert contains(dense_bias.body, s_tir.SBlock)
    assert contains(dense_bias.body, tirx.Mul)
    assert not contains(plain_loops.body, s_tir.SBlock)
    assert not contains(dense_bias.body, relax.Function)


def test_mutate_gives_what_the_public_mutate_gives():
    def rename(var, _mutator):
        return tirx.Var(var.name + "_r", var.ty) if not tirx.is_buffer_var(var) else var

    def double(load, mutator):
        return mutator.default_mutate(load) * tirx.FloatImm("float32", 2.0)

    for func in _functions():
        callbacks = [(ir.TensorLoad, double), (tirx.Var, rename)]
        mine = mutate(func.body, callbacks)
        public = tvm_ffi.structural_mutate(func.body, callbacks)
        assert tvm_ffi.structural_equal(mine, public, map_free_vars=True)
        assert not tvm_ffi.structural_equal(mine, func.body, map_free_vars=True)


def test_mutate_without_a_matching_node_returns_the_node_itself():
    body = plain_loops.body
    assert mutate(body, [(s_tir.SBlock, lambda block, mutator: block)]).same_as(body)


def test_elements_reads_an_array_as_a_tuple():
    for func in _functions():
        assert elements(func.params) == tuple(func.params)
        assert all(a.same_as(b) for a, b in zip(elements(func.params), func.params))
    assert elements(tvm_ffi.convert([])) == ()
