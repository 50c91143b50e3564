"""The command line: ``tir-byoc scan | explain | offload | intrinsics | profile | aot | demo``.

Entry point: :func:`main`, installed as ``tir-byoc`` (also ``python -m tir_byoc``).  Each
subcommand is a thin wrapper over :func:`tir_byoc.scan`, :func:`tir_byoc.explain` or
:func:`tir_byoc.offload`, applied to the IRModules and PrimFuncs a TVMScript file defines
(:mod:`tir_byoc.tvmscript`), reading one :class:`~tir_byoc.planning.Plan` per definition;
:mod:`tir_byoc.cli_output` renders the tables and the ``--json`` records.

stdout carries the table (or the JSON) and nothing else; notes go to stderr.  A mistake in
the input is one line on stderr and exit status 2; work that could not be done (a compiler
failed, a result is wrong) is one line and status 1.  ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import tvm
from tvm import tirx

from . import cli_parser, tvmscript
from .cli_output import (
    Cell,
    Output,
    Table,
    intrinsic_record,
    match_record,
    rejection_record,
)
from .cli_parser import EXIT_USAGE, PROG
from .explanation import explain
from .match import is_s_tir
from .offload import apply, offload_plan
from .planning import Choice, Plan
from .registry import REGISTRY, backend_order
from .rewrite import RewriteError
from .toolchain import ToolchainError
from .tvmscript import Definition, ScriptError

EXIT_OK, EXIT_FAILED = 0, 1


class UsageError(Exception):
    """Bad input on the command line; the message is one line."""


class Failed(Exception):
    """The work asked for could not be done; the message is one line."""


# --------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------


def _load_plugins(plugins: Sequence[str]) -> None:
    """Import plugin files or modules (they register intrinsics) before anything runs."""
    for plugin in plugins:
        if plugin.endswith(".py") or os.sep in plugin:
            tvmscript.import_file(plugin)
            continue
        try:
            importlib.import_module(plugin)
        except ImportError as err:
            raise UsageError(f"plugin {plugin}: cannot import it ({err})") from None
        except Exception as err:  # the plugin's own code failed
            raise UsageError(f"plugin {plugin}: importing it raised {_typed(err)}") from None


def _definitions(args) -> list[Definition]:
    definitions = tvmscript.load(args.file)
    func = getattr(args, "func", None)
    if func is not None:
        names = sorted({name for d in definitions for name in _functions(d)})
        if func not in names:
            raise UsageError(
                f"{args.file}: no PrimFunc named {func!r}; it defines {', '.join(names)}"
            )
    return definitions


def _functions(definition: Definition) -> dict:
    """Name -> PrimFunc of a definition."""
    return {
        gvar.name_hint: func
        for gvar, func in definition.module.functions_items()
        if isinstance(func, tirx.PrimFunc)
    }


def _check_backends(args) -> None:
    try:
        backend_order(args.backends, REGISTRY)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _note_plain_loops(definitions: list[Definition], func: str | None, out: Output) -> None:
    for definition in definitions:
        for name, prim_func in _functions(definition).items():
            if (func is None or name == func) and not is_s_tir(prim_func):
                out.note(
                    f"note: {name} has no SBlocks; its loop nests were read as plain loops, "
                    "each named after the buffer it writes"
                )


def _function_label(definition: Definition, func: str, qualify: bool) -> str:
    if qualify and isinstance(definition.value, tvm.IRModule):
        return f"{definition.name}.{func}"
    return func


# --------------------------------------------------------------------------------------
# Subcommands
# --------------------------------------------------------------------------------------


def _plans(definitions, args) -> list[tuple[Definition, Plan]]:
    """One plan per definition: the single scan of its functions that a command reads."""
    return [(d, offload_plan(d.module, backends=args.backends)) for d in definitions]


def _scan_rows(plans, args) -> list[tuple[Definition, Choice]]:
    func = getattr(args, "func", None)
    return [
        (definition, choice)
        for definition, planned in plans
        for choice in planned.choices
        if func is None or choice.func == func
    ]


def _match_table(rows, qualify: bool) -> Table:
    table = Table(
        ["FUNCTION", "BLOCKS", "PATTERN", "DTYPE", "BATCH", "M", "N", "K", "BACKEND", "INTRINSIC"]
    )
    for definition, match in rows:
        if match.intrinsic:
            backend = Cell(REGISTRY[match.intrinsic].backend)
            served = Cell(match.intrinsic, "good")
        else:
            backend, served = Cell("-", "dim"), Cell(f"none: {match.reason}", "bad")
        table.add(
            _function_label(definition, match.func, qualify),
            ", ".join(match.blocks),
            match.pattern,
            str(match.dtype),
            match.batch.text if match.batch is not None else "-",
            *match.shape,
            backend,
            served,
        )
    return table


def cmd_scan(args, out: Output) -> int:
    """``scan FILE.py``: every chain found, with the intrinsic chosen or why none was."""
    _check_backends(args)
    definitions = _definitions(args)
    plans = _plans(definitions, args)
    rows = _scan_rows(plans, args)
    if args.json:
        out.json([match_record(d, m) for d, m in rows])
        return EXIT_OK
    _note_plain_loops(definitions, args.func, out)
    if rows:
        out.table(_match_table(rows, qualify=len(definitions) > 1))
    served = sum(1 for _, m in rows if m.intrinsic)
    functions = sum(len(_functions(d)) for d in definitions) if args.func is None else 1
    summary = f"{len(rows)} chain(s) in {functions} PrimFunc(s), {served} with an intrinsic"
    refused = [r for _, planned in plans for r in planned.rejections if args.func in (None, r.func)]
    if refused:
        summary += f"; {len(refused)} candidate block(s) refused: tir-byoc explain {args.file}"
    out.note(summary)
    return EXIT_OK


def cmd_explain(args, out: Output) -> int:
    """``explain FILE.py``: candidates that were not matched or rewritten, and why
    (:func:`tir_byoc.explain`: the matcher's and, for a Relax module, the Relax rewrites')."""
    definitions = _definitions(args)
    rows = [
        (definition, rejection)
        for definition in definitions
        for rejection in explain(definition.module)
        if args.func is None or rejection.func == args.func
    ]
    if args.json:
        out.json([rejection_record(d, r) for d, r in rows])
        return EXIT_OK
    _note_plain_loops(definitions, args.func, out)
    if not rows:
        out.note(f"nothing to explain: no candidate block was refused in {args.file}")
        return EXIT_OK
    qualify = len(definitions) > 1
    table = Table(["FUNCTION", "BLOCKS", "NEAREST", "WHY NOT"])
    for definition, rejection in rows:
        table.add(
            _function_label(definition, rejection.func, qualify),
            ", ".join(rejection.blocks),
            Cell(rejection.nearest or "-", None if rejection.nearest else "dim"),
            Cell(rejection.reason, "bad"),
        )
    out.table(table)
    return EXIT_OK


def cmd_offload(args, out: Output) -> int:
    """``offload FILE.py -o OUT.py``: write the rewritten definitions as TVMScript."""
    _check_backends(args)
    output = Path(args.output)
    if output.exists() and output.resolve() == Path(args.file).resolve():
        raise UsageError(f"{output}: refusing to overwrite the input file; choose another -o")
    if not output.parent.is_dir():
        raise UsageError(f"{output}: directory {output.parent} does not exist")
    definitions = _definitions(args)
    plans = _plans(definitions, args)
    rows = _scan_rows(plans, args)
    offloaded = []
    for definition, planned in plans:
        try:
            module = apply(planned, strict=args.strict)
        except ValueError as err:  # strict, and some match has no intrinsic
            raise Failed(_one_line(err)) from None
        offloaded.append(definition.replaced(module))
    header = (
        f"Written by `tir-byoc offload` from {args.file}.\n"
        "Offloaded blocks call tir_byoc intrinsics with T.call_extern: before tvm.compile,\n"
        "load their libraries in the process (tir_byoc.toolchain.load_backend), and export\n"
        "with tir_byoc.export_library so the library is linked in."
    )
    tvmscript.write(offloaded, output, header=header)
    if rows:
        out.table(_match_table(rows, qualify=len(definitions) > 1))
    served = sum(1 for _, m in rows if m.intrinsic)
    out.note(f"wrote {output}: {served} chain(s) offloaded, {len(rows) - served} left to TVM")
    return EXIT_OK


def cmd_intrinsics(args, out: Output) -> int:
    """``intrinsics``: what is registered, and whether it can run on this machine."""
    records = [intrinsic_record(i) for i in REGISTRY]
    if args.json:
        out.json(records)
        return EXIT_OK
    table = Table(["INTRINSIC", "PATTERN", "DTYPES", "BACKEND", "PRIORITY", "SYMBOL", "AVAILABLE"])
    for record in records:
        missing = record["unavailable_reason"]
        table.add(
            record["intrinsic"],
            record["pattern"],
            ", ".join(record["dtypes"]),
            record["backend"],
            record["priority"],
            record["extern_symbol"],
            Cell("yes", "good") if missing is None else Cell(f"no: {missing}", "bad"),
        )
    out.table(table)
    return EXIT_OK


def cmd_demo(args, out: Output) -> int:
    """``demo``: the forum MLP, lowered by Relax, offloaded, built, run, checked."""
    from . import demo  # imports Relax's frontend; only this subcommand needs it

    demo.run(out=sys.stdout)
    return EXIT_OK


def cmd_profile(args, out: Output) -> int:
    """``profile``: build a Relax or TIR module, run it, time each PrimFunc it calls."""
    import numpy as np

    from .model import build_model  # builds with Relax; only this subcommand needs it

    definitions = _definitions(args)
    if len(definitions) != 1:
        names = ", ".join(d.name for d in definitions)
        raise UsageError(f"{args.file}: profile needs one module, the file defines {names}")
    try:
        model = build_model(
            definitions[0].value,
            backends=args.backends,
            offload=not args.no_offload,
            entry=args.func,
        )
    except ValueError as err:
        raise UsageError(f"{args.file}: {err}") from None
    rng = np.random.default_rng(args.seed)
    inputs = []
    for item in model._expected_inputs(0).inputs:
        name, shape, dtype = item.name, item.dims, item.dtype
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise UsageError(
                f"{args.file}: input {name} has a symbolic shape; profile needs static shapes"
            )
        if np.dtype(dtype).kind == "f":
            inputs.append(rng.standard_normal(shape).astype(dtype))
        else:  # indices (token ids): 0 is in range of every lookup
            inputs.append(np.zeros(shape, dtype))
    result = model.profile(*inputs, repeat=args.repeat)
    print(result.table(top=args.top))
    if args.chart:
        out.note(f"chart written to {result.chart(args.chart)}")
    return EXIT_OK


def cmd_aot(args, out: Output) -> int:
    """``aot``: a module as plain C, one entry and one workspace (:func:`tir_byoc.aot.build`)."""
    from . import aot  # builds with Relax; only this subcommand needs it

    definitions = _definitions(args)
    if len(definitions) != 1:
        names = ", ".join(d.name for d in definitions)
        raise UsageError(f"{args.file}: aot needs one module, the file defines {names}")
    try:
        artifact = aot.build(
            definitions[0].value,
            out_dir=args.output,
            name=args.name,
            backends=args.backends,
            constants=args.constants,
            entry=args.func,
        )
    except ValueError as err:  # aot.Unsupported too: one line naming the construct
        raise UsageError(f"{args.file}: {err}") from None
    print("\n".join(artifact.summary()))
    return EXIT_OK


# --------------------------------------------------------------------------------------
# Parser and main
# --------------------------------------------------------------------------------------


#: Each subcommand's handler, by name.
COMMANDS = {
    "scan": cmd_scan,
    "explain": cmd_explain,
    "offload": cmd_offload,
    "intrinsics": cmd_intrinsics,
    "profile": cmd_profile,
    "aot": cmd_aot,
    "demo": cmd_demo,
}


def build_parser() -> argparse.ArgumentParser:
    """The ``tir-byoc`` argument parser (:mod:`tir_byoc.cli_parser`) with this module's
    commands."""
    return cli_parser.build_parser(COMMANDS)


def _one_line(err: BaseException) -> str:
    """The message of ``err`` on one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return "; ".join(lines) or type(err).__name__


def _typed(err: BaseException) -> str:
    """``Type: message`` on one line, for exceptions that are not ours."""
    return f"{type(err).__name__}: {_one_line(err)}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tir-byoc`` with ``argv`` (default: the process's arguments); returns the status."""
    args = build_parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    out = Output.for_stdout(args.color)
    try:
        _load_plugins(args.plugin)
        return args.handler(args, out)
    except (UsageError, ScriptError) as err:
        return _fail(err, EXIT_USAGE, args.debug)
    except (Failed, ToolchainError, RewriteError) as err:
        return _fail(err, EXIT_FAILED, args.debug)
    except BrokenPipeError:  # the reader went away (| head); not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as err:
        if args.debug:
            raise
        print(
            f"{PROG}: internal error: {_typed(err)} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED


def _fail(err: BaseException, status: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(err)
    print(f"{PROG}: error: {_one_line(err)}", file=sys.stderr)
    return status
