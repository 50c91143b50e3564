"""Print a PrimFunc as TVMScript that parses back, ready to paste into a regression test.

Entry point: :func:`to_tvmscript`.  TVM 0.27 prints a parameter with a symbolic shape as
``X: T.Buffer((m, 3), ...)`` under a module-level ``m = TypeVar("m")``, which its parser does
not read back (for int32 variables it quotes the name where it is first bound and declares
it in the body); this rewrites such parameters as ``T.handle`` plus ``T.match_buffer``, which
parses to a structurally equal function.
"""

from __future__ import annotations

from tvm import tirx


def _split_top_level(text: str) -> list[str]:
    """Split ``text`` at the commas that are not inside brackets or quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _symbolic_vars(func: tirx.PrimFunc) -> dict[str, str]:
    """Name -> dtype of the variables in parameter shapes."""
    found = {}
    for param in func.params:
        if not isinstance(param.ty, tirx.BufferType):
            continue
        for extent in param.ty.shape:
            if isinstance(extent, tirx.Var):
                found[extent.name] = str(extent.ty.dtype)
    return found


def to_tvmscript(func: tirx.PrimFunc) -> str:
    """``func`` as TVMScript source that ``@T.prim_func`` parses back to an equal function.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc

    Returns
    -------
    str
        Source starting with ``from tvm.script import tirx as T``.
    """
    text = func.script()
    symbolic = _symbolic_vars(func)
    lines = [
        line
        for line in text.splitlines()
        if not line.startswith("# from ") and "= TypeVar(" not in line
    ]
    header = ["from tvm.script import tirx as T", ""]
    if not symbolic:
        return "\n".join(header + lines) + "\n"
    def_at = next(i for i, line in enumerate(lines) if line.startswith("def "))
    signature = lines[def_at]
    name_end = signature.index("(")
    params = _split_top_level(signature[name_end + 1 : signature.rindex(")")])
    declarations = [f"    {v} = T.{dtype}()" for v, dtype in symbolic.items()]
    lines = [line for line in lines if line not in declarations]  # printed for int32 vars
    new_params, prologue = [], list(declarations)
    for param in params:
        name, _, annotation = param.partition(": ")
        for v in symbolic:  # the int32 printer quotes a shape variable where it is bound
            annotation = annotation.replace(f'"{v}"', v)
        if annotation.startswith("T.Buffer(") and any(v in annotation for v in symbolic):
            new_params.append(f"var_{name}: T.handle")
            arguments = annotation[len("T.Buffer(") : -1]
            prologue.append(f"    {name} = T.match_buffer(var_{name}, {arguments})")
        else:
            new_params.append(param)
    lines[def_at] = f"{signature[:name_end]}({', '.join(new_params)}):"
    lines[def_at + 1 : def_at + 1] = prologue
    return "\n".join(header + lines) + "\n"


__all__ = ["to_tvmscript"]
