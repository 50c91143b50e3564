"""The convolution matcher (tir_byoc.match.conv, conv_chain): what it reads from TVM's
lowered convolutions, and what it declines, with the reason.

The positive cases are Relax convolutions lowered as TVM lowers them; each negative case is a
one-line change of such a function's TVMScript (a mutation, as data) that changes its meaning,
and must be declined with a reason naming what differs.
"""

from __future__ import annotations

import pytest
import tvm
from support.conv_modules import ConvSpec, lowered

import tir_byoc
from tir_byoc.epilogues import OPS
from tir_byoc.match import scan_function
from tir_byoc.match.conv_records import ConvMatch, conv_ops, conv_pattern, is_conv_pattern


def _func(mod: tvm.IRModule):
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def _scan(func):
    return scan_function("f", func)


@pytest.mark.parametrize(
    "spec, pattern, text",
    [
        (
            ConvSpec(ops=("bias", "relu")),
            "conv2d_bias_relu",
            "NCHW 1x4x7x7 -> 4, 3x3/1x1 d1x1 p1x1 g1",
        ),
        (
            ConvSpec(groups=2, stride=(2, 1), dilation=(1, 2), pad_lo=(0, 2), pad_hi=(1, 2)),
            "conv2d",
            "NCHW 1x4x7x7 -> 4, 3x3/2x1 d1x2 p0x2 g2",
        ),
        (
            ConvSpec(layout="last", groups=4, ops=("bias", "clip")),
            "conv2d_bias_clip",
            "NHWC 1x4x7x7 -> 4, 3x3/1x1 d1x1 p1x1 g4",
        ),
        (
            ConvSpec(channels=2, out_channels=6, groups=2, ops=("add",)),
            "conv2d_add",
            "NCHW 1x2x7x7 -> 6, 3x3/1x1 d1x1 p1x1 g2",
        ),
        (
            ConvSpec(sizes=(9,), kernel=(3,), stride=(2,), dilation=(1,), pad_lo=(1,), pad_hi=(0,)),
            "conv1d",
            "NCW 1x4x9 -> 4, 3/2 d1 p1 g1",
        ),
        (
            ConvSpec(
                layout="last",
                sizes=(4, 4, 4),
                kernel=(2, 2, 2),
                stride=(1, 1, 1),
                dilation=(1, 1, 1),
                pad_lo=(0, 0, 0),
                pad_hi=(0, 0, 0),
                ops=("gelu",),
            ),
            "conv3d_gelu",
            "NDHWC 1x4x4x4x4 -> 4, 2x2x2/1x1x1 d1x1x1 p0x0x0 g1",
        ),
    ],
)
def test_a_lowered_convolution_is_read_exactly(spec, pattern, text):
    scan = _scan(_func(lowered(spec)))
    (match,) = scan.matches
    assert isinstance(match, ConvMatch)
    assert match.pattern == pattern
    assert match.conv.text == text
    assert scan.rejections == ()
    assert match.blocks[0] == "pad_temp"  # the padding block goes with the call


def test_the_epilogue_reads_the_per_channel_bias_along_the_channel_axis():
    (match,) = _scan(_func(lowered(ConvSpec(ops=("bias", "channel_scale", "add"))))).matches
    assert [s.op for s in match.epilogue] == ["bias", "channel_scale", "add"]
    assert [s.tensor.name for s in match.epilogue] == ["t0", "t1", "t2"]


def _mutated(spec: ConvSpec, old: str, new: str):
    text = _func(lowered(spec)).script()
    assert old in text, f"the mutation's text {old!r} is not in the lowered function"
    return tvm.script.from_source(text.replace(old, new))


@pytest.mark.parametrize(
    "old, new, reason",
    [
        # The kernel's axes swapped in the input's index: another computation.
        ("v_yy + v_ry", "v_yy + v_rx", "not q * s + r * d"),
        # A padding bound one short: a row of the input read as 0.
        ("v_i2 < T.int64(8)", "v_i2 < T.int64(7)", "with zeros around it"),
        # Padding with 1 instead of 0.
        ("T.float32(0.0))", "T.float32(1.0))", "not 0"),
        # The reduction initialised to 1.
        (
            "conv2d_nchw[v_nn, v_ff, v_yy, v_xx] = T.float32(0.0)",
            "conv2d_nchw[v_nn, v_ff, v_yy, v_xx] = T.float32(1.0)",
            "not initialised to 0",
        ),
        # The input shifted by one more than the padding.
        ("v_i2 - T.int64(1)", "v_i2 - T.int64(2)", "with zeros around it"),
    ],
)
def test_a_convolution_that_means_something_else_is_declined_with_the_reason(old, new, reason):
    func = _mutated(ConvSpec(), old, new)
    scan = _scan(func)
    assert scan.matches == ()
    assert any(reason in r.reason for r in scan.rejections), [str(r) for r in scan.rejections]
    assert all(r.nearest.startswith("conv2d") for r in scan.rejections)


def test_a_group_read_from_the_wrong_input_channels_is_declined():
    spec = ConvSpec(channels=4, out_channels=4, groups=2)
    func = _mutated(
        spec, "v_ff // T.int64(2) * T.int64(2) + v_rc", "v_ff % T.int64(2) * T.int64(2) + v_rc"
    )
    scan = _scan(func)
    assert scan.matches == ()
    assert any("reads input channel" in r.reason for r in scan.rejections), scan.rejections
    assert "(2 groups)" in scan.rejections[0].reason


def test_an_op_after_the_convolution_that_is_no_epilogue_op_stays_tvm_code_with_the_reason():
    func = _mutated(
        ConvSpec(ops=("relu",)),
        "T.max(conv2d_nchw_intermediate[v_i0, v_i1, v_i2, v_i3], T.float32(0.0))",
        "T.max(conv2d_nchw_intermediate[v_i0, v_i1, v_i2, v_i3], T.float32(1.0))",
    )
    scan = _scan(func)
    (match,) = scan.matches
    assert match.pattern == "conv2d"
    (rejection,) = scan.rejections
    assert rejection.blocks == ("compute",) and rejection.nearest == "conv2d"


def test_conv_pattern_names_read_back_into_their_ops():
    for ops in [(), ("bias", "relu"), ("gelu_tanh", "add"), ("bias", "gelu", "channel_scale")]:
        name = conv_pattern(2, ops)
        assert is_conv_pattern(name)
        assert conv_ops(name, OPS) == ops
    assert not is_conv_pattern("dense_bias_relu")
    with pytest.raises(ValueError, match="not a convolution pattern"):
        conv_ops("dense", OPS)


def test_the_reference_and_onednn_conv_intrinsics_serve_the_convolutions_only():
    conv = tir_byoc.REGISTRY["ref.conv"]
    assert conv.serves("conv2d_bias_relu_add")
    assert not conv.serves("dense_bias")
    assert not tir_byoc.REGISTRY["ref.gemm"].serves("conv2d_bias")
    mod = lowered(ConvSpec(ops=("bias", "relu")))
    (choice,) = tir_byoc.scan(mod, backends=["ref"])
    assert choice.intrinsic == "ref.conv"
    (choice,) = tir_byoc.scan(mod, backends=["openblas", "ref"])
    assert choice.intrinsic == "ref.conv"  # OpenBLAS has no convolution


def test_a_channels_first_depthwise_convolution_is_left_to_tvm_with_the_reason():
    mod = lowered(ConvSpec(channels=4, out_channels=4, groups=4, ops=("bias", "relu")))
    (choice,) = tir_byoc.scan(mod, backends=["ref"])
    assert choice.intrinsic is None
    assert "sliding-window" in choice.reason
    mod = lowered(ConvSpec(layout="last", channels=4, out_channels=4, groups=4))
    (choice,) = tir_byoc.scan(mod, backends=["ref"])
    assert choice.intrinsic == "ref.conv"  # channels last: served


@pytest.mark.parametrize("layout", ["first", "last"])
def test_a_symbolic_batch_is_read_as_the_call_passes_it(layout):
    """Every dim static but the batch, which the call passes as it is (one build for every
    batch); its rows are the batch times the output positions."""
    batch = tvm.tirx.Var("n", "int64")
    scan = _scan(_func(lowered(ConvSpec(layout=layout, batch=batch, ops=("bias", "relu")))))
    (match,) = scan.matches
    assert scan.rejections == ()
    assert isinstance(match.conv.batch, tvm.tirx.Var) and match.conv.batch.name == "n"
    assert not match.conv.static_batch
    assert match.conv.text.split()[1] == "nx4x7x7"
    assert str(match.m) == "n * T.int64(49)"


def test_a_batch_the_input_does_not_share_is_declined():
    """The output's batch n read from an input whose batch is m: not one convolution."""
    spec = ConvSpec(layout="last", batch=tvm.tirx.Var("n", "int64"))
    text = _func(lowered(spec)).script()
    old, new = "x: T.Buffer((n, T.int64(7)", "x: T.Buffer((m, T.int64(7)"
    declared = 'n = TypeVar("n")'
    assert old in text and declared in text
    text = text.replace(old, new).replace(declared, f'{declared}\nm = TypeVar("m")')
    func = tvm.script.from_source(text)
    scan = _scan(func)
    assert scan.matches == ()
    assert any("batch" in r.reason for r in scan.rejections), [str(r) for r in scan.rejections]
