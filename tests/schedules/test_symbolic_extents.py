"""The default rules on symbolic extents (tir_byoc/schedules/symbolic.py, loops.py, rows.py).

What inlining and ``compute_at`` write on symbolic shapes is simplified as TVM simplifies it
on static ones: a head split reads its input without dividing by ``seq`` per element, its
parallel loop does not fuse the static loops after a symbolic one, and a softmax over rows of
symbolic length has no ``min`` or ``max`` in its loops and predicates.  Each is checked on the
scheduled PrimFunc, and the results against NumPy at several sizes.
"""

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, sym, tirx

import tir_byoc

BATCH, SEQ = tirx.Var("batch", "int64"), tirx.Var("seq", "int64")


def _build(shape, emit):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(emit(x))
        bb.emit_func_output(out)
    return tir_byoc.build_model(bb.get())


def _head_split(x):
    """(batch, seq, 256) -> (batch * 4, seq, 64): attention's heads, as BERT splits them."""
    b, s = x.ty.shape.values[:2]
    heads = relax.op.reshape(x, relax.ShapeExpr([b, s, 4, 64]))
    heads = relax.op.permute_dims(heads, [0, 2, 1, 3])
    return relax.op.reshape(heads, relax.ShapeExpr([b * 4, s, 64]))


def _scheduled(built) -> tirx.PrimFunc:
    """The one PrimFunc a default rule scheduled."""
    (func,) = [f for g, f in built.module.functions_items() if g.name_hint in built.rules]
    return func


def _walk(func, node_type) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, (node_type, found.append))
    return found


def _divisors(func) -> list:
    """The divisors of every floordiv and floormod in the loads of ``func``."""
    divisors = []
    for load in _walk(func, tvm.ir.TensorLoad):
        for index in load.indices:
            tvm_ffi.structural_walk(
                index,
                [
                    (tirx.FloorDiv, lambda e: divisors.append(e.b)),
                    (tirx.FloorMod, lambda e: divisors.append(e.b)),
                ],
            )
    return divisors


def _parallel_extents(func) -> list:
    return [loop.extent for loop in _walk(func, tirx.For) if loop.kind == tirx.ForKind.PARALLEL]


def _value(expr, **sizes) -> int:
    """``expr`` with each dim set to ``sizes[its name]``."""
    analyzer = sym.Analyzer()
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Var, found.append))
    for var in found:
        analyzer.bind(var, tirx.const(sizes[var.name], var.ty.dtype))
    return int(analyzer.simplify(expr))


def test_a_head_split_of_symbolic_shape_divides_by_no_symbolic_extent():
    built = _build([BATCH, SEQ, 256], _head_split)
    assert set(built.rules.values()) == {"Elementwise"}
    func = _scheduled(built)
    # Reshape, transpose and reshape inlined into one block read x[v0 // 4, v1, v0 % 4 * 64 + v2]:
    # no division or modulo by seq (or batch) is left in the loads.
    divisors = _divisors(func)
    assert divisors, "expected the head's index, v0 // 4"
    assert all(isinstance(d, tirx.IntImm) for d in divisors), [str(d) for d in divisors]
    # One parallel loop over (batch * 4) x seq rows; each row's 64 channels stay inside it.
    (extent,) = _parallel_extents(func)
    assert _value(extent, batch=3, seq=5) == 3 * 4 * 5, str(extent)
    rng = np.random.default_rng(0)
    for b, s in [(1, 1), (2, 7), (3, 16), (1, 33)]:
        a = rng.standard_normal((b, s, 256)).astype("float32")
        expected = a.reshape(b, s, 4, 64).transpose(0, 2, 1, 3).reshape(b * 4, s, 64)
        np.testing.assert_array_equal(built(a), expected)


def _heads_merged(x):
    """(batch, 4, seq, seq) attention weights -> (batch * 4, seq, seq) * 0.125: a reshape whose
    index is a linear index over a square of symbolic sides, taken apart again."""
    b, _, s, _ = x.ty.shape.values
    merged = relax.op.reshape(x, relax.ShapeExpr([b * 4, s, s]))
    return relax.op.multiply(merged, relax.const(0.125, "float32"))


def test_a_reshape_over_a_symbolic_square_divides_by_no_symbolic_extent():
    built = _build([BATCH, 4, SEQ, SEQ], _heads_merged)
    divisors = _divisors(_scheduled(built))
    assert all(isinstance(d, tirx.IntImm) for d in divisors), [str(d) for d in divisors]
    rng = np.random.default_rng(2)
    for b, s in [(1, 1), (2, 3), (1, 17)]:
        a = rng.standard_normal((b, 4, s, s)).astype("float32")
        np.testing.assert_array_equal(built(a), a.reshape(b * 4, s, s) * np.float32(0.125))


def test_a_static_head_split_fuses_every_loop_as_before():
    built = _build([4, 32, 256], _head_split)
    (extent,) = _parallel_extents(_scheduled(built))
    # 4 * 4 heads x 32 rows x 4 vectors of 16: division by a constant costs a multiply.
    assert int(extent) == 4 * 4 * 32 * 4


def test_a_softmax_over_symbolic_rows_has_no_min_or_max_in_its_loops():
    built = _build([BATCH, 4, SEQ, SEQ], lambda x: relax.op.nn.softmax(x, axis=-1))
    assert set(built.rules.values()) == {"VectorRows"}
    func = _scheduled(built)
    # compute_at wrote max(1, (seq + 15) // 16 * 16) - min(0, ...) for the exponentials' loop;
    # inside the row loop seq >= 1, and it is (seq + 15) // 16 like the others.
    loops = _walk(func, tirx.For)
    assert any("seq" in str(loop.extent) for loop in loops)
    for loop in loops:
        assert not _walk_expr(loop.extent, (tirx.Min, tirx.Max)), str(loop.extent)
    for realize in _walk(func, s_tir.SBlockRealize):
        assert not _walk_expr(realize.predicate, (tirx.Min, tirx.Max)), str(realize.predicate)
    rng = np.random.default_rng(1)
    for b, s in [(1, 1), (2, 5), (1, 16), (3, 17), (1, 40)]:
        a = rng.standard_normal((b, 4, s, s)).astype("float32")
        e = np.exp(a - a.max(-1, keepdims=True))
        np.testing.assert_allclose(built(a), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def _walk_expr(expr, types) -> list:
    found = []
    for node_type in types:
        tvm_ffi.structural_walk(expr, (node_type, found.append))
    return found


def _scaled_masked_softmax(x):
    b, s = x.ty.shape.values[0], x.ty.shape.values[-1]
    mask = relax.op.zeros(relax.ShapeExpr([b, 4, s, s]), "float32")
    scaled = relax.op.add(relax.op.multiply(x, relax.const(0.125, "float32")), mask)
    return relax.op.nn.softmax(scaled, axis=-1)


def _block_names(func) -> set[str]:
    return {block.name_hint for block in _walk(func, s_tir.SBlock)}


def test_a_softmax_over_symbolic_rows_computes_its_scale_in_its_passes():
    # Row fusion puts the scale and mask in the softmax's function; on rows of symbolic length
    # each block kept per row is a heap allocation per row, so they are inlined instead.
    built = _build([BATCH, 4, SEQ, SEQ], _scaled_masked_softmax)
    (name,) = [n for n, rule in built.rules.items() if rule == "VectorRows"]
    names = _block_names(built.module[name])
    assert "T_softmax_exp" in names
    assert not names & {"T_multiply", "T_add"}, names
    static = _build([2, 4, 16, 16], _scaled_masked_softmax)
    (name,) = [n for n, rule in static.rules.items() if rule == "VectorRows"]
    assert {"T_multiply", "T_add"} <= _block_names(static.module[name])
    rng = np.random.default_rng(3)
    for b, s in [(1, 1), (2, 9), (1, 33)]:
        a = rng.standard_normal((b, 4, s, s)).astype("float32")
        z = a * np.float32(0.125)
        e = np.exp(z - z.max(-1, keepdims=True))
        np.testing.assert_allclose(built(a), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
