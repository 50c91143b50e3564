"""Property: a convolution served as im2col and a GEMM computes what the convolution computes.

Each example is a Relax ``conv1d``, ``conv2d`` or ``conv3d`` of drawn sizes, kernel,
strides, dilations, groups and asymmetric padding (a window may hang over both edges), with
the weight a constant (as a torch model's is) or a parameter, and optionally a bias of shape
(1, O, 1...) and one of the activations the rewrite takes into the call.
``tir_byoc.build_model`` builds it (the rewrite of :mod:`tir_byoc.relax.convolutions`, the library
call, TVM's code for the gather) and its result is compared with a float64 NumPy convolution
written from the definition, window by window.
Every drawn convolution must be served as a GEMM: the draws stay inside what the rewrite
takes (two or more input channels per group: a depthwise one is left to TVM), so a refusal
is a failure too.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from properties.harness import profile
from tvm import relax
from tvm.script import relax as R

import tir_byoc
from tir_byoc.relax import conv_choice
from tir_byoc.relax import convolutions as relax_convolutions

ACTIVATIONS = {
    None: (None, lambda z: z),
    "relu": (R.nn.relu, lambda z: np.maximum(z, 0)),
    "gelu": (R.nn.gelu, lambda z: 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))),
    "gelu_tanh": (
        R.nn.gelu_tanh,
        lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))),
    ),
    "silu": (R.nn.silu, lambda z: z / (1 + np.exp(-z))),
    "sigmoid": (R.sigmoid, lambda z: 1 / (1 + np.exp(-z))),
    "tanh": (R.tanh, np.tanh),
}


@pytest.fixture(autouse=True, scope="module")
def _im2col():
    """These tests are im2col's: with oneDNN installed, tir_byoc.relax.conv_choice would keep
    the convolutions whole for its convolution primitive."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(conv_choice.MODE_ENV, "im2col")
        yield


@st.composite
def convolutions(draw):
    spatial = draw(st.sampled_from([1, 2, 3]))
    axes = []
    for _ in range(spatial):
        kernel = draw(st.integers(1, 4 if spatial < 3 else 2))
        dilation = draw(st.sampled_from([1, 1, 2, 3]))
        reach = (kernel - 1) * dilation + 1  # the input span one output reads
        before, after = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        size = draw(st.integers(max(1, reach - before - after), 8 if spatial < 3 else 5))
        axes.append((size, kernel, draw(st.integers(1, 3)), before, after, dilation))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    per_group = draw(st.integers(1 if groups == 1 else 2, 4 if groups == 1 else 2))
    return {
        "batch": draw(st.integers(1, 2)),
        "groups": groups,
        "channels": groups * per_group,
        "out_channels": groups * draw(st.integers(1, 5 if groups == 1 else 2)),
        "axes": axes,
        "constant_weight": draw(st.booleans()),
        "bias": draw(st.sampled_from([None, "constant", "parameter"])),
        "activation": draw(st.sampled_from(list(ACTIVATIONS))),
    }


def _module(conv, weight, bias):
    """The Relax module of a drawn convolution; parameters x, then w and b unless constant."""
    spatial = len(conv["axes"])
    sizes = [a[0] for a in conv["axes"]]
    x = relax.Var("x", R.Tensor((conv["batch"], conv["channels"], *sizes), "float32"))
    params = [x]
    w = relax.const(weight, "float32")
    if not conv["constant_weight"]:
        w = relax.Var("w", R.Tensor(weight.shape, "float32"))
        params.append(w)
    b = None
    if conv["bias"] == "constant":
        b = relax.const(bias, "float32")
    elif conv["bias"] == "parameter":
        b = relax.Var("b", R.Tensor(bias.shape, "float32"))
        params.append(b)
    op = (R.nn.conv1d, R.nn.conv2d, R.nn.conv3d)[spatial - 1]
    strides = [a[2] for a in conv["axes"]]
    padding = [a[3] for a in conv["axes"]] + [a[4] for a in conv["axes"]]
    dilation = [a[5] for a in conv["axes"]]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            conv_call = op(
                x, w, strides=strides, padding=padding, dilation=dilation, groups=conv["groups"]
            )
            y = builder.emit(conv_call)
            if b is not None:
                y = builder.emit(R.add(y, b))
            activation = ACTIVATIONS[conv["activation"]][0]
            if activation is not None:
                y = builder.emit(activation(y))
            out = builder.emit_output(y)
        builder.emit_func_output(out)
    return builder.get()


def _expected(conv, x, weight, bias):
    """The convolution from its definition, in float64: for each group, each kernel offset's
    shifted (by offset times dilation), strided slice of the zero-padded input times that
    offset's weights, summed."""
    pads = [(0, 0), (0, 0)] + [(a[3], a[4]) for a in conv["axes"]]
    padded = np.pad(x.astype(np.float64), pads)
    outs = [(a[0] + a[3] + a[4] - (a[1] - 1) * a[5] - 1) // a[2] + 1 for a in conv["axes"]]
    total = np.zeros((conv["batch"], conv["out_channels"], *outs))
    groups = conv["groups"]
    per_in, per_out = conv["channels"] // groups, conv["out_channels"] // groups
    for g, offset in itertools.product(range(groups), np.ndindex(*[a[1] for a in conv["axes"]])):
        window = tuple(
            slice(r * a[5], r * a[5] + (n - 1) * a[2] + 1, a[2])
            for r, n, a in zip(offset, outs, conv["axes"], strict=True)
        )
        ins, outs_g = slice(g * per_in, (g + 1) * per_in), slice(g * per_out, (g + 1) * per_out)
        taps = weight[(outs_g, slice(None), *offset)].astype(np.float64)
        total[:, outs_g] += np.einsum("bc...,oc->bo...", padded[(slice(None), ins, *window)], taps)
    if bias is not None:
        total += bias
    return ACTIVATIONS[conv["activation"]][1](total)


@profile(0.01, ci_share=0.05)
@given(conv=convolutions(), seed=st.integers(0, 2**16))
def test_a_convolution_as_a_gemm_computes_the_convolution(conv, seed):
    rng = np.random.default_rng(seed)
    spatial = len(conv["axes"])
    x = rng.standard_normal((conv["batch"], conv["channels"], *[a[0] for a in conv["axes"]]))
    weight = rng.standard_normal(
        (
            conv["out_channels"],
            conv["channels"] // conv["groups"],
            *[a[1] for a in conv["axes"]],
        )
    )
    bias = rng.standard_normal((1, conv["out_channels"], *[1] * spatial))
    x, weight, bias = (a.astype("float32") for a in (x, weight, bias))
    mod = _module(conv, weight, bias)
    (_site,), declines = relax_convolutions.find(mod)
    assert declines == (), declines
    event(f"conv{spatial}d, {'bias, ' if conv['bias'] else ''}{conv['activation']}")
    event(f"groups {conv['groups']}, dilations {sorted({a[5] for a in conv['axes']})}")

    inputs = [x]
    if not conv["constant_weight"]:
        inputs.append(weight)
    if conv["bias"] == "parameter":
        inputs.append(bias)
    built = tir_byoc.build_model(mod)
    assert built.intrinsics, "the GEMM was not offloaded"
    got = built(*inputs)
    expected = _expected(conv, x, weight, bias if conv["bias"] else None)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
