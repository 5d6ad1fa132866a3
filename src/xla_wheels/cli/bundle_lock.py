"""The bundle's run lock, taken at the CLI edge for every subcommand that writes a bundle.

Each bundle subcommand declares whether it writes the bundle's work or products
(``add_bundle_arguments(..., writes_bundle=...)``); the CLI runs a real run of a writer
inside :func:`held_for`, :func:`xla_wheels.run_lock.bundle_run_lock` (which says why). The
bundle is loaded first, once for the whole run: a bad name or manifest is refused (exit 2)
before the lock exists, and the handler finds the loaded bundle as ``args.loaded_bundle``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

from xla_wheels.bundle import Bundle, load_bundle
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.run_lock import bundle_run_lock


@contextmanager
def held_for(args: argparse.Namespace) -> Iterator[Bundle]:
    """The bundle, loaded once, and the run lock a subcommand that writes it needs around
    its handler (none for a dry run, which writes nothing)."""
    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    if options.dry_run:
        yield bundle
        return
    with bundle_run_lock(options.out_dir, bundle.name, args.command):
        yield bundle
