"""Arguments shared by the subcommands that work on the project checkout.

Standard library only, so that every subcommand module may use them without loading
another stage. Their environment variables follow :mod:`xla_wheels.options`' rule.
"""

from __future__ import annotations

import argparse

from xla_host.arguments import RefusedSwitchAction, add_setting, value_type
from xla_wheels.settings_rows import by_flag, in_group

#: The network and progress settings: the flags' types, and the parsers of their
#: ``XLA_WHEELS_*`` variables (:mod:`xla_wheels.cli.settings`).
PROGRESS_INTERVAL = value_type(by_flag("--progress-interval"))
NET_TIMEOUT = value_type(by_flag("--net-timeout"))
NET_RETRIES = value_type(by_flag("--net-retries"))


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
