"""decline: one record for every site left as it was, falsy, with the message of its kind."""

from __future__ import annotations

import pytest

from tir_byoc.decline import (
    CONVOLUTION,
    COPY_PROOF,
    GEMM_CHAIN,
    RESHAPE_FOLD,
    WEIGHT_COPY,
    Decline,
    Declined,
)


@pytest.mark.parametrize(
    ("decline", "message"),
    [
        (
            Decline("main", ("dense", "T_add"), GEMM_CHAIN, "it reads C", "dense_bias"),
            "main: block dense, T_add not offloaded (nearest pattern: dense_bias): it reads C",
        ),
        (
            Decline("main", ("T_add",), GEMM_CHAIN, "it reads C"),
            "main: block T_add not offloaded: it reads C",
        ),
        (
            Decline("gemm", ("matmul",), WEIGHT_COPY, "reads W, a copy ...; not folded: why"),
            "gemm: block matmul reads W, a copy ...; not folded: why",
        ),
        (
            Decline("copy0", (), COPY_PROOF, "block b writes B, which an earlier block wrote"),
            "block b writes B, which an earlier block wrote",
        ),
        (
            Decline("main", ("y",), CONVOLUTION, "layouts NHWC", "relax.nn.conv2d"),
            "main: y = relax.nn.conv2d: not as im2col + GEMM (layouts NHWC)",
        ),
        (
            Decline("main", ("z",), RESHAPE_FOLD, "m is used 2 times", "relax.reshape"),
            "main: z = reshape(... matmul ...) not folded: m is used 2 times",
        ),
        (
            Decline("main", ("q",), "slice split", "the take reads two axes"),
            "main: q: slice split declined: the take reads two axes",
        ),
    ],
    ids=["chain", "chain without nearest", "weight copy", "copy proof", "conv", "reshape", "other"],
)
def test_a_decline_is_falsy_and_reads_as_its_kind_reads(decline, message):
    assert not decline
    assert str(decline) == message
    assert decline.where == f"{decline.func}: {', '.join(decline.blocks)}"


def test_a_decline_without_a_reason_or_with_a_list_of_blocks_is_refused():
    with pytest.raises(ValueError, match="Decline of main: expected a reason, got an empty one"):
        Decline("main", ("dense",), GEMM_CHAIN, "")
    with pytest.raises(TypeError, match=r"Decline\.blocks: expected a tuple of names, got list"):
        Decline("main", ["dense"], GEMM_CHAIN, "why")


def test_declined_carries_the_reason_and_what_the_check_knew():
    with pytest.raises(Declined) as raised:
        raise Declined("output Y is float16", nearest="dense", op="bias")
    assert (raised.value.reason, raised.value.nearest, raised.value.op) == (
        "output Y is float16",
        "dense",
        "bias",
    )
    assert str(raised.value) == "output Y is float16"
