"""Constant weights packed once (issue 15): what is packed, what is not, and that a pack never
changes a result or meets a call it was not made for.

oneDNN packs a weight only where the layout it prefers is blocked (brgemm CPUs); on AVX2 it
prefers a plain one and nothing would be packed, so the tests of the mechanism ask it to pack
whatever it chooses (``TIR_BYOC_ONEDNN_PACK=always``), and one test checks the default.
"""

import ctypes
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
import tvm_ffi
from backend_checks import library
from tvm import ir, relax, tirx
from tvm.script import relax as R

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.packing import PACKED_WEIGHT_FLAG

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="the oneDNN backend is not available"
)

M, K, N = 64, 96, 80


@pytest.fixture(autouse=True)
def _pack_always(monkeypatch, request):
    if "default_choice" not in request.node.name:
        monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "always")


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
    passes = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
    ]
    return tvm.transform.Sequential(passes)(builder.get())


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


def test_a_constant_weight_is_packed_once_and_the_result_is_unchanged():
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


def _pack(lib, weight, m):
    pack = lib.tir_byoc_onednn_pack
    pack.restype = ctypes.c_int32
    args = [
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
    size = ctypes.c_int64(0)
    assert pack(*args, None, ctypes.byref(size)) == 0
    block = np.zeros(size.value + 64, np.uint8)
    start = (-block.ctypes.data) % 64
    aligned = block[start : start + size.value]
    assert pack(*args, ctypes.c_void_p(aligned.ctypes.data), ctypes.byref(size)) == 0
    return aligned


def test_a_pack_only_serves_the_call_it_was_made_for():
    lib = library("onednn")
    gemm = lib.tir_byoc_onednn_gemm
    gemm.restype = ctypes.c_int32
    weight = WEIGHTS[0]
    block = _pack(lib, weight, M)
    y = np.zeros((M, N), np.float32)
    assert gemm(*_gemm_arguments(lib, block, y, X, M, PACKED_WEIGHT_FLAG)) == 0
    plain = np.zeros((M, N), np.float32)
    assert gemm(*_gemm_arguments(lib, weight, plain, X, M, 0)) == 0
    np.testing.assert_allclose(y, plain, rtol=1e-6, atol=1e-6)
    # A block whose header names another layout is refused (TIR_BYOC_EPACKED), never used.
    stale = block.copy()
    stale[8] ^= 0xFF
    assert gemm(*_gemm_arguments(lib, stale, y, X, M, PACKED_WEIGHT_FLAG)) == 6
    # The plain weight handed over as if it were packed: refused too.
    assert gemm(*_gemm_arguments(lib, weight, y, X, M, PACKED_WEIGHT_FLAG)) == 6


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


def test_default_choice_a_weight_is_packed_where_onednn_prefers_a_blocked_layout():
    lib = library("onednn")
    pack = lib.tir_byoc_onednn_pack
    pack.restype = ctypes.c_int32
    weight = WEIGHTS[0]
    args = [
        ctypes.c_void_p(weight.ctypes.data),
        ctypes.c_int64(M),
        ctypes.c_int64(N),
        ctypes.c_int64(K),
        ctypes.c_int32(0x010101),
        ctypes.c_int32(1),
        ctypes.c_int64(tir_byoc.epilogues.OPS["gelu"].code),
        ctypes.c_double(np.sqrt(0.5)),
        *(ctypes.c_double(0) for _ in range(5)),
    ]
    size = ctypes.c_int64(-1)
    assert pack(*args, None, ctypes.byref(size)) == 0
    lowered = _lowered(WEIGHTS[:1])
    offloaded = tir_byoc.offload(lowered, backends="onednn")
    expected_names = ["fused_matmul_add_gelu_packed" if size.value else "fused_matmul_add_gelu"]
    assert _names(offloaded) == expected_names
    (result,) = _run(offloaded, X)
    (expected,) = _run(lowered, X)
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)
