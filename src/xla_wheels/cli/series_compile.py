"""series-compile: the series' translation units compiled against real XLA headers.

The series is applied to a scratch clone of the source as ``patches-check`` applies it
(one commit per patch); the base is a worktree of that clone at the pin. Both are compiled
by :mod:`xla_wheels.series_checks.unit_compile`; an error the patched tree adds fails the
command (exit 7), naming the patch, the file, the line and g++'s message.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from xla_host.errors import PatchError, ToolchainError, UsageError
from xla_wheels.bundle import load_bundle
from xla_wheels.cli.arguments import add_bundle_arguments
from xla_wheels.cli.settings import pipeline_options
from xla_wheels.gitutil import git
from xla_wheels.patches import check_series
from xla_wheels.series_build import SeriesDoesNotBuild
from xla_wheels.series_checks.unit_compile import SeriesCompileReport
from xla_wheels.settings_rows import add_settings
from xla_wheels.sources import SourceCache


def cmd_series_compile(args: argparse.Namespace) -> int:
    # Imported here: the header set's module is only needed when the command runs.
    from xla_wheels.series_checks.unit_compile import compile_series
    from xla_wheels.series_checks.xla_headers import HEADER_SETS, ensure_headers

    options = pipeline_options(args, os.environ)
    bundle = load_bundle(options.root, args.bundle)
    component = bundle.component("torch_xla")
    if component.commit is None:
        raise UsageError(f"torch_xla is not pinned in {bundle.name}")
    if args.source is None:
        cache = SourceCache(options.source_cache, options.mirror, network=options.network)
        commit = cache.resolve(component)
        source = cache.repo_for(component)
    else:
        source, commit = args.source, component.commit
    if not source.exists():
        raise UsageError(f"{source} does not exist", fix="pass a git checkout of pytorch/xla")
    headers = ensure_headers(options.cache_dir, HEADER_SETS[args.xla_headers], options.network)
    series = f"the torch_xla series of {bundle.name}"
    reports: list[SeriesCompileReport] = []

    def compile_both(tree: Path, patches: Mapping[str, str]) -> None:
        with tempfile.TemporaryDirectory(prefix="xla-wheels-compile-") as work:
            base_tree = Path(work) / "base"
            base = f"HEAD~{len(patches)}"
            git(["worktree", "add", "--quiet", "--detach", str(base_tree), base], cwd=tree)
            try:
                reports.append(compile_series(
                    base_tree, tree, patches, headers, options.cache_dir, Path(work)
                ))  # fmt: skip
            finally:
                git(["worktree", "remove", "--force", str(base_tree)], cwd=tree, check=False)

    results = check_series(source, commit, component, after_apply=compile_both)
    if not reports:
        failed = next((r for r in results if not r.applied), None)
        raise PatchError(
            f"{series} does not apply to {commit}"
            + (f": patches/{failed.relpath}: {failed.detail}" if failed else ""),
            fix="make patches-check BUNDLE=" + bundle.name + " names the patch and hunk",
        )
    report = reports[0]
    for line in report.lines():
        print(line)
    if not report.new_errors and report.not_compiled:
        raise ToolchainError(
            f"{series}: {len(report.not_compiled)} compile(s) did not get through their unit "
            "(listed above as NOT CHECKED), so nothing is proven of them",
            fix="make the header it names available (a stand-in in xla_wheels.series_checks."
            "unit_compile's FORWARD_DECLARATIONS, or a header set that has it), then run "
            "make series-compile again",
        )
    if not report.passed:
        traced = sorted({e.patch for e in report.new_errors if e.patch})
        raise SeriesDoesNotBuild(
            f"{series}: the patched tree adds {len(report.new_errors)} compile error(s) "
            f"the base does not have"
            + (f", from {', '.join(f'patches/{p}' for p in traced)}" if traced else "")
            + " (listed above)",
            fix="fix the named lines in the patch (make patch, edit, amend, make patch-export; "
            "docs/patches.md, 'Updating a patch'), then run make series-compile again",
        )
    if not report.units:
        # A series of Python or build files only: nothing of torch_xla/csrc to compile.
        print(f"series-compile: {series} touches no translation unit: nothing was compiled")
        return 0
    print(
        f"series-compile passed: {len(report.units)} unit(s), no error the base does not have "
        f"(headers {report.headers.header_set.name})"
    )
    return 0


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name != "series-compile":
        raise ValueError(f"{name} is not a subcommand of {__name__}")
    add_bundle_arguments(parser, writes_bundle=False)  # scratch copies only
    add_settings(parser, name, "--source", "--xla-headers")
    parser.set_defaults(handler=cmd_series_compile)
