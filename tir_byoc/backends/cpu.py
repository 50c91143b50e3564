"""What ``/proc/cpuinfo`` says about this CPU, for the backends' choices."""

from __future__ import annotations

from pathlib import Path


def cpuinfo_field(name: str) -> str:
    """The first processor's ``name`` field of ``/proc/cpuinfo`` (``flags``, ``vendor_id``), or
    ``""`` where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""
