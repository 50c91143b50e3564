"""Constant weights packed once (issue 15): what is packed, what is not, and that a pack never
changes a result or meets a call it was not made for.

oneDNN chooses a weight's form by timing the call (plain, transposed, or the layout it
prefers), so which one wins depends on the machine and the moment.  The tests of the mechanism
name the form (``TIR_BYOC_ONEDNN_PACK=library`` or ``transposed``), and the tests of the
default check that whatever is chosen is reported, consistent and computes the same result.
"""

import ctypes
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
import tvm_ffi
from support.backend_checks import library
from tvm import ir, relax, tirx
from tvm.script import relax as R
from tvm.script import tirx as T

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.decline import WEIGHT_PACK
from tir_byoc.offload import offload_reported
from tir_byoc.relax import pipeline
from tir_byoc.signature import PACKED_WEIGHT_FLAG

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="the oneDNN backend is not available"
)

M, K, N = 64, 96, 80


FORMS = ["library", "transposed"]
#: Bytes of the header before a block's weight (PackHeader in onednn/matmul.cpp).
HEADER = 64


@pytest.fixture(autouse=True)
def _named_form(monkeypatch, request):
    if "default_choice" not in request.node.name:
        monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "library")


RNG = np.random.default_rng(0)
WEIGHTS = [RNG.standard_normal((K, N)).astype("float32") for _ in range(2)]
BIAS = RNG.standard_normal(N).astype("float32")
X = RNG.standard_normal((M, K)).astype("float32")


def _lowered(weights, m=M):
    """Linears + bias + gelu, one per weight (a constant array, or None for a parameter)."""
    x = relax.Var("x", R.Tensor((m, K), "float32"))
    params = [x]
    builder = relax.BlockBuilder()
    for i, weight in enumerate(weights):
        if weight is None:
            params.append(relax.Var(f"w{i}", R.Tensor((K, N), "float32")))
    with builder.function("main", params):
        with builder.dataflow():
            outputs, given = [], iter(params[1:])
            for weight in weights:
                w = relax.const(weight) if weight is not None else next(given)
                outputs.append(builder.emit(R.nn.gelu(R.add(R.matmul(x, w), relax.const(BIAS)))))
            out = builder.emit_output(relax.Tuple(outputs) if len(outputs) > 1 else outputs[0])
        builder.emit_func_output(out)
    return pipeline.lower(builder.get())


def _run(mod, *arrays):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [r.numpy() for r in result]


def _names(mod):
    return sorted(g.name_hint for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc))


def _constants(mod):
    """The tensor constants of the Relax functions of ``mod``."""
    found = []
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            tvm_ffi.structural_walk(func, (ir.Constant, found.append))
    return [c for c in found if isinstance(c.value, tvm.runtime.Tensor)]


@pytest.mark.parametrize("form", FORMS)
def test_a_constant_weight_is_packed_once_and_the_result_is_unchanged(monkeypatch, form):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", form)
    lowered = _lowered(WEIGHTS[:1])
    packed = tir_byoc.offload(lowered, backends="onednn")
    assert _names(packed) == ["fused_matmul_add_gelu_packed"]
    script = packed.script(show_meta=False)
    assert "tir_byoc_onednn_gemm" in script
    # The call says its weight is packed; the plain (96, 80) float32 weight is gone.
    flag = str(tirx.IntImm("int32", 0x010101 | PACKED_WEIGHT_FLAG).value)
    assert flag in script
    weights = [c for c in _constants(packed) if c.value.numpy().ndim == 2]
    assert weights == []
    blocks = [c.value.numpy() for c in _constants(packed) if str(c.value.dtype) == "uint8"]
    assert len(blocks) == 1 and blocks[0].nbytes >= K * N * 4
    (expected,) = _run(lowered, X)
    (plain,) = _run(tir_byoc.offload(lowered, backends="onednn", pack_weights=False), X)
    (result,) = _run(packed, X)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(result, plain, rtol=1e-6, atol=1e-6)


def test_one_primfunc_called_with_two_constants_packs_each_call_sites_weight():
    lowered = _lowered(WEIGHTS)
    packed = tir_byoc.offload(lowered, backends="onednn")
    assert _names(packed) == ["fused_matmul_add_gelu_packed"]
    blocks = [c.value.numpy() for c in _constants(packed) if str(c.value.dtype) == "uint8"]
    assert len(blocks) == 2 and not np.array_equal(blocks[0], blocks[1])
    for result, expected in zip(_run(packed, X), _run(lowered, X)):
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)


def test_a_weight_passed_as_a_parameter_is_never_packed():
    weight = WEIGHTS[1]
    lowered = _lowered([WEIGHTS[0], None])
    offloaded = tir_byoc.offload(lowered, backends="onednn")
    # The constant's call takes the packed variant; the parameter's keeps the plain PrimFunc.
    assert _names(offloaded) == ["fused_matmul_add_gelu", "fused_matmul_add_gelu_packed"]
    for result, expected in zip(_run(offloaded, X, weight), _run(lowered, X, weight)):
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)


def test_backends_that_do_not_pack_keep_the_plain_path():
    assert tir_byoc.REGISTRY.backend("onednn").packs
    assert not tir_byoc.REGISTRY.backend("openblas").packs
    assert not tir_byoc.REGISTRY.backend("ref").packs
    offloaded = tir_byoc.offload(_lowered(WEIGHTS[:1]), backends="ref")
    assert _names(offloaded) == ["fused_matmul_add_gelu"]


@T.prim_func(private=True, s_tir=True)
def _dense_scaled_by_a_parameter(
    X: T.Buffer((M, K), "float32"),
    W: T.Buffer((N, K), "float32"),
    s: T.Buffer((1,), "float32"),
    Z: T.Buffer((M, N), "float32"),
):
    Y = T.sblock_alloc_buffer((M, N))
    for i, j, k in T.grid(M, N, K):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(M, N):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            Z[vi, vj] = Y[vi, vj] * s[0]


@T.prim_func(private=True, s_tir=True)
def _dense_on_a_weight_it_computes(
    X: T.Buffer((M, K), "float32"), Wt: T.Buffer((K, N), "float32"), Z: T.Buffer((M, N), "float32")
):
    W = T.sblock_alloc_buffer((N, K))
    for j, k in T.grid(N, K):
        with T.sblock("transpose"):
            vj, vk = T.axis.remap("SS", [j, k])
            W[vj, vk] = Wt[vk, vj]
    for i, j, k in T.grid(M, N, K):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Z[vi, vj] = T.float32(0)
            Z[vi, vj] = Z[vi, vj] + X[vi, vk] * W[vj, vk]


def _called_with_a_constant(func, weight, *others):
    """A Relax ``main(x, *others)`` calling ``func(x, weight, *others)``, the weight constant."""
    x = relax.Var("x", R.Tensor((M, K), "float32"))
    params = [x, *(relax.Var(f"p{i}", R.Tensor(a.shape, "float32")) for i, a in enumerate(others))]
    builder = relax.BlockBuilder()
    with builder.function("main", params):
        with builder.dataflow():
            gv = builder.add_func(func, "layer")
            args = relax.Tuple([x, relax.const(weight), *params[1:]])
            out = builder.emit_output(relax.op.call_tir(gv, args, R.Tensor((M, N), "float32")))
        builder.emit_func_output(out)
    return builder.get()


def test_a_scale_by_a_parameter_is_offloaded_with_its_weight_plain(caplog):
    """Found by the packing property: the pack builds the primitive with the epilogue's
    constants, and a scale read from a parameter is not one (packing raised a TypeError)."""
    scale = np.array([0.375], "float32")
    mod = _called_with_a_constant(_dense_scaled_by_a_parameter, WEIGHTS[0].T.copy(), scale)
    with caplog.at_level(logging.INFO, logger="tir_byoc"):
        offloaded = tir_byoc.offload(mod, backends="onednn")
    assert _names(offloaded) == ["layer"]
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not packed: ")]
    assert any("a scale by a parameter" in line for line in kept), kept
    (result,) = _run(offloaded, X, scale)
    np.testing.assert_allclose(result, X @ WEIGHTS[0] * scale[0], rtol=1e-5, atol=1e-4)


def test_a_weight_left_plain_is_among_the_built_models_declines():
    # The packing decides on the weights' values (and times its forms) as the model is built,
    # so explain() of the source cannot say it; Model.declines keeps what the offload said.
    scale = np.array([0.375], "float32")
    mod = _called_with_a_constant(_dense_scaled_by_a_parameter, WEIGHTS[0].T.copy(), scale)
    offloaded, report = offload_reported(mod, backends="onednn")
    (decline,) = report.declines
    assert decline.what == WEIGHT_PACK and decline.func == "layer" and decline.blocks
    assert decline.reason.startswith("a scale by a parameter"), decline
    assert str(decline).startswith(f"layer: {', '.join(decline.blocks)}: weight not packed: ")
    assert report.paired == () and report.packed == ()
    ir.assert_structural_equal(offloaded, tir_byoc.offload(mod, backends="onednn"))
    built = tir_byoc.build_model(mod, backends="onednn")
    assert decline in built.declines and built.pairs == ()
    np.testing.assert_allclose(built(X, scale), X @ WEIGHTS[0] * scale[0], rtol=1e-5, atol=1e-4)


def test_offload_reported_names_an_unknown_option_in_one_line():
    message = (
        r"offload_reported: unexpected option\(s\) stric; expected those of tir_byoc\.offload: "
    )
    with pytest.raises(TypeError, match=message + r"backends, strict, registry") as error:
        offload_reported(_lowered(WEIGHTS[:1]), stric=True)
    assert "\n" not in str(error.value)


def test_a_weight_the_function_computes_is_not_packed(caplog):
    """Found by the packing property: a GEMM reading a buffer its function computes from the
    constant has no weight parameter to pack (packing raised a ValueError)."""
    mod = _called_with_a_constant(_dense_on_a_weight_it_computes, WEIGHTS[0])
    with caplog.at_level(logging.INFO, logger="tir_byoc"):
        offloaded = tir_byoc.offload(mod, backends="onednn")
    assert _names(offloaded) == ["layer"]
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not packed: ")]
    assert any("W is computed in the function, not passed to it" in line for line in kept), kept
    (result,) = _run(offloaded, X)
    np.testing.assert_allclose(result, X @ WEIGHTS[0], rtol=1e-5, atol=1e-4)


def _gemm_arguments(lib, w, y, x, m, flags):
    codes = tir_byoc.epilogues.OPS["gelu"].code
    return [
        ctypes.c_void_p(x.ctypes.data),
        ctypes.c_void_p(w.ctypes.data),
        ctypes.c_void_p(y.ctypes.data),
        ctypes.c_int64(m),
        ctypes.c_int64(N),
        ctypes.c_int64(K),
        ctypes.c_int32(0x010101 | flags),
        ctypes.c_int32(1),
        *(ctypes.c_int64(v) for v in (1, 1, 0, 0, 0, 0)),
        ctypes.c_int64(codes),
        ctypes.c_double(np.sqrt(0.5)),
        *(ctypes.c_double(0) for _ in range(5)),
        *(ctypes.c_void_p(None) for _ in range(4)),
    ]


def _pack_arguments(weight, m):
    return [
        ctypes.c_void_p(weight.ctypes.data),
        ctypes.c_int64(m),
        ctypes.c_int64(N),
        ctypes.c_int64(K),
        ctypes.c_int32(0x010101),
        ctypes.c_int32(1),
        ctypes.c_int64(tir_byoc.epilogues.OPS["gelu"].code),
        ctypes.c_double(np.sqrt(0.5)),
        *(ctypes.c_double(0) for _ in range(5)),
    ]


def _pack(lib, weight, m, form):
    pack = lib.tir_byoc_onednn_pack
    pack.restype = ctypes.c_int32
    args = _pack_arguments(weight, m)
    code = ctypes.c_int32({"library": 1, "transposed": 2}[form])
    size = ctypes.c_int64(0)
    assert pack(*args, ctypes.byref(code), None, ctypes.byref(size)) == 0
    block = np.zeros(size.value + 64, np.uint8)
    start = (-block.ctypes.data) % 64
    aligned = block[start : start + size.value]
    assert (
        pack(*args, ctypes.byref(code), ctypes.c_void_p(aligned.ctypes.data), ctypes.byref(size))
        == 0
    )
    return aligned


@pytest.mark.parametrize("form", FORMS)
def test_a_pack_only_serves_the_call_it_was_made_for(form):
    lib = library("onednn")
    gemm = lib.tir_byoc_onednn_gemm
    gemm.restype = ctypes.c_int32
    weight = WEIGHTS[0]
    block = _pack(lib, weight, M, form)
    if form == "transposed":  # the K x N weight as N x K, after the header
        transposed = block[HEADER:].view(np.float32).reshape(N, K)
        np.testing.assert_array_equal(transposed, weight.T)
    y = np.zeros((M, N), np.float32)
    assert gemm(*_gemm_arguments(lib, block, y, X, M, PACKED_WEIGHT_FLAG)) == 0
    plain = np.zeros((M, N), np.float32)
    assert gemm(*_gemm_arguments(lib, weight, plain, X, M, 0)) == 0
    np.testing.assert_allclose(y, plain, rtol=1e-5, atol=1e-5)
    # A block whose header names another layout is refused (TIR_BYOC_EPACKED), never used.
    stale = block.copy()
    stale[8] ^= 0xFF
    assert gemm(*_gemm_arguments(lib, stale, y, X, M, PACKED_WEIGHT_FLAG)) == 6
    # ... and so is one whose header names another form, or one this file does not make.
    for other in (3 - {"library": 1, "transposed": 2}[form], 7):
        renamed = block.copy()
        renamed[24:32] = np.frombuffer(np.uint64(other).tobytes(), np.uint8)
        assert gemm(*_gemm_arguments(lib, renamed, y, X, M, PACKED_WEIGHT_FLAG)) == 6
    # The plain weight handed over as if it were packed: refused too.
    assert gemm(*_gemm_arguments(lib, weight, y, X, M, PACKED_WEIGHT_FLAG)) == 6


@pytest.mark.parametrize("form", FORMS)
def test_a_packed_call_whose_gelu_meets_infinities_computes_what_the_tir_does(form):
    # On AVX-512 oneDNN's fused erf GELU gives NaN for +inf and inf past 1.7e38; the call
    # then computes again from the block, unpacked, with the GELU in C (Fusion::guarded).
    lib = library("onednn")
    gemm = lib.tir_byoc_onednn_gemm
    gemm.restype = ctypes.c_int32
    weight = WEIGHTS[0]
    x = X.copy()
    for row, value in enumerate((np.inf, -np.inf, np.nan, 3e38, 1.8e38, -3e38)):
        x[row] = 0.0
        x[row, 0] = value  # z[row] = value * weight[0]: exact, as a single product
    with np.errstate(over="ignore", invalid="ignore"):  # 3e38 * w overflows to inf, as in fp32
        z = (x.astype(np.float64) @ weight.astype(np.float64)).astype(np.float32)
    want = tir_byoc.epilogues.reference("gelu", z, (np.sqrt(0.5),))
    y = np.zeros((M, N), np.float32)
    block = _pack(lib, weight, M, form)
    assert gemm(*_gemm_arguments(lib, block, y, x, M, PACKED_WEIGHT_FLAG)) == 0
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


def test_an_exported_packed_library_gives_the_same_results_in_a_fresh_process(tmp_path):
    lowered = _lowered(WEIGHTS[:1])
    packed = tir_byoc.offload(lowered, backends="onednn")
    model = tir_byoc.build_model(packed, backends="onednn")
    path = model.export_library(tmp_path / "packed.so")
    np.save(tmp_path / "x.npy", X)
    script = textwrap.dedent(
        f"""
        import numpy as np, tvm
        from tvm import relax
        vm = relax.VirtualMachine(tvm.runtime.load_module({str(path)!r}), tvm.cpu())
        x = tvm.runtime.tensor(np.load({str(tmp_path / "x.npy")!r}))
        np.save({str(tmp_path / "y.npy")!r}, vm["main"](x).numpy())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    (expected,) = _run(lowered, X)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-5, atol=1e-4)


def test_default_choice_the_backend_names_the_form_it_chose_and_sizes_its_block():
    lib = library("onednn")
    pack = lib.tir_byoc_onednn_pack
    pack.restype = ctypes.c_int32
    for m in (1, M):
        form, size = ctypes.c_int32(-1), ctypes.c_int64(-1)
        assert (
            pack(*_pack_arguments(WEIGHTS[0], m), ctypes.byref(form), None, ctypes.byref(size)) == 0
        )
        assert form.value in (0, 1, 2)
        if form.value == 0:
            assert size.value == 0
        elif form.value == 2:
            assert size.value == HEADER + K * N * 4
        else:
            assert size.value >= HEADER + K * N * 4
    # A form the backend does not make is refused, not packed.
    form = ctypes.c_int32(99)
    assert pack(*_pack_arguments(WEIGHTS[0], M), ctypes.byref(form), None, ctypes.byref(size)) != 0


def test_default_choice_whatever_is_chosen_is_reported_and_computes_the_same(caplog):
    lowered = _lowered(WEIGHTS[:1])
    with caplog.at_level(logging.INFO, logger="tir_byoc"):
        offloaded = tir_byoc.offload(lowered, backends="onednn")
    packed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("packed: ")]
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not packed: ")]
    if packed:
        assert _names(offloaded) == ["fused_matmul_add_gelu_packed"]
        assert packed[0].endswith(("(library)", "(transposed)")) and not kept
    else:
        assert _names(offloaded) == ["fused_matmul_add_gelu"]
        assert "as fast with the plain weight" in kept[0]
    (result,) = _run(offloaded, X)
    (expected,) = _run(lowered, X)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)


def test_a_form_named_plain_packs_nothing(monkeypatch):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "plain")
    assert _names(tir_byoc.offload(_lowered(WEIGHTS[:1]), backends="onednn")) == [
        "fused_matmul_add_gelu"
    ]


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_every_2d_constant_weight_of_a_real_model_packs_and_the_result_equals_torch(
    monkeypatch, caplog, name
):
    """Issue 15 on the models people run: each Linear's weight (a constant after
    ``from_exported_program``) is packed, only the attention's batched operands are not."""
    from support import real_models

    from tir_byoc.testing import models

    # fp32 goes to MKL, whose packing is named by TIR_BYOC_MKL_PACK (oneDNN's for the record).
    monkeypatch.setenv("TIR_BYOC_MKL_PACK", "library")
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "transposed")
    model = models.MODELS[name]()
    with caplog.at_level(logging.INFO, logger="tir_byoc"):
        compiled = real_models.compile_model(model)
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not packed: ")]
    assert kept and all(line.endswith("a batched weight is not packed") for line in kept), kept
    calls = real_models.library_calls(compiled.offloaded)
    unbatched = [c for c in calls if c.batch == 1 or c.symbol.endswith("_gemm")]
    assert unbatched and all(c.func.endswith("_packed") for c in unbatched), [
        c.func for c in unbatched if not c.func.endswith("_packed")
    ]
    np.testing.assert_allclose(compiled.run(), compiled.expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("form", ["transposed", "library", None])
def test_a_symbolic_m_packs_only_a_form_valid_for_every_m(monkeypatch, form):
    """Issue 15, item 3 and issue 50: the transposed weight serves every M; oneDNN's own
    layout may depend on M, so a call whose M is known only at run time gets it by M, a
    block holding the layouts oneDNN asks for over a sample of M."""
    if form is None:
        monkeypatch.delenv("TIR_BYOC_ONEDNN_PACK")
    else:
        monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", form)
    lowered = _lowered(WEIGHTS[:1], m=tirx.Var("m", "int64"))
    offloaded = tir_byoc.offload(lowered, backends="onednn")
    if form is not None:
        assert _names(offloaded) == ["fused_matmul_add_gelu_packed"]
    for rows in (1, 7, M):
        x = RNG.standard_normal((rows, K)).astype("float32")
        (result,) = _run(offloaded, x)
        (expected,) = _run(lowered, x)
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)
