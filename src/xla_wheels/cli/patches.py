"""Subcommands ``patch-export`` and ``patch-rebase`` (docs/patches.md, "Updating a patch")."""

from __future__ import annotations

import argparse
import os

from xla_host import log
from xla_host.errors import UsageError
from xla_wheels.bundle import Bundle
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.options import PipelineOptions
from xla_wheels.patch_workflow import RebaseResult, continue_rebase, export_series, start_rebase
from xla_wheels.series_build import judge
from xla_wheels.series_checks.key_audit import judge as judge_audit
from xla_wheels.settings_rows import add_settings


def cmd_patch_export(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = args.loaded_bundle  # loaded, and its run lock taken, at the CLI edge
    report = export_series(options, bundle, args.component, force=args.force)
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
            f"check it with `make patches-check BUNDLE={other}` (or give it its own copies)"
        )
    if not options.dry_run and (report.new_pin or any(p.changed for p in report.patches)):
        print(f"next: review `git diff`, then `make lock BUNDLE={bundle.name}`")
    return 0


def cmd_patch_rebase(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = args.loaded_bundle  # loaded, and its run lock taken, at the CLI edge
    result = _rebase(options, bundle, args)
    if result is None:  # a dry run: the plan is printed
        return 0
    series = f"the {args.component} series of {bundle.name}"
    export = f"`make patch-export BUNDLE={bundle.name} COMPONENT={args.component}`"
    if result.audit is not None:
        for line in result.audit.lines():
            print(line)
    if result.build is not None:
        for line in result.build.lines():
            print(line)
        worktree = result.build.step.tree
        judge(
            result.build,
            f"{series} (now on {result.onto[:12]})",
            f"change the patch named above in {worktree}: `git -C {worktree} rebase -i "
            f"{result.onto[:12]}`, change `pick` to `edit` on its line, fix the file, `git -C "
            f"{worktree} commit -a --amend --no-edit`, `git -C {worktree} rebase --continue`; "
            f"then `make patch-rebase BUNDLE={bundle.name} COMPONENT={args.component} "
            f"CONTINUE=1` runs the checks again (or {export} as it is, knowing it does not build)",
        )
    if result.audit is not None:
        judge_audit(
            result.audit,
            f"{series} (now on {result.onto[:12]})",
            "list each read or setter named above in "
            f"patches/{args.component}/cache_key_inputs.toml (module: the lowering or the "
            "compile options read it; keyed: patch 0003 hashes it next to them; outside: "
            "with the reason); then `make patch-rebase "
            f"BUNDLE={bundle.name} COMPONENT={args.component} CONTINUE=1` audits again",
        )
    print(
        f"{series} is now on {result.onto}; next: {export} writes the refreshed patches and "
        "the new pin"
    )
    return 0


def _rebase(
    options: PipelineOptions, bundle: Bundle, args: argparse.Namespace
) -> RebaseResult | None:
    if getattr(args, "continue"):
        return continue_rebase(options, bundle, args.component)
    if not args.onto:
        raise UsageError(
            "no target commit given", fix="pass ONTO=<commit> (make) or --onto <commit>"
        )
    result = start_rebase(options, bundle, args.component, args.onto)
    return None if options.dry_run else result


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    # Both take the bundle and whose series.
    add_bundle_arguments(parser, writes_bundle=True, dry_run=True)
    if name == "patch-export":
        add_settings(parser, name, "--component", "--force")
        parser.set_defaults(handler=cmd_patch_export)
    elif name == "patch-rebase":
        add_settings(parser, name, "--component", "--onto", "--continue")
        parser.set_defaults(handler=cmd_patch_rebase)
    else:
        raise ValueError(f"{name} is not a subcommand of {__name__}")
