"""The 1 x 1 + depthwise pairs of a CNN as one fused oneDNN call (:mod:`tir_byoc.conv_pairs`),
through ``build_model``: transformers' MobileNetV2 at 224 x 224 and an inverted residual
block, against torch, against the same model built without pairs (NaN and infinities in the
input included), on the fallback path, exported and run in a fresh process, with a dynamic
batch at several batches; and the reasons of the pairs left alone.

``TIR_BYOC_ONEDNN_PAIR=fused`` fuses every pair oneDNN has a fused kernel for, so that what is
tested does not depend on this machine's timing; the default choice is timed
(``benchmarks/``)."""

import logging

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from support import real_models
from support.fresh_process import run_python
from support.ms_workers import tiny_search

import tir_byoc
from tir_byoc import meta_schedule as tms
from tir_byoc import toolchain
from tir_byoc.conv_pairs import PAIR_INTRINSIC
from tir_byoc.decline import CONV_PAIR
from tir_byoc.meta_schedule.tune import DATABASE_FILES
from tir_byoc.testing import cnns

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="oneDNN is not installed"
)


def _pairs(model) -> list[str]:
    return [name for name, calls in model.intrinsics.items() if PAIR_INTRINSIC in calls]


def _build(module, inputs, monkeypatch, choice="fused"):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", choice)
    try:
        return tir_byoc.build_model(module, inputs)
    finally:
        monkeypatch.delenv("TIR_BYOC_ONEDNN_PAIR")


def _run_exported(library, x, tmp_path) -> np.ndarray:
    """``main`` of the exported ``library`` on ``x``, loaded and run in a fresh process."""
    np.save(tmp_path / "x.npy", x.numpy())
    script = f"""
        import numpy as np, tvm
        from tvm import relax
        vm = relax.VirtualMachine(tvm.runtime.load_module("{library}"), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(np.load("x.npy")))
        out = out[0] if not hasattr(out, "numpy") else out
        np.save("out.npy", out.numpy())
    """
    run_python(script, tmp_path)
    return np.load(tmp_path / "out.npy")


class InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: 1 x 1 expansion, depthwise 3 x 3, 1 x 1 projection, each with a
    batch norm, ReLU6 after the first two; ``reuse`` also adds the expansion's output to the
    depthwise one's (so that the expansion has a second reader)."""

    def __init__(self, c=24, expanded=144, stride=1, reuse=False):
        super().__init__()
        nn = torch.nn
        self.reuse = reuse
        self.expand = nn.Sequential(
            nn.Conv2d(c, expanded, 1, bias=False), nn.BatchNorm2d(expanded), nn.ReLU6()
        )
        self.depthwise = nn.Sequential(
            nn.Conv2d(expanded, expanded, 3, stride, 1, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded),
            nn.ReLU6(),
        )
        self.project = nn.Sequential(nn.Conv2d(expanded, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        middle = self.expand(x)
        out = self.depthwise(middle)
        if self.reuse:
            out = out + middle
        return self.project(out)


def _block(stride=1, reuse=False):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = InvertedResidual(stride=stride, reuse=reuse)
        # An intermediate of 4 x 56 x 56 x 144 floats (7 MiB): oneDNN fuses such a pair.
        shape = (4, 24, 56, 56)
        cnns.calibrate_batch_norm(module, shape)
        x = torch.randn(*shape)
    return module, (x,)


@pytest.mark.parametrize("stride", [1, 2])
def test_an_inverted_residual_runs_as_one_pair_and_equals_torch(monkeypatch, stride):
    module, inputs = _block(stride)
    paired = _build(module, inputs, monkeypatch)
    assert len(_pairs(paired)) == 1, dict(paired.intrinsics)
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(paired(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)
    # NaN and infinities go where they go without the pair.
    separate = _build(module, inputs, monkeypatch, "separate")
    assert not _pairs(separate)
    x = inputs[0].clone()
    x.view(-1)[::997] = float("nan")
    x.view(-1)[5::1009] = float("inf")
    x.view(-1)[7::1013] = float("-inf")
    got, expected = paired(x).numpy(), separate(x).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    # (ReLU6 maps NaN to 6, as TVM's clip does: the poison reaches the output as values.)
    assert not np.allclose(expected, paired(*inputs).numpy(), rtol=1e-2)
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-4)
    # The fallback (the block's layouts treated as another machine's): the same results.
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", "1")
    np.testing.assert_allclose(paired(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_tuned_build_pairs_and_packs_the_rest_as_the_untuned_one(monkeypatch, tmp_path):
    # Two blocks whose expansions are one PrimFunc: the first block's pair replaces that
    # PrimFunc's first call site, whose weight the tuning had packed and chosen the form on,
    # and the second block's expansion (read twice, so not paired) still needs its own block.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = torch.nn.Sequential(InvertedResidual(), InvertedResidual(reuse=True))
        shape = (4, 24, 56, 56)
        cnns.calibrate_batch_norm(module, shape)
        inputs = (torch.randn(*shape),)
    # A build from an empty database (no trial: a search takes half a minute here), which
    # offloads every chain as the search does where no candidate was measured.
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    for name in DATABASE_FILES:
        (tmp_path / name).write_text("")
    options = {"progress": False}
    tuned = tir_byoc.build_model(
        module, inputs, tune_trials=0, work_dir=tmp_path, tune_options=options
    )
    assert len(_pairs(tuned)) == 1 and len(tuned.pairs) == 1, (tuned.pairs, tuned.intrinsics)
    (decline,) = [d for d in tuned.declines if d.what == CONV_PAIR]
    assert decline.reason.endswith("is also read elsewhere"), decline
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(tuned(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_search_that_measured_the_convolutions_pairs_them_and_rebuilds_the_pair(
    monkeypatch, tmp_path
):
    # The other side of the test above: a search that measured each convolution's variants
    # (replayed traces, 12 trials), so that the pair is formed from the measured choices, then
    # a rebuild from the same database with no trial, which must form the same pair.
    module, inputs = _block()
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    options = tiny_search()
    tuned = tir_byoc.build_model(
        module, inputs, tune_trials=12, work_dir=tmp_path, tune_options=options
    )
    convolutions = [f for f in tms.load_report(tmp_path).functions if "conv2d" in f.name]
    assert len(convolutions) == 3 and all(f.best_ms is not None for f in convolutions), convolutions
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(tuned(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)
    if any(f.choice != "offload" for f in convolutions):
        # TVM's loops measured faster than oneDNN for one of them (a depthwise convolution
        # oneDNN ran 7x faster on the Zen 4 VM): nothing to pair, and so said.
        assert not tuned.pairs, (tuned.pairs, convolutions)
        return
    assert len(_pairs(tuned)) == 1 and len(tuned.pairs) == 1, (tuned.pairs, tuned.intrinsics)
    rebuilt = tir_byoc.build_model(
        module, inputs, tune_trials=0, work_dir=tmp_path, tune_options=options
    )
    assert rebuilt.pairs == tuned.pairs and rebuilt.intrinsics == tuned.intrinsics
    np.testing.assert_allclose(rebuilt(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)


def test_a_pair_whose_intermediate_has_another_reader_is_left_with_its_reason(monkeypatch, caplog):
    module, inputs = _block(reuse=True)
    with caplog.at_level(logging.INFO, logger="tir_byoc"):
        built = _build(module, inputs, monkeypatch)
    assert not _pairs(built) and built.pairs == ()
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not paired")]
    assert len(kept) == 1 and kept[0].endswith("is also read elsewhere"), kept
    # The model says so too: the same pair, its two bindings, and the reason.
    (decline,) = [d for d in built.declines if d.what == CONV_PAIR]
    assert len(decline.blocks) == 2 and decline.reason.endswith("is also read elsewhere")
    assert str(decline) == f"main: {', '.join(decline.blocks)}: not paired: {decline.reason}"
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(built(*inputs).numpy(), want, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def mobilenet():
    """transformers' MobileNetV2 at 224 x 224, batch 1, with every pair oneDNN fuses fused."""
    with pytest.MonkeyPatch.context() as env:
        model = cnns.mobilenet_v2(batch=1)
        return model, _build(model.module, model.inputs, env)


@pytest.fixture(scope="module")
def offloaded(mobilenet):
    """The same model offloaded, before TVM's build turns ``R.call_tir`` into direct calls."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
        return tir_byoc.offload(real_models.lower(mobilenet[0]))


def test_mobilenet_v2_with_its_pairs_equals_torch_and_offloads_every_flop(mobilenet, offloaded):
    model, built = mobilenet
    # At batch 1 the first block's pair (16 -> 96 channels at 112 x 112, a stride 2 with
    # TensorFlow's padding) has a fused kernel on every machine these tests run on.
    assert _pairs(built), dict(built.intrinsics)
    # Model.pairs names each fused pair's bindings and the PrimFunc that calls the pair.
    callees = {line.split(" -> ")[-1].split(" ")[0] for line in built.pairs}
    assert callees == set(_pairs(built)), (built.pairs, _pairs(built))
    with torch.no_grad():
        want = model.module(*model.inputs).numpy()
    np.testing.assert_allclose(built(*model.inputs).numpy(), want, rtol=1e-4, atol=1e-4)
    calls = real_models.library_calls(offloaded)
    offloaded = sum(c.flops for c in calls)
    total = sum(real_models.torch_gemm_flops(model).values())
    assert offloaded == pytest.approx(total, rel=0.01)
    assert any(c.symbol.endswith("_conv_pair") for c in calls)


def test_mobilenet_v2_with_its_pairs_runs_exported_in_a_fresh_process(mobilenet, tmp_path):
    model, built = mobilenet
    library = built.export_library(tmp_path / "mobilenet.so")
    # At one OpenMP thread, set through torch as a benchmark's code run in this process does:
    # the fresh process must run at the same count to give the same bits.  Whether oneDNN's bits
    # follow the count depends on the pack form timed at build, so this fails only sometimes
    # without run_python's OMP_NUM_THREADS.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = _run_exported(library, model.inputs[0], tmp_path)
        want = built(*model.inputs).numpy()
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_an_inverted_residual_as_plain_c_calls_the_pair(monkeypatch, tmp_path):
    from support import aot_harness as harness

    import tir_byoc.aot as aot

    module, inputs = _block(stride=2)
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    artifact = aot.build(
        module, inputs, out_dir=tmp_path / "block", name="block", backends="onednn"
    )
    assert "tir_byoc_onednn_conv_pair(" in (tmp_path / "block" / "block.c").read_text()
    runner = harness.make(artifact)
    (result,), _ = harness.run(artifact, runner, harness.numpy_inputs(inputs))
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(result, want, rtol=1e-4, atol=1e-4)


def test_a_dynamic_batch_pairs_once_and_equals_torch_at_every_batch(monkeypatch, caplog, tmp_path):
    module, inputs = _block()
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PAIR", "fused")
    with caplog.at_level(logging.INFO, logger="tir_byoc"):
        built = tir_byoc.build_model(module, inputs, dynamic={"x": {0: "batch"}})
    assert len(_pairs(built)) == 1, dict(built.intrinsics)
    paired = [r.getMessage() for r in caplog.records if r.getMessage().startswith("paired")]
    assert len(paired) == 1 and "batch" in paired[0], paired
    # Batch 1, one that is not a power of two, the block's (PACK_BATCH) and one above it: the
    # fused primitive where it serves, the two convolutions on their own blocks elsewhere.
    for batch in (1, 3, 8, 11):
        x = torch.randn(batch, 24, 56, 56)
        with torch.no_grad():
            want = module(x).numpy()
        np.testing.assert_allclose(built(x).numpy(), want, rtol=1e-4, atol=1e-4, err_msg=batch)
    monkeypatch.setenv("TIR_BYOC_ONEDNN_TEST_REORDER", "1")
    x = torch.randn(5, 24, 56, 56)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(built(x).numpy(), want, rtol=1e-4, atol=1e-4)
    # Exported, in a fresh process, at a batch of its own.
    monkeypatch.delenv("TIR_BYOC_ONEDNN_TEST_REORDER")
    library = built.export_library(tmp_path / "block.so")
    x = torch.randn(6, 24, 56, 56)
    got = _run_exported(library, x, tmp_path)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
