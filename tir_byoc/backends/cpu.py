"""What ``/proc/cpuinfo`` says about this CPU, for the backends' choices."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def _first_processor() -> dict[str, str]:
    """The fields of ``/proc/cpuinfo``'s first processor, read once per process; empty where
    the file cannot be read (not Linux, a sandbox)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the blank line after the first processor
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpuinfo_field(name: str) -> str:
    """The first processor's ``name`` field of ``/proc/cpuinfo`` (``flags``, ``vendor_id``), or
    ``""`` where it cannot be read."""
    return _first_processor().get(name, "")
