"""The C of the entry: ``int32_t <name>_run(inputs..., outputs..., workspace[, constants])``.

Entry points: :func:`entry_source` (``<name>.c``: the steps of the program in order, each
tensor at its planned place), :func:`public_header` (``<name>.h``: the prototype, each input's
and output's shape and dtype, the workspace and constants sizes, their alignment, the status
codes) and :func:`kernels_header` (``<name>_kernels.h``: the prototypes of the kernels and of
the external functions they and the entry call).

Where a tensor is: an input or output is the caller's pointer; an intermediate is
``ws + <offset>``; a constant a named pointer into the constants (``cs + <offset>``).  A step
whose PrimFunc is one intrinsic call calls the intrinsic itself, with the PrimFunc's arguments
in place of its parameters, so the forum MLP reads
``tir_byoc_ref_dense_bias_relu(x, w1, b1, ws + 0, ...)`` then
``tir_byoc_ref_dense_bias(ws + 0, w2, b2, out, ...)``; other steps call their kernel.  A
nonzero status (an intrinsic's, or a misaligned or NULL pointer, checked first) is returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from .c_expr import ExternSignature
from .c_kernel import ASSERT_STATUS
from .c_spelling import Names, c_type, itemsize, literal, wrap
from .kernels import Kernel
from .program import OUTPUT, Buffer, Program, Scalar, TensorRef
from .workspace import ALIGNMENT, WorkspacePlan

#: The entry's own status codes (an intrinsic's ``TIR_BYOC_E*`` codes, 1 to 6, pass through).
STATUS_CODES = {
    "OK": (0, "success"),
    "EALIGN": (101, "a pointer is not aligned (workspace, constants: ALIGNMENT; tensors: their "
               "element size)"),
    "ENULL": (102, "a pointer is NULL"),
    "EASSERT": (ASSERT_STATUS, "a check in TVM's generated code failed"),
}  # fmt: skip


@dataclass(frozen=True)
class EntryLayout:
    """Names and places the entry's C uses, decided once for the three files.

    Attributes
    ----------
    name : str
        The model's C prefix (``mlp`` -> ``mlp_run``, ``MLP_WORKSPACE_BYTES``).
    inputs, outputs : tuple of (str, TensorRef)
        The C parameter names and tensors, in the order of the prototype.
    constant_names : Mapping[Buffer, str]
        Each constant's local name in the entry.
    constant_offsets : Mapping[Buffer, int]
        Each constant's offset in the constants.
    constants_bytes : int
    blob : bool
        Whether the constants are passed in (``const void *constants``) rather than linked in.
    """

    name: str
    inputs: tuple[tuple[str, TensorRef], ...]
    outputs: tuple[tuple[str, TensorRef], ...]
    constant_names: Mapping[Buffer, str]
    constant_offsets: Mapping[Buffer, int]
    constants_bytes: int
    blob: bool

    @property
    def macro(self) -> str:
        return self.name.upper()

    def prototype(self, tail: str) -> list[str]:
        """The entry's prototype as lines, ending with ``tail`` (``";"`` or ``" {"``)."""
        params = [f"const {_element(r)} *{n}" for n, r in self.inputs]
        params += [f"{_element(r)} *{n}" for n, r in self.outputs]
        params.append("void *workspace")
        if self.blob:
            params.append("const void *constants")
        return wrap(f"int32_t {self.name}_run(", params, f"){tail}")


def _element(ref: TensorRef) -> str:
    return c_type(ref.dtype, "the entry")


# -- the public header ---------------------------------------------------------------------


def public_header(layout: EntryLayout, plan: WorkspacePlan, description: str) -> str:
    m = layout.macro
    lines = [
        f"/* {layout.name}.h - {description}",
        " *",
        f" * Call {layout.name}_run() with the inputs, the outputs and a workspace of",
        f" * {m}_WORKSPACE_BYTES bytes aligned to {m}_ALIGNMENT"
        + (
            f", and the constants ({layout.name}_constants.bin, {m}_CONSTANTS_BYTES bytes,"
            f" aligned to {m}_ALIGNMENT)."
            if layout.blob
            else " (the constants are linked in)."
        ),
        " * It allocates nothing, keeps no state between calls, and returns 0 or a status code;",
        " * the outputs must not overlap the inputs.  Concurrent calls need one workspace each.",
        " */",
        f"#ifndef {m}_H_",
        f"#define {m}_H_",
        "",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define {m}_ALIGNMENT {ALIGNMENT}",
        f"#define {m}_WORKSPACE_BYTES {plan.workspace_bytes}",
        f"#define {m}_CONSTANTS_BYTES {layout.constants_bytes}",
        f"#define {m}_NUM_INPUTS {len(layout.inputs)}",
        f"#define {m}_NUM_OUTPUTS {len(layout.outputs)}",
        "",
    ]
    for kind, tensors in (("INPUT", layout.inputs), ("OUTPUT", layout.outputs)):
        for index, (name, ref) in enumerate(tensors):
            prefix = f"{m}_{kind}{index}"
            shape = ", ".join(map(str, ref.shape)) or "1"
            elements = 1
            for extent in ref.shape:
                elements *= extent
            lines += [
                f"/* {kind.lower()} {index}: {name}, {ref.dtype} ({', '.join(map(str, ref.shape))})"
                " */",
                f'#define {prefix}_NAME "{name}"',
                f'#define {prefix}_DTYPE "{ref.dtype}"',
                f"#define {prefix}_NDIM {len(ref.shape)}",
                f"#define {prefix}_SHAPE {{{shape}}}",
                f"#define {prefix}_ELEMENTS {elements}",
                f"#define {prefix}_BYTES {elements * itemsize(ref.dtype)}",
            ]
    lines += ["", "/* Status codes; 1 to 6 are an intrinsic's TIR_BYOC_E* codes (tir_byoc.h). */"]
    for code, (value, meaning) in STATUS_CODES.items():
        lines.append(f"#define {m}_{code} {value} /* {meaning} */")
    lines += [
        "",
        *layout.prototype(";"),
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {m}_H_ */",
        "",
    ]
    return "\n".join(lines)


# -- the kernels' header -------------------------------------------------------------------


def kernels_header(
    layout: EntryLayout, kernels: Mapping[str, Kernel], externs: Mapping[str, ExternSignature]
) -> str:
    """Prototypes shared by ``<name>.c`` and ``<name>_kernels.c``."""
    m = layout.macro
    lines = [
        f"/* {layout.name}_kernels.h - the PrimFuncs of {layout.name} as C functions, and the",
        " * external functions (intrinsics) they call.  Internal to the model. */",
        f"#ifndef {m}_KERNELS_H_",
        f"#define {m}_KERNELS_H_",
        "",
        "#include <stdbool.h>",
        "#include <stdint.h>",
        "",
    ]
    if layout.constants_bytes and not layout.blob:
        lines += [f"extern const uint8_t {layout.name}_constants[{layout.constants_bytes}];", ""]
    if externs:
        lines.append("/* External functions: the intrinsics. */")
        for symbol, signature in sorted(externs.items()):
            lines += signature.prototype(symbol)
        lines.append("")
    lines.append("/* The kernels. */")
    for kernel in sorted(kernels.values(), key=lambda k: k.c_name):
        c_name, *params = kernel.source.signature
        lines += wrap(f"int32_t {c_name}(", params or ["void"], ");")
    lines += ["", f"#endif /* {m}_KERNELS_H_ */", ""]
    return "\n".join(lines)


# -- the entry -----------------------------------------------------------------------------


def entry_source(
    layout: EntryLayout,
    program: Program,
    plan: WorkspacePlan,
    kernels: Mapping[str, Kernel],
    intrinsic_names: Mapping[str, str],
) -> str:
    """``<name>.c``; ``intrinsic_names`` gives the registry name of each intrinsic symbol."""
    places = _places(layout, plan)
    m = layout.macro
    body = ["  uint8_t *const ws = (uint8_t *)workspace;"]
    if layout.constants_bytes:
        source = "(const uint8_t *)constants" if layout.blob else f"{layout.name}_constants"
        body.append(f"  const uint8_t *const cs = {source};")
    body.append("  int32_t status;")
    body += _checks(layout)
    used = {a.buffer for s in program.steps for a in s.args if isinstance(a, TensorRef)}
    used |= {ref.buffer for _, ref in plan.copies}
    for buffer, name in layout.constant_names.items():
        if buffer in used:
            offset = layout.constant_offsets[buffer]
            element = c_type(buffer.dtype, program.function)
            body.append(f"  const {element} *const {name} = (const {element} *)(cs + {offset});")
    body += _memory_map(program, plan)
    for index, step in enumerate(program.steps):
        kernel = kernels[step.callee]
        label = intrinsic_names.get(kernel.call.symbol) if kernel.call else None
        body.append(f"  /* {index + 1}. {step.callee}{f' ({label})' if label else ''} */")
        callee, args = _step_call(step, kernel, places, plan.scratch[index])
        body += wrap(f"status = {callee}(", args, ");", "  ")
        body.append("  if (status != 0) return status;")
    for index, ref in plan.copies:
        name, out = layout.outputs[index]
        nbytes = math.prod(out.shape) * itemsize(out.dtype)
        body.append(f"  memcpy({name}, {_pointer(ref, places, False)}, {nbytes});")
    body.append(f"  return {m}_OK;")
    lines = [
        f"/* {layout.name}.c - the entry: the model's steps in order, on one workspace. */",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <string.h>",
        "",
        f'#include "{layout.name}.h"',
        f'#include "{layout.name}_kernels.h"',
        "",
        "static int misaligned(const void *pointer, uintptr_t alignment) {",
        "  return (uintptr_t)pointer % alignment != 0;",
        "}",
        "",
        *layout.prototype(" {"),
        *body,
        "}",
        "",
    ]
    return "\n".join(lines)


def _checks(layout: EntryLayout) -> list[str]:
    m = layout.macro
    tensors = (*layout.inputs, *layout.outputs)
    pointers = [n for n, r in tensors if math.prod(r.shape) > 0]
    null = [f"!{n}" for n in pointers] + [f"(!ws && {m}_WORKSPACE_BYTES > 0)"]
    aligned = [f"misaligned(ws, {m}_ALIGNMENT)"]
    if layout.blob and layout.constants_bytes:
        null.append("!cs")
        aligned.append(f"misaligned(cs, {m}_ALIGNMENT)")
    aligned += [f"misaligned({n}, sizeof(*{n}))" for n in pointers]
    return [
        *wrap("if (", null, f") return {m}_ENULL;", "  ", " || "),
        *wrap("if (", aligned, f") return {m}_EALIGN;", "  ", " || "),
    ]


def _memory_map(program: Program, plan: WorkspacePlan) -> list[str]:
    if not plan.offsets and not any(s is not None for s in plan.scratch):
        return []
    lines = [f"  /* The workspace ({plan.workspace_bytes} bytes):"]
    live = _live_steps(program)
    placed = sorted(plan.offsets.items(), key=lambda item: (item[1], live.get(item[0], (0,))))
    for buffer, offset in placed:
        first, last = live.get(buffer, (0, 0))
        shape = "x".join(map(str, buffer.shape)) or "scalar"
        lines.append(
            f"   *   ws + {offset}: {buffer.name}, {shape} {buffer.dtype}, steps {first + 1}-"
            f"{last + 1}"
        )
    for index, offset in enumerate(plan.scratch):
        if offset is not None:
            lines.append(f"   *   ws + {offset}: scratch of step {index + 1}")
    lines[-1] += " */"
    return lines


def _live_steps(program: Program) -> dict[Buffer, tuple[int, int]]:
    live: dict[Buffer, tuple[int, int]] = {}
    for index, step in enumerate(program.steps):
        for arg in step.args:
            if isinstance(arg, TensorRef):
                first, _ = live.get(arg.buffer, (index, index))
                live[arg.buffer] = (first, index)
    return live


def _places(layout: EntryLayout, plan: WorkspacePlan) -> dict[Buffer, str]:
    """Each buffer's base pointer as C (``x``, ``out``, ``ws + 128``, ``fc1_weight``)."""
    places: dict[Buffer, str] = {}
    for name, ref in layout.inputs:
        places[ref.buffer] = name
    for buffer, index in plan.returned.items():
        places[buffer] = layout.outputs[index][0]
    for name, ref in layout.outputs:
        if ref.buffer.kind == OUTPUT:
            places[ref.buffer] = name
    for buffer, offset in plan.offsets.items():
        places[buffer] = f"ws + {offset}"
    places.update(layout.constant_names)
    return places


def _pointer(ref: TensorRef, places: Mapping[Buffer, str], typed: bool, written=False) -> str:
    place = places[ref.buffer]
    if not typed or not place.startswith("ws + "):
        return place
    element = c_type(ref.dtype, "the entry")
    return f"({'' if written else 'const '}{element} *)({place})"


def _step_call(step, kernel: Kernel, places, scratch: int | None) -> tuple[str, list[str]]:
    """The function a step calls and its C arguments."""
    if kernel.call is not None:
        args = []
        for arg in kernel.call.args:
            args.append(arg if isinstance(arg, str) else _argument(step.args[arg], places, False))
        return kernel.call.symbol, args
    args = [
        _argument(arg, places, True, written)
        for arg, written in zip(step.args, kernel.written, strict=True)
    ]
    if kernel.scratch_bytes:
        args.append(f"ws + {scratch}")
    return kernel.c_name, args


def _argument(arg, places, typed: bool, written: bool = False) -> str:
    if isinstance(arg, Scalar):
        return literal(arg.value, arg.dtype, "the entry")
    return _pointer(arg, places, typed, written)


def constant_names(program: Program, preferred: Mapping[Buffer, str]) -> dict[Buffer, str]:
    """A C name for each constant: ``preferred`` where given, else its own, kept unique and
    apart from the entry's parameters and locals."""
    names = Names(["ws", "cs", "status", "workspace", "constants", "misaligned"])
    for buffer in program.inputs:
        names.fresh(buffer.name)
    return {b: names.fresh(preferred.get(b, b.name)) for b in program.constants}
