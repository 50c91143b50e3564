"""MetaSchedule's offload-or-native choice measures the packed call (issue 15, item 4).

``tune_relax`` measures the best offloaded record of a function whose weight is a Relax
constant again with the weight packed (MetaSchedule's random arguments cannot be a packed
block), compares that time with the native one, and builds the winner as measured.  The form is
named (``TIR_BYOC_ONEDNN_PACK=library``) so that a pack is always made.
"""

import numpy as np
import pytest
import tvm
from support.ms_workers import rpc_runner, tiny_search
from tvm import relax, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import local_runner
from tvm.script import relax as R

from tir_byoc import meta_schedule as tms
from tir_byoc import toolchain
from tir_byoc.meta_schedule import measure as measuring
from tir_byoc.relax import pipeline
from tir_byoc.rewrite import intrinsic_calls

pytestmark = pytest.mark.skipif(
    toolchain.unavailable("onednn") is not None, reason="the oneDNN backend is not available"
)

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})
M, K, N = 32, 64, 48
RNG = np.random.default_rng(3)
W_TAIL, W_WHOLE = (RNG.standard_normal((K, N)).astype("float32") for _ in range(2))
BIAS = RNG.standard_normal(N).astype("float32")
X = RNG.standard_normal((M, K)).astype("float32")
#: Fused PrimFuncs of the model: the chain with an exp behind it (tuned, since the exp stays
#: TVM code) and a chain alone (offloaded whole under offload="always").
TAIL, WHOLE = "fused_matmul_add_gelu_tir_exp", "fused_matmul_add_gelu"


@pytest.fixture(autouse=True)
def _named_form(monkeypatch):
    monkeypatch.setenv("TIR_BYOC_ONEDNN_PACK", "library")


def _lowered():
    x = relax.Var("x", R.Tensor((M, K), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            tail = R.matmul(x, relax.const(W_TAIL))
            tail = builder.emit(R.exp(R.nn.gelu(R.add(tail, relax.const(BIAS)))))
            whole = R.matmul(x, relax.const(W_WHOLE))
            whole = builder.emit(R.nn.gelu(R.add(whole, relax.const(BIAS))))
            out = builder.emit_output(relax.Tuple([tail, whole]))
        builder.emit_func_output(out)
    return pipeline.lower(builder.get())


def _expected():
    def gelu(z):
        from math import erf

        return 0.5 * z * (1 + np.vectorize(erf)(z / np.sqrt(2)))

    tail = np.exp(gelu(X.astype("float64") @ W_TAIL + BIAS))
    return tail, gelu(X.astype("float64") @ W_WHOLE + BIAS)


def _run(mod):
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    return [r.numpy() for r in vm["main"](tvm.runtime.tensor(X))]


def _tune(work_dir, offload, trials=4, **options):
    return tms.tune_relax(
        _lowered(),
        TARGET,
        str(work_dir),
        trials,
        offload=offload,
        backends="onednn",
        **tiny_search(**options),
    )


def _primfuncs(mod):
    return {g.name_hint: f for g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def test_the_offloaded_variant_is_measured_and_built_with_its_weight_packed(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the builder's workers make their files here
    pools = []

    class CountedPool(local_runner.PopenPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(local_runner, "PopenPoolExecutor", CountedPool)
    tuned = _tune(tmp_path, "always")
    assert list(scratch.iterdir()) == []  # every candidate's directory was removed
    # One LocalRunner (one worker process) for the search and the packed measurement.
    assert len(pools) == 1
    report = tms.load_report(tmp_path)
    # The tuned function: its best offloaded record measured again, packed, in the runner.
    tail = report[TAIL]
    assert tail.choice == "offload" and tail.trials > 0
    assert tail.best_offload_ms is not None and tail.best_packed_ms is not None
    assert tail.best_ms == tail.best_packed_ms and tail.packed == ("library",)
    assert "offload measured packed (library" in str(tail)
    # The function offloaded whole (not tuned) is packed too, by the backend's timing.
    whole = report[WHOLE]
    assert whole.choice == "offload-untuned" and whole.packed == ("library",)
    # Both calls take the packed variants, scheduled; the plain ones are gone.
    functions = _primfuncs(tuned)
    assert f"{TAIL}_packed" in functions and f"{WHOLE}_packed" in functions
    assert TAIL not in functions and WHOLE not in functions
    assert functions[f"{TAIL}_packed"].attrs["tirx.is_scheduled"]
    assert intrinsic_calls(functions[f"{TAIL}_packed"]) == {"onednn.gemm": 1}
    for result, expected in zip(_run(tuned), _expected()):
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_the_choice_compares_the_packed_time_with_the_native_one(tmp_path):
    tuned = _tune(tmp_path, "choice", trials=8)  # two functions, two variants each
    tail = tms.load_report(tmp_path)[TAIL]
    assert tail.best_native_ms is not None and tail.best_packed_ms is not None
    faster = "offload" if tail.best_packed_ms < tail.best_native_ms else "native"
    assert tail.choice == faster
    functions = _primfuncs(tuned)
    assert (f"{TAIL}_packed" in functions) == (faster == "offload")
    assert tail.packed == (("library",) if faster == "offload" else ())
    for result, expected in zip(_run(tuned), _expected()):
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_pack_weights_false_measures_and_builds_the_plain_call(tmp_path):
    tuned = _tune(tmp_path, "always", pack_weights=False)
    tail = tms.load_report(tmp_path)[TAIL]
    assert tail.choice == "offload" and tail.best_packed_ms is None and tail.packed == ()
    assert not any(name.endswith("_packed") for name in _primfuncs(tuned))


def test_an_rpc_runner_is_given_the_blocks_on_the_remote_device(tmp_path):
    with rpc_runner("tir_byoc_packed") as runner:
        own_alloc = runner.f_alloc_argument
        tuned = _tune(tmp_path, "always", runner=runner)
        # The run's runner measured the packed variant too, and has its own allocator back.
        assert runner.f_alloc_argument is own_alloc
    tail = tms.load_report(tmp_path)[TAIL]
    assert tail.best_packed_ms is not None and tail.packed == ("library",), tail
    assert f"{TAIL}_packed" in _primfuncs(tuned)
    for result, expected in zip(_run(tuned), _expected()):
        np.testing.assert_allclose(result, expected, rtol=1e-4, atol=1e-4)


def test_a_runner_that_cannot_take_blocks_leaves_the_weight_plain_and_says_why(tmp_path):
    class Elsewhere(ms.runner.PyRunner):
        pass

    func = _primfuncs(_lowered())[TAIL]
    block = tvm.runtime.tensor(np.zeros(16, "uint8"))
    ((latency, why),) = measuring.measure([func], TARGET, None, Elsewhere(), {1: block})
    assert latency is None and why == "the runner Elsewhere cannot be given packed weights"
