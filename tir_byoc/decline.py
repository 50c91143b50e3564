"""Why a site was left as it was: :class:`Decline`, the one record of every "why not".

The matcher declines a block that looked like part of a GEMM chain; each Relax rewrite
declines a candidate it could not prove it may rewrite (a convolution left to TVM, a weight
copy not folded, a reshape not folded, ...).  Each such decision is a :class:`Decline`: a
falsy, frozen value naming the function and the sites, the kind of rewrite it came closest to
(:attr:`Decline.what`) and the first condition that failed.  :func:`tir_byoc.explain` and
``tir-byoc explain`` list them, TIR and Relax alike.

:class:`Declined` is the one exception for control flow: a check deep in an analysis raises
it with the reason, and the code that owns the candidate catches it and makes the
:class:`Decline`.  It never leaves the package.

Entry points: :class:`Decline`, :class:`Declined`, and the kinds of site
(:data:`GEMM_CHAIN`, :data:`WEIGHT_COPY`, :data:`COPY_PROOF`, :data:`CONVOLUTION`,
:data:`RESHAPE_FOLD`, :data:`CONV_PAIR`, :data:`WEIGHT_PACK`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: A chain of blocks of a PrimFunc that the matcher did not offload (``nearest``: the pattern
#: it came closest to).
GEMM_CHAIN = "GEMM chain"
#: A GEMM block reading a weight copy that :mod:`tir_byoc.relax.weight_copies` did not fold.
WEIGHT_COPY = "weight copy"
#: A PrimFunc not proven to be a copy of its input (:func:`tir_byoc.relax.copy_map.copy_map`).
COPY_PROOF = "copy proof"
#: A Relax convolution not rewritten as im2col + GEMM: kept whole for a backend's convolution
#: (matched in TIR) or left to TVM (``nearest``: its operator, e.g. ``relax.nn.conv2d``).
CONVOLUTION = "convolution as GEMM"
#: A Relax reshape of a matmul's result that :mod:`tir_byoc.relax.linear_reshapes` kept
#: (``nearest``: ``relax.reshape``).
RESHAPE_FOLD = "reshape fold"
#: A 1 x 1 + depthwise convolution pair that :mod:`tir_byoc.conv_pairs` did not fuse into one
#: oneDNN call (the sites: the two bindings' variables; decided when the model is built).
CONV_PAIR = "convolution pair"
#: A constant weight of an offloaded call that :mod:`tir_byoc.packing` left plain (the sites:
#: the call's blocks; decided when the model is built).
WEIGHT_PACK = "weight packing"

#: How the message of each kind reads (the words users and logs have always seen).  A kind
#: not listed reads as :data:`_DEFAULT_MESSAGE`.
_MESSAGES = {
    GEMM_CHAIN: "{func}: block {sites} not offloaded{near}: {reason}",
    WEIGHT_COPY: "{func}: block {sites} {reason}",
    COPY_PROOF: "{reason}",
    CONVOLUTION: "{func}: {sites} = {nearest}: not as im2col + GEMM ({reason})",
    RESHAPE_FOLD: "{func}: {sites} = reshape(... matmul ...) not folded: {reason}",
    CONV_PAIR: "{func}: {sites}: not paired: {reason}",
    WEIGHT_PACK: "{func}: {sites}: weight not packed: {reason}",
}
_DEFAULT_MESSAGE = "{func}: {sites}: {what} declined{near}: {reason}"


@dataclass(frozen=True)
class Decline:
    """A site left as it was, and why.  Falsy, so ``if not found`` reads as "declined".

    Attributes
    ----------
    func : str
        The PrimFunc or Relax function holding the site.
    blocks : tuple of str
        The site in it: the SBlocks of a PrimFunc, or a Relax binding's variable.
    what : str
        The kind of site, the rewrite it came closest to (:data:`GEMM_CHAIN`,
        :data:`CONVOLUTION`, ...).
    reason : str
        The first condition that failed, in words.
    nearest : str or None
        The pattern (or, for a Relax operator, the operator) the site came closest to.
    """

    func: str
    blocks: tuple[str, ...]
    what: str
    reason: str
    nearest: str | None = None

    def __post_init__(self):
        if not isinstance(self.blocks, tuple):
            raise TypeError(
                f"Decline.blocks: expected a tuple of names, got {type(self.blocks).__name__}"
            )
        if not self.reason:
            raise ValueError(f"Decline of {self.func}: expected a reason, got an empty one")

    def __bool__(self) -> bool:
        return False

    @property
    def where(self) -> str:
        """The function and the site, e.g. ``main: dense, T_add``."""
        return f"{self.func}: {', '.join(self.blocks)}"

    def __str__(self) -> str:
        near = f" (nearest pattern: {self.nearest})" if self.nearest else ""
        return _MESSAGES.get(self.what, _DEFAULT_MESSAGE).format(
            func=self.func,
            sites=", ".join(self.blocks),
            what=self.what,
            reason=self.reason,
            nearest=self.nearest,
            near=near,
        )


class Declined(Exception):
    """Internal control flow: a candidate fails a condition; caught where its :class:`Decline`
    is made, never raised out of the package.

    Parameters
    ----------
    reason : str
        The condition that failed, in words.
    nearest : str or None
        The pattern the candidate came closest to, if the check knows it.
    op : str or None
        The part being read when declined (the matcher: the epilogue op, ``"bias"``,
        ``"gelu"``, ...).
    """

    def __init__(self, reason: str, nearest: str | None = None, op: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.nearest = nearest
        self.op = op


__all__ = [
    "CONVOLUTION",
    "CONV_PAIR",
    "COPY_PROOF",
    "GEMM_CHAIN",
    "RESHAPE_FOLD",
    "WEIGHT_COPY",
    "WEIGHT_PACK",
    "Decline",
    "Declined",
]
