"""One build for every batch size and sequence length: build_model with dynamic dims.

Each model is built once with its batch (and sequence) dims symbolic, then called at several
sizes, 1 and a size that is no power of two among them, and every output is compared with
torch's at that size.  A call outside the declared bounds, or whose dims disagree, is a
one-line error naming the input and the dim, and the model stays usable.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.fresh_process import run_python  # noqa: E402

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
        ({"dynamic": {"input": {0: ("b", 1, 1)}}}, "'b' from 1 to 1; expected 0 <= min < max"),
        ({"dynamic": {"input": {0: ("b", 4, 2)}}}, "'b' from 4 to 2; expected 0 <= min < max"),
        ({"dynamic": {"input": {0: ("b", 1.0, 8)}}}, "expected integer bounds"),
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


# -- transformers: batch and sequence -------------------------------------------------------

try:  # the small real models, wherever the move left them
    from tir_byoc.testing import models as real_models
except ImportError:
    from support import real_models

#: The longest sequence the small models take (their position tables have 32 rows).
LONGEST = 32
#: (batch, sequence) each model is called at: 1, and sizes that are no power of two.
SIZES = [(1, 1), (1, 7), (3, 16), (2, LONGEST), (5, 13)]


class DynamicCausal(torch.nn.Module):
    """A decoder's logits under the additive causal mask, sliced to the sequence's length.

    The mask has one row more than the longest sequence: a slice that takes a whole tensor
    is one torch.export specializes (its guard ``seq != 32`` would refuse the bound)."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder
        self.register_buffer("mask", tir_byoc.frontend.causal_mask(LONGEST + 1))

    def forward(self, ids):
        s = ids.shape[1]
        mask = self.mask[:, :, :s, :s]
        return self.decoder(input_ids=ids, attention_mask=mask, use_cache=False).logits


def _transformer(name):
    real = getattr(real_models, name)()
    module = real.module if name == "bert" else DynamicCausal(real.module.decoder).eval()
    return module, real.inputs


@pytest.fixture(scope="module", params=["bert", "gpt2", "llama"])
def transformer(request):
    pytest.importorskip("transformers")
    module, inputs = _transformer(request.param)
    built = tir_byoc.build_model(
        module, inputs, dynamic={0: {0: ("batch", 1, 16), 1: ("seq", 1, LONGEST)}}
    )
    return module, built


def test_transformer_every_size(transformer):
    module, built = transformer
    assert built.dynamic_dims == {"batch": (1, 16), "seq": (1, LONGEST)}
    generator = torch.Generator().manual_seed(3)
    for batch, sequence in SIZES:
        ids = torch.randint(0, real_models.VOCAB, (batch, sequence), generator=generator)
        _close(built, module, ids)


def test_transformer_scheduled_functions_are_well_formed(transformer):
    # The rules' symbolic nests are written twice behind a run-time test (small_nests): each
    # copy must define its own loop variables, iterators and intermediates.
    from tvm import s_tir, tirx

    _, built = transformer
    written_twice = 0
    for gvar, func in built.module.functions_items():
        if isinstance(func, tirx.PrimFunc) and gvar.name_hint in built.rules:
            s_tir.analysis.verify_well_formed(func, True)
            written_twice += "serial_nest" in str(func)
    assert written_twice, "expected symbolic nests written twice"


def test_transformer_gemms_all_served(transformer):
    _, built = transformer
    # Every GEMM a library serves at one shape is served at every shape: no GEMM is left to
    # TVM, and nothing runs unscheduled but the shape computation TVM adds.
    assert not [n for n, rule in built.rules.items() if "matmul" in n]
    # Attention's q @ k^T reads K as it is (relax.untranspose proves the shapes symbolically).
    assert "NT_matmul" in built.intrinsics
    assert set(built.unscheduled) <= {"shape_func", tir_byoc.dynamic.CHECK_BOUNDS}
    assert all("symbolic dims" in why for why in built.unscheduled.values())


def test_transformer_out_of_bounds_then_usable(transformer):
    module, built = transformer
    with pytest.raises(
        ValueError,
        match=rf"^tir_byoc.Model: input 0 \(\w+\) dim 1 \(seq\) is 40, expected 1..{LONGEST}$",
    ):
        built(torch.zeros(2, 40, dtype=torch.int64))
    _close(built, module, torch.randint(0, real_models.VOCAB, (2, 9)))


def test_sequence_beyond_the_model_names_torchs_guard():
    pytest.importorskip("transformers")
    module, inputs = _transformer("bert")
    with pytest.raises(ValueError, match=r"cannot keep the dims dynamic as given.*seq"):
        tir_byoc.build_model(module, inputs, dynamic={0: {1: ("seq", 1, 64)}})


# -- a CNN: batch -------------------------------------------------------------------------------


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        return self.fc(torch.relu(self.c2(x)).mean(dim=(2, 3)))


def test_cnn_every_batch_and_what_it_leaves_says_why():
    torch.manual_seed(0)
    module = SmallCNN().eval()
    built = tir_byoc.build_model(
        module, (torch.randn(4, 3, 32, 32),), dynamic={"x": {0: ("batch", 1, 64)}}
    )
    for batch in (1, 3, 4, 17):
        _close(built, module, torch.randn(batch, 3, 32, 32))
    with pytest.raises(ValueError, match=r"dim 0 \(batch\) is 65, expected 1..64$"):
        built(torch.randn(65, 3, 32, 32))
    # Each convolution is a library call at the symbolic batch (channels-last; the zoo's CNNs
    # in tests/models/test_dynamic_cnn.py), and nothing about them is declined in TIR.
    convolutions = [f for f, used in built.intrinsics.items() if "conv2d" in f]
    assert len(convolutions) == 2 and all(built.intrinsics[f] for f in convolutions)
    assert not [d for d in built.declines if d.nearest == "conv2d"]


# -- export ---------------------------------------------------------------------------------


def test_dynamic_export_runs_at_every_batch_in_a_fresh_process(mlp, tmp_path):
    """The library runs at every batch, and refuses a batch outside the bounds on its own."""
    module, built = mlp
    library = built.export_library(tmp_path / "mlp.so")
    inputs = {
        f"x{b}": np.random.default_rng(b).standard_normal((b, 64), "float32") for b in (1, 37)
    }
    np.savez(tmp_path / "in.npz", **inputs)
    script = f"""
        import sys
        sys.modules["torch"] = None  # the exported library must not need torch
        import numpy as np, tvm
        from tvm import relax
        vm = relax.VirtualMachine(tvm.runtime.load_module("{library}"), tvm.cpu())
        data = np.load("in.npz")
        outs = {{k: vm["main"](tvm.runtime.tensor(data[k]))[0].numpy() for k in data}}
        np.savez("out.npz", **outs)
        assert "tir_byoc" not in sys.modules, "the library needed tir_byoc"
        # The library checks the bounds itself: 257 rows is one too many, 0 one too few.
        for rows in (257, 0):
            try:
                vm["main"](tvm.runtime.tensor(np.zeros((rows, 64), "float32")))
            except ValueError as error:
                print(str(error).splitlines()[-1])
            else:
                print(f"{{rows}} rows ran")
    """
    stdout = run_python(script, tmp_path)
    refused = "tir_byoc.Model: input 0 (input) dim 0 (batch) is out of its bounds, expected 1..256"
    assert stdout.splitlines() == [refused, refused]
    outs = np.load(tmp_path / "out.npz")
    for key, x in inputs.items():
        assert outs[key].shape == (x.shape[0], 10)
        np.testing.assert_array_equal(outs[key], built(x))
        _close(built, module, torch.from_numpy(x))


# -- the default schedules on symbolic extents ----------------------------------------------


def test_rows_of_symbolic_length_are_reduced_in_vectors_at_every_length():
    from tvm import relax, tirx

    n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, m], "float32"))
    g = relax.Var("g", relax.TensorType([m], "float32"))
    with bb.function("main", [x, g]):
        with bb.dataflow():
            s = bb.emit(relax.op.exp(relax.op.nn.softmax(x, axis=-1)))
            out = bb.emit_output(relax.op.nn.layer_norm(s, g, g, axes=[-1]))
        bb.emit_func_output(out)
    built = tir_byoc.build_model(bb.get())
    # Every row's maximum and sums in vector lanes, the rows in parallel (on one thread only
    # where the whole nest is too little work, decided at run time): nothing serial.
    assert set(built.rules.values()) == {"VectorRows"}
    for why in built.serial_blocks.values():
        assert all(w.endswith("in parallel from there") for w in why.values()), why
    rng = np.random.default_rng(0)
    for rows, cols in [(1, 1), (3, 7), (2, 8), (5, 9), (4, 33), (7, 384)]:
        a = rng.standard_normal((rows, cols)).astype("float32")
        gamma = rng.standard_normal(cols).astype("float32")
        e = np.exp(a - a.max(-1, keepdims=True))
        e = np.exp(e / e.sum(-1, keepdims=True))
        mean, var = e.mean(-1, keepdims=True), e.var(-1, keepdims=True)
        expected = (e - mean) / np.sqrt(var + 1e-5) * gamma + gamma
        np.testing.assert_allclose(built(a, gamma), expected, rtol=1e-4, atol=1e-4)


def test_tuning_a_dynamic_build_asks_for_the_sizes_to_tune_at(tmp_path):
    # Tuning by size itself: tests/meta_schedule/test_sizes.py.
    with pytest.raises(
        ValueError,
        match=r"expected tune_sizes= with tune_trials= or work_dir= on a build with the "
        r"symbolic dims batch \(MetaSchedule tunes static shapes\), such as \[\{'batch': 1\}\]$",
    ):
        tir_byoc.build_model(
            _mlp(),
            (torch.randn(8, 64),),
            dynamic={"input": {0: "batch"}},
            tune_trials=4,
            work_dir=tmp_path,
        )
