"""relax.untranspose: attention's ``q @ k^T`` multiplies K as it is, no transposed copy of it.

The rewritten cases check the Relax left (no ``permute_dims``, one ``NT_matmul``), that the
product is offloaded as a ``bmm_dense``, and that the build computes what the build without
the rewrite computes.  Each refused case comes back as it was.
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
from tir_byoc.relax import pipeline, untranspose
from tir_byoc.relax.untranspose import UntransposeBatchMatmuls

# fmt: off


@I.ir_module
class Scores:
    """q @ k.transpose(-1, -2) on (2, 4, 16, 8) heads, as torch.export writes it."""

    @R.function
    def main(q: R.Tensor((2, 4, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            e = R.broadcast_to(p, R.shape([2, 4, 8, 16]))
            r = R.reshape(e, R.shape([8, 8, 16]))
            a = R.reshape(q, R.shape([8, 16, 8]))
            m = R.matmul(a, r)
            y = R.reshape(m, R.shape([2, 4, 16, 16]))
            R.output(y)
        return y


@I.ir_module
class ScoresWithoutExpand:
    @R.function
    def main(q: R.Tensor((8, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            r = R.reshape(p, R.shape([8, 8, 16]))
            m = R.matmul(q, r)
            y = R.reshape(m, R.shape([2, 4, 16, 16]))
            R.output(y)
        return y


@I.ir_module
class ScaledScores:
    """nn.MultiheadAttention's: K^T scaled by a constant before the product."""

    @R.function
    def main(q: R.Tensor((2, 4, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            s = R.multiply(p, R.const(0.25, "float32"))
            e = R.broadcast_to(s, R.shape([2, 4, 8, 16]))
            r = R.reshape(e, R.shape([8, 8, 16]))
            a = R.reshape(q, R.shape([8, 16, 8]))
            m = R.matmul(a, r)
            y = R.reshape(m, R.shape([2, 4, 16, 16]))
            R.output(y)
        return y


@I.ir_module
class ScaledByATensor:
    """A product by a tensor is not a scaling that commutes with the transpose: refused."""

    @R.function
    def main(q: R.Tensor((8, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32"),
             c: R.Tensor((8, 16), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            s = R.multiply(p, c)
            r = R.reshape(s, R.shape([8, 8, 16]))
            m = R.matmul(q, r)
            y = R.reshape(m, R.shape([2, 4, 16, 16]))
            R.output(y)
        return y


@I.ir_module
class QueryBroadcast:
    """One query matrix for every group: Relax's matmul broadcasts it, the NT product would not."""

    @R.function
    def main(q: R.Tensor((1, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            r = R.reshape(p, R.shape([8, 8, 16]))
            m = R.matmul(q, r)
            y = R.reshape(m, R.shape([2, 4, 16, 16]))
            R.output(y)
        return y


@I.ir_module
class HeadsPermuted:
    """Not the last two axes: a different matrix per group, refused."""

    @R.function
    def main(q: R.Tensor((8, 16, 8), "float32"), k: R.Tensor((2, 8, 4, 16), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 2, 1, 3])
            r = R.reshape(p, R.shape([8, 8, 16]))
            m = R.matmul(q, r)
            R.output(m)
        return m


@I.ir_module
class TransposeUsedTwice:
    @R.function
    def main(q: R.Tensor((8, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            r = R.reshape(p, R.shape([8, 8, 16]))
            m = R.matmul(q, r)
            out = (m, p)
            R.output(out)
        return out


@I.ir_module
class ReshapeSplitsTheMatrix:
    """The reshape does not keep the last two dims: not a stack of K's transposes."""

    @R.function
    def main(q: R.Tensor((16, 16, 4), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            r = R.reshape(p, R.shape([16, 4, 16]))
            m = R.matmul(q, r)
            R.output(m)
        return m


@I.ir_module
class FourDimensional:
    """A 4-D matmul: left to Relax's own lowering."""

    @R.function
    def main(q: R.Tensor((2, 4, 16, 8), "float32"), k: R.Tensor((2, 4, 16, 8), "float32")):
        with R.dataflow():
            p = R.permute_dims(k, axes=[0, 1, 3, 2])
            m = R.matmul(q, p)
            R.output(m)
        return m


# fmt: on

WITHOUT_REWRITE = tuple(p for p in pipeline.BEFORE_LEGALIZE if p is not UntransposeBatchMatmuls)


@pytest.mark.parametrize(
    ("module", "scale"),
    [(Scores, 1.0), (ScoresWithoutExpand, 1.0), (ScaledScores, 0.25)],
    ids=["expand", "no expand", "scaled"],
)
def test_the_product_reads_k_untransposed_and_computes_the_same(module, scale, monkeypatch):
    (site,), declines = untranspose.find(module)
    assert (site.matmul.name, len(site.scales), declines) == ("m", int(scale != 1.0), ())
    rewritten = UntransposeBatchMatmuls()(module)
    tvm.ir.assert_structural_equal(rewritten, untranspose.rewrite(module, (site,)))
    text = rewritten.script()
    assert "permute_dims" not in text and "broadcast_to" not in text
    assert text.count("NT_matmul") >= 2  # the PrimFunc and its call
    relax.analysis.well_formed(rewritten)  # raises on an ill-formed module

    built = tir_byoc.build_model(module)
    intrinsics = dict(built.intrinsics)
    assert intrinsics["NT_matmul"] and all(i.endswith("bmm_dense") for i in intrinsics["NT_matmul"])
    inputs = relax_inputs(module)
    got = built(*inputs)
    monkeypatch.setattr(pipeline, "BEFORE_LEGALIZE", WITHOUT_REWRITE)
    before = tir_byoc.build_model(module)
    assert "NT_matmul" not in before.intrinsics
    np.testing.assert_allclose(got, before(*inputs), rtol=1e-5, atol=1e-5)
    q, k = inputs
    k_scaled = k.reshape(8, 16, 8).astype(np.float64) * scale
    expected = q.reshape(8, 16, 8).astype(np.float64) @ k_scaled.transpose(0, 2, 1)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "module",
    [
        HeadsPermuted,
        TransposeUsedTwice,
        ReshapeSplitsTheMatrix,
        FourDimensional,
        ScaledByATensor,
        QueryBroadcast,
    ],
    ids=[
        "other axes",
        "transpose used twice",
        "reshape splits the matrix",
        "4-D matmul",
        "scaled by a tensor",
        "query broadcast over the groups",
    ],
)
def test_anything_else_comes_back_as_it_was(module):
    assert untranspose.find(module) == ((), ())
    assert UntransposeBatchMatmuls()(module).same_as(module)
