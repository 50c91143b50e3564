"""The ``tir-byoc`` command line's arguments: its subcommands, their options and help.

Entry point: :func:`build_parser`, given each subcommand's handler by :mod:`tir_byoc.cli`,
which runs them.  Errors in the arguments are one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from collections.abc import Callable, Mapping

#: The command's name, and the status of a usage error.
PROG, EXIT_USAGE = "tir-byoc", 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(handlers: Mapping[str, Callable]) -> argparse.ArgumentParser:
    """The ``tir-byoc`` argument parser; each subcommand's ``handler`` is ``handlers[name]``."""
    # Options accepted before or after the subcommand; after it, they override.
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, default=argparse.SUPPRESS)
    parser = _Parser(
        prog=PROG,
        description="Offload dense/matmul + bias + relu loop nests in TVMScript files to C "
        "intrinsics, and explain the ones that are not offloaded.",
    )
    _add_common(parser, default=None)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def command(name, help_text):
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handlers[name])
        return sub

    scan_parser = command("scan", "list the chains a TVMScript file holds and their intrinsics")
    _add_file(scan_parser)
    scan_parser.add_argument(
        "--json", action="store_true", help="JSON records (schema in docs/cli.md)"
    )
    scan_parser.add_argument("--func", metavar="NAME", help="only the PrimFunc NAME")
    _add_backends(scan_parser)

    explain_parser = command("explain", "say why candidate blocks were not offloaded")
    _add_file(explain_parser)
    explain_parser.add_argument("--func", metavar="NAME", help="only the PrimFunc NAME")
    explain_parser.add_argument(
        "--json", action="store_true", help="JSON records (schema in docs/cli.md)"
    )

    offload_parser = command("offload", "write the offloaded module as TVMScript")
    _add_file(offload_parser)
    offload_parser.add_argument(
        "-o", "--output", required=True, metavar="OUT.py", help="file to write"
    )
    offload_parser.add_argument(
        "--strict", action="store_true", help="fail if some chain has no intrinsic"
    )
    _add_backends(offload_parser)

    intrinsics_parser = command("intrinsics", "list the registered intrinsics")
    intrinsics_parser.add_argument("--json", action="store_true", help="JSON records")

    profile_parser = command("profile", "build a module, run it, and time each PrimFunc it calls")
    _add_file(profile_parser)
    profile_parser.add_argument(
        "--func", metavar="NAME", help="the function to run (default: main, or the only one)"
    )
    profile_parser.add_argument("--repeat", type=int, default=20, help="runs to take medians of")
    profile_parser.add_argument("--top", type=int, default=None, help="only the N slowest")
    profile_parser.add_argument("--chart", metavar="OUT.png", help="also write a bar chart")
    profile_parser.add_argument(
        "--no-offload", action="store_true", help="build without tir_byoc, for comparing"
    )
    profile_parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    _add_backends(profile_parser)

    aot_parser = command(
        "aot", "write a module as plain C: one entry, one workspace, no TVM runtime"
    )
    _add_file(aot_parser)
    aot_parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write")
    aot_parser.add_argument("--name", default="model", help="C prefix (default: model)")
    aot_parser.add_argument(
        "--func", metavar="NAME", help="the function to build (default: main, or the only one)"
    )
    aot_parser.add_argument(
        "--constants",
        choices=["embedded", "blob"],
        default="embedded",
        help="link the weights in (default), or write them to a file the caller passes",
    )
    _add_backends(aot_parser)

    command("demo", "run the forum MLP end to end (lower, offload, build, check)")
    return parser


def _add_common(parser, default) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        default=False if default is None else default,
        help="show tracebacks and tir_byoc's log",
    )
    parser.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto" if default is None else default,
        help="colour the table (auto: only on a terminal, and not with NO_COLOR set)",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="FILE.py|MODULE",
        default=[] if default is None else default,
        help="import this first (it registers intrinsics); may be repeated",
    )


def _add_file(parser) -> None:
    parser.add_argument("file", metavar="FILE.py", help="Python file with TVMScript")


def _add_backends(parser) -> None:
    parser.add_argument(
        "--backends",
        metavar="LIST",
        help="comma-separated backends to use, most preferred first (default: "
        "$TIR_BYOC_BACKENDS, else all by intrinsic priority)",
    )


def _version() -> str:
    try:
        return importlib.metadata.version("tir-byoc")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


__all__ = ["EXIT_USAGE", "PROG", "build_parser"]
