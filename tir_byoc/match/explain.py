"""Explanations for candidates the chain search never reaches.

:func:`stranded_epilogues` names the elementwise blocks downstream of a refused reduction;
:func:`unreadable_candidates` names multiply-reduce blocks whose body is not one store, and
:func:`unread_loop_nests` multiply-reduce loop nests over loops the matcher does not read.
Called by :mod:`.scan`.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..decline import GEMM_CHAIN, Decline
from .reduction import looks_like_gemm, multiplies_elements
from .stir import FunctionIndex, is_spatial
from .traversal import contains


def stranded_epilogues(start: int, index: FunctionIndex, func_name: str):
    """Elementwise blocks downstream of a refused reduction: (position, Decline) pairs."""
    rejections, seen = [], {start}
    pending = [start]
    while pending:
        position = pending.pop(0)
        producer = index.nests[position]
        written = producer.block.body.buffer
        for owner in index.owners_of(written):
            # Nests are indexed in program order: an earlier user (an init) is not downstream.
            if owner <= position or owner in seen or not is_spatial(index.nests[owner].block):
                continue
            seen.add(owner)
            pending.append(owner)
            reason = (
                f"it reads {written.name}, the output of block {producer.name}, which is not "
                "offloaded"
            )
            target = index.nests[owner].name
            rejections.append((owner, Decline(func_name, (target,), GEMM_CHAIN, reason)))
    return rejections


STATEMENT_WORDS = {
    tirx.IfThenElse: "an if statement",
    tirx.SeqStmt: "several statements",
    tirx.For: "a loop",
}


def unreadable_candidates(index: FunctionIndex, func_name: str) -> list[Decline]:
    """Multiply-reduce blocks whose body is not one store (an if, several statements, ...)."""
    rejections = []
    for block in index.inner_blocks:
        if contains(block.body, s_tir.SBlock) or not looks_like_gemm(block):
            continue
        body = next(
            (w for kind, w in STATEMENT_WORDS.items() if isinstance(block.body, kind)),
            type(block.body).__name__,
        )
        reason = (
            f"the body of block {block.name_hint} is {body}, not a single store "
            "Y[i, j] = Y[i, j] + X[i, k] * W[.., ..]"
        )
        rejections.append(Decline(func_name, (block.name_hint,), GEMM_CHAIN, reason, "dense"))
    return rejections


def unread_loop_nests(index: FunctionIndex, func_name: str) -> list[Decline]:
    """Multiply-reduce nests of plain loops with a loop over another dtype than int32 or
    int64 (a ``range(T.uint32(M))``): not lifted into blocks, so never analysed."""
    return [
        Decline(func_name, (nest.name,), GEMM_CHAIN, nest.reason, "dense")
        for nest in index.unread
        if nest.reduces and multiplies_elements(nest.update)
    ]
