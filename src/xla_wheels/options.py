"""The one options object of a pipeline run, built once at the CLI edge.

As in cibuildwheel's ``options.py``: every setting is read here (command line first,
then environment, then default), and stages receive this frozen object instead of
reading the environment themselves.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from xla_wheels.errors import UsageError


def default_cache_dir() -> Path:
    """Per-machine cache (sources, environments): survives ``git clean`` of the repo."""
    if value := os.environ.get("XLA_WHEELS_CACHE"):
        return Path(value)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xla-wheels"


@dataclass(frozen=True)
class PipelineOptions:
    root: Path
    """The project checkout: build/bundles, patches/ and wheels.lock live here."""
    cache_dir: Path
    out_dir: Path
    """Per-build work (worktrees, logs): ``out/<bundle>/``; never shipped."""
    mirror: str | None
    """Directory of bare repositories or URL prefix replacing each remote's host."""
    dry_run: bool

    @property
    def lock_path(self) -> Path:
        return self.root / "wheels.lock"

    @property
    def source_cache(self) -> Path:
        return self.cache_dir / "sources"


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
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
        help="per-machine cache (default: $XLA_WHEELS_CACHE or ~/.cache/xla-wheels)",
    )
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="work directory (default: <root>/out)"
    )
    parser.add_argument(
        "--mirror",
        default=None,
        help="directory of bare repositories or URL prefix that replaces the remotes' "
        "host (default: $XLA_WHEELS_MIRROR)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        default=None,
        help="print the plan instead of running it (default: $DRY_RUN)",
    )


def add_bundle_parser(
    subparsers: argparse._SubParsersAction,
    name: str,
    help_text: str,
) -> argparse.ArgumentParser:
    """A subcommand that works on one bundle: the common options plus ``--bundle``."""
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    add_common_arguments(parser)
    parser.add_argument(
        "--bundle", "-b", default="", help="bundle name (build/bundles/<name>.toml)"
    )
    return parser


def options_from_args(args: argparse.Namespace) -> PipelineOptions:
    root = (args.root or Path(os.environ.get("XLA_WHEELS_ROOT", "."))).resolve()
    if not (root / "build" / "bundles").is_dir():
        raise UsageError(
            f"{root} is not a project checkout (no build/bundles directory)",
            fix="run from the repository root or pass --root",
        )
    dry_run = args.dry_run if args.dry_run is not None else _truthy(os.environ.get("DRY_RUN"))
    return PipelineOptions(
        root=root,
        cache_dir=(args.cache_dir or default_cache_dir()).resolve(),
        out_dir=(args.out_dir or root / "out").resolve(),
        mirror=args.mirror or os.environ.get("XLA_WHEELS_MIRROR") or None,
        dry_run=dry_run,
    )


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}
