"""Arguments shared by the subcommands that work on the project checkout.

Standard library only, so that every subcommand module may use them without loading
another stage. Their environment variables follow :mod:`xla_wheels.options`' rule.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xla_wheels.values import (
    SWITCH_SPELLINGS,
    BadValue,
    check_output_dir,
    parse_amount,
    parse_count,
    parse_switch,
)

#: The longest wait between progress lines a user may ask for (a day): anything longer is
#: a typo, and would look like a hang.
MAX_PROGRESS_INTERVAL = 86400.0
#: The longest a network step may wait for an answer (a day), and the most retries of a
#: transient fault: more is a typo, and would look like a hang.
MAX_NET_TIMEOUT = 86400.0
MAX_NET_RETRIES = 20


class SwitchAction(argparse.Action):
    """An on/off flag: ``--dry-run`` alone is on; ``--dry-run=VALUE`` is on or off by
    :func:`xla_wheels.values.parse_switch` (the Makefile passes the user's raw value), and
    any other value is refused at parse time, before anything runs."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("metavar", "yes|no")
        super().__init__(option_strings, dest, nargs="?", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.parse(values))

    def parse(self, values: str | Sequence[Any] | None) -> bool:
        if values is None:
            return True
        try:
            return parse_switch(str(values))
        except BadValue as bad:
            raise argparse.ArgumentError(self, f"{values!r} {bad.reason}") from None


class RefusedSwitchAction(SwitchAction):
    """``--dry-run`` of a subcommand that has no dry run: off is accepted (so that
    ``DRY_RUN=0`` through make works everywhere), on is refused: running for real when
    the user asked for a dry run would act behind their back."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if self.parse(values):
            command = getattr(namespace, "command", None) or parser.prog.split()[-1]
            raise argparse.ArgumentError(self, f"{command} has no dry run")
        setattr(namespace, self.dest, False)


def add_switch(
    parser: argparse.ArgumentParser | Any, flag: str, *, help: str, default: bool | None = False
) -> None:
    """An on/off flag (see :class:`SwitchAction`); ``default`` None when an environment
    variable may give it (the options reader then looks there)."""
    parser.add_argument(
        flag, action=SwitchAction, default=default, help=f"{help} [{SWITCH_SPELLINGS}]"
    )


class ValueType:
    """An argparse ``type`` from a :mod:`xla_wheels.values` parser: a value is refused at
    parse time with the parser's reason; ``example`` is a value that works (for the fix)."""

    def __init__(self, parse: Callable[[str], Any], example: str, name: str) -> None:
        self.parse = parse
        self.example = example
        self.__name__ = name  # argparse names the type in some of its messages

    def __call__(self, text: str) -> Any:
        try:
            return self.parse(text)
        except BadValue as bad:
            raise argparse.ArgumentTypeError(f"{text!r} {bad.reason}") from None


def count(low: int, high: int, example: int) -> ValueType:
    """A whole number in ``[low, high]``."""
    return ValueType(
        lambda text: parse_count(text, low=low, high=high, example=example), str(example), "count"
    )


def amount(low: float, high: float, example: float, unit: str) -> ValueType:
    """A finite number of ``unit`` in ``[low, high]``."""
    return ValueType(
        lambda text: parse_amount(text, low=low, high=high, example=example, unit=unit),
        f"{example:g}",
        "amount",
    )


#: The network and progress settings: the flags' types, and the parsers of their
#: ``XLA_WHEELS_*`` variables (:mod:`xla_wheels.cli.settings`).
PROGRESS_INTERVAL = amount(0, MAX_PROGRESS_INTERVAL, 30, "seconds")
NET_TIMEOUT = amount(1, MAX_NET_TIMEOUT, 60, "seconds")
NET_RETRIES = count(0, MAX_NET_RETRIES, 3)
#: A directory the pipeline writes into (``--out``, ``--out-dir``, ``--cache-dir``).
OUTPUT_DIR = ValueType(check_output_dir, "out", "directory")


def add_common_arguments(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """The pipeline's own settings, shared by every subcommand that works on the project.

    ``--dry-run`` is honoured where the subcommand has a dry run (prints what it would do
    and changes nothing); elsewhere it is hidden, an off value is accepted and an on value
    refused (exit 2) rather than ignored.
    """
    parser.add_argument(
        "--root",
        type=Path,
        help="project checkout (default: $XLA_WHEELS_ROOT or the current directory)",
    )
    parser.add_argument(
        "--cache-dir",
        type=OUTPUT_DIR,
        help="per-machine cache (default: $XLA_WHEELS_CACHE, else "
        "$XDG_CACHE_HOME/xla-wheels, else ~/.cache/xla-wheels)",
    )
    parser.add_argument(
        "--out-dir",
        type=OUTPUT_DIR,
        help="work directory (default: $XLA_WHEELS_OUT or <root>/out)",
    )
    parser.add_argument(
        "--mirror",
        help="directory of bare repositories or URL prefix that replaces the remotes' "
        "host (default: $XLA_WHEELS_MIRROR)",
    )
    if dry_run:
        add_switch(
            parser,
            "--dry-run",
            default=None,
            help="print what would be done and change nothing (default: $XLA_WHEELS_DRY_RUN, else "
            "off)",
        )
    else:
        parser.add_argument(
            "--dry-run", action=RefusedSwitchAction, default=None, help=argparse.SUPPRESS
        )
    # Whether --dry-run is honoured: the options reader refuses XLA_WHEELS_DRY_RUN where not.
    parser.set_defaults(has_dry_run=dry_run)
    parser.add_argument(
        "--progress-interval",
        type=PROGRESS_INTERVAL,
        help="seconds between 'still fetching' lines when stderr is not a terminal; 0 for "
        "none (default: $XLA_WHEELS_PROGRESS_INTERVAL or 30)",
    )
    parser.add_argument(
        "--net-timeout",
        type=NET_TIMEOUT,
        help="seconds a network step waits for an answer before it counts as timed out; a "
        "transfer gets more by its size (default: $XLA_WHEELS_NET_TIMEOUT or 60)",
    )
    parser.add_argument(
        "--net-retries",
        type=NET_RETRIES,
        help="times a network step is tried again after a transient fault (refused, reset, "
        "HTTP 5xx, timed out), with growing pauses (default: $XLA_WHEELS_NET_RETRIES or 3)",
    )


def add_bundle_arguments(
    parser: argparse.ArgumentParser, *, writes_bundle: bool, dry_run: bool = False
) -> None:
    """A subcommand that works on one bundle: the common options plus ``--bundle``.

    ``writes_bundle``: whether it writes the bundle's work or products (``out/<bundle>``,
    ``dist/<bundle>``, its ``wheels.lock`` entry). Every bundle subcommand says which, so
    none can forget: the CLI edge (:mod:`xla_wheels.cli.bundle_lock`) holds the bundle's
    run lock around those that do (exit 5 for a second run), except for a dry run.
    """
    add_common_arguments(parser, dry_run=dry_run)
    parser.set_defaults(writes_bundle=writes_bundle)
    parser.add_argument(
        "--bundle", "-b", default="", help="bundle name (build/bundles/<name>.toml)"
    )
