"""How TVM's types, literals and names are spelled in C.

Entry points: :func:`c_type` (a dtype as a C type), :func:`literal` (an integer or float
constant as a C literal that reads back to the same value), :func:`identifier` (a name made a
C identifier that clashes with no keyword or with what the generated code uses), and
:class:`Names` (unique identifiers within one C scope).
"""

from __future__ import annotations

import math
import re

import numpy as np

from .errors import Unsupported

_C_TYPES = {
    "bool": "bool",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "float32": "float",
    "float64": "double",
}

#: C keywords and the names the generated code itself uses (libm, the entry's locals).
RESERVED = frozenset(
    """
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool true false NULL main memcpy memset uintptr_t
    INFINITY NAN isnan isinf isfinite scratch
    """.split()
)

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def c_type(dtype: str, function: str) -> str:
    """The C type of one element of ``dtype`` (``"float32"`` -> ``"float"``)."""
    spelled = _C_TYPES.get(str(dtype))
    if spelled is None:
        raise Unsupported(f"dtype {dtype}", function, "the C build takes bool, ints, fp32, fp64")
    return spelled


def itemsize(dtype: str) -> int:
    return 1 if str(dtype) == "bool" else np.dtype(str(dtype)).itemsize


def literal(value, dtype: str, function: str) -> str:
    """``value`` as a C literal of ``dtype``, exact: a float32 in the shortest digits that read
    back as the same float (with ``f``), infinities and NaN through ``math.h``."""
    dtype = str(dtype)
    if dtype == "bool":
        return "true" if value else "false"
    if dtype.startswith(("int", "uint")):
        value = int(value)
        unsigned = dtype.startswith("u")
        if dtype.endswith("64"):
            if unsigned:
                return f"UINT64_C({value})"
            if not -(2**31) <= value < 2**31:
                return f"INT64_C({value})"
        if value == -(2**31):
            return "(-2147483647 - 1)"
        return f"{value}u" if unsigned else str(value)
    if dtype in ("float32", "float64"):
        value = float(value)
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            spelled = "INFINITY" if dtype == "float32" else "(double)INFINITY"
            return spelled if value > 0 else f"(-{spelled})"
        text = str(np.float32(value)) if dtype == "float32" else repr(value)
        if not any(c in text for c in ".e"):
            text += ".0"
        return f"{text}f" if dtype == "float32" else text
    raise Unsupported(f"a {dtype} constant", function, "the C build takes bool, ints, fp32, fp64")


def identifier(name: str) -> str:
    """``name`` as a C identifier: invalid characters become ``_``, and a keyword, a reserved
    name or a leading digit gets a ``_`` appended or prepended."""
    text = _INVALID.sub("_", str(name)) or "v"
    if text[0].isdigit():
        text = f"_{text}"
    return f"{text}_" if text in RESERVED else text


class Names:
    """Unique C identifiers within one scope: ``fresh("x")`` gives ``x``, then ``x_1``..."""

    def __init__(self, taken=()):
        self._taken = set(taken) | set(RESERVED)

    def fresh(self, name: str) -> str:
        base = identifier(name)
        candidate, suffix = base, 0
        while candidate in self._taken:
            suffix += 1
            candidate = f"{base}_{suffix}"
        self._taken.add(candidate)
        return candidate


def wrap(head: str, items, tail: str, indent: str = "", separator: str = ", ", width=100):
    """``head + items joined by separator + tail`` as lines of at most ``width`` characters
    where the items allow, the continuation lines aligned after ``head``."""
    items = list(items)
    text = indent + head + separator.join(items) + tail
    if len(text) <= width or not items:
        return [text]
    hang = " " * (len(indent) + len(head))
    if len(hang) > width // 2:
        hang = indent + "    "
    lines, current = [], indent + head
    glue = separator.rstrip()
    for index, item in enumerate(items):
        piece = item + (glue if index < len(items) - 1 else tail)
        fresh = current in (indent + head, hang)
        if not fresh and len(current) + 1 + len(piece) > width:
            lines.append(current.rstrip())
            current = hang + piece
        else:
            current += ("" if fresh else " ") + piece
    lines.append(current)
    return lines
