"""The pattern family tir_byoc offloads, declared once as data.

A pattern is three choices:

* a **weight layout**: ``dense`` (``Y[i, j] = sum_k X[i, k] * W[j, k]``, weight N x K) or
  ``matmul`` (``Y[i, j] = sum_k X[i, k] * W[k, j]``, weight K x N);
* a **batch form**: ``none`` (2-D X and Y), ``leading`` (leading batch dims on X and Y, a 2-D
  weight shared by every batch row) or ``batched`` (X, W and Y all carry a batch dim, as a
  batched matmul; a batch dim of 1 broadcasts);
* an **epilogue**: an ordered tuple of operations with parameters, in any order, as many as
  one call carries (:func:`tir_byoc.epilogues.epilogue_error`); the operations are data
  (:data:`tir_byoc.epilogues.OPS`).

Names say all three: ``dense``, ``matmul_bias_relu``, ``batch_dense_bias`` (leading batch
dims), ``bmm_matmul`` (batched), ``dense_bias_scale`` (the scale after the bias).  The
matcher recognises every member; :data:`PATTERNS` lists the canonical ones (an epilogue of at
most one op per slot, in slot order: :func:`tir_byoc.epilogues.epilogues`).  A
``leading`` member is called through its 2-D member's entry point, its batch dims folded into
M (:attr:`Pattern.call_pattern`); the ``none`` and ``batched`` members have entry points of
their own (:data:`CALL_PATTERNS`, the calling conventions of ``intrinsics/include/tir_byoc.h``);
a member whose epilogue is more than a bias and a relu is called through the one entry point
that takes the epilogue as data (:data:`GEMM_ENTRY`).
:func:`pattern` reads any member's name; :func:`describe` builds
any member's TIR description (an S-TIR PrimFunc with symbolic extents, built with TE the way
TVM lowers the operators), which the tests scan to check that the matcher recognises every
pattern from its own description, and which doubles as a numerical oracle.  An intrinsic
states the member it serves by name (:class:`tir_byoc.registry.Intrinsic`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import te, tirx

from .epilogues import OPS, compose, epilogue_error, epilogues

#: Weight layouts: the name of the pattern family and the weight's index order.
WEIGHT_LAYOUTS = {"dense": "nk", "matmul": "kn"}

#: Batch forms, with the prefix they give a pattern's name.
BATCH_FORMS = {"none": "", "leading": "batch_", "batched": "bmm_"}

#: Epilogue operations (:data:`tir_byoc.epilogues.OPS`), in slot order.
EPILOGUE_OPS = tuple(OPS)

#: The epilogues with entry points of their own (``tir_byoc_<backend>_dense_bias_relu``, ...).
FIXED_EPILOGUES = ((), ("bias",), ("relu",), ("bias", "relu"))

#: The entry point that takes the weight layout, the batch and the epilogue as arguments.
GEMM_ENTRY = "gemm"


@dataclass(frozen=True)
class EpilogueOp:
    """One operation of an epilogue: its name and its parameters (constants), if any."""

    name: str
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        if self.name not in OPS:
            raise ValueError(f"epilogue op: expected one of {EPILOGUE_OPS}, got {self.name!r}")


@dataclass(frozen=True)
class Pattern:
    """One member of the family.

    Parameters
    ----------
    layout : str
        ``"dense"`` (weight N x K) or ``"matmul"`` (weight K x N).
    epilogue : tuple of EpilogueOp or str
        The operations in the order they apply; names are turned into :class:`EpilogueOp`.
    batch : str
        A key of :data:`BATCH_FORMS`.
    """

    layout: str
    epilogue: tuple[EpilogueOp, ...] = ()
    batch: str = "none"

    def __post_init__(self):
        if self.layout not in WEIGHT_LAYOUTS:
            raise ValueError(
                f"pattern: expected layout in {sorted(WEIGHT_LAYOUTS)}, got {self.layout!r}"
            )
        if self.batch not in BATCH_FORMS:
            raise ValueError(
                f"pattern: expected batch form in {sorted(BATCH_FORMS)}, got {self.batch!r}"
            )
        ops = tuple(op if isinstance(op, EpilogueOp) else EpilogueOp(op) for op in self.epilogue)
        error = epilogue_error(op.name for op in ops)
        if error:
            raise ValueError(f"pattern: expected an epilogue one call carries, but {error}")
        object.__setattr__(self, "epilogue", ops)

    @property
    def name(self) -> str:
        return BATCH_FORMS[self.batch] + "_".join((self.layout, *self.ops))

    @property
    def call_pattern(self) -> str:
        """The entry point that serves this member: :data:`GEMM_ENTRY` for an epilogue beyond
        bias and relu; else the 2-D member for a ``leading`` one (its compact leading dims fold
        into M, which is exact), else the member itself."""
        if self.ops not in FIXED_EPILOGUES:
            return GEMM_ENTRY
        if self.batch == "leading":
            return Pattern(self.layout, self.epilogue).name
        return self.name

    @property
    def ops(self) -> tuple[str, ...]:
        """The epilogue's operation names, in order."""
        return tuple(op.name for op in self.epilogue)

    @property
    def has_bias(self) -> bool:
        return "bias" in self.ops

    @property
    def has_relu(self) -> bool:
        return "relu" in self.ops


def _members() -> dict[str, Pattern]:
    members = {}
    for batch in BATCH_FORMS:
        for layout in WEIGHT_LAYOUTS:
            for epilogue in epilogues():
                member = Pattern(layout, epilogue, batch)
                members[member.name] = member
    return members


#: The canonical members of the family, by name (see :func:`pattern` for the others).
FAMILY: dict[str, Pattern] = _members()

#: The canonical members (the matcher recognises every member, :func:`pattern` names them).
PATTERNS: dict[str, Pattern] = FAMILY

#: The members with an entry point of their own, which an intrinsic may implement: the 2-D
#: and the batched ones with a fixed epilogue (a ``leading`` member is served by its 2-D
#: member's intrinsic; every other one by :data:`GEMM_ENTRY`).
CALL_PATTERNS: dict[str, Pattern] = {n: p for n, p in FAMILY.items() if p.call_pattern == n}


#: Epilogues out of slot order or with an op twice, as real models write them: OPT's scale
#: after the bias, GPT-NeoX's two residual adds, Gemma 2's soft-capping, and three more orders.
REORDERED_EPILOGUES = (
    ("bias", "scale"),
    ("bias", "add", "add"),
    ("div", "tanh", "scale"),
    ("relu", "bias"),
    ("add", "gelu"),
    ("mul", "scale", "bias", "silu"),
)


_BY_FORM = {(p.layout, p.ops, p.batch): p for p in PATTERNS.values()}


#: Op names, longest first, for reading a name's epilogue (``gelu_tanh`` before ``gelu``).
_OP_NAMES = sorted(OPS, key=len, reverse=True)


@functools.cache
def pattern(name: str) -> Pattern:
    """The member of the family called ``name``; a one-line ValueError if there is none.

    A name is an optional batch prefix (``batch_``, ``bmm_``), the layout and the epilogue's ops
    in order, joined by ``_``: ``batch_dense_bias_scale``, ``dense_bias_add_add``.
    """
    if name in FAMILY:
        return FAMILY[name]
    rest, batch = name, "none"
    for form, prefix in BATCH_FORMS.items():
        if prefix and rest.startswith(prefix):
            rest, batch = rest[len(prefix) :], form
    layout, _, rest = rest.partition("_")
    ops = []
    while rest:
        op = next((o for o in _OP_NAMES if rest == o or rest.startswith(o + "_")), None)
        if op is None:
            break
        ops.append(op)
        rest = rest[len(op) + 1 :]
    try:
        if rest or layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"{rest or layout!r} is not a layout or an op")
        return Pattern(layout, tuple(ops), batch)
    except ValueError as error:
        raise ValueError(
            f"unknown pattern {name!r} ({error}); expected [batch_|bmm_](dense|matmul) then "
            f"ops of {list(OPS)}, joined by '_'"
        ) from None


@functools.cache
def pattern_for(layout: str, epilogue: tuple[str, ...], batch: str = "none") -> Pattern | None:
    """The member with this weight layout, epilogue and batch form, or None if there is none
    (an epilogue more than one call carries)."""
    member = _BY_FORM.get((layout, tuple(epilogue), batch))
    if member is not None:
        return member
    try:
        return Pattern(layout, tuple(epilogue), batch)
    except ValueError:
        return None


def describe(
    name: str,
    *,
    x_dtype: str = "float32",
    w_dtype: str | None = None,
    out_dtype: str | None = None,
    index_dtype: str = "int64",
) -> tirx.PrimFunc:
    """Build the TIR description of pattern ``name`` with symbolic extents.

    Parameters
    ----------
    name : str
        A key of :data:`FAMILY` (any member, batched ones included).
    x_dtype, w_dtype, out_dtype : str
        Element types; inputs narrower than ``out_dtype`` are cast inside the reduction,
        the way Relax lowers a matmul with ``out_dtype``.
    index_dtype : str
        Dtype of the extents M, N, K (and B, the batch, for batched members).

    Returns
    -------
    tvm.tirx.PrimFunc
        An S-TIR PrimFunc ``(X, W, [b,] Y)`` whose blocks are ``name``'s loop nests.
    """
    member = pattern(name)
    w_dtype = w_dtype or x_dtype
    out_dtype = out_dtype or x_dtype
    m, n, k, batch = (tirx.Var(v, index_dtype) for v in "MNKB")
    lead = () if member.batch == "none" else (batch,)

    # Step 1. The reduction, over the batch dims the form gives each operand.
    x = te.placeholder((*lead, m, k), x_dtype, name="X")
    w_dims = (n, k) if member.layout == "dense" else (k, n)
    w_lead = lead if member.batch == "batched" else ()
    w = te.placeholder((*w_lead, *w_dims), w_dtype, name="W")
    r = te.reduce_axis((0, k), name="k")

    def operand(load, dtype):
        return load if dtype == out_dtype else load.astype(out_dtype)

    def product(*index):
        *b, i, j = index
        w_index = (j, r) if member.layout == "dense" else (r, j)
        w_load = w[(*b, *w_index)] if w_lead else w[w_index]
        return operand(x[(*b, i, r)], x_dtype) * operand(w_load, w_dtype)

    y = te.compute(
        (*lead, m, n),
        lambda *index: te.sum(product(*index), axis=r),
        name=member.layout,
    )
    args = [x, w]

    # Step 2. The epilogue, spelled as Relax's LegalizeOps spells each operation.
    for op in member.ops:
        tensor = None
        if OPS[op].tensor == "vector":
            tensor = te.placeholder((n,), out_dtype, name="b" if op == "bias" else "g")
        elif OPS[op].tensor == "full":
            tensor = te.placeholder(y.shape, out_dtype, name="R" if op == "add" else "G")
        if tensor is not None:
            args.append(tensor)
        y = compose(op, y, tensor)
    return te.create_prim_func([*args, y])
