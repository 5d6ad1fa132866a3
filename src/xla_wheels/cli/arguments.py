"""Arguments shared by the subcommands that work on the project checkout.

Standard library only, so that every subcommand module may use them without loading
another stage. Their environment variables follow :mod:`xla_wheels.options`' rule.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_common_arguments(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """The pipeline's own settings, shared by every subcommand that works on the project.

    ``--dry-run`` only where the subcommand honours it (prints what it would do and changes
    nothing); elsewhere argparse rejects the flag (exit 2) rather than ignore it.
    """
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="project checkout (default: $XLA_WHEELS_ROOT or the current directory)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="per-machine cache (default: $XLA_WHEELS_CACHE, else "
        "$XDG_CACHE_HOME/xla-wheels, else ~/.cache/xla-wheels)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="work directory (default: $XLA_WHEELS_OUT or <root>/out)",
    )
    parser.add_argument(
        "--mirror",
        default=None,
        help="directory of bare repositories or URL prefix that replaces the remotes' "
        "host (default: $XLA_WHEELS_MIRROR)",
    )
    if dry_run:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            default=None,
            help="print what would be done and change nothing (default: $XLA_WHEELS_DRY_RUN)",
        )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=None,
        help="seconds between 'still fetching' lines when stderr is not a terminal; 0 for "
        "none (default: $XLA_WHEELS_PROGRESS_INTERVAL or 30)",
    )


def add_bundle_arguments(parser: argparse.ArgumentParser, *, dry_run: bool = False) -> None:
    """A subcommand that works on one bundle: the common options plus ``--bundle``."""
    add_common_arguments(parser, dry_run=dry_run)
    parser.add_argument(
        "--bundle", "-b", default="", help="bundle name (build/bundles/<name>.toml)"
    )
