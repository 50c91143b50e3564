"""What the AOT build refuses, as one exception with a one-line message.

Entry point: :class:`Unsupported`.  Every reader of the built model (the Relax program, the
PrimFunc lowering, the C printer) raises it for a construct that has no plain-C form here,
naming the construct and the function, before :func:`tir_byoc.aot.build` writes any file.
"""

from __future__ import annotations


class Unsupported(ValueError):
    """A construct the AOT build cannot express as plain C; the message is one line.

    Attributes
    ----------
    construct : str
        What was found (``"symbolic shape (n, 16)"``, ``"packed call vm.builtin.copy"``).
    function : str
        The Relax function or PrimFunc it was found in.
    """

    def __init__(self, construct: str, function: str, hint: str = ""):
        self.construct = construct
        self.function = function
        message = f"tir_byoc.aot: {construct} in {function} is not supported"
        super().__init__(f"{message} ({hint})" if hint else message)
