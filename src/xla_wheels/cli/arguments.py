"""Arguments shared by the subcommands that work on the project checkout.

Standard library only, so that every subcommand module may use them without loading
another stage. Their environment variables follow :mod:`xla_wheels.options`' rule.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xla_host.arguments import OUTPUT_DIR, ValueType, amount, count
from xla_host.values import SWITCH_SPELLINGS, BadValue, parse_switch
from xla_wheels.settings_table import Setting, by_flag, in_group


class SwitchAction(argparse.Action):
    """An on/off flag: ``--dry-run`` alone is on; ``--dry-run=VALUE`` is on or off by
    :func:`xla_host.values.parse_switch` (the Makefile passes the user's raw value), and
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


def value_type(setting: Setting) -> ValueType:
    """The argparse ``type`` of a number setting of the table: its range, its default as
    the example of a value that works."""
    example = setting.default if isinstance(setting.default, float | int) else setting.example
    assert setting.low is not None and setting.high is not None and example is not None
    if setting.kind == "count":
        return count(int(setting.low), int(setting.high), int(example))
    return amount(setting.low, setting.high, example, setting.unit)


#: The network and progress settings: the flags' types, and the parsers of their
#: ``XLA_WHEELS_*`` variables (:mod:`xla_wheels.cli.settings`).
PROGRESS_INTERVAL = value_type(by_flag("--progress-interval"))
NET_TIMEOUT = value_type(by_flag("--net-timeout"))
NET_RETRIES = value_type(by_flag("--net-retries"))
_TYPES: dict[str, Callable[[str], Any]] = {"path": Path, "directory": OUTPUT_DIR}


def add_setting(
    parser: argparse.ArgumentParser | Any,
    setting: Setting,
    *,
    command: str | None = None,
    kind: Callable[[str], Any] | None = None,
) -> None:
    """The flag of one row of the settings table as subcommand ``command`` takes it, its
    default in its help. A row with an environment variable gets no argparse default: the
    options reader then looks at the environment, then the row's default. ``kind``: the
    type, when it is not the row's own (a fix that depends on the machine)."""
    assert setting.flag is not None
    # The table's commands column is what --help and make help say: a subcommand that
    # takes a flag its row does not list would make both wrong.
    assert not setting.commands or command is None or command in setting.commands, (
        f"{setting.flag} is not a setting of {command} in the settings table"
    )
    per = setting.per(command)
    default = (per.default if per else setting.default) if setting.env is None else None
    help = setting.help_with_default(command)
    if setting.kind == "switch":
        add_switch(parser, setting.flag, default=None if setting.env else False, help=help)
        return
    extra: dict[str, Any] = {}
    if setting.dest:
        extra["dest"] = setting.dest
    if setting.metavar:
        extra["metavar"] = setting.metavar
    if setting.kind in ("repeated", "words"):
        parser.add_argument(setting.flag, action="append", help=help, **extra)
        return
    if kind is None:
        numeric = setting.kind in ("count", "amount")
        kind = value_type(setting) if numeric else _TYPES.get(setting.kind, str)
    parser.add_argument(
        setting.flag,
        type=kind,
        default=default,
        choices=(setting.choices if per is None or per.choices is None else per.choices) or None,
        help=help,
        **extra,
    )


def add_settings(parser: argparse.ArgumentParser | Any, command: str, *flags: str) -> None:
    """The flags of subcommand ``command``, each from its row."""
    for flag in flags:
        add_setting(parser, by_flag(flag), command=command)


def add_common_arguments(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """The pipeline's own settings, shared by every subcommand that works on the project:
    the common and network rows of the settings table.

    ``--dry-run`` is honoured where the subcommand has a dry run (prints what it would do
    and changes nothing); elsewhere it is hidden, an off value is accepted and an on value
    refused (exit 2) rather than ignored.
    """
    for setting in (*in_group("common"), *in_group("network")):
        add_setting(parser, setting)
    if dry_run:
        add_setting(parser, by_flag("--dry-run"))
    else:
        parser.add_argument(
            "--dry-run", action=RefusedSwitchAction, default=None, help=argparse.SUPPRESS
        )
    # Whether --dry-run is honoured: the options reader refuses XLA_WHEELS_DRY_RUN where not.
    parser.set_defaults(has_dry_run=dry_run)


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
