"""A backend's pack function called on one constant weight: the form it chooses and the block.

Entry point: :func:`pack_call`, which :mod:`tir_byoc.packing` calls for each weight it packs.
The pack functions (``tir_byoc_<backend>_pack`` for a GEMM, ``tir_byoc_<backend>_conv_pack``
for a convolution; ``intrinsics/include/tir_byoc.h`` gives their protocol) take the call's
arguments without its operands, are called once with no output to choose the form and say the
block's size, and once more to write the block.
"""

from __future__ import annotations

import ctypes

import numpy as np
import tvm

from .calls import epilogue_arguments
from .match import Match
from .match.conv_records import ConvMatch
from .match.exprs import const_value

#: ``TIR_BYOC_PACK_CHOOSE`` (for one M), ``TIR_BYOC_PACK_CHOOSE_ANY_M``, and the forms of a
#: block (``TIR_BYOC_PACK_*``), by name.
PACK_CHOOSE, PACK_CHOOSE_ANY_M = -1, -2
PACK_FORMS = {
    0: "plain",
    1: "library",
    2: "transposed",
    3: "blocked",
    4: "library_by_m",
    5: "layout_by_m",
}
#: The batch a convolution of a symbolic batch is packed (and its form timed) for: oneDNN
#: asked one of ResNet-50's weights in another layout at batch 1 than at 2 and more (two
#: threads), and a call whose layout differs pays a reorder of the weight.
PACK_BATCH = 8


def pack_call(lib, match: Match, weight: tvm.runtime.Tensor, form: int | None = None):
    """``weight`` packed by ``tir_byoc_<backend>_pack`` for ``match``'s call in ``form``, or in
    the form the backend chooses (for every M if M is symbolic): ``(form, block)``, the block
    (a new uint8 tensor) None for the plain form.

    Nothing is copied on the way: the library reads the constant where it is and writes the
    block where it stays, so building a packed model holds the blocks and nothing more.
    """
    plain = np.from_dlpack(weight)  # a view of the constant
    if not plain.flags.c_contiguous:
        plain = np.ascontiguousarray(plain)
    codes, constants = epilogue_arguments(match)
    if isinstance(match, ConvMatch):
        form = PACK_CHOOSE if form is None else form
        # A symbolic batch is packed for a batch of PACK_BATCH; the conv entry point reorders
        # the block at run time for a batch whose primitive wants another layout.
        geometry = [v if isinstance(v, int) else PACK_BATCH for v in match.conv.call_arguments()]
        args = [ctypes.c_void_p(plain.ctypes.data), ctypes.c_int32(match.dtype.code)]
        args += [*map(ctypes.c_int32, geometry[:2]), *map(ctypes.c_int64, geometry[2:])]
        args += [ctypes.c_int64(codes), *(ctypes.c_double(c) for c in constants)]
        return _run_pack(lib, match, args, form)
    # A symbolic M passes one example, 1: the backend samples the M it needs itself.
    rows = const_value(match.rows)
    if form is None:
        form = PACK_CHOOSE if rows is not None else PACK_CHOOSE_ANY_M
    args = [
        ctypes.c_void_p(plain.ctypes.data),
        *(
            ctypes.c_int64(int(v))
            for v in (1 if rows is None else rows, const_value(match.n), const_value(match.k))
        ),
        ctypes.c_int32(match.dtype.code),
        ctypes.c_int32(0 if match.layout == "dense" else 1),
        ctypes.c_int64(codes),
        *(ctypes.c_double(c) for c in constants),
    ]
    return _run_pack(lib, match, args, form)


def _run_pack(lib, match: Match, args: list, form: int):
    """``(form, block)`` from the pack function ``lib`` (the block None for the plain form)."""
    chosen, size = ctypes.c_int32(form), ctypes.c_int64(0)

    def call(out):
        status = lib(*args, ctypes.byref(chosen), out, ctypes.byref(size))
        if status != 0:
            raise RuntimeError(f"packing the weight of {match.pattern} failed with status {status}")

    call(None)
    if size.value == 0:
        return chosen.value, None
    block = tvm.runtime.empty((size.value,), "uint8")
    address = np.from_dlpack(block).ctypes.data
    if address % 64:  # TVM allocates 64-byte aligned (kAllocAlignment); the block needs it
        raise RuntimeError(f"expected a 64-byte aligned tensor from TVM, got one at {address:#x}")
    call(ctypes.c_void_p(address))
    return chosen.value, block


__all__ = ["PACK_BATCH", "PACK_CHOOSE", "PACK_CHOOSE_ANY_M", "PACK_FORMS", "pack_call"]
