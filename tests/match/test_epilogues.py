"""Epilogues as data: each op as TVM lowers it, its numerics, and the near misses explain names.

Every op of :data:`tir_byoc.epilogues.OPS` is lowered by Relax itself (``LegalizeOps``,
``FuseOps``, ``FuseTIR``) after a Linear, offloaded with every available backend, and run
against the same module built by TVM alone, on inputs whose products are ordinary, large
(±1e4 and beyond) and special (NaN, ±inf, ±1e30, put in the bias so the value reaching the
op is exactly that).
"""

import math

import numpy as np
import pytest
import tvm_ffi
from support.byoc_testing import only_match
from tvm import relax, s_tir, te, tirx
from tvm.script import relax as R

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.epilogues import OPS
from tir_byoc.match import scan_function
from tir_byoc.match.epilogue import EpilogueParser
from tir_byoc.patterns import describe
from tir_byoc.rewrite import intrinsic_calls

M, K, N = 8, 4, 6
SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0], "float32")


def _linear_then(op_name):
    """A Relax module: the op after ``x @ w + b`` as a Relax operator (a scale before the +)."""
    x = relax.Var("x", R.Tensor((M, K), "float32"))
    w = relax.Var("w", R.Tensor((K, N), "float32"))
    b = relax.Var("b", R.Tensor((N,), "float32"))
    t = relax.Var("t", R.Tensor((M, N), "float32"))
    g = relax.Var("g", R.Tensor((N,), "float32"))
    builder = relax.BlockBuilder()
    ops = {
        "scale": lambda z: R.multiply(z, R.const(0.125, "float32")),
        "div": lambda z: R.divide(z, R.const(8.0, "float32")),
        "relu": R.nn.relu,
        "gelu": R.nn.gelu,
        "gelu_tanh": R.nn.gelu_tanh,
        "silu": R.nn.silu,
        # CLIP's quick_gelu, as torch writes it: x * sigmoid(1.702 * x).
        "swish": lambda z: R.multiply(z, R.sigmoid(R.multiply(R.const(1.702, "float32"), z))),
        # torch's nn.Hardswish, as torch.export decomposes it: x * clamp(x + 3, 0, 6) / 6.
        "hardswish": _hardswish,
        "sigmoid": R.sigmoid,
        "tanh": R.tanh,
        "clip": lambda z: R.clip(z, 0.0, 6.0),
        "leaky_relu": lambda z: R.nn.leakyrelu(z, 0.01),
        "add": lambda z: R.add(z, t),
        "mul": lambda z: R.multiply(z, t),
        "channel_scale": lambda z: R.multiply(g, z),  # torch's layer_scale * x
    }
    with builder.function("main", [x, w, b, t, g]):
        with builder.dataflow():
            if OPS[op_name].slot == "scale":  # the scale slot comes before the bias
                out = builder.emit_output(R.add(ops[op_name](R.matmul(x, w)), b))
            else:
                out = builder.emit_output(ops[op_name](R.add(R.matmul(x, w), b)))
        builder.emit_func_output(out)
    return _fuse(builder.get())


def _hardswish(z):
    three, six = R.const(3.0, "float32"), R.const(6.0, "float32")
    clamped = R.clip(R.clip(R.add(z, three), 0, math.inf), -math.inf, 6)
    return R.divide(R.multiply(z, clamped), six)


def _fuse(mod):
    return relax.transform.FuseTIR()(
        relax.transform.FuseOps()(
            relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
        )
    )


def _available_backends():
    return [b for b in ("ref", "openblas", "mkl", "onednn") if toolchain.unavailable(b) is None]


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K)).astype("float32")
    x[1] *= 1e4  # large magnitudes
    x[2] *= 100
    w = rng.standard_normal((K, N)).astype("float32")
    b = rng.standard_normal(N).astype("float32")
    t = rng.standard_normal((M, N)).astype("float32")
    g = rng.standard_normal(N).astype("float32")
    # Row 0 of the product is zeroed and the bias carries the special values.
    x[0] = 0
    b[: len(SPECIAL)] = SPECIAL
    return x, w, b, t, g


def _run(mod, arrays):
    import tvm

    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


@pytest.mark.parametrize("op", [op for op in OPS if op != "bias"])
def test_each_op_as_relax_lowers_it_is_offloaded_and_agrees_with_tvm(op):
    entries = ("gemm", "matmul_bias_relu") if op == "relu" else ("gemm",)
    _agrees_on_every_backend(_linear_then(op), _inputs(seed=len(op)), entries, op)


def _agrees_on_every_backend(lowered, arrays, entries, label):
    """``lowered`` offloaded to each available backend calls one of its ``entries`` once and
    gives TVM's own result: NaN and the infinities exactly where TVM's code puts them, the
    rest to fp32 tolerance, relative for the large rows."""
    expected = _run(lowered, arrays)
    for backend in _available_backends():
        offloaded = tir_byoc.offload(lowered, backends=backend)
        fired = {}
        for _, func in offloaded.functions_items():
            if isinstance(func, tirx.PrimFunc):
                fired.update(intrinsic_calls(func))
        assert fired in [{f"{backend}.{entry}": 1} for entry in entries], (backend, fired)
        result = _run(offloaded, arrays)
        np.testing.assert_array_equal(np.isnan(result), np.isnan(expected), err_msg=backend)
        finite = np.isfinite(expected)
        np.testing.assert_array_equal(result[~finite], expected[~finite], err_msg=backend)
        np.testing.assert_allclose(
            result[finite], expected[finite], rtol=2e-5, atol=1e-4, err_msg=f"{label} {backend}"
        )


#: Epilogues out of slot order or with an op twice, as real models write them after a GEMM
#: (z = x @ w; b a bias, t and u tensors of z's shape, g a layer scale), by the pattern they are
#: read as.
REORDERED = {
    # OPT's and Whisper's query projection: the scale after the bias.
    "matmul_bias_scale": lambda z, b, t, u, g: R.multiply(R.add(z, b), R.const(0.125, "float32")),
    # GPT-NeoX's, GPT-J's and Phi's parallel attention and MLP: two residual adds.
    "matmul_bias_add_add": lambda z, b, t, u, g: R.add(R.add(R.add(z, b), t), u),
    # Gemma 2's soft-capping of the logits.
    "matmul_div_tanh_scale": lambda z, b, t, u, g: R.multiply(
        R.tanh(R.divide(z, R.const(30.0, "float32"))), R.const(30.0, "float32")
    ),
    "matmul_relu_bias": lambda z, b, t, u, g: R.add(R.nn.relu(z), b),
    "matmul_bias_mul_gelu_add": lambda z, b, t, u, g: R.add(
        R.nn.gelu(R.multiply(R.add(z, b), t)), u
    ),
    # DINOv2's and BEiT's attention and MLP outputs: the residual after a layer scale.
    "matmul_bias_channel_scale_add": lambda z, b, t, u, g: R.add(t, R.multiply(g, R.add(z, b))),
}


@pytest.mark.parametrize("name", list(REORDERED))
def test_an_epilogue_out_of_slot_order_is_offloaded_whole_and_agrees_with_tvm(name):
    x = relax.Var("x", R.Tensor((M, K), "float32"))
    w = relax.Var("w", R.Tensor((K, N), "float32"))
    b = relax.Var("b", R.Tensor((N,), "float32"))
    t = relax.Var("t", R.Tensor((M, N), "float32"))
    u = relax.Var("u", R.Tensor((M, N), "float32"))
    g = relax.Var("g", R.Tensor((N,), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, w, b, t, u, g]):
        with builder.dataflow():
            out = builder.emit_output(REORDERED[name](R.matmul(x, w), b, t, u, g))
        builder.emit_func_output(out)
    lowered = _fuse(builder.get())
    (match,) = tir_byoc.scan(lowered)
    assert match.pattern == name
    x_, w_, b_, t_, g_ = _inputs(seed=len(name))
    arrays = (x_, w_, b_, t_, np.flip(t_, axis=0).copy(), g_)
    _agrees_on_every_backend(lowered, arrays, ("gemm",), name)


# -- erf and tanh gelu are never confused -----------------------------------------------


def _dense_then(fn, *, extra=None):
    x = te.placeholder((M, K), "float32", name="X")
    w = te.placeholder((N, K), "float32", name="W")
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="dense")
    out = te.compute((M, N), lambda i, j: fn(y[i, j]), name="epilogue")
    return te.create_prim_func([x, w, out])


def f32(v):
    return tirx.const(v, "float32")


def gelu_erf(z, half=0.5, root=math.sqrt(0.5)):
    return z * (f32(half) + te.erf(z * f32(root)) * f32(0.5))


def gelu_tanh(z, c0=math.sqrt(2 / math.pi), c1=0.044715):
    return f32(0.5) * z * (f32(1.0) + te.tanh(f32(c0) * z * (f32(1.0) + f32(c1) * z * z)))


def test_erf_and_tanh_gelu_are_told_apart():
    assert only_match(_dense_then(gelu_erf)).pattern == "dense_gelu"
    assert only_match(_dense_then(gelu_tanh)).pattern == "dense_gelu_tanh"
    # Each gelu's constant in the other's spelling is no gelu at all.
    erf_with_tanh_constant = _dense_then(lambda z: gelu_erf(z, root=math.sqrt(2 / math.pi)))
    tanh_with_erf_constant = _dense_then(lambda z: gelu_tanh(z, c0=math.sqrt(0.5)))
    for func, op in ((erf_with_tanh_constant, "gelu"), (tanh_with_erf_constant, "gelu_tanh")):
        assert only_match(func).pattern == "dense"
        (rejection,) = tir_byoc.explain(func)
        assert rejection.reason.startswith(f"{op}: a constant is ")
        assert rejection.nearest == f"dense_{op}"


def test_swish_carries_its_alpha_and_is_told_apart_from_silu():
    def swish(alpha):
        return lambda z: z * te.sigmoid(f32(alpha) * z)

    for alpha in (1.702, -0.5):
        (match,) = tir_byoc.scan(_dense_then(swish(alpha)))
        assert match.pattern == "dense_swish"
        assert [float(c) for c in match.epilogue[0].constants] == [float(np.float32(alpha))]
    assert only_match(_dense_then(lambda z: z * te.sigmoid(z))).pattern == "dense_silu"
    # The sigmoid of another value than the one it multiplies is no swish.
    shifted = _dense_then(lambda z: z * te.sigmoid(f32(1.702) * (z + f32(1.0))))
    assert only_match(shifted).pattern == "dense"
    (rejection,) = tir_byoc.explain(shifted)
    assert "multiplies the value by a computed value of itself" in rejection.reason


def test_hardswish_is_read_from_torchs_spellings_and_told_apart_from_near_misses():
    def hardswish(shift=3.0, divisor=6.0, lo=0.0):
        return lambda z: z * te.max(te.min(z + f32(shift), f32(6.0)), f32(lo)) / f32(divisor)

    # x * F.relu6(x + 3) / 6 in one block; nn.Hardswish's two clamps are the Relax test above.
    (match,) = tir_byoc.scan(_dense_then(hardswish()))
    assert (match.pattern, match.epilogue[0].constants) == ("dense_hardswish", ())
    for near, reason in (
        (hardswish(divisor=5.0), "hardswish: a constant is 5.0 where hardswish has 6"),
        (hardswish(shift=2.0), "hardswish: a constant is 2.0 where hardswish has 3"),
        (hardswish(lo=-1.0), "hardswish: a constant is -1.0 where hardswish has 0"),
    ):
        func = _dense_then(near)
        assert only_match(func).pattern == "dense"
        (rejection,) = tir_byoc.explain(func)
        assert (rejection.nearest, rejection.reason) == ("dense_hardswish", reason)
    # x * (relu6(x + 3) / 6) rounds otherwise than (x * relu6(x + 3)) / 6: not this op.
    divided_first = _dense_then(
        lambda z: z * (te.max(te.min(z + f32(3.0), f32(6.0)), f32(0.0)) / f32(6.0))
    )
    assert only_match(divided_first).pattern == "dense"


def test_a_torch_linear_then_hardswish_offloads_the_hardswish_and_agrees_with_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Hardswish()).eval()
    x = torch.randn(5, 16) * 4
    with torch.no_grad():
        expected = layers(x).numpy()
    for backend in _available_backends():
        model = tir_byoc.build_model(layers, (x,), backends=backend)
        np.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-5, atol=1e-5)
        # One PrimFunc is left, and it calls the library once: the bias and the hardswish run
        # inside the call, no PrimFunc of TVM's computes them.
        assert dict(model.schedules) == dict.fromkeys(
            model.intrinsics, tir_byoc.built_model.OFFLOADED
        )
        (name,) = model.intrinsics
        assert intrinsic_calls(model.module[name]) == {f"{backend}.gemm": 1}
        blocks = []
        tvm_ffi.structural_walk(model.module[name].body, (s_tir.SBlock, blocks.append))
        assert {b.name_hint for b in blocks} == {"root", f"dense_bias_hardswish_{backend}"}


@pytest.mark.parametrize("pattern", ["dense_bias_gelu", "dense_scale_bias_gelu_tanh_add"])
def test_each_prefix_of_a_chain_is_read_from_where_the_previous_one_ended(monkeypatch, pattern):
    # Every block's composed expression holds the previous block's node: the parser reads
    # each node once, however many prefixes (and gelu's two reads of its input) hold it.
    read = []
    parse = EpilogueParser._parse

    def counting(self, expr):
        read.append(expr.__chandle__())
        return parse(self, expr)

    monkeypatch.setattr(EpilogueParser, "_parse", counting)
    func = describe(pattern)
    (match,) = scan_function(pattern, func).matches
    assert match.pattern == pattern
    assert len(read) == len(set(read))
    # One node per block at least (the last read first), and the load of the product.
    blocks = len(match.blocks) - 1
    assert blocks + 1 <= len(read) <= 2 * blocks + 1


# -- near misses name what differs --------------------------------------------------------


@pytest.mark.parametrize(
    "fn, nearest, reason",
    [
        (lambda z: gelu_erf(z, half=0.6), "dense_gelu", "gelu: a constant is 0.6"),
        (lambda z: gelu_tanh(z, c1=0.05), "dense_gelu_tanh", "gelu_tanh: a constant is 0.05"),
        (
            lambda z: te.max(te.min(z, f32(0.0)), f32(6.0)),
            "dense_clip",
            "clip bounds are swapped: lower 6.0 > upper 0.0",
        ),
        (
            lambda z: te.max(z, z * f32(1.5)),
            "dense_leaky_relu",
            "leaky relu slope 1.5 is outside [0, 1]",
        ),
        (
            lambda z: tirx.Select(z > f32(0.0), z, z * f32(-0.5)),
            "dense_leaky_relu",
            "leaky relu slope -0.5 is outside [0, 1]",
        ),
        (lambda z: te.erf(z), "dense_gelu", "applies erf() alone, not as part of a gelu"),
        (lambda z: te.max(z, f32(1.0)), "dense_relu", "max() against 1.0 alone"),
    ],
    ids=[
        "gelu-half",
        "gelu-tanh-cubic",
        "clip-swapped",
        "leaky-steep",
        "leaky-negative",
        "erf",
        "max-1",
    ],
)
def test_a_near_miss_names_the_op_and_what_differs(fn, nearest, reason):
    func = _dense_then(fn)
    match = only_match(func)
    assert match.pattern == "dense" and match.blocks == ("dense",)
    (rejection,) = tir_byoc.explain(func)
    assert rejection.blocks == ("epilogue",)
    assert rejection.nearest == nearest and reason in rejection.reason, rejection


def test_a_leaky_relu_of_slope_0_is_read_as_tvm_folds_it():
    # TE folds z * 0 to 0: the select is then a relu whose NaN becomes 0, as TVM computes it.
    # Left unfolded (as tir_byoc.testing's builder writes it), it is refused, because TVM
    # folds it only later: tests/testing/test_programs.py, the mutation leaky_slope_zero.
    folded = only_match(_dense_then(lambda z: tirx.Select(z > f32(0.0), z, z * f32(0.0))))
    assert folded.pattern == "dense_relu" and folded.relu_nan == "zero"


def test_clip_records_what_its_spelling_makes_of_nan():
    # max(min(z, 6), 0): min(NaN, 6) is 6, max(6, 0) is 6; min(6, z) keeps NaN, max(NaN, 0) is 0.
    first = only_match(_dense_then(lambda z: te.max(te.min(z, f32(6.0)), f32(0.0))))
    second = only_match(_dense_then(lambda z: te.max(te.min(f32(6.0), z), f32(0.0))))
    third = only_match(_dense_then(lambda z: te.max(f32(0.0), te.min(f32(6.0), z))))
    assert first.epilogue[-1].constants == (0.0, 6.0, 6.0)
    assert second.epilogue[-1].constants == (0.0, 6.0, 0.0)
    assert math.isnan(third.epilogue[-1].constants[2])


def test_a_transpose_of_the_chain_output_ends_the_chain_with_a_reason():
    """Found by the property suite: composing a block that reads the chain's output at other
    indices used to raise through TVM's mutator and stop the scan."""
    x = te.placeholder((M, K), "float32", name="X")
    w = te.placeholder((M, K), "float32", name="W")
    b = te.placeholder((M,), "float32", name="b")
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((M, M), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="dense")
    z = te.compute((M, M), lambda i, j: y[i, j] + b[j], name="T_add")
    t = te.compute((M, M), lambda j, i: z[i, j], name="transpose")
    func = te.create_prim_func([x, w, b, z, t])
    assert only_match(func).pattern == "dense_bias"
    (rejection,) = tir_byoc.explain(func)
    assert rejection.blocks == ("transpose",)
    assert "reads T_add at other indices than its own axes" in rejection.reason


def test_a_multiply_by_a_per_row_vector_is_no_layer_scale():
    x = te.placeholder((M, K), "float32", name="X")
    w = te.placeholder((N, K), "float32", name="W")
    g = te.placeholder((M,), "float32", name="g")
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((M, N), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="dense")
    out = te.compute((M, N), lambda i, j: y[i, j] * g[i], name="epilogue")
    func = te.create_prim_func([x, w, g, out])
    assert only_match(func).pattern == "dense"
    (rejection,) = tir_byoc.explain(func)
    assert rejection.nearest == "dense_channel_scale"
    assert "layer scale g is indexed by the row" in rejection.reason, rejection
