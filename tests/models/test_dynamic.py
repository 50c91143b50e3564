"""One build for every batch size and sequence length: build_model with dynamic dims.

Each model is built once with its batch (and sequence) dims symbolic, then called at several
sizes, 1 and a size that is no power of two among them, and every output is compared with
torch's at that size.  A call outside the declared bounds, or whose dims disagree, is a
one-line error naming the input and the dim, and the model stays usable.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tir_byoc  # noqa: E402

Dim = torch.export.Dim


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).eval()


def _close(model, module, *inputs, tolerance=1e-4):
    with torch.no_grad():
        expected = module(*inputs)
    np.testing.assert_allclose(
        model(*inputs).numpy(), expected.numpy(), rtol=tolerance, atol=tolerance
    )


@pytest.fixture(scope="module")
def mlp():
    module = _mlp()
    built = tir_byoc.build_model(
        module, (torch.randn(8, 64),), dynamic={"input": {0: ("batch", 1, 256)}}
    )
    return module, built


@pytest.mark.parametrize("batch", [1, 3, 8, 100, 256])
def test_mlp_every_batch(mlp, batch):
    module, built = mlp
    _close(built, module, torch.randn(batch, 64))


def test_mlp_dims_and_offload(mlp):
    _, built = mlp
    assert built.dynamic_dims == {"batch": (1, 256)}
    # Both Linears are served by a library at every batch, as in the static build.
    assert len(built.intrinsics) == 2


def test_out_of_bounds_is_one_line_and_model_stays_usable(mlp):
    module, built = mlp
    with pytest.raises(
        ValueError,
        match=r"^tir_byoc.Model: input 0 \(input\) dim 0 \(batch\) "
        r"is 300, expected 1..256$",
    ):
        built(torch.randn(300, 64))
    with pytest.raises(ValueError, match=r"dim 1 is 63, expected 64"):
        built(torch.randn(4, 63))
    _close(built, module, torch.randn(5, 64))


def test_full_form_with_torch_dims():
    module = _mlp()
    built = tir_byoc.build_model(
        module, (torch.randn(8, 64),), dynamic_shapes=({0: Dim("rows", min=2, max=16)},)
    )
    assert built.dynamic_dims == {"rows": (2, 16)}
    _close(built, module, torch.randn(13, 64))
    with pytest.raises(ValueError, match=r"dim 0 \(rows\) is 1, expected 2..16"):
        built(torch.randn(1, 64))


def test_shared_name_means_one_dim():
    class Add(torch.nn.Module):
        def forward(self, a, b):
            return torch.relu(a) + b

    built = tir_byoc.build_model(
        Add().eval(),
        (torch.randn(4, 8), torch.randn(4, 8)),
        dynamic={"a": {0: "n"}, "b": {0: "n"}},
    )
    x, y = torch.randn(7, 8), torch.randn(7, 8)
    np.testing.assert_allclose(built(x, y).numpy(), (torch.relu(x) + y).numpy())
    with pytest.raises(
        ValueError,
        match=r"input 1 \(b\) dim 0 \(n\) is 6, expected 7, as "
        r"input 0 \(a\) dim 0 \(n\) is",
    ):
        built(torch.randn(7, 8), torch.randn(6, 8))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dynamic": {"nope": {0: "b"}}}, "dynamic= names input 'nope'"),
        ({"dynamic": {"input": {2: "b"}}}, "has axis 2; the input has 2 axes"),
        ({"dynamic": {"input": {0: 3}}}, "expected a name, \\(name, min, max\\)"),
        (
            {"dynamic": {"input": {0: "b"}}, "dynamic_shapes": ({0: Dim("b")},)},
            "got both",
        ),
    ],
)
def test_bad_dynamic_options(options, message):
    with pytest.raises(ValueError, match=message):
        tir_byoc.build_model(_mlp(), (torch.randn(8, 64),), **options)


def test_dynamic_only_for_torch():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(x)
    with pytest.raises(ValueError, match="are for a torch model"):
        tir_byoc.build_model(bb.get(), dynamic={"x": {0: "n"}})
