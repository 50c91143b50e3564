"""Import ``tvm.s_tir.tensor_intrin`` in seconds rather than minutes.

Entry point: :func:`import_tensor_intrinsics`, which :func:`~.space.design_space` calls before
MetaSchedule's ``TuneContext`` does the import itself.

That module parses about 500 TVMScript functions (every target's tensor intrinsics), and
TVMScript's ``T.prim_func`` starts each parse with ``inspect.stack()``.  For every frame of the
stack, ``inspect`` looks up the frame's module; for a file that is no module's (the import
machinery's frozen frames, ``<string>``, ``<ast>``: about 20,000 lookups during this import) it
scans all of ``sys.modules``, each time: about a minute for the import alone, and longer in a
process that has loaded torch and transformers (more modules to scan).

TVMScript reads two things from those frames: the frames themselves (their locals, for the
closure variables of the parsed function) and the source line of the decorator's caller (a
class body of ``@I.ir_module``).  :func:`import_tensor_intrinsics` replaces ``inspect.stack``,
for the duration of that one import, by one that builds the same ``FrameInfo`` records with
the line read by ``linecache`` instead of through the module lookup.
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import sys
import threading

_MODULE = "tvm.s_tir.tensor_intrin"
_lock = threading.Lock()


def _stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)`` without the per-frame module lookup (``context`` lines around
    each frame's current line, as ``inspect`` gives them)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
        lines, index = None, None
        source = linecache.getlines(filename, frame.f_globals) if context > 0 else []
        if source:  # the window inspect.getframeinfo takes, shifted to fit in the file
            start = max(0, min(lineno - 1 - context // 2, len(source) - context))
            lines, index = source[start : start + context], lineno - 1 - start
        frames.append(
            inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name, lines, index)
        )
        frame = frame.f_back
    return frames


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (once per process) with the fast ``inspect.stack``."""
    if _MODULE in sys.modules:
        return
    with _lock:
        if _MODULE in sys.modules:
            return
        original = inspect.stack
        inspect.stack = _stack
        try:
            importlib.import_module(_MODULE)
        finally:
            inspect.stack = original
