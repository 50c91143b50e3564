"""Shared test helpers: offload a PrimFunc, run it before and after, compare every buffer.

Thin wrappers over :mod:`tir_byoc.testing` with the signatures the tests use: the inputs come
from :mod:`tir_byoc.testing.inputs`, compiling, running and comparing (tolerances per dtype,
widened with sqrt(K); integers exact) from :mod:`tir_byoc.testing.equivalence`, and intrinsic
counts from :func:`tir_byoc.rewrite.intrinsic_calls`.  A symbolic extent not given in
``sizes`` is :data:`DEFAULT_EXTENT`.

(Not in conftest.py: tests/properties has a conftest of its own, and ``from byoc_testing import``
would pick whichever was imported first.)
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import s_tir, tirx

import tir_byoc
from tir_byoc.rewrite import intrinsic_calls
from tir_byoc.testing import equivalence, inputs

#: The value of a symbolic extent a test does not give.
DEFAULT_EXTENT = 5


def random_arguments(func: tirx.PrimFunc, sizes=None, seed=0) -> list[np.ndarray]:
    """One random array per buffer parameter (symbolic dims from ``sizes``, default 5)."""
    return inputs.random_arguments(func, sizes, seed, default_extent=DEFAULT_EXTENT)


def run(func: tirx.PrimFunc, arrays) -> list[np.ndarray]:
    """Build ``func`` for llvm, run it on copies of ``arrays``, return every buffer after."""
    return equivalence.run(func, arrays)


def assert_equivalent(func: tirx.PrimFunc, sizes=None, expect_calls=None, **offload_options):
    """Offload ``func`` and check that every buffer ends up the same as without offloading.

    Returns the offloaded function.  ``expect_calls`` (dict intrinsic -> count) is checked
    against :func:`intrinsic_calls` of the offloaded function.
    """
    offloaded = tir_byoc.offload(func, **offload_options)
    bindings = inputs.resolved_sizes(func, sizes, default_extent=DEFAULT_EXTENT)
    equivalence.assert_equivalent(func, offloaded, bindings=bindings)
    if expect_calls is not None:
        assert intrinsic_calls(offloaded) == expect_calls
    return offloaded


def only_match(func) -> tir_byoc.Match:
    matches = tir_byoc.scan(func)
    assert len(matches) == 1, matches
    return matches[0]


def reasons(func) -> list[str]:
    return [r.reason for r in tir_byoc.explain(func)]


__all__ = [
    "DEFAULT_EXTENT",
    "assert_equivalent",
    "intrinsic_calls",
    "only_match",
    "random_arguments",
    "reasons",
    "run",
]


def numpy_pattern(name, x, w, *tensors):
    """What pattern ``name`` computes in NumPy, its epilogue's constants those of ``describe``.

    ``tensors`` are the epilogue's bias, residual and gate arrays, in op order.
    """
    from tir_byoc.epilogues import OPS, reference
    from tir_byoc.patterns import pattern

    member = pattern(name)
    y = x @ (np.swapaxes(w, -1, -2) if member.layout == "dense" else w)
    given = iter(tensors)
    for op in member.ops:
        tensor = next(given) if OPS[op].tensor else None
        y = reference(op, y, OPS[op].example, tensor)
    return y


def called_intrinsic(name, backend="ref") -> str:
    """The intrinsic of ``backend`` that serves pattern ``name``."""
    from tir_byoc.patterns import pattern

    return f"{backend}.{pattern(name).call_pattern}"


def representatives() -> list[str]:
    """A small set of members that covers the family, for tests that build each member.

    Every member with a fixed epilogue, then every other canonical epilogue once and each of
    the reordered ones, its weight layout and batch form turning with each.
    """
    from tir_byoc.epilogues import epilogues
    from tir_byoc.patterns import (
        BATCH_FORMS,
        FAMILY,
        FIXED_EPILOGUES,
        REORDERED_EPILOGUES,
        WEIGHT_LAYOUTS,
        Pattern,
    )

    forms = [(layout, batch) for batch in BATCH_FORMS for layout in WEIGHT_LAYOUTS]
    chosen = [n for n, p in FAMILY.items() if p.ops in FIXED_EPILOGUES]
    others = [e for e in epilogues() if e not in FIXED_EPILOGUES] + list(REORDERED_EPILOGUES)
    for turn, epilogue in enumerate(others):
        layout, batch = forms[turn % len(forms)]
        chosen.append(Pattern(layout, epilogue, batch).name)
    return chosen


def sample_patterns() -> list[str]:
    """Members for tests that compile each one: the fixed ones, each op alone in turning
    layouts and batch forms, and long chains."""
    from tir_byoc.patterns import FIXED_EPILOGUES, pattern

    chosen = [
        n
        for n in representatives()
        if len(pattern(n).ops) <= 1 or pattern(n).ops in FIXED_EPILOGUES
    ]
    return [
        *chosen,
        "batch_dense_scale_bias_gelu_add",
        "bmm_matmul_div_bias_gelu_tanh_mul",
        "matmul_bias_silu_mul",
        "dense_scale_bias_clip_add",
    ]


def lowered(make_output, shape) -> tirx.PrimFunc:
    """The PrimFunc :func:`tir_byoc.build_model` lowers the Relax ``make_output(x)`` to, for a
    float32 ``x`` of ``shape`` (the module must lower to one PrimFunc)."""
    from tvm import relax
    from tvm.script import relax as R

    from tir_byoc.relax import pipeline

    x = relax.Var("x", R.Tensor(shape, "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(make_output(x))
        builder.emit_func_output(out)
    mod = pipeline.lower(builder.get())
    (func,) = [f for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


def relax_inputs(mod: tvm.IRModule, seed: int = 0) -> list[np.ndarray]:
    """Standard-normal float32 arrays for the parameters of ``mod["main"]`` (static shapes)."""
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
        for p in mod["main"].params
    ]


def vector_loads(func: tirx.PrimFunc) -> list:
    """The vector loads left in ``func`` once TVM's vectoriser has run over it, simplified
    first as TVM's lowering does (a condition the simplifier folds is then gone)."""
    passes = [
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True),
    ]
    mod = tvm.transform.Sequential(passes)(tvm.IRModule({"main": func}))
    loads = []
    tvm_ffi.structural_walk(
        mod["main"].body,
        (tvm.ir.TensorLoad, lambda load: loads.append(load) if load.ty.dtype.lanes > 1 else None),
    )
    return loads


#: How many floats :func:`pointwise_func` maps: 4 million.
POINTS = 1 << 22


def pointwise_func(expression, lanes: int) -> tirx.PrimFunc:
    """y = expression(x) over :data:`POINTS` float32s, in a loop of ``lanes``-wide vectors
    (1: a serial loop); ``expression`` builds a TIR expression from an element of x."""
    from tvm import te

    x = te.placeholder((POINTS,), "float32", name="x")
    y = te.compute((POINTS,), lambda i: expression(x[i]), name="y")
    func = te.create_prim_func([x, y])
    if lanes == 1:
        return func
    sch = s_tir.Schedule(func)
    (loop,) = sch.get_loops(sch.get_sblock("y"))
    sch.vectorize(sch.split(loop, [None, lanes])[1])
    return sch.mod["main"]


def run_pointwise(built, x: np.ndarray) -> np.ndarray:
    """A built :func:`pointwise_func` over ``x`` (at most :data:`POINTS` values)."""
    padded = np.zeros(POINTS, "float32")
    padded[: x.size] = x
    out = tvm.runtime.tensor(np.empty_like(padded))
    built(tvm.runtime.tensor(padded), out)
    return out.numpy()[: x.size]
