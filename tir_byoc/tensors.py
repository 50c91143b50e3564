"""A built model's inputs as TVM tensors and its outputs back, without a copy where possible.

Entry points: :func:`to_tvm` (one input: a torch tensor, a NumPy array or a TVM tensor) and
:func:`from_tvm` (what the entry returned, as NumPy arrays or torch tensors).

torch tensors go both ways through DLPack (``tvm.runtime.from_dlpack``, ``torch.from_dlpack``):
the built model reads the caller's memory and the caller gets the model's output memory, in
every dtype both sides know (float32, float16, bfloat16, int8, bool, ...).  A copy is made
only where TVM cannot take the tensor as it is, and then once:

- a strided view that is not contiguous, or contiguous data not aligned to
  :data:`ALIGNMENT` bytes (TVM's compiled code assumes that alignment; a slice such as
  ``x[1:]`` starts elsewhere) is copied into a fresh contiguous tensor;
- a sparse tensor (COO, CSR, ...) is made dense;
- a tensor with a conjugate or negative bit set is resolved.

NumPy arrays are taken through DLPack too when they are C-contiguous, aligned and of a dtype
NumPy exports that way, and copied otherwise (bfloat16 from ``ml_dtypes``, read-only arrays).
A 0-d array stays 0-d.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi

from .frontend import is_torch_tensor

#: The data alignment, in bytes, TVM requires of a tensor it does not allocate itself.
ALIGNMENT = 64


def to_tvm(value, index: int, *, copy: bool = False) -> tvm.runtime.Tensor:
    """Input ``index`` of a call as a TVM tensor on the CPU.

    Parameters
    ----------
    value : torch.Tensor, numpy.ndarray or tvm.runtime.Tensor
    index : int
        Its position among the inputs, for error messages.
    copy : bool
        Always copy (for a buffer the model writes, which must not be the caller's memory).

    Raises
    ------
    ValueError
        A value of another type, a torch layout or dtype TVM cannot take.
    """
    if is_torch_tensor(value):
        return _from_torch(value, index, copy)
    if isinstance(value, np.ndarray | np.generic):
        return _from_numpy(np.asarray(value), copy)
    if isinstance(value, tvm.runtime.Tensor):
        return tvm.runtime.tensor(value.numpy(), tvm.cpu()) if copy else value
    raise ValueError(
        f"tir_byoc.Model: expected input {index} as a NumPy array or a torch tensor, "
        f"got {type(value).__name__}"
    )


def _from_torch(tensor, index: int, copy: bool) -> tvm.runtime.Tensor:
    import torch

    # Step 1. Dense, on the CPU, without autograd or lazy conjugate/negative bits.
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        if tensor.layout not in _sparse_layouts(torch):
            raise ValueError(
                f"tir_byoc.Model: input {index} has layout {tensor.layout}; expected a dense "
                "(torch.strided) or sparse tensor"
            )
        tensor = tensor.to_dense()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.resolve_conj().resolve_neg()
    # Step 2. Copied only when TVM cannot read it where it lies.
    if copy or not tensor.is_contiguous() or tensor.data_ptr() % ALIGNMENT:
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    try:
        converted = tvm.runtime.from_dlpack(tensor)
        str(converted.dtype)  # raises for a type code TVM has no dtype for
        return converted
    except Exception as error:  # a dtype DLPack or TVM does not know (complex, uint16, ...)
        raise ValueError(
            f"tir_byoc.Model: input {index} is a {tensor.dtype} tensor, which TVM cannot take "
            f"({str(error).splitlines()[0] if str(error) else type(error).__name__}); expected "
            "a float, integer or bool tensor"
        ) from None


def _sparse_layouts(torch) -> tuple:
    return (
        torch.sparse_coo,
        torch.sparse_csr,
        torch.sparse_csc,
        torch.sparse_bsr,
        torch.sparse_bsc,
    )


def _from_numpy(array: np.ndarray, copy: bool) -> tvm.runtime.Tensor:
    if (
        not copy
        and array.flags.c_contiguous
        and array.flags.writeable
        and array.ctypes.data % ALIGNMENT == 0
        and array.dtype.kind in "biuf"
    ):
        return tvm.runtime.from_dlpack(array)
    if not array.flags.c_contiguous:
        array = np.array(array, order="C")  # np.ascontiguousarray would make a 0-d array 1-d
    return tvm.runtime.tensor(array, tvm.cpu())


def from_tvm(result, as_torch: bool, shared: frozenset = frozenset(), _path: tuple = ()):
    """What an entry returned (a tensor, or nested tuples of them), as NumPy arrays or as
    torch tensors (``as_torch``); other values as they are.

    A torch output shares the memory the model wrote it to, except at the paths (tuples of
    indices into nested tuples) in ``shared``: memory the model keeps (a constant, or a view
    of one), which is copied so that the caller cannot change the model by changing it.
    """
    if isinstance(result, tvm.runtime.Tensor):
        if not as_torch:
            return result.numpy()
        import torch

        tensor = torch.from_dlpack(result)
        return tensor.clone() if _path in shared else tensor
    if isinstance(result, tuple | list | tvm_ffi.Array):
        return tuple(from_tvm(r, as_torch, shared, (*_path, i)) for i, r in enumerate(result))
    return result


def kept_outputs(entry) -> frozenset:
    """Paths of the outputs of ``entry`` (a Relax function after TVM's build pipeline) that
    may share memory with something the model keeps between calls.

    An output is its own memory when it is a tensor the call allocated (``R.vm.alloc_tensor``
    and a call writing it); anything else (a constant, a parameter, a view that
    ``vm.builtin.reshape`` makes of either) is counted as kept, so :func:`from_tvm` copies it.
    """
    from tvm import relax

    bound = {}
    for block in getattr(entry.body, "blocks", ()):
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding):
                bound[binding.var] = binding.value

    def resolve(expr):
        while isinstance(expr, relax.Var) and expr in bound:
            expr = bound[expr]
        if isinstance(expr, relax.TupleGetItem):
            inner = resolve(expr.tuple_value)
            if isinstance(inner, relax.Tuple):
                return resolve(inner.fields[expr.index])
        return expr

    kept = set()

    def visit(expr, path):
        expr = resolve(expr)
        if isinstance(expr, relax.Tuple):
            for i, field in enumerate(expr.fields):
                visit(field, (*path, i))
        elif not (isinstance(expr, relax.Call) and expr.op == _ALLOC_TENSOR):
            kept.add(path)

    visit(entry.body.body, ())
    return frozenset(kept)


_ALLOC_TENSOR = tvm.ir.Op.get("relax.vm.alloc_tensor")


__all__ = ["ALIGNMENT", "from_tvm", "kept_outputs", "to_tvm"]
