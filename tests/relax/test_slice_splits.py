"""relax.slice_splits: q, k and v taken from a packed projection as slices of it, no transposed
copy.

The rewritten cases check the Relax left (slices, no take), and that the build computes, bit
for bit, what the build without the rewrite computes and what NumPy's slices hold.  Each
refused case comes back as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from support.byoc_testing import relax_inputs
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import tir_byoc
from tir_byoc.relax import pipeline, slice_splits
from tir_byoc.relax.slice_splits import SliceSplits

# fmt: off


@I.ir_module
class PackedSplit:
    """nn.MultiheadAttention's split of a (L, B, 3E) projection, as torch.export writes it."""

    @R.function
    def main(y: R.Tensor((16, 2, 24), "float32")):
        with R.dataflow():
            w = R.reshape(y, R.shape([16, 2, 3, 8]))
            x = R.expand_dims(w, axis=[0])
            z = R.permute_dims(x, axes=[3, 1, 2, 0, 4])
            s = R.squeeze(z, axis=[-2])
            q = R.take(s, R.const(0, "int64"), axis=0, mode="fast")
            k = R.take(s, R.const(1, "int64"), axis=0, mode="fast")
            v = R.take(s, R.const(2, "int64"), axis=0, mode="fast")
            out = (q, k, v)
            R.output(out)
        return out


@I.ir_module
class SplitAlsoUsedWhole:
    """The split tensor is also an output: the takes become slices, the chain stays."""

    @R.function
    def main(y: R.Tensor((16, 2, 24), "float32")):
        with R.dataflow():
            w = R.reshape(y, R.shape([16, 2, 3, 8]))
            x = R.expand_dims(w, axis=[0])
            z = R.permute_dims(x, axes=[3, 1, 2, 0, 4])
            s = R.squeeze(z, axis=[-2])
            k = R.take(s, R.const(1, "int64"), axis=0, mode="fast")
            out = (k, s)
            R.output(out)
        return out


@I.ir_module
class SplitOnTheLastAxis:
    """No layout op at all: the parts taken on the split axis where the reshape left it."""

    @R.function
    def main(y: R.Tensor((4, 12), "float32")):
        with R.dataflow():
            w = R.reshape(y, R.shape([4, 2, 6]))
            v = R.take(w, R.const(1, "int32"), axis=1)
            R.output(v)
        return v


@I.ir_module
class OtherAxesSwapped:
    """The permutation also swaps L and B (both 4, so the shapes still agree): a part is
    y's slice transposed, refused."""

    @R.function
    def main(y: R.Tensor((4, 4, 24), "float32")):
        with R.dataflow():
            w = R.reshape(y, R.shape([4, 4, 3, 8]))
            z = R.permute_dims(w, axes=[2, 1, 0, 3])
            q = R.take(z, R.const(0, "int64"), axis=0)
            R.output(q)
        return q


@I.ir_module
class ScaledBetween:
    """An arithmetic op in the chain: not a renaming of axes, refused."""

    @R.function
    def main(y: R.Tensor((16, 2, 24), "float32")):
        with R.dataflow():
            w = R.reshape(y, R.shape([16, 2, 3, 8]))
            m = R.multiply(w, R.const(2.0, "float32"))
            z = R.permute_dims(m, axes=[2, 0, 1, 3])
            q = R.take(z, R.const(0, "int64"), axis=0)
            R.output(q)
        return q


@I.ir_module
class IndexFromATensor:
    @R.function
    def main(y: R.Tensor((16, 2, 24), "float32"), i: R.Tensor((), "int64")):
        with R.dataflow():
            w = R.reshape(y, R.shape([16, 2, 3, 8]))
            z = R.permute_dims(w, axes=[2, 0, 1, 3])
            q = R.take(z, i, axis=0)
            R.output(q)
        return q


def packed_part(take):
    """y (16, 2, 24) split into 3 parts of 8 on its last axis, the parts moved to the front,
    then ``take(z)`` of them."""

    @I.ir_module
    class Module:
        @R.function
        def main(y: R.Tensor((16, 2, 24), "float32")):
            with R.dataflow():
                w = R.reshape(y, R.shape([16, 2, 3, 8]))
                z = R.permute_dims(w, axes=[2, 0, 1, 3])
                q = take(z)
                R.output(q)
            return q

    return Module


# Index 3 of 3 parts: what take reads depends on its mode, refused.
IndexOutOfRange = packed_part(lambda z: R.take(z, R.const(3, "int64"), axis=0, mode="clip"))
# An index of shape (1,) keeps the axis: not a part, refused.
IndexList = packed_part(lambda z: R.take(z, R.const([0], "int64"), axis=0))


@I.ir_module
class ReshapeNotASplit:
    """The reshape merges axes instead of splitting the last one: refused."""

    @R.function
    def main(y: R.Tensor((16, 2, 3, 8), "float32")):
        with R.dataflow():
            w = R.reshape(y, R.shape([32, 3, 8]))
            z = R.permute_dims(w, axes=[1, 0, 2])
            q = R.take(z, R.const(0, "int64"), axis=0)
            R.output(q)
        return q


# fmt: on

WITHOUT_REWRITE = tuple(p for p in pipeline.BEFORE_LEGALIZE if p is not SliceSplits)


@pytest.mark.parametrize(
    ("module", "parts", "left"),
    [
        (PackedSplit, [(0, 8), (8, 16), (16, 24)], ()),
        (SplitAlsoUsedWhole, [(8, 16)], ("permute_dims", "expand_dims", "squeeze", "reshape")),
        (SplitOnTheLastAxis, [(6, 12)], ()),
    ],
    ids=["multihead attention's split", "split also used whole", "no layout op"],
)
def test_each_part_is_a_slice_and_holds_the_same_values(module, parts, left, monkeypatch):
    sites, declines = slice_splits.find(module)
    assert [(s.begin, s.end) for s in sites] == parts and declines == ()
    rewritten = SliceSplits()(module)
    tvm.ir.assert_structural_equal(rewritten, slice_splits.rewrite(module, sites))
    text = rewritten.script()
    assert "R.take" not in text
    assert text.count("R.strided_slice") == len(parts)
    for op in ("permute_dims", "expand_dims", "squeeze", "reshape"):
        assert (op in text) == (op in left), op
    relax.analysis.well_formed(rewritten)  # raises on an ill-formed module

    inputs = relax_inputs(module)
    got = tir_byoc.build_model(module)(*inputs)
    monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", WITHOUT_REWRITE)
    before = tir_byoc.build_model(module)(*inputs)
    got, before = (v if isinstance(v, list | tuple) else [v] for v in (got, before))
    for new, old in zip(got, before, strict=True):
        np.testing.assert_array_equal(new, old)
    (y,) = inputs
    for (begin, end), part in zip(parts, got, strict=False):
        np.testing.assert_array_equal(part, y[..., begin:end])


@pytest.mark.parametrize(
    "module",
    [
        OtherAxesSwapped,
        ScaledBetween,
        IndexFromATensor,
        IndexOutOfRange,
        IndexList,
        ReshapeNotASplit,
    ],
    ids=[
        "other axes swapped",
        "arithmetic in the chain",
        "index from a tensor",
        "index out of range",
        "index of shape (1,)",
        "reshape merges axes",
    ],
)
def test_anything_else_comes_back_as_it_was(module):
    assert slice_splits.find(module) == ((), ())
    assert SliceSplits()(module).same_as(module)


def test_the_lowering_slices_before_the_operators_become_tir():
    passes = pipeline.lowering_passes()
    assert passes.index(SliceSplits) < passes.index(relax.transform.LegalizeOps)
