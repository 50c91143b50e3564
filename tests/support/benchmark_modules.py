"""The modules of ``benchmarks/`` in the tests that check them.

They import each other by bare name (``import workloads``), so they are imported with the
folder on ``sys.path``, and forgotten afterwards: the next test file gets fresh ones.
"""

import contextlib
import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def benchmark_modules(*names: str):
    """The modules ``names`` of ``benchmarks/``; on exit the folder leaves ``sys.path`` and
    every module loaded from it leaves ``sys.modules``."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name, module in list(sys.modules.items()):
            if Path(getattr(module, "__file__", None) or "").parent == BENCHMARKS:
                del sys.modules[name]
