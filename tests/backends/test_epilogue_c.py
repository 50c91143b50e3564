"""The gemm entry point of every backend (``tir_byoc_<backend>_gemm``) against NumPy.

Each backend's library is called through ctypes with an epilogue as data (op codes, constants,
tensors; ``intrinsics/include/tir_byoc.h``) and compared with the fp32 NumPy oracle
:func:`tir_byoc.epilogues.reference` applied, op after op, to the float64 product cast to fp32:
every op alone and chains of them, both weight layouts, 2-D and batched calls, K = 0, and
products holding NaN, infinities and huge values, which must come out exactly where the
oracle has them.  Then the refused calls, and, for oneDNN, which ops its primitive fuses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import platform
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from support.backend_checks import TOLERANCES, library

from tir_byoc import toolchain
from tir_byoc.backends.cpu import cpuinfo_field
from tir_byoc.epilogues import OPS, RELU_KEEP_NAN_CODE, reference
from tir_byoc.signature import DtypeSignature

BACKENDS = ("ref", "openblas", "mkl", "onednn")
#: The backends whose epilogue runs in tir_byoc_run_epilogue (MKL shares its own parts).
C_EPILOGUE_BACKENDS = ("ref", "openblas", "onednn")
F32 = DtypeSignature.parse("float32").code
BF16 = DtypeSignature.parse("bfloat16,bfloat16->float32").code
PACKED_WEIGHT = 1 << 25  # TIR_BYOC_PACKED_WEIGHT
OK, EDTYPE, ESHAPE, ENULL, EEPILOGUE = 0, 1, 2, 3, 5
NK, KN = 0, 1  # tir_byoc_layout

# ------------------------------------------------------------------------------------------
# Epilogues as data.


@dataclass(frozen=True)
class Op:
    """One op of an epilogue: its name in :data:`OPS`, its constants (the op's example when
    None), and for relu whether it keeps NaN (a code of its own)."""

    name: str
    constants: tuple[float, ...] | None = None
    keep_nan: bool = False

    @property
    def code(self) -> int:
        return RELU_KEEP_NAN_CODE if self.keep_nan else OPS[self.name].code

    @property
    def values(self) -> tuple[float, ...]:
        return OPS[self.name].example if self.constants is None else self.constants

    def __str__(self) -> str:
        suffix = "_keep_nan" if self.keep_nan else ""
        values = "" if self.constants is None else "(" + ",".join(map(str, self.constants)) + ")"
        return self.name + suffix + values


def clip(lo, hi, nan):
    return Op("clip", (lo, hi, nan))


RELU_KEEP_NAN = Op("relu", keep_nan=True)
NAN = float("nan")

#: Every op alone, then chains, by test id.
CHAINS: dict[str, tuple[Op, ...]] = {
    **{name: (Op(name),) for name in OPS},
    "relu_keep_nan": (RELU_KEEP_NAN,),
    "scale,bias,gelu,add": (Op("scale"), Op("bias"), Op("gelu"), Op("add")),
    "bias,silu,mul": (Op("bias"), Op("silu"), Op("mul")),
    "bias,swish-1,add": (Op("bias"), Op("swish", (-1.0,)), Op("add")),
    "div,bias": (Op("div"), Op("bias")),
    "div3,bias": (Op("div", (3.0,)), Op("bias")),
    "bias,relu_keep_nan": (Op("bias"), RELU_KEEP_NAN),
    "bias,relu_keep_nan,add": (Op("bias"), RELU_KEEP_NAN, Op("add")),
    "clip_nan_to_lo": (clip(0.0, 6.0, 0.0),),
    "clip_nan_to_hi": (clip(0.0, 6.0, 6.0),),
    "clip_nan_stays": (clip(0.0, 6.0, NAN),),
    "bias,clip_nan_to_lo,add": (Op("bias"), clip(-1.0, 1.0, -1.0), Op("add")),
    "gelu_tanh,add": (Op("gelu_tanh"), Op("add")),
    # A gelu followed by ops that map NaN to a number: where oneDNN's gelu is guarded
    # (AVX-512), its NaN for +inf must be caught before the relu or clip hides it.
    "bias,gelu,relu": (Op("bias"), Op("gelu"), Op("relu")),
    "gelu,clip_nan_to_lo": (Op("gelu"), clip(0.0, 6.0, 0.0)),
    "bias,leaky_relu0": (Op("bias"), Op("leaky_relu", (0.0,))),
    "scale,bias,relu,mul": (Op("scale"), Op("bias"), Op("relu"), Op("mul")),
    "bias,channel_scale,add": (Op("bias"), Op("channel_scale"), Op("add")),  # DINOv2
    "bias,hardswish,add": (Op("bias"), Op("hardswish"), Op("add")),  # MobileNetV3
    "eight_ops": (
        Op("scale", (0.5,)),
        Op("bias"),
        Op("tanh"),
        Op("add"),
        Op("mul"),
        Op("scale", (3.0,)),
        Op("leaky_relu", (0.1,)),
        Op("add"),
    ),
}


def pack(chain) -> tuple[int, list[float]]:
    """The ``ops`` argument (a code per byte, first op lowest) and the six constants."""
    ops = sum(op.code << (8 * i) for i, op in enumerate(chain))
    constants = [c for op in chain for c in op.values]
    return ops, constants + [0.0] * (6 - len(constants))


# ------------------------------------------------------------------------------------------
# Calls as data.

#: Values a product is made to hold exactly (a (m, 1) x times a weight column of ones).
SPECIAL = np.array(
    [NAN, np.inf, -np.inf, 1e30, -1e30, 3e38, -3e38, 100, -100, 89, -89, 20, -20, 0.0, -0.0, 1],
    np.float32,
)


@dataclass(frozen=True)
class Shape:
    """One call's extents.  ``w_batch`` says along which batch dims the weight has its own
    matrices (else stride 0, broadcast); ``specials`` puts special values into the product:
    ``"column"`` makes x the column :data:`SPECIAL` (k = 1), ``"rows"`` puts NaN, +-inf,
    +-1e30 and large values into rows of the last batch's x."""

    name: str
    m: int
    n: int
    k: int
    batch: tuple[int, int] = (1, 1)
    w_batch: tuple[bool, bool] = (False, False)
    specials: str | None = None

    @property
    def lead(self) -> tuple[int, ...]:
        return () if self.batch == (1, 1) else self.batch

    @property
    def w_lead(self) -> tuple[int, ...]:
        if not self.lead:
            return ()
        return tuple(b if own else 1 for b, own in zip(self.batch, self.w_batch, strict=True))


SPECIAL_COLUMN = Shape("special_column", len(SPECIAL), 23, 1, specials="column")
SHAPES = (
    Shape("2d", 13, 37, 64),
    Shape("batched", 5, 19, 33, batch=(2, 3), w_batch=(True, False)),
    Shape("batched_broadcast", 4, 9, 16, batch=(2, 3)),
    Shape("k0", 6, 11, 0),
    SPECIAL_COLUMN,
    Shape("special_rows", 8, 21, 16, batch=(2, 3), w_batch=(True, True), specials="rows"),
)


@dataclass
class Operands:
    """The arrays of one call, laid out as the gemm entry point reads them."""

    x: np.ndarray
    w: np.ndarray  # (*w_lead, n, k) for NK, (*w_lead, k, n) for KN
    y: np.ndarray
    tensors: list[np.ndarray] = field(default_factory=list)


def make_operands(shape: Shape, layout: int, chain, rng) -> Operands:
    m, n, k = shape.m, shape.n, shape.k
    x = rng.standard_normal((*shape.lead, m, k)).astype(np.float32)
    w_matrix = (n, k) if layout == NK else (k, n)
    w = rng.standard_normal((*shape.w_lead, *w_matrix)).astype(np.float32)
    if shape.specials == "column":
        x[..., 0] = SPECIAL
        w[...] = 1.0
    elif shape.specials == "rows":
        last = x[-1, -1]  # one matrix keeps ordinary values in every other batch
        last[0, 3], last[1, 5], last[2, 7], last[3, 1] = NAN, np.inf, -np.inf, 1e30
        last[4, 2] = -1e30
        last[5] *= 30.0  # products of magnitude ~100
        last[6] *= -1e4  # ... and ~1e4, where exp overflows
    y = np.full((*shape.lead, m, n), 7.0, np.float32)
    tensors = []
    for op in chain:
        kind = OPS[op.name].tensor
        if kind is not None:
            size = (n,) if kind == "vector" else y.shape
            tensors.append(rng.standard_normal(size).astype(np.float32))
    return Operands(x, w, y, tensors)


def expected(operands: Operands, layout: int, chain) -> np.ndarray:
    """The product in float64 cast to fp32, then each op of ``chain`` as TVM computes it."""
    w = operands.w.astype(np.float64)
    w_kn = np.swapaxes(w, -1, -2) if layout == NK else w
    z = (operands.x.astype(np.float64) @ w_kn).astype(np.float32)
    tensors = iter(operands.tensors)
    for op in chain:
        tensor = next(tensors) if OPS[op.name].tensor else None
        z = reference(op.name, z, op.values, tensor, keep_nan=op.keep_nan)
    return z


def batch_arguments(shape: Shape) -> list[int]:
    """batch0, batch1, x strides, w strides (in elements) of ``shape``'s compact arrays."""
    b0, b1 = shape.batch
    matrix = shape.m * shape.k
    if not shape.lead:
        return [1, 1, 0, 0, 0, 0]
    w_matrix = shape.n * shape.k
    w_stride1 = w_matrix if shape.w_batch[1] else 0
    w_stride0 = (w_matrix * (b1 if shape.w_batch[1] else 1)) if shape.w_batch[0] else 0
    return [b0, b1, b1 * matrix, matrix, w_stride0, w_stride1]


def entry_point(backend: str, name: str = "gemm"):
    """``tir_byoc_<backend>_<name>`` (:data:`tir_byoc.toolchain.ENTRY_POINTS`), or a skip with
    the reason."""
    reason = toolchain.unavailable(backend)
    if reason is not None:
        pytest.skip(reason)
    return toolchain.entry_point(backend, name)


def pointer(array) -> int | None:
    return None if array is None else array.ctypes.data


def call(function, operands: Operands, shape: Shape, layout: int, chain, change=None) -> int:
    """Call the gemm entry point; ``change`` replaces arguments by name (dtypes, layout, ops,
    tensors) to build the refused calls."""
    ops, constants = pack(chain)
    tensors = [pointer(t) for t in operands.tensors]
    arguments = {"dtypes": F32, "layout": layout, "ops": ops, "tensors": tensors}
    arguments.update(change or {})
    tensors = list(arguments["tensors"]) + [None] * (4 - len(arguments["tensors"]))
    return function(
        pointer(operands.x),
        pointer(operands.w),
        pointer(operands.y),
        shape.m,
        shape.n,
        shape.k,
        arguments["dtypes"],
        arguments["layout"],
        *batch_arguments(shape),
        arguments["ops"],
        *constants,
        *tensors,
    )


def term_scale(operands: Operands, layout: int) -> np.ndarray:
    """The mean |x[i, r] * w[r, j]| of each output (at least 1), leaving out the non-finite and
    huge entries put into x: an fp32 sum's error grows with its terms, not with its value."""
    x = np.abs(operands.x.astype(np.float64))
    x[~np.isfinite(x) | (x >= 1e20)] = 0.0
    w = np.abs(operands.w.astype(np.float64))
    w_kn = np.swapaxes(w, -1, -2) if layout == NK else w
    k = x.shape[-1]
    return np.maximum(1.0, (x @ w_kn) / max(k, 1))


def assert_matches(got, want, k: int, scale, what: str) -> None:
    """NaN exactly where ``want`` has NaN, the same infinities, the rest within fp32
    tolerance: rtol as the backend tests, atol 1e-4 sqrt(K) on terms of size ``scale``."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions")
    infinite = np.isinf(want) | np.isinf(got)
    np.testing.assert_array_equal(got[infinite], want[infinite], err_msg=f"{what}: infinities")
    rtol, _ = TOLERANCES["float32"]
    atol = 1e-4 * math.sqrt(max(k, 1)) * np.broadcast_to(scale, want.shape)
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf
        error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    outside = ~nan & ~infinite & (error > atol + rtol * np.abs(want))
    worst = np.unravel_index(np.argmax(np.where(outside, error, -1.0)), want.shape)
    assert not outside.any(), (
        f"{what}: {outside.sum()} of {want.size} values off; at {worst}: "
        f"got {got[worst]}, expected {want[worst]} (atol {atol[worst]:.3g}, rtol {rtol})"
    )


# ------------------------------------------------------------------------------------------
# Tests.


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("layout", [NK, KN], ids=["nk", "kn"])
@pytest.mark.parametrize("chain", list(CHAINS), ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_epilogue_matches_numpy(backend, chain, layout, shape):
    function = entry_point(backend)
    ops = CHAINS[chain]
    rng = np.random.default_rng(zlib.crc32(f"{chain}/{layout}/{shape.name}".encode()))
    operands = make_operands(shape, layout, ops, rng)
    assert call(function, operands, shape, layout, ops) == OK
    want = expected(operands, layout, ops)
    what = f"{backend}.gemm {' then '.join(map(str, ops))} layout={layout} shape={shape.name}"
    assert_matches(operands.y, want, shape.k, term_scale(operands, layout), what)


@pytest.mark.parametrize("chain", list(CHAINS), ids=str)
@pytest.mark.parametrize("backend", C_EPILOGUE_BACKENDS)
def test_the_epilogue_entry_point_runs_every_op_in_c(backend, chain):
    """``tir_byoc_<backend>_epilogue`` (what benchmarks/epilogue.py times) over values with the
    specials in them: every op in C, as the oracle computes it."""
    function = entry_point(backend, "epilogue")
    ops = CHAINS[chain]
    rng = np.random.default_rng(zlib.crc32(chain.encode()))
    z = rng.standard_normal((len(SPECIAL), 41)).astype(np.float32) * 4
    z[:, 0], z[:, 40] = SPECIAL, SPECIAL[::-1]  # the vector part and the scalar tail
    operands = make_operands(Shape("alone", *z.shape, 1), NK, ops, rng)
    y = z.copy()
    code, constants = pack(ops)
    tensors = [t.ctypes.data for t in operands.tensors]
    tensors += [None] * (4 - len(tensors))
    assert function(y.ctypes.data, *y.shape, code, *constants, *tensors) == OK
    want = z
    for op, tensor in zip(ops, _tensors_of(ops, operands.tensors), strict=True):
        want = reference(op.name, want, op.values, tensor, keep_nan=op.keep_nan)
    assert_matches(y, want, 1, 1.0, f"{backend}.epilogue {' then '.join(map(str, ops))}")


def test_the_epilogue_entry_point_refuses_bad_arguments():
    function = entry_point("ref", "epilogue")
    y = np.zeros((2, 3), np.float32)
    assert function(y.ctypes.data, -1, 3, 0, *[0.0] * 6, *[None] * 4) == ESHAPE
    assert function(None, 2, 3, 0, *[0.0] * 6, *[None] * 4) == ENULL
    assert function(y.ctypes.data, 2, 3, OPS["add"].code, *[0.0] * 6, *[None] * 4) == ENULL
    assert function(y.ctypes.data, 2, 3, 0xFF, *[0.0] * 6, *[None] * 4) == EEPILOGUE
    np.testing.assert_array_equal(y, 0.0)  # nothing written by a refused call
    parts = entry_point("ref", "epilogue_parts")
    assert parts(OPS["gelu"].code, 2, 3) == 1
    assert parts(0xFF, 2, 3) == -EEPILOGUE  # the gemm entry point's refusal, negated


def _tensors_of(chain, tensors):
    """Each op's tensor (None for an op without one), in op order."""
    given = iter(tensors)
    return [next(given) if OPS[op.name].tensor else None for op in chain]


def test_special_values_reach_the_epilogue():
    # The oracle itself: the special column holds NaN and both infinities after each op that
    # keeps them, so the exact comparisons above compare something.
    operands = make_operands(SPECIAL_COLUMN, NK, (), np.random.default_rng(0))
    z = expected(operands, NK, ())
    assert np.isnan(z).any() and np.isposinf(z).any() and np.isneginf(z).any()
    assert np.isnan(expected(operands, NK, (Op("gelu"),))).any()  # gelu(-inf) = -inf * 0
    assert not np.isnan(expected(operands, NK, (Op("relu"),))).any()
    assert np.isnan(expected(operands, NK, (RELU_KEEP_NAN,))).any()


def _glibc_vector_math_expected() -> bool:
    """Whether this machine should give the C epilogue libmvec's AVX2 erff, tanhf and expf:
    x86-64 Linux with AVX2, glibc 2.35 or later (its first with erff and tanhf) and libmvec."""
    libc, version = platform.libc_ver()
    if platform.machine() != "x86_64" or libc != "glibc" or not version:
        return False
    major, minor = (int(part) for part in version.split(".")[:2])
    return (
        (major, minor) >= (2, 35)
        and "avx2" in cpuinfo_field("flags").split()
        and ctypes.util.find_library("mvec") is not None
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_c_epilogue_calls_glibc_vector_math_where_the_machine_has_it(backend):
    # The shapes above run the vector variants over each row's leading multiple of 8 (the
    # special column's rows too) and libm's scalar functions over the rest; this checks the
    # variants are really found where they exist, so those comparisons covered them.
    reason = toolchain.unavailable(backend)
    if reason is not None:
        pytest.skip(reason)
    found = _glibc_vector_math_expected() and backend != "mkl"  # MKL has its own vector math
    assert toolchain.vector_math(backend) == (toolchain.VECTOR_FUNCTIONS if found else ())


def _parts_run(tmp_path, threads: int, backends) -> dict:
    out = tmp_path / f"epilogue-parts-{threads}.npz"
    env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
    script = Path(__file__).parents[1] / "support" / "epilogue_parts_run.py"
    done = subprocess.run(
        [sys.executable, str(script), str(out), ",".join(backends)], env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(np.load(out))


def test_the_c_epilogue_shared_among_tvm_threads_computes_what_one_thread_computes(tmp_path):
    """Two threads in TVM's pool, then one: a large output's epilogue is cut into two blocks
    of rows (301 rows: uneven), a small one's is not, and the outputs are the same bits."""
    backends = [b for b in C_EPILOGUE_BACKENDS if toolchain.unavailable(b) is None]
    shared, alone = _parts_run(tmp_path, 2, backends), _parts_run(tmp_path, 1, backends)
    if int(shared["threads"]) < 2:
        pytest.skip("TVM's pool has one thread on this machine: nothing is shared")
    for backend in backends:
        for name, parts_at_two in (("large", 2), ("small", 1)):
            key = f"{backend}.{name}"
            assert int(shared[f"{key}.parts"]) == parts_at_two, key
            assert int(alone[f"{key}.parts"]) == 1, key
            for result in (shared, alone):
                np.testing.assert_allclose(
                    result[key], result[f"{key}.expected"], rtol=1e-5, atol=1e-5, err_msg=key
                )
            np.testing.assert_array_equal(shared[key], alone[key], err_msg=key)


BASE = Shape("error_paths", 2, 3, 4)

#: Calls that are refused, each a change to a well-formed call of bias then add.
REFUSED = {
    # TIR_BYOC_OP_COUNT, the first code no op has:
    "unknown op code": ({"ops": max(op.code for op in OPS.values()) + 1}, EEPILOGUE),
    "op code 255": ({"ops": 0xFF}, EEPILOGUE),
    "a byte after the end marker": ({"ops": 3 | 4 << 16}, EEPILOGUE),
    "a bias without its tensor": ({"tensors": [None, None]}, ENULL),
    "an add without its tensor": ({"tensors": ["bias", None]}, ENULL),
    "more tensors than four": ({"ops": 0x0303030303, "tensors": ["bias"] * 4}, EEPILOGUE),
    "a bf16 signature": ({"dtypes": BF16}, EDTYPE),
    # oneDNN and MKL pack: a plain weight passed as packed is refused by the block's header check.
    "the packed-weight flag": ({"dtypes": F32 | PACKED_WEIGHT}, {"onednn": 6, "mkl": 6}),
    "an unknown layout": ({"layout": 2}, ESHAPE),
}


@pytest.mark.parametrize("refusal", list(REFUSED))
@pytest.mark.parametrize("backend", BACKENDS)
def test_refused_calls(backend, refusal):
    function = entry_point(backend)
    chain = (Op("bias"), Op("add"))
    operands = make_operands(BASE, NK, chain, np.random.default_rng(1))
    # The well-formed call first: the refusal is the change's doing.
    assert call(function, operands, BASE, NK, chain) == OK
    change, status = REFUSED[refusal]
    if "tensors" in change:
        named = {"bias": pointer(operands.tensors[0])}
        change = {**change, "tensors": [named.get(t, t) for t in change["tensors"]]}
    if isinstance(status, dict):  # per backend; the others do not pack (TIR_BYOC_EDTYPE)
        status = status.get(backend, EDTYPE)
    assert call(function, operands, BASE, NK, chain, change) == status


#: Pairs of epilogues, and whether oneDNN runs them with one primitive: the constants of an op
#: run in C do not shape the primitive, those of a fused op do (see Plan in matmul.cpp).
ONEDNN_FUSION = {
    "div by non-powers of two: both in C": ((Op("div", (3.0,)),), (Op("div", (5.0,)),), True),
    "div by powers of two: both fused": ((Op("div", (8.0,)),), (Op("div", (4.0,)),), False),
    "keep-NaN relu: in C": ((Op("bias"), RELU_KEEP_NAN), (Op("bias"),), True),
    "relu: fused": ((Op("bias"), Op("relu")), (Op("bias"),), False),
    "clip turning NaN into NaN: in C": ((clip(0.0, 6.0, NAN),), (RELU_KEEP_NAN,), True),
    "clip turning NaN into lo: fused": ((clip(0.0, 6.0, 0.0),), (clip(0.0, 5.0, 0.0),), False),
    "leaky relu of slope 0: in C": ((Op("leaky_relu", (0.0,)),), (RELU_KEEP_NAN,), True),
    "leaky relu of slope 0.1: fused": ((Op("leaky_relu", (0.1,)),), (RELU_KEEP_NAN,), False),
    "gelu with another constant: in C": ((Op("gelu", (0.7,)),), (), True),
    "gelu: fused": ((Op("gelu"),), (), False),
    "ops after one in C: in C": (
        (Op("bias"), RELU_KEEP_NAN, Op("gelu")),
        (Op("bias"), RELU_KEEP_NAN, Op("tanh")),
        True,
    ),
    "bias after scale: a fused binary add": ((Op("scale"), Op("bias")), (Op("scale"),), False),
    "layer scale: a fused binary mul": ((Op("bias"), Op("channel_scale")), (Op("bias"),), False),
    "hardswish: in C": ((Op("bias"), Op("hardswish")), (Op("bias"),), True),
}


@pytest.mark.parametrize("case", list(ONEDNN_FUSION))
def test_onednn_fuses_only_the_ops_it_computes_exactly(case):
    function = entry_point("onednn")
    lib = library("onednn")
    info = (ctypes.c_int64 * 4)()
    lib.tir_byoc_onednn_cache_info(info)
    capacity = info[1]
    lib.tir_byoc_onednn_set_cache_capacity(ctypes.c_int64(256))
    first, second, same = ONEDNN_FUSION[case]
    # A shape no other test uses, so the first call creates its primitive.
    shape = Shape("fusion", 2 + list(ONEDNN_FUSION).index(case), 3, 29)
    misses = []
    try:
        for chain in (first, second):
            operands = make_operands(shape, NK, chain, np.random.default_rng(2))
            assert call(function, operands, shape, NK, chain) == OK
            want = expected(operands, NK, chain)
            assert_matches(operands.y, want, shape.k, term_scale(operands, NK), case)
            lib.tir_byoc_onednn_cache_info(info)
            misses.append(info[3])
    finally:
        lib.tir_byoc_onednn_set_cache_capacity(ctypes.c_int64(capacity))
    assert misses[1] - misses[0] == (0 if same else 1), case
