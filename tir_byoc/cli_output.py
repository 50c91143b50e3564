"""What the command line prints: aligned tables for people, JSON records for programs.

:class:`Table` (with :class:`Cell`) renders columns, coloured on a terminal and wrapped to its
width; :class:`Output` sends results to stdout and notes to stderr; :func:`match_record`,
:func:`rejection_record` and :func:`intrinsic_record` are the ``--json`` schema (version
:data:`SCHEMA_VERSION`, documented in docs/cli.md).  Used by :mod:`tir_byoc.cli`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from tvm import tirx

from . import toolchain
from .decline import Decline
from .registry import REGISTRY, Choice
from .tvmscript import Definition

#: Version of the ``--json`` record layouts (see docs/cli.md); bumped on any incompatible change.
SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------

_STYLES = {"header": "1", "good": "32", "bad": "33", "dim": "2"}


@dataclass(frozen=True)
class Cell:
    """One table cell; ``style`` (a key of ``_STYLES``) colours it on a terminal."""

    text: str
    style: str | None = None


class Table:
    """Aligned columns; the last one wraps to the terminal width when there is one."""

    def __init__(self, headers: Sequence[str]):
        self.headers = list(headers)
        self.rows: list[list[Cell]] = []

    def add(self, *cells) -> None:
        row = [c if isinstance(c, Cell) else Cell(str(c)) for c in cells]
        if len(row) != len(self.headers):
            raise ValueError(f"expected {len(self.headers)} cells, got {len(row)}")
        self.rows.append(row)

    def render(self, *, colour: bool = False, width: int | None = None) -> str:
        """The table as text; ``width`` (a terminal's) wraps the last column to fit."""
        header = [Cell(h, "header") for h in self.headers]
        rows = [header, *self.rows]
        widths = [max(len(row[i].text) for row in rows) for i in range(len(self.headers) - 1)]
        indent = sum(widths) + 2 * len(widths)
        last_width = max(20, width - indent - 1) if width else None
        lines = []
        for row in rows:
            *leading, last = row
            prefix = "".join(
                _paint(cell.text, cell.style, colour) + " " * (w - len(cell.text) + 2)
                for cell, w in zip(leading, widths)
            )
            pieces = textwrap.wrap(last.text, last_width) if last_width else [last.text]
            pieces = pieces or [""]
            lines.append(prefix + _paint(pieces[0], last.style, colour))
            lines += [" " * indent + _paint(p, last.style, colour) for p in pieces[1:]]
        return "\n".join(line.rstrip() for line in lines)


def _paint(text: str, style: str | None, colour: bool) -> str:
    if not colour or style is None or not text:
        return text
    return f"\033[{_STYLES[style]}m{text}\033[0m"


@dataclass(frozen=True)
class Output:
    """Where and how to print: stdout for results, stderr for notes."""

    colour: bool
    width: int | None

    @classmethod
    def for_stdout(cls, when: str) -> Output:
        tty = sys.stdout.isatty()
        if when == "auto":
            colour = tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
        else:
            colour = when == "always"
        width = shutil.get_terminal_size().columns if tty else None
        return cls(colour, width)

    def table(self, table: Table) -> None:
        print(table.render(colour=self.colour, width=self.width))

    @staticmethod
    def json(records) -> None:
        print(json.dumps(records, indent=2))

    @staticmethod
    def note(text: str) -> None:
        print(text, file=sys.stderr)


# --------------------------------------------------------------------------------------
# Records: one per match, per rejection, per intrinsic (the --json schema)
# --------------------------------------------------------------------------------------


def _extent(expr) -> int | str:
    """A static extent as an int; a symbolic one by name (or as its expression)."""
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Var):
        return expr.name
    return str(expr)


def match_record(definition: Definition, match: Choice) -> dict:
    """The ``--json`` object of ``scan`` for one match (schema in docs/cli.md)."""
    intrinsic = REGISTRY[match.intrinsic] if match.intrinsic else None
    return {
        "schema_version": SCHEMA_VERSION,
        "definition": definition.name,
        "function": match.func,
        "blocks": list(match.blocks),
        "pattern": match.pattern,
        "dtype": str(match.dtype),
        "dtypes": {"x": match.dtype.x, "w": match.dtype.w, "out": match.dtype.out},
        "batch": [_extent(d) for d in match.batch.dims] if match.batch is not None else None,
        "m": _extent(match.m),
        "n": _extent(match.n),
        "k": _extent(match.k),
        "buffers": match.buffers,
        "intermediates": [v.name for v in match.intermediates],
        "intrinsic": match.intrinsic,
        "backend": intrinsic.backend if intrinsic else None,
        "extern_symbol": intrinsic.extern_symbol if intrinsic else None,
        "reason": match.reason,
    }


def rejection_record(definition: Definition, rejection: Decline) -> dict:
    """The ``--json`` object of ``explain`` for one refused candidate."""
    return {
        "schema_version": SCHEMA_VERSION,
        "definition": definition.name,
        "function": rejection.func,
        "blocks": list(rejection.blocks),
        "nearest": rejection.nearest,
        "reason": rejection.reason,
    }


def intrinsic_record(intrinsic) -> dict:
    """The ``--json`` object of ``intrinsics`` for one registered intrinsic."""
    missing = toolchain.unavailable(intrinsic.backend, REGISTRY)
    return {
        "schema_version": SCHEMA_VERSION,
        "intrinsic": intrinsic.name,
        "pattern": intrinsic.pattern,
        "dtypes": [str(d) for d in intrinsic.dtypes],
        "backend": intrinsic.backend,
        "extern_symbol": intrinsic.extern_symbol,
        "priority": intrinsic.priority,
        "source": str(intrinsic.source),
        "available": missing is None,
        "unavailable_reason": missing,
    }
