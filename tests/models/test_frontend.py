"""Known frontend problems are recognised by their error and reported in one line.

The boolean-compare problem is reproduced for real (a tiny Relax module, compiled in
milliseconds); the torch-side ones (a ``use_cache`` cache, sdpa attention torch cannot
decompose) are raised by a stand-in for the failing stage, since reproducing them needs a
transformers model and seconds of export each.
"""

import numpy as np
import pytest

pytest.importorskip("torch")

import torch
import tvm
import tvm.relax.frontend.torch as relax_torch
from tvm import relax

import tir_byoc
from tir_byoc import frontend


@pytest.mark.parametrize("problem", frontend.KNOWN_PROBLEMS, ids=lambda p: p.symptom[:30])
def test_each_known_problem_is_recognised_by_its_stage_and_symptom(problem):
    error = RuntimeError(f"something failed: {problem.symptom} (details)")
    ops = [f"aten.{problem.requires_op}.default"] if problem.requires_op else []
    advice = frontend.diagnose(problem.stage, error, graph_ops=ops)
    assert advice == problem.advice.format(functions="?", arithmetic="?")
    other_stage = next(s for s in frontend.STAGES if s != problem.stage)
    assert frontend.diagnose(other_stage, error, graph_ops=ops) is None
    assert frontend.diagnose(problem.stage, RuntimeError("unrelated"), graph_ops=ops) is None


def test_an_op_specific_problem_needs_its_op_in_the_graph():
    error = ValueError("Cannot view a tensor with shape torch.Size([2, 16, 64]) and strides")
    assert frontend.diagnose("import", error, graph_ops=["aten.view.default"]) is None
    advice = frontend.diagnose(
        "import", error, graph_ops=["aten.scaled_dot_product_attention.default"]
    )
    assert "attn_implementation='eager'" in advice


def test_a_problem_names_a_known_stage():
    with pytest.raises(ValueError, match="expected a stage in"):
        frontend.FrontendProblem("run", "x", "y")


def _binary(operation, dtype: str) -> tvm.IRModule:
    """``main(a, b) = operation(a, b)`` on (2, 1, 16, 1) and (2, 1, 1, 16) tensors of
    ``dtype``."""
    builder = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((2, 1, 16, 1), dtype))
    b = relax.Var("b", relax.TensorType((2, 1, 1, 16), dtype))
    with builder.function("main", [a, b]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(operation(a, b)))
        builder.emit_func_output(out)
    return builder.get()


def test_comparing_booleans_is_reported_with_the_function_and_what_to_change():
    with pytest.raises(tir_byoc.UnsupportedModel) as error:
        tir_byoc.build_model(_binary(relax.op.equal, "bool"))
    message = str(error.value)
    assert "\n" not in message
    assert "cannot compile comparisons of booleans (equal)" in message
    assert "pass a prepared additive float attention_mask" in message
    assert "Invalid operand types for FCmp instruction)" in message
    assert "fcmp oeq i1" in str(error.value.__cause__)
    # The same comparison on floats builds.
    assert tir_byoc.build_model(_binary(relax.op.equal, "float32")).schedules == {"equal": "dlight"}
    # An order of booleans fails another check, and is named as well.
    with pytest.raises(tir_byoc.UnsupportedModel, match=r"comparisons of booleans \(less\)"):
        tir_byoc.build_model(_binary(relax.op.less, "bool"))


@pytest.mark.parametrize(
    ("operation", "word"),
    [(relax.op.add, "addition"), (relax.op.multiply, "multiplication")],
    ids=["add", "multiply"],
)
def test_arithmetic_on_booleans_is_reported_as_what_it_is(operation, word):
    """Not as a comparison, and without the attention-mask advice (a torch model's boolean
    arithmetic is written as logic before it gets here: tests/models/test_frontend_ops.py)."""
    name = operation.__name__
    with pytest.raises(tir_byoc.UnsupportedModel) as error:
        tir_byoc.build_model(_binary(operation, "bool"))
    message = str(error.value)
    assert "\n" not in message
    assert f"cannot compile arithmetic on booleans ({word} in {name}): write it as logic" in (
        message
    )
    assert "comparison" not in message and "attention" not in message
    assert "MatchesCode(DLDataTypeCode::kDLFloat)" in message


class _Attention(torch.nn.Module):
    def forward(self, q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)


class _Linear(torch.nn.Module):
    def forward(self, q):
        return q * 2


def _failing_import(message):
    def from_exported_program(_exported, **_options):
        raise ValueError(message)

    return from_exported_program


def test_sdpa_that_torch_cannot_decompose_asks_for_eager_attention(monkeypatch):
    message = "Cannot view a tensor with shape torch.Size([2, 16, 64]) and strides (64, 128, 1)"
    monkeypatch.setattr(relax_torch, "from_exported_program", _failing_import(message))
    q = torch.ones(1, 2, 4, 8)
    with pytest.raises(tir_byoc.UnsupportedModel, match="attn_implementation='eager'") as error:
        tir_byoc.build_model(_Attention().eval(), q)
    assert "\n" not in str(error.value)
    # Without scaled_dot_product_attention in the graph the error is not ours to explain.
    with pytest.raises(ValueError, match="Cannot view a tensor") as error:
        tir_byoc.build_model(_Linear().eval(), q)
    assert not isinstance(error.value, tir_byoc.UnsupportedModel)


def test_a_returned_cache_asks_for_use_cache_false(monkeypatch):
    def export(*_args, **_kwargs):
        raise RuntimeError(
            "Found <class 'transformers.cache_utils.DynamicCache'> in output, which is not a "
            "known type.\nIf this type holds tensors, you need to register a pytree for it."
        )

    monkeypatch.setattr(torch.export, "export", export)
    with pytest.raises(tir_byoc.UnsupportedModel, match="pass use_cache=False") as error:
        tir_byoc.build_model(_Linear().eval(), torch.ones(2))
    assert "\n" not in str(error.value)
    assert "DynamicCache" in str(error.value)


def test_an_unknown_export_error_is_raised_as_it_is(monkeypatch):
    original = RuntimeError("some other export failure")

    def export(*_args, **_kwargs):
        raise original

    monkeypatch.setattr(torch.export, "export", export)
    with pytest.raises(RuntimeError) as error:
        tir_byoc.build_model(_Linear().eval(), torch.ones(2))
    assert error.value is original


def test_the_causal_mask_is_zero_on_and_below_the_diagonal_and_the_dtype_minimum_above():
    mask = tir_byoc.frontend.causal_mask(4)
    assert mask.shape == (1, 1, 4, 4) and mask.dtype == torch.float32
    lowest = torch.finfo(torch.float32).min
    expected = torch.tensor([[0.0 if j <= i else lowest for j in range(4)] for i in range(4)])
    assert torch.equal(mask[0, 0], expected)
    assert (
        tir_byoc.frontend.causal_mask(2, torch.float16)[0, 0, 0, 1]
        == torch.finfo(torch.float16).min
    )


class IntegerDivisions(torch.nn.Module):
    """True divisions of an int64 tensor, by an int, by an int tensor and by its own maximum;
    and one of floats, which needs nothing."""

    def forward(self, x, i):
        return x + i / 4, x + i / torch.tensor(3), i / i.max(), x / 2


def test_a_true_division_of_integers_gives_torch_values():
    """TVM 0.27 imports ``i / 4`` as an integer division; the values must be torch's."""
    x = torch.randn(6, generator=torch.Generator().manual_seed(0))
    i = torch.tensor([-7, -1, 0, 3, 5, 9])
    built = tir_byoc.build_model(IntegerDivisions().eval(), (x, i))
    for got, expected in zip(built(x, i), IntegerDivisions()(x, i), strict=True):
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_only_true_divisions_of_integers_get_their_operands_cast():
    class Divisions(torch.nn.Module):
        def forward(self, x, i):
            return i / 4, x / 2, torch.div(i, 3, rounding_mode="floor"), i // 2

    x, i = torch.randn(6), torch.arange(6)
    exported = torch.export.export(Divisions(), (x, i))
    assert frontend.divide_in_float(exported) == 1
    casts = [n for n in exported.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    assert [(c.args[0].name, c.kwargs["dtype"]) for c in casts] == [("i", torch.float32)]
    (division,) = casts[0].users
    assert division.args == (casts[0], 4.0)
    torch.testing.assert_close(exported.module()(x, i)[0], i / 4, rtol=0, atol=0)


class Indexing(torch.nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, x):
        return self.index(x)


_I, _J = torch.tensor([2, 0, 1]), torch.tensor([1, 3, 2])
X4 = torch.randn(3, 4, 5, 6, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize(
    ("index", "axes"),
    [(lambda x: x[_I, :, _J], [0, 2]), (lambda x: x[:, _I, _J], [1, 2])],
    ids=["a ':' between", "adjacent, paired"],
)
def test_index_tensors_tvm_would_take_as_an_outer_product_are_refused_in_one_line(index, axes):
    with pytest.raises(frontend.UnsupportedModel) as refused:
        tir_byoc.build_model(Indexing(index).eval(), (X4,))
    message = str(refused.value)
    assert "\n" not in message
    assert f"index tensors on axes {axes} of a 4-D tensor" in message
    assert "index one axis at a time" in message


@pytest.mark.parametrize(
    "index",
    [lambda x: x[:, _I[:, None], _J], lambda x: x[:, :, _J], lambda x: x[_I, _I, _J, _J]],
    ids=["adjacent, an outer product", "one axis", "every axis"],
)
def test_indexing_tvm_imports_as_torch_does_is_built(index):
    built = tir_byoc.build_model(Indexing(index).eval(), (X4,))
    np.testing.assert_array_equal(built(X4).numpy(), index(X4).numpy())
