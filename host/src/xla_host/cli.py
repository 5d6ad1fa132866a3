"""``xla-host``: the host's own command, ``gate``, ``doctor``, ``launch-env`` and ``cache``
from the lane, no checkout.

A host installs only the host wheel (``xla-wheels-host``, standard library only) into its
torch environment, by hash, from the lane; then::

    xla-host doctor --lane https://lanes.corp/validation/ --bundle v6e-2.11
    xla-host gate   --lane https://lanes.corp/validation/ --bundle v6e-2.11 --out out/gate

Both fetch the bundle document (:mod:`xla_host.bundle_document`) from the lane (a
directory, or the URL serving it), verify its sha256 (``--bundle-sha256``, else the
lane's index), and judge this environment against it; ``--bundle-document FILE`` reads a
document given as a file instead.

This module owns the ``xla-host`` console script and ``python -m xla_host``: the same
command line on every machine, whatever else is installed. ``gate``, ``doctor`` and
``launch-env`` are :mod:`xla_host.host_commands`, the same handlers the builder's command
line runs over its checkout; here over the lane's document (:mod:`xla_host.lane_source`).
The builder's command is ``xla-wheels`` (``xla_wheels.cli``, a checkout's ``.venv``),
whose ``--lane`` names a lane of ``build/lanes.toml``, not a URL; a builder command given
here is refused with the builder's command line as the fix. The same edge as the builder's
(:mod:`xla_host.edge`): ``error:``/``fix:``, exit 0 ok, 1 a check judged against, 2 bad
input or cannot judge, 8 the lane did not answer in time, 10 a disk fault, 130
interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence

import xla_host
from xla_host import host_commands, net
from xla_host.edge import Parser, exit_code_of
from xla_host.errors import UsageError
from xla_host.lane_source import PROG, HostLine

__all__ = ["BUILDER_PROG", "HOST_COMMANDS", "PROG", "build_parser", "main"]

#: The builder's command (``xla_wheels.cli``), named when a builder command is given here.
BUILDER_PROG = "xla-wheels"
HOST_COMMANDS = {
    "gate": "decide whether this environment may ship the bundle (warm restart, HBM query); "
    "the receipt goes to --out",
    "doctor": "check this host against the bundle's document (the runtime contract: "
    "PJRT_DEVICE, XLA_NO_SPECIAL_SCALARS, the cache path; versions, installed files) "
    "without importing torch_xla",
    "launch-env": "write the bundle's launch profile for a launcher (env.sh, env.json, the "
    "pre-import helper xla_launch_profile.py) from its document",
    "cache": "cache packs: `cache fetch` installs a signed pack so this host starts warm",
}


class _Version(argparse.Action):
    """``--version``: the installed version is read only when asked for (xla_host.__getattr__)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        sys.stdout.write(f"{parser.prog} {xla_host.__version__}\n")  # as argparse's own
        parser.exit()


def main(argv: Sequence[str] | None = None) -> int:
    """The ``xla-host`` console script and ``python -m xla_host`` (module doc)."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    return exit_code_of(lambda: _run(arguments))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="The host side of xla-wheels: judge this environment against a bundle "
        "published in a lane.",
        epilog=f"example:\n  {PROG} gate --lane https://lanes.corp/validation/ --bundle "
        f"v6e-2.11\n\nEvery command's options: {PROG} COMMAND --help",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    line = HostLine(os.environ)
    for name, help_text in HOST_COMMANDS.items():
        if name == "cache":  # no bundle document: a pack is verified on its own
            from xla_host import cache_command

            cache = commands.add_parser(name, help=help_text, description=help_text)
            cache_command.add_arguments(name, cache)
            continue
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=f"example:\n  {PROG} {name} --lane https://lanes.corp/validation/ "
            "--bundle v6e-2.11",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        host_commands.add_arguments(name, sub, line)
    return parser


def _run(arguments: list[str]) -> int:
    if arguments and not arguments[0].startswith("-") and arguments[0] not in HOST_COMMANDS:
        name = arguments[0]
        close = difflib.get_close_matches(name, HOST_COMMANDS, n=1)
        raise UsageError(
            f"{name} is not a command of {PROG} (the host's: {', '.join(HOST_COMMANDS)}); "
            f"a builder command runs as `{BUILDER_PROG} {name}`",
            fix=(f"did you mean `{PROG} {close[0]}`? " if close else "")
            + f"run `{BUILDER_PROG} {name} ...` in the project's checkout (its `.venv`, "
            f"`make venv`), or use one of: {', '.join(HOST_COMMANDS)}",
        )
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except argparse.ArgumentError as error:
        flag = (error.argument_name or "argument").split("/")[0]
        raise UsageError(f"{flag}: {error.message}", fix=f"see `{PROG} --help`") from None
    if hasattr(args, "net_timeout"):
        # The flags, else their XLA_WHEELS_* variables, checked before anything runs.
        args.network = net.policy_from(args, os.environ)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)
