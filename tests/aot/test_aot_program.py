"""What the AOT build reads and refuses: the entry as a program, TIR entries, and one-line
errors for what has no plain-C form, before any file is written."""

import numpy as np
import pytest
from support import aot_harness as harness
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import tir_byoc
import tir_byoc.aot as aot
from tir_byoc.aot.program import INPUT, INTERMEDIATE, read_program
from tir_byoc.demo import lowered_mlp

pytestmark = pytest.mark.usefixtures("reference_backend")


# fmt: off
@I.ir_module
class Dynamic:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32")) -> R.Tensor(("n", 4), "float32"):
        y = R.add(x, x)
        return y


@I.ir_module
class Branchy:
    @R.function
    def main(c: R.Tensor((), "bool"), x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        if c:
            y = R.add(x, x)
        else:
            y = R.multiply(x, x)
        return y


@I.ir_module
class Packed:
    @R.function(pure=False)
    def main(x: R.Tensor((4,), "float32")) -> R.Tensor((4,), "float32"):
        y = R.call_packed("my_library.scale", x, ty_args=R.Tensor((4,), "float32"))
        return y


@I.ir_module
class Returns:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")):
        with R.dataflow():
            y = R.add(x, R.const(1.0, "float32"))
            v = R.reshape(y, (4, 4))
            w = R.multiply(v, v)
            z = R.reshape(w, (16,))
            R.output(z, y)
        return (z, x, y)
@T.prim_func(s_tir=True)
def dense_bias_relu(
    x: T.Buffer((8, 5), "float32"),
    w: T.Buffer((6, 5), "float32"),
    bias: T.Buffer((6,), "float32"),
    y: T.Buffer((8, 6), "float32"),
):
    T.func_attr({"tirx.noalias": True})
    d = T.sblock_alloc_buffer((8, 6))
    for i, j, k in T.grid(8, 6, 5):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                d[vi, vj] = T.float32(0)
            d[vi, vj] = d[vi, vj] + x[vi, vk] * w[vj, vk]
    for i, j in T.grid(8, 6):
        with T.sblock("bias_relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = T.max(d[vi, vj] + bias[vj], T.float32(0))
# fmt: on


@pytest.mark.parametrize(
    ("module", "construct"),
    [
        (Dynamic, "symbolic shape R.shape([n, 4]) of parameter x"),
        (Branchy, "control flow (R.If)"),
        (Packed, "packed call my_library.scale"),
    ],
)
def test_what_has_no_c_form_is_one_line_before_any_file(module, construct, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(aot.Unsupported) as error:
        aot.build(module, out_dir=out, name="refused")
    message = str(error.value)
    assert message == f"tir_byoc.aot: {construct} in main is not supported"
    assert "\n" not in message and error.value.function == "main"
    assert not out.exists()


def test_the_mlp_program_is_two_calls_on_one_intermediate():
    built = tir_byoc.build_model(lowered_mlp())
    program = read_program(built.module, built.entry)
    assert [b.name for b in program.inputs] == [
        "x", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"
    ]  # fmt: skip
    assert {b.kind for b in program.inputs} == {INPUT} and program.constants == ()
    (hidden, returned) = program.intermediates
    assert hidden.kind == INTERMEDIATE and hidden.shape == (64, 500)
    first, second = program.steps
    assert first.args[-1].buffer is hidden and second.args[0].buffer is hidden
    assert program.outputs[0].buffer is returned is second.args[-1].buffer
    # The VM allocates both tensors as storages of their own.
    assert program.vm_storage_bytes == 64 * 500 * 4 + 64 * 10 * 4


def test_returned_tensors_are_computed_in_place_and_a_returned_input_is_copied(tmp_path):
    artifact = aot.build(Returns, out_dir=tmp_path / "returns", name="returns")
    program = read_program(artifact.model.module, "main")
    assert [ref.buffer.kind for ref in program.outputs] == [INTERMEDIATE, INPUT, INTERMEDIATE]
    source = artifact.path("returns.c").read_text()
    assert "memcpy(out1, x, 64);" in source  # the input, returned as it is
    # y is an output and read by the next step: computed in out2, read from there.
    calls = [line.strip() for line in source.splitlines() if "status = " in line]
    assert calls[0].endswith(", out2);") and "(out2, out0)" in calls[1]
    assert artifact.workspace_bytes == 0
    x = np.arange(16, dtype="float32").reshape(2, 8)
    results, _ = harness.run(artifact, harness.make(artifact), [x])
    for result, expected in zip(results, artifact.model(x), strict=True):
        np.testing.assert_array_equal(result, expected)
    np.testing.assert_array_equal(results[0], ((x + 1) ** 2).reshape(16))


def test_a_tir_entry_takes_what_it_reads_and_writes_what_it_writes(tmp_path):
    artifact = aot.build(dense_bias_relu, out_dir=tmp_path / "tir", name="dense")
    assert [s.name for s in artifact.inputs] == ["x", "w", "bias"]
    assert [s.name for s in artifact.outputs] == ["y"]
    assert artifact.intrinsic_steps == 1 and artifact.model.intrinsics
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s.shape).astype(s.dtype) for s in artifact.inputs]
    (result,), _ = harness.run(artifact, harness.make(artifact), inputs)
    x, w, bias = inputs
    np.testing.assert_allclose(result, np.maximum(x @ w.T + bias, 0), rtol=1e-4, atol=1e-4)


def test_a_built_model_is_taken_as_it_is_and_nothing_else_with_it(tmp_path):
    built = tir_byoc.build_model(lowered_mlp())
    with pytest.raises(ValueError, match="taken as it is"):
        aot.build(built, backends="ref", out_dir=tmp_path, name="mlp")
    with pytest.raises(ValueError, match="lower-case C identifier"):
        aot.build(built, out_dir=tmp_path, name="my-model")
    with pytest.raises(ValueError, match="'embedded' or 'blob'"):
        aot.build(built, out_dir=tmp_path, name="mlp", constants="rom")
    assert list(tmp_path.iterdir()) == []
