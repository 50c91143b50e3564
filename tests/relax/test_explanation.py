"""explanation: ``tir_byoc.explain`` lists every decline of a Relax module, the Relax rewrites'
with the matcher's, and every rewrite's ``find`` declines with :class:`Decline` values."""

from __future__ import annotations

import importlib
import json

import pytest
import tvm

import tir_byoc
from tir_byoc import cli
from tir_byoc.decline import CONVOLUTION, GEMM_CHAIN, RESHAPE_FOLD, WEIGHT_COPY, Decline
from tir_byoc.offload import offload_plan
from tir_byoc.planning import Planner
from tir_byoc.relax import pipeline, weight_copies

#: A Relax module with one candidate each rewrite, and the matcher, leaves as it was: a
#: channels-last conv2d, a reshape of a matmul on an input that is no reshape, a reduction over
#: two axes, and a GEMM on an activation copied by a transpose it cannot read through.
MIXED = """
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T


@I.ir_module
class Mixed:
    @T.prim_func(private=True, s_tir=True)
    def two_axes(
        X: T.Buffer((4, 3, 2), "float32"),
        W: T.Buffer((5, 3, 2), "float32"),
        Y: T.Buffer((4, 5), "float32"),
    ):
        for i, j, k, l in T.grid(4, 5, 3, 2):
            with T.sblock("dense2"):
                vi, vj, vk, vl = T.axis.remap("SSRR", [i, j, k, l])
                with T.init():
                    Y[vi, vj] = T.float32(0)
                Y[vi, vj] = Y[vi, vj] + X[vi, vk, vl] * W[vj, vk, vl]

    @T.prim_func(private=True, s_tir=True)
    def swap(A: T.Buffer((3, 2, 6), "float32"), B: T.Buffer((2, 3, 6), "float32")):
        for n, i, k in T.grid(2, 3, 6):
            with T.sblock("T_transpose"):
                vn, vi, vk = T.axis.remap("SSS", [n, i, k])
                B[vn, vi, vk] = A[vi, vn, vk]

    @T.prim_func(private=True, s_tir=True)
    def linear(
        X: T.Buffer((2, 3, 6), "float32"),
        W: T.Buffer((5, 6), "float32"),
        Y: T.Buffer((2, 3, 5), "float32"),
    ):
        for n, i, j, k in T.grid(2, 3, 5, 6):
            with T.sblock("matmul"):
                vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
                with T.init():
                    Y[vn, vi, vj] = T.float32(0)
                Y[vn, vi, vj] = Y[vn, vi, vj] + X[vn, vi, vk] * W[vj, vk]

    @R.function
    def main(
        x: R.Tensor((1, 6, 6, 2), "float32"),
        w: R.Tensor((3, 2, 2, 2), "float32"),
        a: R.Tensor((32, 64), "float32"),
        b: R.Tensor((64, 128), "float32"),
        p: R.Tensor((4, 3, 2), "float32"),
        q: R.Tensor((5, 3, 2), "float32"),
        u: R.Tensor((3, 2, 6), "float32"),
        v: R.Tensor((5, 6), "float32"),
    ):
        cls = Mixed
        with R.dataflow():
            y = R.nn.conv2d(x, w, data_layout="NHWC", out_layout="NHWC")
            m = R.matmul(a, b, out_dtype="float32")
            z = R.reshape(m, R.shape([2, 16, 128]))
            t = R.call_tir(cls.two_axes, (p, q), out_ty=R.Tensor((4, 5), "float32"))
            ut = R.call_tir(cls.swap, (u,), out_ty=R.Tensor((2, 3, 6), "float32"))
            g = R.call_tir(cls.linear, (ut, v), out_ty=R.Tensor((2, 3, 5), "float32"))
            R.output(y, z, t, g)
        return (y, z, t, g)
"""

#: (what, function, site, nearest) of each decline of ``Mixed``, in the order explain lists
#: them: the Relax rewrites' in pipeline order, then the lowered module's.
EXPECTED = [
    (CONVOLUTION, "main", ("y",), "relax.nn.conv2d"),
    (RESHAPE_FOLD, "main", ("z",), "relax.reshape"),
    (GEMM_CHAIN, "two_axes", ("dense2",), "dense"),
    (WEIGHT_COPY, "linear", ("matmul",), "dense"),
]


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "mixed.py"
    path.write_text(MIXED)
    return path


@pytest.fixture(scope="module")
def mixed(mixed_file):
    (definition,) = tir_byoc.tvmscript.load(mixed_file)
    return definition.module


def _rewrite_module(make_pass):
    """The module of a pipeline pass, when it is a rewrite with ``find``."""
    module = importlib.import_module(make_pass.__module__)
    return module if callable(getattr(module, "find", None)) else None


def test_explain_lists_the_relax_rewrites_declines_with_the_matchers(mixed):
    before = tvm.ir.save_json(mixed)
    declines = tir_byoc.explain(mixed)
    assert [(d.what, d.func, d.blocks, d.nearest) for d in declines] == EXPECTED
    assert all(isinstance(d, Decline) and not d for d in declines)
    conv, reshape, chain, copy = declines
    assert str(conv) == (
        "main: y = relax.nn.conv2d: not as im2col + GEMM (layouts NHWC/OIHW/NHWC; im2col serves "
        "NCHW/OIHW/NCHW)"
    )
    assert reshape.reason == "the matmul's input a is not a reshape (folding would add one)"
    assert chain.reason == "block reduces over 2 axes; the family reduces over one (k)"
    assert copy.reason.startswith("reads X, a copy that swap makes on every call of main")
    assert tvm.ir.save_json(mixed) == before  # explain rewrites nothing


def test_a_lowered_relax_module_is_explained_as_it_is(mixed):
    lowered = pipeline.lower(mixed)
    declines = tir_byoc.explain(lowered)
    assert declines == offload_plan(lowered).rejections
    assert {d.what for d in declines} == {GEMM_CHAIN, WEIGHT_COPY}


def test_every_rewrite_declines_with_decline_values(mixed):
    # The pipeline's stages, each rewrite's find run where the pipeline runs its pass.
    mod, kinds, rewrites = mixed, set(), 0
    for make_pass in (*pipeline.BEFORE_LEGALIZE, *pipeline.LOWERING):
        rewrite = _rewrite_module(make_pass)
        if rewrite is not None:
            rewrites += 1
            sites, declines = rewrite.find(mod)
            assert isinstance(sites, tuple) and isinstance(declines, tuple)
            assert all(isinstance(d, Decline) and not d and d.reason for d in declines)
            kinds.update(d.what for d in declines)
        mod = make_pass()(mod)
    assert rewrites >= 6  # wrap_indices, convolutions, linear_reshapes, ..., fuse_rows
    planner = Planner(None, tir_byoc.REGISTRY)
    _, declines = weight_copies.find(mod, planner.plan_function)
    assert [(d.what, d.func) for d in declines] == [(WEIGHT_COPY, "linear")]
    assert kinds == {CONVOLUTION, RESHAPE_FOLD}


def test_the_command_line_explains_a_relax_file_with_its_rewrites_declines(mixed_file, capsys):
    assert cli.main(["explain", str(mixed_file)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["FUNCTION", "BLOCKS", "NEAREST", "WHY", "NOT"]
    assert [row.split()[:3] for row in rows] == [
        [func, ", ".join(blocks), nearest] for _, func, blocks, nearest in EXPECTED
    ]
    assert cli.main(["explain", str(mixed_file), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["function"], tuple(r["blocks"]), r["nearest"]) for r in records] == [
        (func, blocks, nearest) for _, func, blocks, nearest in EXPECTED
    ]
    assert records[0]["reason"] == "layouts NHWC/OIHW/NHWC; im2col serves NCHW/OIHW/NCHW"
