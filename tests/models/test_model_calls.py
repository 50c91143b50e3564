"""Calling a built model the way a service does: from several threads, with any tensor type.

A Relax VM keeps the registers of the call it runs, so one VM shared by threads crashed or
mixed their values; each thread now runs its own VM over the shared executable.  oneDNN's
primitives shared one scratchpad across threads and gave wrong sums (up to 0.09 off on BERT's
output); each thread now passes its own.  Torch
tensors go in and out through DLPack, without a copy where TVM can read them as they lie.
"""

import threading

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

import tir_byoc
from tir_byoc import tensors
from tir_byoc.registry import REGISTRY
from tir_byoc.testing import models

THREADS, CALLS = 4, 25


class _Sine(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2


class _AddScalar(torch.nn.Module):
    def forward(self, x, src):
        return x + src


class _WithConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(3, dtype=torch.float32))

    def forward(self, x):
        return x * 2, self.table


def _build(module, *inputs):
    return tir_byoc.build_model(module.eval(), inputs)


@pytest.fixture(scope="module")
def sine():
    return _build(_Sine(), torch.randn(4, 8))


@pytest.mark.parametrize("backend", REGISTRY.backends)
def test_threads_calling_one_real_model_get_what_serial_calls_get(backend):
    bert = models.bert()
    model = tir_byoc.build_model(bert.module, bert.inputs, backends=backend)
    assert {i.split(".")[0] for c in model.intrinsics.values() for i in c} == {backend}
    serial = model(*bert.inputs).numpy()
    results, errors = [], []

    def serve():
        try:
            results.extend(model(*bert.inputs).numpy() for _ in range(CALLS))
        except Exception as error:  # a thread's exception would otherwise vanish
            errors.append(error)

    workers = [threading.Thread(target=serve) for _ in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors
    assert len(results) == THREADS * CALLS
    differing = [np.abs(r - serial).max() for r in results if not np.array_equal(r, serial)]
    assert not differing, (len(differing), max(differing))
    with torch.no_grad():
        np.testing.assert_allclose(serial, bert.module(*bert.inputs).numpy(), rtol=1e-4, atol=1e-4)


def test_each_thread_runs_its_own_vm(sine):
    here = sine.vm()
    there = []
    worker = threading.Thread(target=lambda: there.append(sine.vm()))
    worker.start()
    worker.join()
    assert sine.vm() is here
    assert there[0] is not here


def test_a_torch_input_is_read_where_it_lies_and_the_output_is_not_copied(sine):
    x = torch.randn(4, 8)
    (argument,) = sine.arguments((x,))
    assert torch.from_dlpack(argument).data_ptr() == x.data_ptr()
    out = sine(x)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), (torch.sin(x) * 2).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "view",
    [
        pytest.param(lambda x: torch.cat([x, x], 1)[:, ::2], id="strided"),
        pytest.param(lambda x: torch.cat([x.flatten(), x.flatten()])[1:33].view(4, 8), id="offset"),
        pytest.param(lambda x: x.to_sparse(), id="sparse-coo"),
        pytest.param(lambda x: x.to_sparse_csr(), id="sparse-csr"),
        pytest.param(lambda x: x.clone().requires_grad_(), id="requires-grad"),
    ],
)
def test_an_input_tvm_cannot_read_as_it_lies_is_copied_once_and_computed_right(sine, view):
    x = torch.randn(4, 8)
    given = view(x)
    with torch.no_grad():
        dense = given if given.layout == torch.strided else given.to_dense()
        expected = (torch.sin(dense) * 2).numpy()
    (argument,) = sine.arguments((given,))
    if given.layout == torch.strided:
        assert torch.from_dlpack(argument).data_ptr() % tensors.ALIGNMENT == 0
    np.testing.assert_allclose(sine(given).numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_torch_tensors_go_in_and_come_out_in_their_dtype(dtype):
    x = torch.randn(4, 8).to(dtype)
    built = _build(_Sine(), x)
    out = built(x)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.float().numpy(), (torch.sin(x) * 2).float().numpy(), atol=0.02)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64, torch.bool])
def test_integer_and_bool_tensors_keep_their_dtype(dtype):
    class Pick(torch.nn.Module):
        def forward(self, x):
            return torch.flip(x, [0])

    x = torch.tensor([1, 0, 1, 1], dtype=dtype)
    out = _build(Pick(), x)(x)
    assert out.dtype == dtype
    assert torch.equal(out, torch.flip(x, [0]))


def test_a_0d_input_stays_0d_from_torch_and_from_numpy():
    x, src = torch.ones(3, dtype=torch.int64), torch.tensor(5)
    built = _build(_AddScalar(), x, src)
    assert torch.equal(built(x, src), x + 5)
    np.testing.assert_array_equal(built(x.numpy(), np.array(5)), (x + 5).numpy())


def test_a_returned_constant_is_copied_so_the_caller_cannot_change_the_model():
    built = _build(_WithConstant(), torch.ones(3))
    _, table = built(torch.ones(3))
    table.add_(100)
    _, again = built(torch.ones(3))
    assert torch.equal(again, torch.arange(3, dtype=torch.float32))


def test_a_tensor_tvm_has_no_dtype_for_is_a_one_line_error(sine):
    with pytest.raises(ValueError, match=r"input 0 is a torch.complex64 tensor") as error:
        sine(torch.randn(4, 8, dtype=torch.complex64))
    assert "\n" not in str(error.value)


def test_a_prim_func_never_writes_into_the_callers_output_buffer():
    built = tir_byoc.build_model(_prim_func_double())
    x = torch.arange(4, dtype=torch.float32)
    y = torch.zeros(4)
    out = built(x, y)
    assert torch.equal(out, x * 2)
    assert torch.equal(y, torch.zeros(4))


def _prim_func_double():
    from tvm.script import tirx as T

    @T.prim_func
    def double(x: T.Buffer((4,), "float32"), y: T.Buffer((4,), "float32")):
        for i in range(4):
            y[i] = x[i] * T.float32(2)

    return double
