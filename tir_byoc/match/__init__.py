"""The matcher: find GEMM + epilogue chains in S-TIR PrimFuncs, by semantics.

Entry point: :func:`scan_function`, which returns a :class:`FunctionScan` holding one
:class:`Match` per chain found and one :class:`~tir_byoc.decline.Decline` per block that looked
like part of a chain but was refused, with the reason.

A chain is a reduction block computing ``Y[..., i, j] = sum_k X[..., i, k] * W[..., ., .]``
followed by zero or more elementwise blocks, linked through intermediate buffers that
nothing else touches.  The elementwise blocks are composed into one expression of the
product and read as an epilogue of :data:`tir_byoc.epilogues.OPS` (bias, gelu, a residual
add, ...), never by how they are spelled or split into blocks.  Anything that cannot be
proven to compute a pattern exactly is refused: a wrong offload is worse than a missed one.

The matcher only reads IR; :mod:`tir_byoc.rewrite` builds the replacement from a Match.

One idea per module, each calling only those listed after it:

- :mod:`.scan`: :func:`scan_function`, the entry point;
- :mod:`.chain`: grows a chain from a reduction through its epilogues;
- :mod:`.explain`: reasons for candidates the chain search never reaches;
- :mod:`.epilogue`: the epilogue recognition: rules keyed by the root operation, and the
  templates of :mod:`.templates`;
- :mod:`.templates`: the ops of fixed form, matched by their spellings as templates (read from
  the ops' records in :mod:`tir_byoc.epilogues`);
- :mod:`.reduction`: the GEMM analysis;
- :mod:`.batch`: the batch dims of a GEMM;
- :mod:`.stir`: S-TIR facts (loop nests, buffer uses, binding and compactness);
- :mod:`.extents`: extents proven equal, and shapes the loops cover;
- :mod:`.records`: Match, FunctionScan;
- :mod:`.exprs`: reading expressions, and the words reports use for them;
- :mod:`.traversal`: structural walks and mutations without the FFI wrappers' per-call setup.
"""

from ..patterns import PATTERNS
from .records import RELU_KEEPS_NAN, RELU_NAN_TO_ZERO, FunctionScan, Match
from .scan import scan_function
from .stir import is_s_tir

__all__ = [
    "PATTERNS",
    "RELU_KEEPS_NAN",
    "RELU_NAN_TO_ZERO",
    "FunctionScan",
    "Match",
    "is_s_tir",
    "scan_function",
]
