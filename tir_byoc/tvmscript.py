"""TVMScript files: load what a file defines, and write modules back as a file that loads.

Entry points: :func:`load` (the IRModules and PrimFuncs a ``.py`` file defines at module
level), :func:`write` / :func:`dumps` (definitions as TVMScript source that imports again)
and :func:`import_file` (run a Python file by path, with one-line errors).

Loading imports the file as a module from its real path: the TVMScript parser reads a
function's source with :mod:`inspect`, so text exec'd from a string does not parse.

Writing works around the way TVM 0.27 prints: the imports come out commented, and symbolic
shapes come out as module-level ``M = TypeVar("M")`` (int64) or as quoted names inside
``T.Buffer`` shapes declared in the body (int32).  Python 3.11 evaluates annotations while the
class body runs, where those names mean nothing; ``from __future__ import annotations`` leaves
them to the TVMScript parser, which reads them from the source and understands both spellings.
Each definition's TypeVars are bound just around it, so that they cannot shadow another
definition's int32 variables of the same name.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import itertools
import os
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm import tirx

#: Names the written file binds itself; a definition may not use them.
RESERVED_NAMES = frozenset({"I", "T", "R", "TypeVar", "Axis", "annotations"})

_COMMENTED_IMPORT = re.compile(r"^# ((?:from \S+ )?import .+)$")
_TYPE_VAR = re.compile(r'^(\w+) = TypeVar\("\1"\)$')
_DIAGNOSTIC_PLACE = re.compile(r"-->\s*(?P<file>.+?):(?P<line>\d+):(?P<col>\d+)")
_module_ids = itertools.count()


class ScriptError(ValueError):
    """A TVMScript file cannot be loaded or written; the message is one line."""


@dataclass(frozen=True)
class Definition:
    """An IRModule or PrimFunc bound to a name at the top level of a file.

    Attributes
    ----------
    name : str
        The Python name it is bound to.
    value : tvm.IRModule or tvm.tirx.PrimFunc
    """

    name: str
    value: tvm.IRModule | tirx.PrimFunc

    @property
    def module(self) -> tvm.IRModule:
        """The definition as an IRModule; a PrimFunc is the only function, under ``name``."""
        if isinstance(self.value, tvm.IRModule):
            return self.value
        return tvm.IRModule({self.name: self.value})

    def replaced(self, module: tvm.IRModule) -> Definition:
        """The same definition holding ``module`` (a transformed :attr:`module`)."""
        value = module if isinstance(self.value, tvm.IRModule) else module[self.name]
        return Definition(self.name, value)


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load(path: str | Path) -> list[Definition]:
    """Import ``path`` and return the IRModules and PrimFuncs it defines, in file order.

    Parameters
    ----------
    path : str or pathlib.Path
        A Python file with TVMScript (``@I.ir_module`` classes, ``@T.prim_func`` functions)
        or any code that binds IRModules or PrimFuncs at module level.

    Returns
    -------
    list of Definition

    Raises
    ------
    ScriptError
        The file is missing, does not parse, fails to import or defines nothing; the
        message is one line naming the file (and the line, when there is one).
    """
    path = Path(path)
    namespace = import_file(path)
    definitions, seen = [], set()
    for name, value in namespace.items():
        if isinstance(value, (tvm.IRModule, tirx.PrimFunc)) and id(value) not in seen:
            seen.add(id(value))
            definitions.append(Definition(name, value))
    if not definitions:
        raise ScriptError(
            f"{path}: defines no IRModule or PrimFunc; expected TVMScript such as an "
            "@I.ir_module class or a @T.prim_func function at module level"
        )
    return definitions


def import_file(path: str | Path) -> dict:
    """Execute the Python file ``path`` as a module and return its namespace.

    The module is registered in ``sys.modules`` while it runs (the TVMScript parser looks
    it up there) and the file's directory is on ``sys.path`` (so it can import its
    neighbours).  Any failure is a :class:`ScriptError` with a one-line message.
    """
    path = Path(path)
    # Step 1. A readable Python file.
    if not path.exists():
        raise ScriptError(f"{path}: no such file")
    if not path.is_file():
        raise ScriptError(f"{path}: not a file; expected a Python file")
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ScriptError(f"{path}: cannot be read as UTF-8 text ({err})") from None
    try:
        ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise ScriptError(f"{path}:{err.lineno}: syntax error: {err.msg}") from None
    # Step 2. Run it as a module.
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_tir_byoc_script_{next(_module_ids)}_{stem}"
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    directory = str(path.resolve().parent)
    sys.modules[name] = module
    sys.path.insert(0, directory)
    try:
        loader.exec_module(module)
    except tvm.error.DiagnosticError as err:
        raise ScriptError(_diagnostic_line(path, err)) from None
    except SyntaxError as err:
        raise ScriptError(f"{err.filename}:{err.lineno}: syntax error: {err.msg}") from None
    except SystemExit as err:
        raise ScriptError(f"{path}: exited while being imported (status {err.code})") from None
    except Exception as err:  # anything the user's code raises while it is imported
        raise ScriptError(_import_failure_line(path, err)) from None
    finally:
        sys.modules.pop(name, None)
        if directory in sys.path:
            sys.path.remove(directory)
    return vars(module)


def _diagnostic_line(path: Path, err: Exception) -> str:
    """``file:line:col: TVMScript error: message`` from TVM's multi-line diagnostic."""
    text = str(err)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    message = lines[0] if lines else type(err).__name__
    message = message.removeprefix("error:").strip()
    place = _DIAGNOSTIC_PLACE.search(text)
    if place is None:
        return f"{path}: TVMScript error: {message}"
    same = Path(place["file"]).resolve() == path.resolve()
    where = f"{path if same else place['file']}:{place['line']}:{place['col']}"
    return f"{where}: TVMScript error: {message}"


def _import_failure_line(path: Path, err: Exception) -> str:
    resolved = str(path.resolve())
    line = None
    for frame in traceback.extract_tb(err.__traceback__):
        if str(Path(frame.filename).resolve()) == resolved:
            line = frame.lineno
    where = f"{path}:{line}" if line else str(path)
    message = (str(err).strip().splitlines() or [""])[0]
    detail = f"{type(err).__name__}: {message}" if message else type(err).__name__
    text = f"{where}: importing it raised {detail}"
    if "data must be int or Expr" in message:
        text += (
            " (symbolic shapes in a signature need `from __future__ import annotations` "
            "at the top of the file)"
        )
    return text


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


def dumps(definitions: list[Definition], *, header: str = "") -> str:
    """TVMScript source defining ``definitions`` under their names; it imports again.

    Parameters
    ----------
    definitions : list of Definition
    header : str, optional
        Comment text put at the top of the file (each line gets ``# ``).

    Returns
    -------
    str
    """
    names = [d.name for d in definitions]
    for name in names:
        if not name.isidentifier() or name in RESERVED_NAMES:
            raise ScriptError(
                f"cannot write a definition named {name!r}: expected a Python identifier "
                f"other than {', '.join(sorted(RESERVED_NAMES))}"
            )
    if len(set(names)) != len(names):
        raise ScriptError(f"cannot write two definitions with the same name: {names}")
    imports, sections, symbols = [], [], set()
    for definition in definitions:
        prelude, body = _printed(definition)
        type_vars = []
        for line in prelude:
            if (found := _TYPE_VAR.match(line)) is not None:
                type_vars.append(found[1])
                continue
            found = _COMMENTED_IMPORT.match(line)
            imports.append(found[1] if found else line)
        symbols.update(type_vars)
        sections.append(_section(body, type_vars))
    clashes = sorted(symbols & set(names))
    if clashes:
        raise ScriptError(
            f"cannot write a definition named like a symbolic shape variable: {clashes}"
        )
    parts = [f"# {line}".rstrip() for line in header.splitlines()]
    parts += ["from __future__ import annotations", "", *dict.fromkeys(imports)]
    for section in sections:
        parts += ["", "", section]
    return "\n".join(parts).rstrip() + "\n"


def _section(body: str, type_vars: list[str]) -> str:
    """One definition, with its int64 shape variables bound around it and no further.

    The variables are deleted after the definition: another definition may declare an
    int32 variable of the same name in its body, which a module-level TypeVar would shadow.
    """
    if not type_vars:
        return body
    declare = "\n".join(f'{name} = TypeVar("{name}")' for name in type_vars)
    return f"{declare}\n\n\n{body}\n\n\ndel {', '.join(type_vars)}"


def write(definitions: list[Definition], path: str | Path, *, header: str = "") -> Path:
    """Write :func:`dumps` of ``definitions`` to ``path``, checked to load back the same.

    The text goes to a temporary file next to ``path``, which is loaded and compared
    structurally with ``definitions``; only a file that reproduces them replaces ``path``.
    Functions parsed from TVMScript or lowered by Relax pass; a PrimFunc built directly with
    TE may not, because it can hold details the printer does not show (an int32 literal 0 in
    an int64 iterator domain), and is then refused rather than silently changed.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ScriptError
        ``path`` cannot be written, or the written text does not reproduce a definition.
    """
    path = Path(path)
    text = dumps(definitions, header=header)
    if not path.parent.is_dir():
        raise ScriptError(f"{path}: directory {path.parent} does not exist")
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".py")
    except OSError as err:
        raise ScriptError(f"{path}: cannot write ({err.strerror})") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        _check_reproduces(definitions, Path(temporary), path)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def _check_reproduces(definitions: list[Definition], written: Path, path: Path) -> None:
    try:
        loaded = {d.name: d.value for d in load(written)}
    except ScriptError as err:
        raise ScriptError(f"{path}: the written TVMScript does not load back ({err})") from None
    for definition in definitions:
        again = loaded.get(definition.name)
        if again is None:
            raise ScriptError(f"{path}: the written TVMScript lost {definition.name}")
        mismatch = tvm_ffi.get_first_structural_mismatch(definition.value, again, False)
        if mismatch is not None:
            raise ScriptError(
                f"{path}: the written TVMScript does not reproduce {definition.name} exactly "
                f"(first difference at {mismatch[0]}); nothing was written"
            )


def _printed(definition: Definition) -> tuple[list[str], str]:
    """(prelude lines, body) of TVM's printout of ``definition``."""
    text = definition.value.script(name=definition.name)
    if "metadata[" in text:
        raise ScriptError(
            f"{definition.name} holds constants that TVMScript prints as metadata, which a "
            "script file cannot carry; bind them as function parameters first"
        )
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("@")), None)
    if start is None:
        raise ScriptError(f"{definition.name}: TVM printed no decorated definition")
    prelude = [line for line in lines[:start] if line.strip()]
    return prelude, "\n".join(lines[start:]).rstrip()
