"""Real models, end to end: results equal torch's, and every GEMM FLOP runs in a library.

Transformers' encoders and decoders (a ViT and a Whisper encoder among them, whose
convolutions are GEMMs too) and ``nn.TransformerEncoderLayer``, small and with random weights
(see :mod:`real_models`), are exported with torch, lowered with Relax, offloaded and run on the
Relax VM.  The share of GEMM work offloaded is measured apart from the matcher: torch counts
what the model computes, the extern calls of the offloaded module say what the libraries get.
The first tests check those two counters themselves.
"""

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
import tvm
from support import real_models
from tvm import relax
from tvm.script import tirx as T

import tir_byoc
from tir_byoc import demo
from tir_byoc.testing import models


# fmt: off
@T.prim_func
def three_calls(
    x: T.Buffer((8, 3), "float32"), w: T.Buffer((3, 5), "float32"), y: T.Buffer((8, 5), "float32")
):
    T.evaluate(
        T.call_extern(
            "int32", "tir_byoc_ref_matmul", x.data, w.data, y.data,
            T.int64(8), T.int64(5), T.int64(3), 65793,
        )
    )
    for _ in range(3):
        T.evaluate(
            T.call_extern(
                "int32", "tir_byoc_ref_bmm_matmul", x.data, w.data, y.data,
                T.int64(4), T.int64(5), T.int64(3), 65793,
                T.int64(2), T.int64(1), T.int64(12), T.int64(12), T.int64(0), T.int64(0),
            )
        )
    T.evaluate(T.call_extern("int32", "not_a_tir_byoc_kernel", x.data, T.int64(8), 1))
# fmt: on


def test_extern_calls_are_read_from_the_calling_convention():
    assert real_models.extern_calls("three_calls", three_calls) == [
        real_models.ExternCall("three_calls", "tir_byoc_ref_matmul", 8, 5, 3, batch=1, times=1),
        real_models.ExternCall("three_calls", "tir_byoc_ref_bmm_matmul", 4, 5, 3, batch=2, times=3),
    ]


def _main_calling_forward_twice(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with a Relax ``main`` that calls its ``forward`` twice."""
    forward = mod.get_global_var("forward")
    builder = relax.BlockBuilder(mod)
    params = [relax.Var(p.name, p.ty) for p in mod["forward"].params]
    with builder.function("main", params):
        with builder.dataflow():
            builder.emit(relax.Call(forward, params))
            output = builder.emit_output(relax.Call(forward, params))
        builder.emit_func_output(output)
    return builder.get()


def test_library_calls_count_each_call_site():
    lowered = demo.lowered_mlp(batch=4, in_features=8, hidden=6, out_features=3)
    offloaded = tir_byoc.offload(lowered)
    layers = [2 * 4 * 6 * 8, 2 * 4 * 3 * 6]
    assert [c.flops for c in real_models.library_calls(offloaded, entry="forward")] == layers
    twice = _main_calling_forward_twice(offloaded)
    assert [c.flops for c in real_models.library_calls(twice)] == layers + layers
    assert real_models.library_calls(lowered, entry="forward") == []


def test_torch_flops_include_the_attention_matmuls():
    # nn.TransformerEncoderLayer's eval fast path and CPU flash attention count as zero
    # unless the counter runs them as plain matmuls.
    b, s, h, i = (
        models.BATCH,
        models.SEQUENCE,
        models.HIDDEN,
        models.INTERMEDIATE,
    )
    projections = 2 * b * s * (3 * h * h + h * h + 2 * h * i)
    attention = 2 * 2 * b * s * s * h
    counts = real_models.torch_gemm_flops(models.encoder_layer())
    assert sum(counts.values()) == projections + attention


class _ConvolutionGradient(torch.nn.Module):
    """A convolution's backward pass, which FlopCounterMode counts and no GEMM op is."""

    def forward(self, x):
        weight = torch.ones(4, 4, 3)
        grad = torch.ones(1, 4, x.shape[-1] - 2)
        return torch.ops.aten.convolution_backward(
            grad, x, weight, None, [1], [0], [1], False, [0], 1, [True, False, False]
        )[0]


def test_torch_flops_refuse_work_that_is_not_a_gemm():
    gradient = models.RealModel("grad", _ConvolutionGradient(), (torch.zeros(1, 4, 8),))
    with pytest.raises(ValueError, match="GEMM operators only"):
        real_models.torch_gemm_flops(gradient)


def test_torch_flops_count_a_convolution_as_the_gemm_of_its_im2col():
    b, c, o, k, length = 2, 4, 6, 3, 10
    conv = torch.nn.Conv1d(c, o, k, padding=1).eval()
    counts = real_models.torch_gemm_flops(
        models.RealModel("conv", conv, (torch.zeros(b, c, length),))
    )
    assert counts == {"aten.convolution": 2 * (b * length) * o * (c * k)}


@pytest.fixture(scope="module", params=list(models.MODELS))
def compiled(request):
    """One model lowered, offloaded with every available backend, and built: once per model."""
    with pytest.MonkeyPatch.context() as env:
        env.delenv(tir_byoc.registry.BACKENDS_ENV, raising=False)
        return real_models.compile_model(models.MODELS[request.param]())


def test_offloaded_model_agrees_with_torch(compiled):
    result = compiled.run()
    difference = float(np.abs(result - compiled.expected).max())
    np.testing.assert_allclose(
        result,
        compiled.expected,
        rtol=1e-4,
        atol=1e-4,
        err_msg=f"{compiled.model.name}: max abs difference {difference:.3g}",
    )


def test_every_gemm_flop_is_offloaded(compiled):
    total = real_models.torch_gemm_flops(compiled.model)
    offloaded = sum(c.flops for c in real_models.library_calls(compiled.offloaded))
    fraction = offloaded / sum(total.values())
    refused = "\n  ".join(real_models.refusals(compiled.offloaded)) or "(none reported)"
    assert fraction == 1.0, (
        f"{compiled.model.name}: {fraction:.1%} of the GEMM FLOPs offloaded "
        f"({offloaded} of {sum(total.values())}; torch counts {total}); refused:\n  {refused}"
    )


def test_no_epilogue_stays_behind_an_offloaded_gemm(compiled):
    """Issue 12's bar: every activation, gate and residual add that Relax fuses with a GEMM
    runs in the library call, none as TVM code reading the call's output."""
    assert real_models.epilogues_left_behind(compiled.offloaded) == []


@pytest.mark.parametrize("name", list(models.MODELS))
def test_build_model_leaves_no_function_unscheduled_and_agrees_with_torch(name):
    """Issue 13, item 2: what tir_byoc leaves to TVM gets a default rule, every PrimFunc of it,
    and a block that still runs on one thread, or reduces a row serially, says why."""
    model = models.MODELS[name]()
    built = tir_byoc.build_model(model.module, model.inputs)
    assert dict(built.unscheduled) == {}
    assert set(built.rules) | set(built.intrinsics) == set(built.schedules)
    for blocks in built.serial_blocks.values():
        assert all(
            reason.endswith("runs on one thread")
            or "runs as TVM wrote it" in reason
            or reason.startswith("reduces each row serially: ")
            or reason.endswith("not vectorised")
            for reason in blocks.values()
        )
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    np.testing.assert_allclose(built(*model.inputs).numpy(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", ["1", "0"], ids=["nhwc", "nchw"])
def test_convnext_runs_its_depthwise_convolutions_fast_and_agrees_with_torch(
    channels_last, monkeypatch
):
    """Channels-last (the default), each 7 x 7 depthwise convolution is the library's
    convolution; kept NCHW, TVM's loop in the window rule."""
    monkeypatch.setenv("TIR_BYOC_CHANNELS_LAST", channels_last)
    model = models.convnext()
    built = tir_byoc.build_model(model.module, model.inputs)
    windows = {name for name, rule in built.rules.items() if rule == "SlidingWindow"}
    profile = built.profile(*model.inputs, repeat=1, warmup=0)
    library = {t.name for t in profile.functions if t.offloaded and "conv2d" in t.name}
    if channels_last == "1":
        # The stem, the two depthwise convolutions and the downsampling between the stages.
        assert windows == set() and len(library) == 4, (windows, library)
    else:
        assert len(windows) == 2, dict(built.rules)  # one depthwise convolution per stage
        assert all("conv2d" in name for name in windows)
    assert dict(built.unscheduled) == {}
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    np.testing.assert_allclose(built(*model.inputs).numpy(), expected, rtol=1e-4, atol=1e-4)
