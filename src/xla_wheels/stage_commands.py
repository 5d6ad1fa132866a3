"""Subcommands of the foundation stages: bundles, diff, sources, patch, lock, wheels."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from xla_wheels import log
from xla_wheels.builder.config import add_build_arguments, build_config_from_args
from xla_wheels.builder.container import build_image_argv
from xla_wheels.bundle import available_bundles, describe, diff, load_bundle
from xla_wheels.errors import LockError, PatchError, UsageError
from xla_wheels.lockfile import check_lock, update_bundle_entry
from xla_wheels.options import add_bundle_parser, add_common_arguments, options_from_args
from xla_wheels.patches import check_series
from xla_wheels.pipeline import plan, run_until
from xla_wheels.plan import render_plan
from xla_wheels.sources import SourceCache, known_commits

Subparsers = "argparse._SubParsersAction[argparse.ArgumentParser]"


def cmd_bundles(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    blocks = [describe(load_bundle(options.root, name)) for name in available_bundles(options.root)]
    print("\n\n".join(blocks))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    left = load_bundle(options.root, args.left)
    if args.right is None:
        # One bundle: what it changes relative to the bundle it extends.
        if left.extends is None:
            raise UsageError(
                f"bundle {left.name} extends no other bundle",
                fix="name two bundles: make diff A=<bundle> B=<bundle>",
            )
        left, right = load_bundle(options.root, left.extends), left
    else:
        right = load_bundle(options.root, args.right)
    rows = diff(left, right)
    if not rows:
        print(f"{left.name} and {right.name} pin the same inputs")
        return 0
    width = max(len(field) for field, _, _ in rows)
    print(f"{'':<{width}}  {left.name}  ->  {right.name}")
    for field, a, b in rows:
        print(f"{field:<{width}}  {a}  ->  {b}")
    return 0


def _make_stage_handler(last_stage: str):  # noqa: ANN202 - returns a handler
    def handler(args: argparse.Namespace) -> int:
        options = options_from_args(args)
        build_config = build_config_from_args(args) if last_stage == "collect" else None
        if options.dry_run:
            bundle = load_bundle(options.root, args.bundle)
            print(render_plan(plan(options, bundle, build_config)))
            return 0
        run_until(options, args.bundle, last_stage, build_config)
        log.info(f"{last_stage}: done for {args.bundle}")
        return 0

    return handler


def cmd_builder_image(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    config = build_config_from_args(args)
    argv = build_image_argv(config.engine, config.image, options.root)
    if options.dry_run:
        print(log.format_command(argv))
        return 0
    with log.section(f"builder image {config.image} ({config.engine})"):
        log.command(argv)
        return subprocess.run(argv, check=False).returncode


def cmd_patches_check(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    bundle = load_bundle(options.root, args.bundle)
    component = bundle.component(args.component)
    if component.commit is None:
        raise UsageError(f"{component.name} is not pinned in {bundle.name}")
    if args.source is None:
        cache = SourceCache(options.source_cache, options.mirror)
        commit = cache.resolve(component)
        source = cache.repo_for(component)
    else:
        source, commit = args.source, component.commit
    if not source.exists():
        raise UsageError(f"{source} does not exist", fix="pass a git checkout of the component")
    results = check_series(source, commit, component)
    for result in results:
        print(f"{'ok  ' if result.applied else 'FAIL'} patches/{result.relpath}: {result.detail}")
    not_reached = len(component.patches) - len(results)
    if not_reached:
        print(f"     ({not_reached} later patch(es) not tried)")
    if not all(result.applied for result in results) or not_reached:
        raise PatchError(f"the {component.name} series of {bundle.name} does not apply to {commit}")
    print(f"{component.name} series of {bundle.name}: {len(results)} patch(es) apply to {commit}")
    return 0


def cmd_lock(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    bundle = load_bundle(options.root, args.bundle)
    # Short pins are resolved from the local source cache only (`make sources` fetches
    # them); unresolved ones are written as such, never guessed.
    resolved = known_commits(bundle, SourceCache(options.source_cache, options.mirror))
    entry = update_bundle_entry(options.lock_path, bundle, resolved, options.root)
    unresolved = [name for name, pin in entry.components.items() if not pin.resolved]
    print(
        f"wheels.lock: wrote bundle {bundle.name}"
        + (f" (unresolved pins: {', '.join(unresolved)})" if unresolved else "")
    )
    return 0


def cmd_lock_check(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    problems = check_lock(options.root, options.lock_path)
    if problems:
        raise LockError(
            "wheels.lock does not match the bundles:\n  " + "\n  ".join(problems),
            fix="review the change, then `make lock BUNDLE=<name>` for each bundle named",
        )
    print(f"wheels.lock matches all {len(available_bundles(options.root))} bundle(s)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bundles", help="list the bundles with their pins")
    add_common_arguments(parser)
    parser.set_defaults(handler=cmd_bundles)

    parser = subparsers.add_parser(
        "diff", help="what differs between two bundles (one: between it and its parent)"
    )
    add_common_arguments(parser)
    parser.add_argument("left")
    parser.add_argument("right", nargs="?", default=None)
    parser.set_defaults(handler=cmd_diff)

    for name, stage, text in (
        ("sources", "sources", "fetch each component at its pin into a fresh worktree"),
        ("patch", "patches", "run up to the patch stage (sources, then the patch series)"),
        ("wheels", "collect", "the main job: resolve, sources, patches, build, collect/lock"),
    ):
        parser = add_bundle_parser(subparsers, name, text)
        if stage == "collect":
            add_build_arguments(parser)
        parser.set_defaults(handler=_make_stage_handler(stage))

    parser = subparsers.add_parser(
        "builder-image", help="build the builder image from the Dockerfile (ENGINE, BUILDER_IMAGE)"
    )
    add_common_arguments(parser)
    add_build_arguments(parser)
    parser.set_defaults(handler=cmd_builder_image)

    parser = add_bundle_parser(
        subparsers,
        "patches-check",
        "apply a component's series to a scratch copy of a checkout and report each patch",
    )
    parser.add_argument("--component", default="torch_xla", help="component (default torch_xla)")
    parser.add_argument(
        "--source",
        type=Path,
        default=None,
        help="git checkout (bare or not) holding the pinned commit "
        "(default: the source cache, fetching if needed)",
    )
    parser.set_defaults(handler=cmd_patches_check)

    parser = add_bundle_parser(subparsers, "lock", "write the bundle's entry in wheels.lock")
    parser.set_defaults(handler=cmd_lock)

    parser = subparsers.add_parser(
        "lock-check", help="fail when a manifest or patch no longer matches wheels.lock"
    )
    add_common_arguments(parser)
    parser.set_defaults(handler=cmd_lock_check)
