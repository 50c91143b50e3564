"""The modules of ``benchmarks/`` in the tests that check them.

They import each other by bare name (``import workloads``), as they do when run from their
folder; pytest puts that folder on the path (``pythonpath`` in pyproject.toml).  Each test file
gets fresh modules: they are forgotten when its ``with`` block ends.
"""

import contextlib
import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def benchmark_modules(*names: str):
    """The modules ``names`` of ``benchmarks/``; on exit every module loaded from that folder
    leaves ``sys.modules``."""
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        for name, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "").parent == BENCHMARKS:
                del sys.modules[name]
