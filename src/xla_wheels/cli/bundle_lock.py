"""The bundle's run lock, taken at the CLI edge for every subcommand that writes a bundle.

Each bundle subcommand declares whether it writes the bundle's work or products
(``add_bundle_arguments(..., writes_bundle=...)``); the CLI runs a real run of a writer
inside :func:`held_for`, :func:`xla_wheels.run_lock.bundle_run_lock` (which says why). The
bundle is loaded first: a bad name or manifest is refused (exit 2) before the lock exists.
"""

from __future__ import annotations

import argparse
import os
from contextlib import AbstractContextManager, nullcontext

from xla_wheels.bundle import load_bundle
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.run_lock import bundle_run_lock


def held_for(args: argparse.Namespace) -> AbstractContextManager[object]:
    """The run lock a subcommand that writes a bundle needs around its handler (none for a
    dry run)."""
    options = pipeline_options(args, os.environ)
    if options.dry_run:
        return nullcontext()  # a dry run writes nothing
    bundle = load_bundle(options.root, args.bundle)
    return bundle_run_lock(options.out_dir, bundle.name, args.command)
