"""Arguments and handlers of the foundation and build stages' subcommands.

bundles, diff, sources, patch, wheels, builder-image, patches-check, lock, lock-check, record.
Settings come from :mod:`xla_wheels.options` (flag, then ``XLA_WHEELS_*``, then default).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from xla_host import log, runner
from xla_host.arguments import add_setting, count
from xla_host.errors import CheckFailed, LockError, PatchError, PatchFileError, UsageError
from xla_host.redact import shown
from xla_wheels.builder.config import ENGINES, jobs_that_fit
from xla_wheels.builder.container import EngineError, build_image_argv
from xla_wheels.bundle import (
    Bundle,
    Component,
    available_bundles,
    describe,
    diff,
    load_bundle,
    restore_patches_fix,
    series_changes,
)
from xla_wheels.cli.arguments import add_bundle_arguments, add_common_arguments
from xla_wheels.cli.settings import MAX_JOBS, build_config, pipeline_options
from xla_wheels.gitutil import git_out
from xla_wheels.options import PipelineOptions
from xla_wheels.patches import PatchResult, check_series, parse_patch
from xla_wheels.pipeline import plan, run_until
from xla_wheels.plan import render_plan
from xla_wheels.series_build import (
    BuildCheckReport,
    build_check_step,
    judge,
    no_step_line,
    run_build_check,
)
from xla_wheels.series_checks.key_audit import (
    TABLE_SUBPATH,
    AuditReport,
    audit_series,
    missing_key_patch_summary,
)
from xla_wheels.series_checks.key_audit import judge as judge_audit
from xla_wheels.series_hygiene import refuse
from xla_wheels.settings_rows import add_settings, by_flag, in_group
from xla_wheels.sources import SourceCache, known_commits
from xla_wheels.wheels_lock import check_lock, update_bundle_entry


def cmd_bundles(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    blocks = [describe(load_bundle(options.root, name)) for name in available_bundles(options.root)]
    print(shown("\n\n".join(blocks)))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    if args.left is None:
        names = ", ".join(available_bundles(options.root))
        raise UsageError(
            "diff needs a bundle",
            fix=f"name one or two of {names}: make diff A=<bundle> [B=<bundle>] "
            "(CLI: xla-wheels diff A [B])",
        )
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
        print(shown(f"{field:<{width}}  {a}  ->  {b}"))
    for line in series_changes(left, right):
        print(shown(line))
    return 0


def cmd_stages(last_stage: str, args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    config = build_config(args, os.environ) if last_stage == "collect" else None
    bundle = args.loaded_bundle  # loaded once, at the CLI edge (cli/bundle_lock.py)
    if options.dry_run:
        print(render_plan(plan(options, bundle, config, last_stage)))
        if config is not None:
            # The plan lists what preflight checks; this says what it finds today.
            from xla_wheels.builder.preflight import dry_run_verdict

            print(dry_run_verdict(options, bundle, config))
        return 0
    run_until(options, bundle, last_stage, config)
    log.info(f"{last_stage}: done for {args.bundle}")
    return 0


def cmd_builder_image(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    config = build_config(args, os.environ)
    for item in args.build_arg or ():
        if "=" not in item or item.startswith("="):
            raise UsageError(
                f"build argument {item!r} is not NAME=VALUE",
                fix="write e.g. --build-arg BASE_IMAGE=mirror.example/python:3.13-slim-bookworm",
            )
    argv = build_image_argv(
        config.engine, config.image, options.root, build_args=tuple(args.build_arg or ())
    )
    if options.dry_run:
        print(log.format_command(argv))
        return 0
    with log.section(f"builder image {config.image} ({config.engine})"):
        try:
            # A failure is raised inside the section, so it closes as failed, not "done".
            runner.run(argv, output="inherit", error=lambda result: EngineError(
                f"{config.engine} could not build the builder image {config.image} "
                f"(exit {result.returncode}); its output is above",
                fix="fix the cause it names (behind a proxy or mirror: --build-arg "
                "BASE_IMAGE=<mirror>/python:..., LLVM_APT_BASE=, BAZELISK_BASE_URL=; make: "
                'BUILD_ARGS=; docs/building.md "Builder image behind a mirror"), then run '
                "it again",
            ))  # fmt: skip
        except FileNotFoundError:
            raise UsageError(
                f"{argv[0]} is not on PATH",
                fix=f"install {argv[0]}, or pick another engine: --engine "
                f"{'|'.join(ENGINES)} (make: ENGINE=)",
            ) from None
    print(f"builder image {config.image}: built")
    return 0


def cmd_patches_check(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    component = bundle.component(args.component)
    if component.commit is None:
        raise UsageError(f"{component.name} is not pinned in {bundle.name}")
    if args.source is None:
        cache = SourceCache(options.source_cache, options.mirror, network=options.network)
        commit = cache.resolve(component)
        source = cache.repo_for(component)
    else:
        source, commit = args.source, component.commit
    if not source.exists():
        raise UsageError(f"{source} does not exist", fix="pass a git checkout of the component")
    series = f"the {component.name} series of {bundle.name}"
    rungs = _Rungs(bundle.name)
    try:
        return _patches_check(options, bundle, component, source, commit, series, rungs)
    finally:
        # What ran and what did not, also when a rung failed: "checked" only for a rung
        # that ran.
        for line in rungs.lines():
            print(line)


class _Rungs:
    """The rungs of patches-check and what became of each (``None``: not reached)."""

    def __init__(self, bundle: str) -> None:
        self.done: dict[str, str | None] = dict.fromkeys(
            ("applies", "cache key audit", "compiled checks"), None
        )
        self.done["series-compile"] = (
            f"not run here (`make series-compile BUNDLE={bundle}` compiles every unit the "
            "series touches against real XLA headers)"
        )

    def lines(self) -> list[str]:
        return [
            f"rung {name}: {what or 'not run (not reached)'}" for name, what in self.done.items()
        ]


def _patches_check(
    options: PipelineOptions, bundle: Bundle, component: Component, source: Path,
    commit: str, series: str, rungs: _Rungs,
) -> int:  # fmt: skip
    """Apply, audit and build-check the series, noting in ``rungs`` what ran."""
    reports: list[BuildCheckReport] = []
    audits: list[AuditReport] = []

    def build_check(tree: Path, patches: Mapping[str, str]) -> None:
        # The cache key audit runs on every commit, its own Base included: it is cheap, and
        # the table may have been changed without the series.
        applied = [ref.relpath for ref in component.patches]
        if (audit := audit_series(options.root, component.name, tree, applied)) is not None:
            audits.append(audit)
            rungs.done["cache key audit"] = (
                f"not run, {audit.not_run}" if audit.not_run else "ran (its verdict is above)"
            )
        else:
            rungs.done["cache key audit"] = "not run (the series has no cache key table)"
        # Applied to its own Base, the series is what was verified when it was written;
        # on any other commit, "applies" says nothing about "builds".
        head = git_out(["rev-parse", "HEAD~" + str(len(patches))], cwd=tree)
        bases = {parse_patch(ref.path).base for ref in component.patches}
        if bases == {head}:
            print(f"compiled checks: not run, {series} is on the commit its Base names")
            rungs.done["compiled checks"] = "not run (the series is on its Base's commit)"
            return
        with tempfile.TemporaryDirectory(prefix="xla-wheels-checks-") as work:
            step = build_check_step(
                options.root,
                options.cache_dir,
                component.name,
                tree,
                head,
                Path(work),
                network=options.network,
            )
            if step is None:
                print(no_step_line(component.name))
                rungs.done["compiled checks"] = "not run (the series has no checks/)"
                return
            reports.append(run_build_check(step, patches))
            rungs.done["compiled checks"] = "ran (its verdict is above)"

    results = check_series(source, commit, component, after_apply=build_check)
    for result in results:
        print(f"{'ok  ' if result.applied else 'FAIL'} patches/{result.relpath}: {result.detail}")
        for defect in result.defects:
            print(f"       {defect.render()}")
    defects = [defect for result in results for defect in result.defects]
    refuse(
        defects,
        f"{series} holds conflict markers or whitespace errors; nothing was applied",
        "fix those lines in the patch (in the patched worktree: `make patch BUNDLE="
        f"{bundle.name}`, edit and amend the commit, then `make patch-export BUNDLE="
        f"{bundle.name} COMPONENT={component.name}`; see docs/patches.md, 'Updating a patch')",
    )
    not_reached = len(component.patches) - len(results)
    if not_reached:
        print(f"     ({not_reached} later patch(es) not tried)")
    failed = next((result for result in results if not result.applied), None)
    if failed is not None:
        rungs.done["applies"] = "ran: does not apply"
        raise _series_failure(failed, series, commit, bundle.name, component.name)
    rungs.done["applies"] = f"ran: {len(results)} patch(es) apply"
    print(f"{series}: {len(results)} patch(es) apply to {commit}")
    _judge_checks(reports, audits, series, bundle, component.name, commit)
    return 0


def _judge_checks(
    reports: list[BuildCheckReport],
    audits: list[AuditReport],
    series: str,
    bundle: Bundle,
    component: str,
    commit: str,
) -> None:
    """The compiled checks' and the cache key audit's reports, then their verdicts: a key
    patch out of the series first, since it is the cause (widening the table, or fixing
    code that needs the patch, is no fix)."""
    for line in [line for report in reports for line in report.lines()]:
        print(line)
    for line in [line for audit in audits for line in audit.lines()]:
        print(line)
    for audit in audits:
        if audit.missing:
            raise CheckFailed(
                f"{series}: {missing_key_patch_summary(audit)}",
                fix=restore_patches_fix(
                    bundle, component, [patch.relpath for patch in audit.missing]
                ),
            )
    for report in reports:
        judge(
            report,
            series,
            "carry the series onto that commit with `make patch-rebase BUNDLE="
            f"{bundle.name} COMPONENT={component} ONTO={commit}` and fix the patch "
            "named above there (docs/patches.md, 'Carrying the series to another commit')",
        )
    for audit in audits:
        judge_audit(audit, series, _AUDIT_FIX)


def _series_failure(
    failed: PatchResult, series: str, commit: str, bundle: str, component: str
) -> PatchError:
    """The summary of the first patch that stopped the check, saying what stopped it."""
    patch = f"patches/{failed.relpath}"
    if failed.failed_at == "header":
        return PatchFileError(
            f"{series}: the header of {patch} is wrong (the FAIL line above says how); "
            "the patch was not tried",
            fix=f"fix that header line in {patch} (docs/patches.md, 'Patch files': Files "
            "names exactly the files the diff touches), then run patches-check again",
        )
    return PatchError(
        f"{series} does not apply to {commit}: {patch} fails (the FAIL line above names "
        "the file and the first failing hunk)",
        fix=f"carry the series onto that commit with `make patch-rebase BUNDLE={bundle} "
        f"COMPONENT={component} ONTO={commit}` and fix {patch} there (docs/patches.md, "
        "'Carrying the series to another commit')",
    )


_AUDIT_FIX = (
    f"list each read or setter named above in {TABLE_SUBPATH}: status module when the "
    "lowering or the compile options read it (the key has it through the module), keyed "
    "when patch 0003 hashes it next to them, outside with the reason (docs/cache-key.md, "
    "'What the persistent cache key covers')"
)


def cmd_lock(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    bundle = args.loaded_bundle
    # Short pins are resolved from the local source cache only (`make sources` fetches
    # them); unresolved ones are written as such, never guessed.
    resolved = known_commits(bundle, SourceCache(options.source_cache, options.mirror))
    if options.dry_run:
        for name, commit in sorted(resolved.items()):
            print(f"{name}: {commit or 'unresolved (not in the source cache)'}")
        print(f"DRY_RUN: would write bundle {bundle.name} in {options.lock_path.name}; unchanged")
        return 0
    # Under the run lock the CLI edge holds; a broken lock is refused before it is written.
    entry = update_bundle_entry(options.lock_path, bundle, resolved, options.root)
    unresolved = [name for name, pin in entry.components.items() if not pin.resolved]
    print(
        f"wheels.lock: wrote bundle {bundle.name}"
        + (f" (unresolved pins: {', '.join(unresolved)})" if unresolved else "")
    )
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    # Imported here: only `record` loads the publish stage's provenance check.
    from xla_wheels.external_wheels import offered_wheels, record_external
    from xla_wheels.layout import BundleLayout

    options = pipeline_options(args, os.environ)
    bundle = args.loaded_bundle
    if args.wheels is None:
        raise UsageError(
            "record needs the directory of the wheels to record",
            fix=f"make record BUNDLE={bundle.name} WHEELS=<dir> (CLI: --wheels <dir>)",
        )
    layout = BundleLayout.of(options, bundle.name)
    resolved = known_commits(bundle, SourceCache(options.source_cache, options.mirror))
    if options.dry_run:
        for wheel in offered_wheels(args.wheels):
            print(f"would check and record {wheel} into {layout.dist}")
        print(f"DRY_RUN: {options.lock_path.name} and {layout.dist} unchanged")
        return 0
    for path in record_external(layout, bundle, args.wheels, resolved, options.root):
        print(f"recorded {path} for bundle {bundle.name}")
    return 0


def cmd_lock_check(args: argparse.Namespace) -> int:
    options = pipeline_options(args, os.environ)
    problems = check_lock(options.root, options.lock_path)
    if problems:
        # Each problem starts with its bundle's name: the fix is the command for each.
        named = dict.fromkeys(problem.partition(":")[0] for problem in problems)
        commands = ", ".join(f"`make lock BUNDLE={name}`" for name in named)
        raise LockError(
            "wheels.lock does not match the bundles:\n  " + "\n  ".join(problems),
            fix=f"review the change, then {commands}",
        )
    print(f"wheels.lock matches all {len(available_bundles(options.root))} bundle(s)")
    return 0


def add_build_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    group = parser.add_argument_group("build stage")
    # A refused --jobs value's fix proposes the jobs that fit this machine.
    jobs = by_flag("--jobs")
    add_setting(group, jobs, command=command, kind=count(1, MAX_JOBS, jobs_that_fit()))
    # Every other flag of the build and remote-cache rows this subcommand takes.
    for setting in (*in_group("build"), *in_group("remote-cache")):
        if setting.flag and setting is not jobs and command in setting.commands:
            add_setting(group, setting, command=command)


#: The stage each running subcommand stops after.
_LAST_STAGE = {"sources": "sources", "patch": "patches", "wheels": "collect"}


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    """Define subcommand ``name``'s arguments on ``parser`` and set its handler."""
    if name == "bundles":
        add_common_arguments(parser)
        parser.set_defaults(handler=cmd_bundles)
    elif name == "diff":
        add_common_arguments(parser)
        # Optional for argparse so that a missing bundle gets our message with make's
        # spelling (A=, B=) instead of argparse's "required: left".
        parser.add_argument("left", nargs="?", metavar="A", help="a bundle (default: none)")
        parser.add_argument(
            "right",
            nargs="?",
            metavar="B",
            help="another bundle (default: the bundle A extends)",
        )
        parser.set_defaults(handler=cmd_diff)
    elif name in _LAST_STAGE:
        add_bundle_arguments(parser, writes_bundle=True, dry_run=True)
        if _LAST_STAGE[name] == "collect":
            add_build_arguments(parser, name)
        parser.set_defaults(handler=functools.partial(cmd_stages, _LAST_STAGE[name]))
    elif name == "builder-image":
        add_common_arguments(parser, dry_run=True)
        add_build_arguments(parser, name)
        parser.set_defaults(handler=cmd_builder_image)
    elif name == "patches-check":
        add_bundle_arguments(parser, writes_bundle=False)  # scratch copies only
        add_settings(parser, name, "--component", "--source")
        parser.set_defaults(handler=cmd_patches_check)
    elif name == "lock":
        add_bundle_arguments(parser, writes_bundle=True, dry_run=True)
        parser.set_defaults(handler=cmd_lock)
    elif name == "record":
        add_bundle_arguments(parser, writes_bundle=True, dry_run=True)
        add_settings(parser, name, "--wheels")
        parser.set_defaults(handler=cmd_record)
    elif name == "lock-check":
        add_common_arguments(parser)
        parser.set_defaults(handler=cmd_lock_check)
    else:
        raise ValueError(f"{name} is not a subcommand of {__name__}")
