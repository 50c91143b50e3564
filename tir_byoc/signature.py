"""Dtype signatures: which element types a match reads, and which it accumulates into.

A signature is written ``"float32"`` (everything float32) or ``"x_dtype,w_dtype->out_dtype"``
(``"float16,float16->float32"``: fp16 inputs accumulated in fp32).  The C side receives it
packed into one int32 (:meth:`DtypeSignature.code`, ``TIR_BYOC_SIGNATURE`` in
``intrinsics/include/tir_byoc.h``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Element type codes shared with ``intrinsics/include/tir_byoc.h``.
DTYPE_CODES = {
    "float32": 1,
    "float16": 2,
    "bfloat16": 3,
    "int8": 4,
    "uint8": 5,
    "int32": 6,
    "float64": 7,
}

#: Epilogue flags or-ed into the packed signature (``TIR_BYOC_RELU_KEEPS_NAN`` in
#: ``tir_byoc.h``): the relu keeps a NaN instead of mapping it to 0.
RELU_KEEPS_NAN_FLAG = 1 << 24
#: The weight argument is a block packed at build time (``TIR_BYOC_PACKED_WEIGHT``).
PACKED_WEIGHT_FLAG = 1 << 25

#: Input dtypes that may be widened to an accumulator dtype inside the reduction.
WIDENINGS = {
    "float16": ("float32", "float64"),
    "bfloat16": ("float32", "float64"),
    "float32": ("float64",),
    "int8": ("int32", "float32", "float64"),
    "uint8": ("int32", "float32", "float64"),
}


@dataclass(frozen=True, order=True)
class DtypeSignature:
    """The element types of a match: input ``x``, weight ``w``, and output/accumulator ``out``.

    The bias, when there is one, has the ``out`` dtype.
    """

    x: str
    w: str
    out: str

    def __post_init__(self):
        for role in ("x", "w", "out"):
            dtype = getattr(self, role)
            if dtype not in DTYPE_CODES:
                raise ValueError(
                    f"dtype signature: expected {role} dtype in {sorted(DTYPE_CODES)}, "
                    f"got {dtype!r}"
                )

    @classmethod
    def parse(cls, text: str | DtypeSignature) -> DtypeSignature:
        """Parse ``"float32"`` or ``"uint8,int8->int32"``."""
        if isinstance(text, DtypeSignature):
            return text
        if not isinstance(text, str):
            raise ValueError(
                f"dtype signature: expected a string such as 'float32' or "
                f"'float16,float16->float32', got {text!r}"
            )
        if "->" not in text and "," not in text:
            return cls(text.strip(), text.strip(), text.strip())
        inputs, _, out = text.partition("->")
        parts = [p.strip() for p in inputs.split(",")]
        if len(parts) != 2 or "->" not in text:
            raise ValueError(
                f"dtype signature: expected 'x_dtype,w_dtype->out_dtype', got {text!r}"
            )
        return cls(parts[0], parts[1], out.strip())

    @property
    def code(self) -> int:
        """The packed int32 passed as the last argument of every intrinsic call."""
        return DTYPE_CODES[self.x] | DTYPE_CODES[self.w] << 8 | DTYPE_CODES[self.out] << 16

    def __str__(self) -> str:
        if self.x == self.w == self.out:
            return self.x
        return f"{self.x},{self.w}->{self.out}"
