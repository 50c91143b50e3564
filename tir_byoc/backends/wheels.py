"""Finding a library that a Python wheel installed: the files behind a backend's ``locate``.

Entry point: :func:`installed_file`.  Wheels such as ``onednn-cpu-gomp`` put their shared
libraries and headers outside the package directory (``<prefix>/lib``, ``<prefix>/include``);
the distribution's file list (``importlib.metadata``) says where, wherever the environment is.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from ..registry import BackendUnavailable


def installed_file(distribution: str, suffix: str, install: str) -> Path:
    """The installed file of ``distribution`` whose path ends with ``suffix``.

    Parameters
    ----------
    distribution : str
        The PyPI distribution name, e.g. ``"onednn-cpu-gomp"``.
    suffix : str
        The end of the file's path, e.g. ``"libdnnl.so"`` or ``"oneapi/dnnl/dnnl.hpp"``.
    install : str
        The command that installs it, for the error message.

    Raises
    ------
    BackendUnavailable
        If the distribution is not installed or does not contain the file.
    """
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        raise BackendUnavailable(f"{distribution} is not installed (`{install}`)") from None
    wanted = f"/{suffix}"
    for file in files:
        if f"/{file.as_posix()}".endswith(wanted):
            path = Path(file.locate()).resolve()
            if path.is_file():
                return path
    raise BackendUnavailable(
        f"{distribution} is installed but {suffix} is missing from it; reinstall it (`{install}`)"
    )
