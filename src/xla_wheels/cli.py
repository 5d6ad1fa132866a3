"""The one command line of the pipeline (``xla-wheels`` / ``python -m xla_wheels``).

Every subcommand is registered by its stage module through a ``register(subparsers)``
function that adds a parser with ``set_defaults(handler=...)``; a handler takes the
parsed namespace and returns an exit code. This module is the only place where
:class:`~xla_wheels.errors.PipelineError` becomes a message and an exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from xla_wheels import __version__
from xla_wheels.errors import PipelineError

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def _registrations() -> list[Register]:
    # Imported here so that ``--help`` of one subcommand never pays for another's imports.
    from xla_wheels import commands

    return list(commands.REGISTRATIONS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xla-wheels",
        description="Build, publish and gate patched PyTorch/XLA wheels from pinned bundles.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _registrations():
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except PipelineError as error:
        print(f"error: {error.message}", file=sys.stderr)
        if error.fix:
            print(f"  fix: {error.fix}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
