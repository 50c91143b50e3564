"""relax.pipeline: the whole order in one place, registered with TVM as ``"tir_byoc"``.

A TVM user who never calls ``build_model`` compiles with ``tvm.compile(mod, target,
relax_pipeline=relax.get_pipeline("tir_byoc"))`` and gets the module ``build_model`` builds:
offloaded, the weight copies folded, and the numbers NumPy computes.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

import tir_byoc
from tir_byoc.demo import BATCH, IN_FEATURES, MLP, mlp_reference, mlp_weights
from tir_byoc.relax import pipeline
from tir_byoc.relax.linear_reshapes import FoldLinearReshapes
from tir_byoc.rewrite import intrinsic_calls

pytestmark = pytest.mark.usefixtures("reference_backend")


def _mlp() -> tvm.IRModule:
    """The demo's MLP as ``relax.frontend.nn`` exports it: Relax operators, nothing lowered."""
    spec = {"forward": {"x": nn.spec.Tensor((BATCH, IN_FEATURES), "float32")}}
    mod, _ = MLP().export_tvm(spec=spec)
    return mod


@tvm.instrument.pass_instrument
class _AfterPipeline:
    """Keeps the module the registered pipeline returned inside ``tvm.compile``."""

    def __init__(self):
        self.module = None

    def run_after_pass(self, mod, info):
        if info.name == "tir_byoc.Pipeline":
            self.module = mod


def _intrinsics(mod: tvm.IRModule) -> dict[str, int]:
    """How often each intrinsic is called, over every PrimFunc of ``mod``."""
    counts: dict[str, int] = {}
    for _, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            for name, n in intrinsic_calls(func).items():
                counts[name] = counts.get(name, 0) + n
    return counts


def test_tvm_compile_with_the_registered_pipeline_offloads_and_computes_what_numpy_does():
    mod = _mlp()
    after = _AfterPipeline()
    with tvm.transform.PassContext(instruments=[after]):
        executable = tvm.compile(
            mod, target="llvm", relax_pipeline=relax.get_pipeline(pipeline.NAME)
        )
    # Both GEMMs called their intrinsics, on the weights themselves: the transposes are gone.
    assert _intrinsics(after.module) == {"ref.dense_bias_relu": 1, "ref.dense_bias": 1}
    assert not [g for g, _ in after.module.functions_items() if "transpose" in g.name_hint]
    vm = relax.VirtualMachine(executable, tvm.cpu())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, IN_FEATURES)).astype("float32")
    params = mlp_weights(rng)
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, *params)]).numpy()
    np.testing.assert_allclose(result, mlp_reference(x, *params), rtol=1e-4, atol=1e-4)


def test_the_registered_pipeline_builds_the_module_build_model_builds():
    target = tvm.target.Target("llvm")
    with target:
        piped = relax.get_pipeline("tir_byoc")(_mlp())
    built = tir_byoc.build_model(_mlp(), target=target)
    tvm.ir.assert_structural_equal(piped, built.module)
    assert _intrinsics(piped) == {"ref.dense_bias_relu": 1, "ref.dense_bias": 1}


def test_the_options_reach_the_offload():
    with tvm.target.Target("llvm"):
        native = relax.get_pipeline("tir_byoc", offload=False)(_mlp())
    assert _intrinsics(native) == {}


def test_the_order_is_the_rewrites_then_the_lowering():
    passes = pipeline.lowering_passes()
    assert passes == (*pipeline.BEFORE_LEGALIZE, *pipeline.LOWERING)
    assert passes.index(FoldLinearReshapes) < passes.index(relax.transform.LegalizeOps)
    assert passes[-1] is relax.transform.FuseTIR


def test_without_a_target_in_scope_the_pipeline_says_what_it_expected():
    with pytest.raises(ValueError, match=r"^tir_byoc pipeline: expected an llvm \(CPU\) target"):
        relax.get_pipeline("tir_byoc")(_mlp())


def test_a_reshape_of_symbolic_shapes_is_a_view_and_no_uncalled_copy_is_built():
    # Scores of (batch, heads, seq, seq) computed per call, reshaped to (batch * heads, seq,
    # seq) for a batched matmul.  The default rules would rewrite that reshape's loops out of
    # the form RewriteDataflowReshape recognises (the build would copy); stage 4 makes it a
    # view first, and stage 6 drops the copy LegalizeOps writes again and nothing calls.
    torch = pytest.importorskip("torch")

    class Scores(torch.nn.Module):
        def forward(self, x):
            b, h, s, d = x.shape
            scores = (x @ x.transpose(-1, -2)).exp()
            return (scores.reshape(b * h, s, s) @ x.reshape(b * h, s, d)).sum(-1)

    module = Scores().eval()
    built = tir_byoc.build_model(
        module, (torch.randn(2, 4, 8, 16),), dynamic={0: {0: ("batch", 1, 4), 2: ("seq", 1, 32)}}
    )
    names = [gvar.name_hint for gvar, _ in built.module.functions_items()]
    assert not [name for name in names if name.startswith("reshape")], names
    assert set(built.unscheduled) <= {"shape_func", "tir_byoc_check_bounds"}
    generator = torch.Generator().manual_seed(0)
    for shape in ((1, 4, 5, 16), (3, 4, 32, 16)):
        x = torch.randn(*shape, generator=generator) * 0.25  # scores of order 1
        np.testing.assert_allclose(built(x), module(x).numpy(), rtol=1e-4, atol=1e-4)
