"""Property: a convolution matched in TIR and served by a backend's conv entry point computes
what the convolution and its epilogue compute.

Each example is a Relax ``conv1d``, ``conv2d`` or ``conv3d`` with drawn layout (channels first
or last), sizes, kernel, stride, dilation, asymmetric padding and groups (one, several, or
depthwise), followed by a drawn sequence of epilogue ops (a per-channel bias, relu, relu6,
gelu, gelu_tanh, silu, sigmoid, tanh, leaky relu, a scale, a residual add, a gate, a channel
scale), lowered as TVM lowers it
(LegalizeOps, FuseOps, FuseTIR: no tir_byoc rewrite before).  It is offloaded to the reference
convolution and, where its library is installed, to oneDNN's; the whole chain must be one
conv call (a convolution or an op left to TVM is a failure), and its result is compared with a
float64 NumPy convolution written from the definition.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from hypothesis import event, given
from hypothesis import strategies as st
from properties.harness import profile
from support.conv_modules import OPS, ConvSpec, expected, inputs, lowered
from tvm import relax

import tir_byoc
from tir_byoc.calls import intrinsic_calls
from tir_byoc.epilogues import epilogue_error


def _backends():
    found = ["ref"]
    if tir_byoc.toolchain.unavailable("onednn") is None:
        found.append("onednn")
    return found


@st.composite
def specs(draw):
    dims = draw(st.sampled_from([1, 2, 2, 3]))
    sizes, kernel, stride, dilation, lo, hi = [], [], [], [], [], []
    for _ in range(dims):
        k = draw(st.integers(1, 3 if dims < 3 else 2))
        d = draw(st.sampled_from([1, 1, 2]))
        before, after = draw(st.integers(0, 2)), draw(st.integers(0, 2))
        reach = (k - 1) * d + 1
        n = draw(st.integers(max(1, reach - before - after), 9 if dims < 3 else 5))
        sizes.append(n)
        kernel.append(k)
        stride.append(draw(st.integers(1, 3)))
        dilation.append(d)
        lo.append(before)
        hi.append(after)
    kind = draw(st.sampled_from(["one", "grouped", "depthwise"]))
    if kind == "one":
        groups, per_in, per_out = 1, draw(st.integers(1, 5)), draw(st.integers(1, 5))
    elif kind == "grouped":
        groups, per_in, per_out = draw(st.integers(2, 3)), draw(st.integers(2, 3)), 2
    else:
        groups, per_in, per_out = draw(st.integers(2, 6)), 1, draw(st.sampled_from([1, 1, 2]))
    ops = draw(st.lists(st.sampled_from(sorted(OPS)), max_size=4))
    # gelu then tanh would be named as the one op gelu_tanh: the family refuses it.
    ops = [o for i, o in enumerate(ops) if not (o == "tanh" and i and ops[i - 1] == "gelu")]
    while epilogue_error(ops):  # more constants or tensors than one call carries
        ops = ops[:-1]
    return ConvSpec(
        layout=draw(st.sampled_from(["first", "last"])),
        batch=draw(st.integers(1, 2)),
        channels=groups * per_in,
        out_channels=groups * per_out,
        groups=groups,
        sizes=tuple(sizes),
        kernel=tuple(kernel),
        stride=tuple(stride),
        dilation=tuple(dilation),
        pad_lo=tuple(lo),
        pad_hi=tuple(hi),
        ops=tuple(ops),
    )


def _run(mod, arrays):
    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


@pytest.mark.parametrize("backend", _backends())
@profile(0.01, ci_share=0.05)
@given(spec=specs(), seed=st.integers(0, 2**16))
def test_an_offloaded_convolution_computes_the_convolution_and_its_epilogue(backend, spec, seed):
    mod = lowered(spec)
    plan = tir_byoc.scan(mod, backends=[backend])
    if spec.groups == spec.channels > 1 and spec.layout == "first":
        # Left to TVM's sliding-window schedule (tir_byoc.match.conv_records.prefer_tvm).
        (choice,) = plan
        assert choice.intrinsic is None and "depthwise" in choice.reason, choice.reason
        event("depthwise, channels first: left to TVM")
        return
    assert [c.intrinsic for c in plan] == [f"{backend}.conv"], [
        (c.pattern, c.reason) for c in plan
    ] + [str(r) for r in tir_byoc.explain(mod)]
    (choice,) = plan
    ops = spec.ops
    if spec.y_shape == spec.channel_shape:  # one value per channel: read as a full tensor
        ops = tuple({"bias": "add", "channel_scale": "mul"}.get(o, o) for o in ops)
    assert tuple(s.op for s in choice.match.epilogue) == ops, choice.pattern
    offloaded = tir_byoc.offload(mod, backends=[backend])
    calls: dict[str, int] = {}
    for func in offloaded.functions.values():
        if isinstance(func, tvm.tirx.PrimFunc):
            for name, count in intrinsic_calls(func).items():
                calls[name] = calls.get(name, 0) + count
    assert calls == {f"{backend}.conv": 1}
    event(f"conv{spec.dims}d {spec.layout}, groups {spec.groups}, ops {len(spec.ops)}")
    arrays = inputs(spec, seed)
    got = _run(offloaded, arrays)
    want = expected(spec, arrays)
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("layout", ["first", "last"])
def test_a_non_finite_weight_in_the_padding_gives_what_tvm_gives(backend, layout):
    # TVM multiplies the padding's zeros by the weight (0 * inf is NaN); the library kernels
    # skip those taps.  Such a call is computed by the reference product instead.
    spec = ConvSpec(layout=layout, channels=4, out_channels=8, ops=("bias",))
    mod = lowered(spec)
    arrays = inputs(spec, 0)
    weight = arrays[1]
    weight[(0, 0, 0, 0)] = np.inf  # a corner tap: in the padding for the edge outputs
    weight[(1, 1, 2, 2) if layout == "first" else (2, 2, 1, 1)] = np.nan
    want = _run(mod, arrays)
    assert np.isnan(want).any() and np.isfinite(want).any()
    got = _run(tir_byoc.offload(mod, backends=[backend]), arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
