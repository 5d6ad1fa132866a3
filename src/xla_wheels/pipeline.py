"""The stages in order, and the plan that ``DRY_RUN=1`` prints instead of running them.

resolve -> sources -> patches -> build -> collect/lock. Each function takes the previous
stage's typed output; nothing is shared through globals. The plan is composed from the
same inputs as the real run, so what ``DRY_RUN=1`` shows is what a run executes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from xla_host import log
from xla_host.errors import SourceError
from xla_host.redact import Redactor
from xla_wheels.builder import build_and_collect as build_stage
from xla_wheels.builder.config import BuildConfig
from xla_wheels.bundle import Bundle
from xla_wheels.checks_before_fetch import check_before_fetch
from xla_wheels.gitutil import RUN_ENV, RUN_OPTIONS, GitRunner, run_git
from xla_wheels.layout import BundleLayout
from xla_wheels.options import PipelineOptions
from xla_wheels.patches import (
    AppliedSeries,
    apply_series,
    branch_name,
    describe_series,
    messages_dir,
    series_commands,
    write_state,
)
from xla_wheels.plan import PlannedCommand, PlannedStage
from xla_wheels.progress import Timings
from xla_wheels.sources import CheckedOutSource, SourceCache, fetch_sources, plan_commands
from xla_wheels.upstream_tree import BUILD_OWNED
from xla_wheels.wheels_lock import update_bundle_entry, written_on_success


@dataclass(frozen=True)
class PatchedSources:
    """Output of the patch stage: worktrees ready to build."""

    sources: Mapping[str, CheckedOutSource]


def run_sources(
    options: PipelineOptions, bundle: Bundle, runner: GitRunner = run_git
) -> dict[str, CheckedOutSource]:
    cache = SourceCache(
        options.source_cache,
        options.mirror,
        runner,
        network=options.network,
    )
    return fetch_sources(bundle, cache, BundleLayout.of(options, bundle.name).src)


def run_patches(bundle: Bundle, sources: Mapping[str, CheckedOutSource]) -> PatchedSources:
    for name, source in sources.items():
        component = bundle.component(name)
        with log.section(f"patches: {name} ({len(component.patches)} file(s))"):
            branch = branch_name(bundle.name, source.worktree)
            if source.head and source.head != source.commit:
                # The sources stage reused a worktree whose HEAD is exactly the commit
                # this series makes from the pin (checked by content): nothing to apply.
                log.info(f"  {name}: the worktree already is this series, kept as it is")
                applied = AppliedSeries(
                    name, source.commit, describe_series(component), source.head, branch
                )
            else:
                applied = apply_series(
                    source.worktree,
                    component,
                    source.commit,
                    branch=branch,
                    build_owned=BUILD_OWNED.get(name, ()),
                )
            write_state(source.worktree, applied)
            for patch in applied.patches:
                log.info(f"  committed patches/{patch.relpath} sha256:{patch.sha256}")
            log.info(f"  {name}: branch {branch} at {applied.head} (the revision the build sees)")
    return PatchedSources(sources)


def run_until(
    options: PipelineOptions,
    bundle: Bundle,
    last_stage: str,
    build_config: BuildConfig | None = None,
) -> None:
    """Run the stages up to and including ``last_stage``.

    Each stage writes ``out/<bundle>/logs/<stage>.log`` (commands and their output,
    credentials masked; the recipes write their own), and the timings table at the end
    lists every stage, ran, cached or failed, also when the run fails.

    ``wheels.lock`` is written only when the whole run succeeded (one atomic write at
    the end, see :func:`~xla_wheels.wheels_lock.written_on_success`): a patch that does not
    apply, a failed build or ship check, or Ctrl-C leave it byte-identical. The sources
    stage alone records nothing: the series has not been shown to apply to the commits.
    """
    # Everything that can be checked without fetching, before anything is fetched. The
    # caller holds the bundle's run lock (the CLI edge: one run per bundle, exit 5).
    check_before_fetch(options, bundle)
    with (
        written_on_success(),
        contextlib.ExitStack() as at_exit,
    ):
        build_run = None
        if last_stage in ("build", "collect"):
            # Preflight first: every blocker (pins, remotes, engine, disk, memory) at once,
            # before anything is fetched. It also knows which build stages are cached.
            build_run = build_stage.prepare(options, bundle, build_config or BuildConfig())
        timings = build_run.timings if build_run is not None else Timings()
        at_exit.callback(timings.report)  # the table, also when the run fails
        logs = BundleLayout.of(options, bundle.name).logs
        redact = Redactor(build_config.remote_cache.secret_values() if build_config else {})
        with log.section(f"resolve: bundle {bundle.name}"):
            log.info(f"manifest {bundle.path} sha256:{bundle.manifest_sha256}")
            unresolved = bundle.unresolved_pins()
            if unresolved:
                raise SourceError(
                    f"bundle {bundle.name} has unresolved pins: " + "; ".join(unresolved),
                    fix=f"pin them in {bundle.path.name} (the build refuses to guess a commit)",
                )
        if last_stage == "resolve":
            return
        if build_run is not None and build_run.all_cached:
            # Every build stage is cached for these exact inputs (full SHAs, patch digests):
            # fresh worktrees would only be thrown away, so sources and patches are skipped.
            log.info("sources, patches: skipped (both build stages are cached for these inputs)")
            timings.add("sources", 0.0, "cached")
            timings.add("patches", 0.0, "cached")
            update_bundle_entry(options.lock_path, bundle, build_run.commits, options.root)
            patched = None
        else:
            with log.stage_log(logs / "sources.log", redact), timings.stage("sources"):
                sources = run_sources(options, bundle)
            if last_stage == "sources":
                return
            with log.stage_log(logs / "patches.log", redact), timings.stage("patches"):
                patched = run_patches(bundle, sources)
            resolved = {name: source.commit for name, source in sources.items()}
            update_bundle_entry(options.lock_path, bundle, resolved, options.root)
        if build_run is None:  # the last stage was patches
            return
        if patched is not None:
            build_run = build_stage.after_sources(build_run, patched.sources)
        build_stage.build(build_run)
        if last_stage == "collect":
            with log.stage_log(logs / "collect.log", redact):
                target = build_stage.collect(build_run)
                log.info(f"collect: {target}")


def plan(
    options: PipelineOptions,
    bundle: Bundle,
    build_config: BuildConfig | None = None,
    last_stage: str = "collect",
) -> list[PlannedStage]:
    """Every stage up to ``last_stage``, every command with its environment, every pin and
    patch digest: what :func:`run_until` with the same ``last_stage`` runs."""
    cache = SourceCache(options.source_cache, options.mirror, network=options.network)
    layout = BundleLayout.of(options, bundle.name)
    stages = [
        PlannedStage(
            "resolve",
            facts=(
                f"bundle {bundle.name}: {bundle.path.relative_to(options.root)} "
                f"sha256:{bundle.manifest_sha256}",
                f"python {bundle.python}",
                *(
                    f"runtime {pin.name}{pin.specifier} (install {pin.install_version})"
                    for pin in bundle.runtime.values()
                ),
                *(f"BLOCKED: {problem}" for problem in bundle.unresolved_pins()),
            ),
        )
    ]
    source_commands: list[PlannedCommand] = []
    git_env = " ".join(f"{key}={value}" for key, value in RUN_ENV.items())
    source_facts: list[str] = [
        f"git runs with {' '.join(RUN_OPTIONS)} and {git_env}",
        "commands for a cold cache; <placeholders> are discovered at run time",
    ]
    for component in bundle.components.values():
        if component.commit is None:
            source_facts.append(f"{component.name}: UNPINNED ({component.unpinned_reason})")
            continue
        kind = "full SHA" if component.is_full_sha else "short SHA, resolved by the fetch"
        source_facts.append(
            f"{component.name}: {component.commit} ({kind}) from {component.remote}"
        )
        source_commands += plan_commands(component, cache, layout.worktree(component.name))
    stages.append(PlannedStage("sources", tuple(source_facts), tuple(source_commands)))
    patch_commands: list[PlannedCommand] = []
    patch_facts = []
    for component in bundle.components.values():
        worktree = layout.worktree(component.name)
        branch = branch_name(bundle.name, worktree)
        patch_commands.extend(series_commands(worktree, component, branch).commands)
        patch_facts.append(
            f"{component.name}: {len(component.patches)} commit(s) on branch {branch}, "
            f"messages (the patch headers) written to {messages_dir(worktree)}"
            if component.patches
            else f"{component.name}: no patches"
        )
    stages.append(PlannedStage("patches", tuple(patch_facts), tuple(patch_commands)))
    if last_stage not in ("build", "collect"):
        # Preflight and the build stages run only for a build (see run_until).
        return stages[: [stage.name for stage in stages].index(last_stage) + 1]
    preflight, build = build_stage.plan_stages(options, bundle, build_config or BuildConfig())
    # Preflight runs first (before anything is fetched), so the plan lists it first.
    return [preflight, *stages, *build]
