"""The pattern family tir_byoc offloads, declared once as data.

A pattern is three choices:

* a **weight layout**: ``dense`` (``Y[i, j] = sum_k X[i, k] * W[j, k]``, weight N x K) or
  ``matmul`` (``Y[i, j] = sum_k X[i, k] * W[k, j]``, weight K x N);
* a **batch form**: ``none`` (2-D X and Y), ``leading`` (leading batch dims on X and Y, a 2-D
  weight shared by every batch row) or ``batched`` (X, W and Y all carry a batch dim, as a
  batched matmul; a batch dim of 1 broadcasts);
* an **epilogue**: an ordered tuple of operations with parameters, today ``bias``
  (``Z[..., i, j] = Y[..., i, j] + b[j]``) and ``relu`` (``max(Z, 0)``), in that order.

Names say all three: ``dense``, ``matmul_bias_relu``, ``batch_dense_bias`` (leading batch
dims), ``bmm_matmul`` (batched).  The matcher recognises every member (:data:`PATTERNS`).  A
``leading`` member is called through its 2-D member's entry point, its batch dims folded into
M (:attr:`Pattern.call_pattern`); the ``none`` and ``batched`` members have entry points of
their own (:data:`CALL_PATTERNS`, the calling conventions of ``intrinsics/include/tir_byoc.h``).
:func:`pattern` reads any member's name; :func:`describe` builds
any member's TIR description (an S-TIR PrimFunc with symbolic extents, built with TE the way
TVM lowers the operators), which the tests scan to check that the matcher recognises every
pattern from its own description, and which doubles as a numerical oracle.  An intrinsic
states the member it serves by name (:class:`tir_byoc.registry.Intrinsic`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import te, tirx

#: Weight layouts: the name of the pattern family and the weight's index order.
WEIGHT_LAYOUTS = {"dense": "nk", "matmul": "kn"}

#: Batch forms, with the prefix they give a pattern's name.
BATCH_FORMS = {"none": "", "leading": "batch_", "batched": "bmm_"}

#: Epilogue operations, in the only order the family allows.
EPILOGUE_OPS = ("bias", "relu")


@dataclass(frozen=True)
class EpilogueOp:
    """One operation of an epilogue: its name and its parameters (none for bias and relu)."""

    name: str
    params: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        if self.name not in EPILOGUE_OPS:
            raise ValueError(f"epilogue op: expected one of {EPILOGUE_OPS}, got {self.name!r}")


@dataclass(frozen=True)
class Pattern:
    """One member of the family.

    Parameters
    ----------
    layout : str
        ``"dense"`` (weight N x K) or ``"matmul"`` (weight K x N).
    epilogue : tuple of EpilogueOp or str
        A subsequence of ``("bias", "relu")``; names are turned into :class:`EpilogueOp`.
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
        names = tuple(op.name for op in ops)
        if tuple(op for op in EPILOGUE_OPS if op in names) != names:
            raise ValueError(
                f"pattern: expected an epilogue ordered as {EPILOGUE_OPS}, each at most once, "
                f"got {names!r}"
            )
        object.__setattr__(self, "epilogue", ops)

    @property
    def name(self) -> str:
        return BATCH_FORMS[self.batch] + "_".join((self.layout, *self.ops))

    @property
    def call_pattern(self) -> str:
        """The member whose entry point serves this one: the 2-D member for a ``leading`` one
        (its compact leading dims fold into M, which is exact), else the member itself."""
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
            for epilogue in ((), ("bias",), ("relu",), ("bias", "relu")):
                member = Pattern(layout, epilogue, batch)
                members[member.name] = member
    return members


#: Every member of the family, by name.
FAMILY: dict[str, Pattern] = _members()

#: The members the matcher recognises: all of them.
PATTERNS: dict[str, Pattern] = FAMILY

#: The members with an entry point of their own, which an intrinsic may implement: the 2-D
#: and the batched ones (a ``leading`` member is served by its 2-D member's intrinsic).
CALL_PATTERNS: dict[str, Pattern] = {n: p for n, p in FAMILY.items() if p.call_pattern == n}

_BY_FORM = {(p.layout, p.ops, p.batch): p for p in PATTERNS.values()}


def pattern(name: str) -> Pattern:
    """The member of the family called ``name``; ValueError naming the members if none is."""
    if name not in FAMILY:
        raise ValueError(f"unknown pattern {name!r}; expected one of {sorted(FAMILY)}")
    return FAMILY[name]


def pattern_for(layout: str, epilogue: tuple[str, ...], batch: str = "none") -> Pattern | None:
    """The member with this weight layout, epilogue and batch form, or None if there is none."""
    return _BY_FORM.get((layout, tuple(epilogue), batch))


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

    # Step 2. The epilogue, one block per operation as Relax's FuseTIR emits it.
    if member.has_bias:
        b = te.placeholder((n,), out_dtype, name="b")
        args.append(b)
        y = _elementwise(y, lambda value, j: value + b[j], "T_add")
    if member.has_relu:
        zero = tirx.const(0, out_dtype)
        y = _elementwise(y, lambda value, j: te.max(value, zero), "compute")
    return te.create_prim_func([*args, y])


def _elementwise(producer: te.Tensor, fn, name: str) -> te.Tensor:
    return te.compute(producer.shape, lambda *index: fn(producer[index], index[-1]), name=name)
