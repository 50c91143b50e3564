"""Python files that are not on the import path, imported by their path."""

import importlib.util
import sys
from pathlib import Path


def import_file(path: Path):
    """The module of the file ``path``, registered in ``sys.modules`` under its stem (so that
    a file importing it by that bare name, as a script beside it does, gets this one)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[path.stem]
        raise
    return module
