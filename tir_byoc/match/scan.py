"""The matcher's entry point: :func:`scan_function` finds every chain in a PrimFunc.

It indexes the function once (:mod:`.stir`), analyses each candidate reduction
(:mod:`.reduction`), grows its chain (:mod:`.chain`) and collects the refusals with their
reasons (:mod:`.explain`).  Called by :mod:`tir_byoc.planning`.
"""

from __future__ import annotations

from tvm import tirx

from ..decline import GEMM_CHAIN, Decline, Declined
from .chain import extend_chain, separate_init
from .conv import looks_like_conv
from .conv_chain import scan_convolution
from .explain import stranded_epilogues, unread_loop_nests, unreadable_candidates
from .extents import Extents
from .records import FunctionScan
from .reduction import analyze_reduction, looks_like_gemm
from .stir import FunctionIndex


def scan_function(name: str, func: tirx.PrimFunc) -> FunctionScan:
    """Find every chain in ``func`` and every refused candidate, with reasons.

    Parameters
    ----------
    name : str
        The function's name in its module (reported in each record).
    func : tvm.tirx.PrimFunc
        The function to scan; it is not modified.

    Returns
    -------
    FunctionScan
    """
    index = FunctionIndex(func)
    extents = Extents()
    matches, rejections, covered = [], [], set()
    stranded = []
    for position, nest in enumerate(index.nests):
        if position in covered or not looks_like_gemm(nest.block):
            continue
        if looks_like_conv(nest.block):  # a convolution is never read as a GEMM
            match, declined, members = scan_convolution(position, index, extents, name)
            matches += [match] if match is not None else []
            rejections += declined
            covered.update(members)
            continue
        init = separate_init(nest, index, covered)
        try:
            core = analyze_reduction(nest, extents, index, *(index.nests[p] for p in init))
        except Declined as refused:
            nearest = refused.nearest or "dense"
            rejections.append(Decline(name, (nest.name,), GEMM_CHAIN, refused.reason, nearest))
            stranded += stranded_epilogues(position, index, name)
            continue
        positions = (*init, position)
        match, refused, members = extend_chain(positions, core, index, extents, name)
        covered.update(members)
        matches.append(match)
        rejections.extend(refused)
    rejections += [r for position, r in stranded if position not in covered]
    rejections += unreadable_candidates(index, name)
    rejections += unread_loop_nests(index, name)
    return FunctionScan(name, tuple(matches), tuple(rejections))
