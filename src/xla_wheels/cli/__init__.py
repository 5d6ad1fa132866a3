"""The one command line of the pipeline (``xla-wheels`` / ``python -m xla_wheels``).

The package holds every subcommand's arguments; this module is the only place where a
:class:`~xla_host.errors.PipelineError` becomes ``error:`` / ``fix:`` lines and an exit
code (0 done or passed, 1 a step or check failed, 2 bad input or cannot judge, 5 another
run holds the bundle (:mod:`xla_wheels.run_lock`), 10 a disk fault, 130 interrupted). An
``OSError`` of a full disk, a quota, a read-only filesystem or no permission that escapes
a subcommand is a disk fault too (:mod:`xla_wheels.disk_faults`), never a traceback.

:data:`COMMANDS` names each subcommand's module of this package (``gate`` is standard
library only: it runs in the builder image; ``gate``, ``doctor`` and ``launch-env`` are
the host's commands, :mod:`xla_host.host_commands`, over the checkout). Each has
``add_arguments(name, parser)``, which defines one subcommand's arguments and sets its
``handler`` (a function of the parsed namespace returning the exit code). Adding a
subcommand is one line in :data:`COMMANDS` (a module of this package, or a full dotted
path for a stage that keeps its arguments next to it) and that function.

Only the module of the subcommand being run is imported, so ``xla-wheels gate --help``
loads the gate and nothing of the build or publish stages. Settings are read by
:mod:`xla_wheels.options` from the parsed arguments and the environment.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

from xla_host import edge
from xla_host.arguments import RefusedSwitchAction, SwitchAction
from xla_host.edge import Parser
from xla_host.errors import UsageError
from xla_wheels import __version__
from xla_wheels.cli.from_make import MakeRun
from xla_wheels.cli.help import subcommand_help
from xla_wheels.cli.settings import check_environment, env_switch, refuse_dry_run
from xla_wheels.disk_faults import disk_error
from xla_wheels.exit_codes import help_epilog

#: Every subcommand, in the order ``--help`` shows them: (module, one-line help); the
#: module is relative to this package unless it is a dotted path.
COMMANDS: dict[str, tuple[str, str]] = {
    "bundles": ("stages", "list the bundles with their pins"),
    "diff": ("stages", "what differs between two bundles (one: between it and its parent)"),
    "sources": ("stages", "fetch each component at its pin into a fresh worktree"),
    "patch": ("stages", "run up to the patch stage (sources, then the patch series)"),
    "wheels": ("stages", "the main job: resolve, sources, patches, build, collect/lock"),
    "builder-image": ("stages", "build the builder image from the Dockerfile"),
    "patches-check": (
        "stages",
        "apply a component's series to a scratch copy of a checkout and report each patch",
    ),
    "series-compile": (
        "series_compile",
        "compile every translation unit the torch_xla series touches, base and patched, "
        "against real XLA headers; fail on an error the series adds",
    ),
    "patch-export": (
        "patches",
        "write the patched worktree's commits back as the bundle's patch files",
    ),
    "patch-rebase": (
        "patches",
        "carry a component's patch series onto another commit (exit 3: stopped at a "
        "conflict for you to resolve)",
    ),
    "lock": ("stages", "write the bundle's entry in wheels.lock"),
    "lock-check": ("stages", "fail when a manifest or patch no longer matches wheels.lock"),
    "record": (
        "stages",
        "record wheels built elsewhere (a stock control, a builder fleet's output) as the "
        "bundle's, after the build stage's name, hash and provenance checks",
    ),
    "launch-env": (
        "checkout_source",
        "write a bundle's launch profile for a launcher (env.sh, env.json, the pre-import "
        "helper)",
    ),
    "gate": (
        "checkout_source",
        "decide whether a torch_xla build may ship (warm restart, HBM query)",
    ),
    "cache": (
        "xla_host.cache_command",
        "cache packs: `cache fetch` installs a signed pack so a new host starts warm",
    ),
    "bench-restart": (
        "gate",
        "restart benchmark: cold/warm time to first step, medians and spread",
    ),
    "publish": (
        "publish",
        "upload the bundle's locked wheels to a PEP 503 index with twine (or, without "
        "--index-url, write a static index in dist/<bundle>/simple/)",
    ),
    "requirements": (
        "publish",
        "write the hash-pinned requirements file hosts install the bundle from",
    ),
    "verify-install": (
        "publish",
        "install the bundle by hash into a fresh venv from the index, check versions and "
        "provenance against wheels.lock, import torch_xla",
    ),
    "doctor": (
        "checkout_source",
        "check a training host against a bundle (versions, runtime flags, cache) without "
        "importing torch_xla",
    ),
    "abi-check": (
        "abi",
        "list the symbols torch_xla's _XLAC imports that the paired torch does not export "
        "(the `undefined symbol` at import), without importing either",
    ),
    "publish-lane": (
        "release",
        "publish the bundle's locked wheels into a lane (default: the publish lane of "
        "build/lanes.toml, validation)",
    ),
    "promote": (
        "release",
        "copy exactly the locked files of a bundle into a lane, only when the lane's "
        "policy holds for its receipts",
    ),
    "compare": ("release", "two bundles' receipts side by side"),
    "lane-requirements": (
        "release",
        "per lane: hash-pinned requirements.txt and PEP 751 pylock.toml of its current bundle",
    ),
    "lanes": ("release", "each lane's index, current bundle and policy (or its history)"),
    "status": (
        "release",
        "every bundle (built, lanes, receipts, why a promotion is refused) and whether each "
        "lane's index serves exactly what lanes.lock says; reads only",
    ),
    "cache-pack": (
        "release",
        "publish the gate's signed cache pack of a bundle and workload into a lane, by hash, "
        "beside the bundle (the lane keeps the packs of the bundles it serves or can roll "
        "back to)",
    ),
    "rollback": (
        "release",
        "return a lane to a bundle it served before, with a reason, after the integrity "
        "checks (not the policy)",
    ),
    "runtime-image": (
        "runtime",
        "build an image to train from: a lane's bundle installed by hash, the host package, "
        "a launch profile's environment, OCI labels, the host check as entrypoint",
    ),
    "jobs": ("runtime", "which jobs ran a wheel, from a directory of audit stamps; reads only"),
    "attest": (
        "supply",
        "sign each locked wheel's in-toto statement (SLSA provenance) with the team's key",
    ),
    "rebuild-check": (
        "supply",
        "rebuild the bundle's wheels from nothing into a fresh stage and compare them byte "
        "for byte with wheels.lock (diffoscope's report on a difference)",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s arguments (and its module's imports) are loaded."""
    parser = Parser(
        prog="xla-wheels",
        description="Build, publish and gate patched PyTorch/XLA wheels from pinned bundles.",
        epilog="example:\n  xla-wheels wheels --bundle v6e-2.11\n\n"
        "Every command's options: xla-wheels COMMAND --help\n\n" + help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, **subcommand_help(name, help_text))
        if name == command:
            dotted = module_name if "." in module_name else f"{__name__}.{module_name}"
            module = importlib.import_module(dotted)
            module.add_arguments(name, sub)
    return parser


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every action of ``parser`` and of its loaded subcommands."""
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)


def _example(action: argparse.Action) -> str:
    """A value that works for ``action``, for the fix."""
    if action.choices:
        return str(next(iter(action.choices)))
    if example := getattr(action.type, "example", None):
        return str(example)
    if action.default not in (None, False, ""):
        return str(action.default)
    return "1" if action.nargs == "?" else "<value>"


def _bad_argument(
    error: argparse.ArgumentError, parser: argparse.ArgumentParser, make: MakeRun | None
) -> UsageError:
    """The error for a refused argument value, in the words the user typed."""
    names = (error.argument_name or "").split("/")
    action = next((a for a in _actions(parser) if set(a.option_strings) & set(names)), None)
    flag = names[0] or "argument"
    variable = make.variable_of(names) if make is not None else None
    example = _example(action) if action is not None else "<value>"
    # A subcommand without a dry run: the working command is the same one without it. A
    # switch value not understood: the fix is the side that changes less, a dry run on,
    # any other switch off (FORCE=1 overwrites files: proposed only for that problem).
    refused = isinstance(action, RefusedSwitchAction)
    drop = refused or (isinstance(action, SwitchAction) and action.dest != "dry_run")
    if make is not None and variable is not None:
        fix = make.command(None if drop else variable, example, instead_of=variable)
        return UsageError(f"{variable}: {error.message}", fix=fix)
    fix = f"run it without {flag}" if drop else f"pass {flag} {example}"
    return UsageError(f"{flag}: {error.message}", fix=fix)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    return exit_code_of(lambda: _run(arguments))


def exit_code_of(action: Callable[[], int]) -> int:
    """``action``'s exit code through the one edge (:mod:`xla_host.edge`), with the
    builder's reading of a disk fault (the mount, its free space)."""
    return edge.exit_code_of(action, disk_error=disk_error)


def checked_arguments(
    parser: Callable[[], argparse.ArgumentParser], arguments: Sequence[str]
) -> argparse.Namespace:
    """The edge's checks, before anything runs, for the CLI and every other entry point
    make runs (the demo): a make variable the Makefile does not read, a refused argument
    (named by its make variable), a switch or number of the environment not understood, a
    dry run asked of a command that has none (by make or by the environment)."""
    make = MakeRun.from_environ(os.environ)
    if make is not None:
        make.check_command_line()
    built = parser()
    try:
        args = built.parse_args(arguments)
    except argparse.ArgumentError as error:
        raise _bad_argument(error, built, make) from None
    if make is not None:
        make.check_dry_run(honoured=getattr(args, "dry_run", None) is True)
        make.check_received(arguments)
    # A switch or number in the environment that is not understood is refused before
    # anything runs, whether or not this subcommand reads it.
    check_environment(os.environ)
    if env_switch(os.environ, "--dry-run") and not getattr(args, "has_dry_run", False):
        refuse_dry_run(getattr(args, "command", None) or built.prog)
    return args


def _run(arguments: list[str]) -> int:
    # The subcommand is the first argument that is not an option (the top-level parser
    # has only --help and --version, which take no value).
    command = next((arg for arg in arguments if not arg.startswith("-")), None)
    args = checked_arguments(lambda: build_parser(command), arguments)
    handler: Callable[[argparse.Namespace], int] = args.handler
    if not getattr(args, "writes_bundle", False):
        return handler(args)
    # Imported only for a subcommand that writes a bundle: the gate's stay standard-library.
    from xla_wheels.cli.bundle_lock import held_for

    with held_for(args) as bundle:
        args.loaded_bundle = bundle
        return handler(args)
