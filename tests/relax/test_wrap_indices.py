"""relax.wrap_indices: a negative gather index reads what torch reads, not memory before the tensor.

The torch modules go the whole way (``torch.export``, TVM's import, :func:`tir_byoc.build_model`)
and must give torch's values exactly: a gather copies, it does not round.  The Relax cases
check what the rewrite leaves, and that a gather with nothing to wrap comes back as it was.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import tir_byoc
from tir_byoc.relax import pipeline, wrap_indices
from tir_byoc.relax.slice_splits import SliceSplits
from tir_byoc.relax.wrap_indices import WrapIndices

X = torch.randn(2, 3, 6, 4, generator=torch.Generator().manual_seed(0))
#: Run-time indices with negative values, for the first two axes of X.
ROWS, COLUMNS = torch.tensor([-1, 0, 1, -2]), torch.tensor([-3, 2, 0, -1])


class ConstantTake(torch.nn.Module):
    """Falcon's split of its fused q/k/v: ``aten.index.Tensor`` with one list, a ``take``."""

    def forward(self, x):
        return x[..., [-2], :] + x[..., [-1], :]


class ConstantIndexTensor(torch.nn.Module):
    """Lists on every leading axis: ``R.index_tensor`` with two constants."""

    def forward(self, x):
        return x[[-1, 0], [-2, 1]]


class RuntimeTake(torch.nn.Module):
    def forward(self, x, rows):
        return x[:, :, rows]


class RuntimeIndexTensor(torch.nn.Module):
    def forward(self, x, rows, columns):
        return x[rows, columns]


@pytest.mark.parametrize(
    ("module", "inputs"),
    [
        (ConstantTake(), (X,)),
        (ConstantIndexTensor(), (X,)),
        (RuntimeTake(), (X, ROWS)),
        (RuntimeIndexTensor(), (X, ROWS, COLUMNS)),
    ],
    ids=["constant take", "constant index_tensor", "run-time take", "run-time index_tensor"],
)
def test_negative_indices_read_what_torch_reads(module, inputs):
    with torch.no_grad():
        expected = module(*inputs).numpy()
    built = tir_byoc.build_model(module.eval(), inputs)
    np.testing.assert_array_equal(built(*inputs).numpy(), expected)


# fmt: off


@I.ir_module
class Gathers:
    @R.function
    def main(x: R.Tensor((2, 3, 6), "float32"), i: R.Tensor((4,), "int64")):
        with R.dataflow():
            a = R.take(x, R.const(np.array([-2, 5], "int64")), axis=2, mode="fast")
            b = R.take(x, i, axis=1, mode="fast")
            c = R.index_tensor(x, (i, R.const(np.array([-3, 0, 2, -1], "int64"))))
            out = (a, b, c)
            R.output(out)
        return out


@I.ir_module
class NothingToWrap:
    @R.function
    def main(x: R.Tensor((2, 3, 6), "float32"), i: R.Tensor((4,), "int64")):
        with R.dataflow():
            a = R.take(x, R.const(np.array([0, 5], "int64")), axis=2, mode="fast")
            b = R.take(x, i, axis=1, mode="clip")
            c = R.take(x, i, axis=1, mode="wrap")
            d = R.index_tensor(x, (R.const(np.array([1, 0], "int64")),))
            out = (a, b, c, d)
            R.output(out)
        return out


# fmt: on


def _bindings(mod) -> dict[str, relax.Call]:
    return {b.var.name: b.value for block in mod["main"].body.blocks for b in block.bindings}


def test_constants_are_wrapped_at_build_time_and_run_time_indices_when_they_are_read():
    sites, declines = wrap_indices.find(Gathers)
    assert [(s.function, s.var.name, s.op) for s in sites] == [
        ("main", "a", "relax.take"),
        ("main", "b", "relax.take"),
        ("main", "c", "relax.index_tensor"),
    ]
    assert declines == ()
    wrapped = WrapIndices()(Gathers)
    tvm.ir.assert_structural_equal(wrapped, wrap_indices.rewrite(Gathers, sites))
    relax.analysis.well_formed(wrapped)  # raises on an ill-formed module
    bindings = _bindings(wrapped)
    # A constant: its values mod the axis size, the mode kept.
    a = bindings["a"]
    assert str(a.attrs.mode) == "fast"
    np.testing.assert_array_equal(a.args[1].value.numpy(), [4, 5])
    # A run-time index: the take wraps it.
    assert str(bindings["b"].attrs.mode) == "wrap"
    # index_tensor: the run-time index taken mod 2 first, the constant mod 3.
    c = bindings["c"]
    first, second = c.args[1].fields
    assert bindings[first.name].op.name == "relax.floor_mod"
    assert int(bindings[first.name].args[1].value.numpy()) == 2
    np.testing.assert_array_equal(second.value.numpy(), [0, 0, 2, 2])


def test_gathers_with_nothing_to_wrap_come_back_as_they_were():
    assert wrap_indices.find(NothingToWrap) == ((), ())
    assert WrapIndices()(NothingToWrap).same_as(NothingToWrap)


def test_the_lowering_wraps_before_it_reads_takes_as_slices():
    passes = pipeline.lowering_passes()
    assert passes.index(WrapIndices) < passes.index(SliceSplits)
    assert passes.index(WrapIndices) < passes.index(relax.transform.LegalizeOps)


@I.ir_module
class OutOfRange:
    @R.function
    def main(x: R.Tensor((2, 3, 6), "float32")):
        with R.dataflow():
            a = R.take(x, R.const(np.array([7, -7], "int64")), axis=2, mode="fast")
            b = R.index_tensor(x, (R.const(np.array([2, -3], "int64")),))
            out = (a, b)
            R.output(out)
        return out


def test_a_constant_out_of_range_is_wrapped_at_run_time_not_read_out_of_bounds():
    bindings = _bindings(WrapIndices()(OutOfRange))
    assert str(bindings["a"].attrs.mode) == "wrap"
    (index,) = bindings["b"].args[1].fields
    assert bindings[index.name].op.name == "relax.floor_mod"
