"""Subcommands ``patch-export`` and ``patch-rebase`` (README, "Updating a patch")."""

from __future__ import annotations

import argparse
import os

from xla_wheels import log
from xla_wheels.bundle import COMPONENT_NAMES, Bundle, load_bundle
from xla_wheels.bundle_lock import unless_dry_run
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.errors import UsageError
from xla_wheels.options import PipelineOptions, pipeline_options
from xla_wheels.patch_workflow import continue_rebase, export_series, start_rebase
from xla_wheels.sources import SourceCache


def cmd_patch_export(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    with unless_dry_run(options.dry_run, options.out_dir, bundle.name, "patch-export"):
        report = export_series(
            options.root,
            options.out_dir,
            bundle,
            args.component,
            force=args.force,
            dry_run=options.dry_run,
        )
    verb = "would write" if options.dry_run else "wrote"
    for patch in report.patches:
        print(f"{verb if patch.changed else 'unchanged'}: patches/{patch.relpath}")
    if report.new_pin:
        print(
            f"{verb}: {bundle.path.name} [components.{args.component}] commit = "
            f'"{report.new_pin}"'
        )
    for other in report.shared_with:
        log.warning(
            f"bundle {other} lists these patch files too, at another {args.component} commit: "
            "check it with `make patches-check` (or give it its own copies)"
        )
    if not options.dry_run and (report.new_pin or any(p.changed for p in report.patches)):
        print(f"next: review `git diff`, then `make lock BUNDLE={bundle.name}`")
    return 0


def cmd_patch_rebase(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    with unless_dry_run(options.dry_run, options.out_dir, bundle.name, "patch-rebase"):
        onto = _rebase(options, bundle, args)
    if onto is None:  # a dry run: the plan is printed
        return 0
    print(
        f"{args.component} series of {bundle.name} is now on {onto}; next: `make patch-export "
        f"BUNDLE={bundle.name} COMPONENT={args.component}` writes the refreshed patches and "
        "the new pin"
    )
    return 0


def _rebase(options: PipelineOptions, bundle: Bundle, args: argparse.Namespace) -> str | None:
    if args.continue_:
        return continue_rebase(options.out_dir, bundle, args.component)
    else:
        if not args.onto:
            raise UsageError(
                "no target commit given", fix="pass ONTO=<commit> (make) or --onto <commit>"
            )
        cache = SourceCache(options.source_cache, options.mirror)
        onto = start_rebase(
            cache, options.out_dir, bundle, args.component, args.onto, dry_run=options.dry_run
        )
        return None if options.dry_run else onto


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    if name == "patch-export":
        add_bundle_arguments(parser, dry_run=True)
        parser.add_argument("--component", default="torch_xla", choices=COMPONENT_NAMES)
        parser.add_argument(
            "--force",
            action="store_true",
            help="overwrite patch files edited by hand since the patch stage applied them",
        )
        parser.set_defaults(handler=cmd_patch_export)
    elif name == "patch-rebase":
        add_bundle_arguments(parser, dry_run=True)
        parser.add_argument("--component", default="torch_xla", choices=COMPONENT_NAMES)
        parser.add_argument("--onto", default=None, help="the commit to carry the series onto")
        parser.add_argument(
            "--continue",
            dest="continue_",
            action="store_true",
            help="continue after resolving a conflict",
        )
        parser.set_defaults(handler=cmd_patch_rebase)
    else:
        raise ValueError(f"{name} is not a subcommand of {__name__}")
