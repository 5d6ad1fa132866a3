"""Preflight: every reason the build cannot succeed, found in seconds, reported at once.

Runs before anything is fetched or built, so a hopeless `make wheels` stops within
seconds instead of after an hour of compiling. The checks that wait on something (the
engine's daemon, each remote) run in parallel with short timeouts.

The checks are data (:class:`Check`): :func:`checks` lists them, :func:`run_checks` runs
that list and the dry-run plan prints the same list (:func:`planned_preflight`), so what the
plan says preflight checks is what it checks.
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from xla_host import runner
from xla_host.errors import PipelineError, SourceError
from xla_host.runner import StepTimedOut
from xla_wheels import disk_faults
from xla_wheels.builder.config import ENGINES, BuildConfig, cores, jobs_that_fit, mem_total_gib
from xla_wheels.builder.container import image_present, probe_engine
from xla_wheels.bundle import Bundle, Component
from xla_wheels.checks_before_fetch import is_mirror_directory, mirror_problem
from xla_wheels.options import PipelineOptions
from xla_wheels.plan import PlannedCommand, PlannedStage
from xla_wheels.sources import SourceCache, effective_remote, ls_remote_command

GIB = 1024**3


class PreflightError(PipelineError):
    """One or more blockers; the message lists all of them."""

    def __init__(self, bundle: str, blockers: list[str], again: str) -> None:
        text = f"preflight: bundle {bundle} cannot be built here ({len(blockers)} blocker(s)):"
        text += "".join(f"\n  - {blocker}" for blocker in blockers)
        super().__init__(text, fix=f"fix each blocker above, then run `{again}` again")


def again_command(
    options: PipelineOptions, bundle: Bundle, config: BuildConfig, **changes: str
) -> str:
    """The whole ``make wheels`` command of this run, with ``changes`` (make variable ->
    value) applied: every fix preflight prints is a command that can be run as it is."""
    defaults = BuildConfig()
    variables = {
        "BUNDLE": bundle.name,
        "MIRROR": options.mirror or "",
        "BUILD_MODE": config.mode if config.mode != defaults.mode else "",
        "ENGINE": config.engine if config.engine != defaults.engine else "",
        "BUILDER_IMAGE": config.image if config.image != defaults.image else "",
        "HOST_PYTHON": config.host_python if config.host_python != defaults.host_python else "",
        "JOBS": str(config.jobs) if config.jobs != cores() else "",
        **changes,
    }
    words = [f"{name}={shlex.quote(value)}" for name, value in variables.items() if value]
    return " ".join(["make wheels", *words])


def _ls_remote(cache: SourceCache, url: str, timeout: float) -> str | None:
    try:
        process = cache.run(ls_remote_command(url), check=False, timeout=timeout)
    except StepTimedOut:
        return f"no answer within {timeout:.0f}s"
    if process.returncode != 0:
        lines = process.stderr.strip().splitlines()
        return lines[-1] if lines else f"git ls-remote exit {process.returncode}"
    return None


def _check_component(
    component: Component, cache: SourceCache, mirror: str | None, timeout: float, again: str
) -> list[str]:
    if component.commit is None:
        return []  # reported by the pin check
    repo = cache.repo_for(component)
    if repo.exists() and cache.has_commit(repo, component.commit):
        return []  # the source cache already holds the pin: no network needed
    if is_mirror_directory(mirror):
        # A mirror directory is local: ask it for the commit itself, not just whether
        # it answers (a stale mirror answers and then lacks the pin).
        problem = mirror_problem(component, cache, mirror, cache.run)
        return [problem] if problem else []
    try:
        url = effective_remote(component.remote, mirror)
    except SourceError as error:
        return [f"{component.name}: {error.message}"]
    problem = _ls_remote(cache, url, timeout)
    if problem is None:
        return []
    what = (
        f"short SHA {component.commit} cannot be resolved"
        if not component.is_full_sha
        else f"commit {component.commit[:12]} cannot be fetched"
    )
    fix = (
        f"fetch through a mirror: `{again}`"
        if not mirror
        else "check the mirror has this repository"
    )
    return [f"{component.name}: {what}: remote {url} unreachable ({problem}); {fix}"]


def _check_engine(options: PipelineOptions, bundle: Bundle, config: BuildConfig) -> list[str]:
    if config.mode == "host":
        missing = [t for t in (config.host_python, *config.host_tools) if shutil.which(t) is None]
        return [f"host mode: `{tool}` is not on PATH; install it" for tool in missing]
    problem = probe_engine(config.engine)
    if problem:
        others = [engine for engine in ENGINES if engine != config.engine]
        return [
            f"engine {config.engine}: {problem}; install/start it, or pick another: "
            + ", ".join(
                f"`{again_command(options, bundle, config, ENGINE=engine)}`" for engine in others
            )
            + f" (or `{again_command(options, bundle, config, BUILD_MODE='host')}` on a "
            "prepared builder)"
        ]
    if not image_present(config.engine, config.image):
        image = "" if config.image == BuildConfig().image else f" BUILDER_IMAGE={config.image}"
        return [
            f"engine {config.engine}: builder image {config.image} not found; build it with "
            f"`make builder-image ENGINE={config.engine}{image}`"
        ]
    return []


def _check_python(options: PipelineOptions, bundle: Bundle, config: BuildConfig) -> list[str]:
    if config.mode != "host" or shutil.which(config.host_python) is None:
        return []
    process = runner.run(
        [config.host_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        echo="none",
        check=False,  # no version printed: the blocker says '?'
    )
    found = process.stdout.strip()
    if found != bundle.python:
        return [
            f"host mode: {config.host_python} is Python {found or '?'}, bundle {bundle.name} "
            f"needs {bundle.python}; `"
            + again_command(options, bundle, config, HOST_PYTHON=f"python{bundle.python}")
            + "`"
        ]
    return []


def _check_resources(options: PipelineOptions, bundle: Bundle, config: BuildConfig) -> list[str]:
    problems = []
    where = disk_faults.existing(options.out_dir)
    free = disk_faults.free_bytes(where) / GIB
    if free < config.min_disk_gib:
        problems.append(
            f"disk: {free:.0f} GiB free under {where}, a build needs "
            f"about {config.min_disk_gib:.0f} GiB; free space, or put the "
            "work directory on a bigger disk: `XLA_WHEELS_OUT=<dir on a bigger disk> "
            f"{again_command(options, bundle, config)}`"
        )
    total = mem_total_gib()
    need = config.mem_base_gib + config.jobs * config.mem_per_job_gib
    if total is not None and total < need:
        fits = int((total - config.mem_base_gib) // config.mem_per_job_gib)
        # Proposed: what this machine's memory and cores both take.
        jobs = jobs_that_fit(config.mem_per_job_gib, config.mem_base_gib)
        problems.append(
            f"memory: {total:.0f} GiB here, JOBS={config.jobs} needs about {need:.0f} GiB "
            f"({config.mem_per_job_gib:.0f} GiB per job + {config.mem_base_gib:.0f}); "
            + (
                f"use `{again_command(options, bundle, config, JOBS=str(jobs))}`"
                if fits >= 1
                else "use a larger builder"
            )
        )
    return problems


@dataclass(frozen=True)
class Check:
    """One preflight check: what the plan prints (``name``, ``what``) and what runs."""

    name: str
    what: str
    run: Callable[[], list[str]]
    """Returns the blockers found (empty: passed)."""
    commands: tuple[PlannedCommand, ...] = ()
    """The commands the check may run, for the plan."""


def checks(
    options: PipelineOptions,
    bundle: Bundle,
    config: BuildConfig,
    *,
    need_sources: bool = True,
    cache: SourceCache | None = None,
) -> list[Check]:
    """Every check, in the order their blockers are reported."""
    cache = cache or SourceCache(options.source_cache, options.mirror)
    found = [
        Check(
            "pins",
            "every component has a commit",
            lambda: [f"pin: {problem}" for problem in bundle.unresolved_pins()],
        )
    ]
    if need_sources:
        for component in bundle.components.values():
            commands: tuple[PlannedCommand, ...] = ()
            if component.commit is not None:
                with contextlib.suppress(SourceError):
                    probe = ls_remote_command(effective_remote(component.remote, options.mirror))
                    commands = (replace(probe, note="when the cache lacks the commit"),)
            found.append(
                Check(
                    f"remote {component.name}",
                    "the source cache holds the pinned commit, or a MIRROR directory holds "
                    "it (`git cat-file -e`), or the remote (or MIRROR URL) answers "
                    f"`git ls-remote` within {config.remote_probe_timeout:.0f}s",
                    functools.partial(
                        _check_component,
                        component,
                        cache,
                        options.mirror,
                        config.remote_probe_timeout,
                        again_command(options, bundle, config, MIRROR="<dir or URL>"),
                    ),
                    commands,
                )
            )
    where = (
        f"engine {config.engine} answers and has image {config.image}"
        if config.mode == "container"
        else "host tools on PATH: " + ", ".join([config.host_python, *config.host_tools])
    )
    need = config.mem_base_gib + config.jobs * config.mem_per_job_gib
    found.append(
        Check(f"{config.mode} mode", where, lambda: _check_engine(options, bundle, config))
    )
    if config.mode == "host":
        found.append(
            Check(
                "python",
                f"{config.host_python} is Python {bundle.python}",
                lambda: _check_python(options, bundle, config),
            )
        )
    found.append(
        Check(
            "resources",
            f"disk >= {config.min_disk_gib:.0f} GiB free under the work directory; "
            f"memory >= {need:.0f} GiB for JOBS={config.jobs}",
            lambda: _check_resources(options, bundle, config),
        )
    )
    return found


def run_checks(found: list[Check]) -> list[str]:
    """Run every check in parallel (some wait on the network); blockers in list order."""
    with ThreadPoolExecutor(max_workers=len(found)) as pool:
        results = list(pool.map(lambda check: check.run(), found))
    return [problem for result in results for problem in result]


def dry_run_verdict(options: PipelineOptions, bundle: Bundle, config: BuildConfig) -> str:
    """What a dry run says of preflight: the blockers the checks that contact no remote
    find now (the real run would stop on them), or that they find none. A dry run changes
    nothing and waits on no network, so the remotes are left to the real run."""
    blockers = run_checks(checks(options, bundle, config, need_sources=False))
    if not blockers:
        return (
            "preflight now: no blocker found (pins, engine or host tools, disk, memory); "
            "the remotes are checked by the real run"
        )
    return (
        f"preflight now: the real run would stop: {len(blockers)} blocker(s) "
        "(the remotes not checked by a dry run):"
        + "".join(f"\n  - {blocker}" for blocker in blockers)
    )


def planned_preflight(
    options: PipelineOptions,
    bundle: Bundle,
    config: BuildConfig,
    *,
    need_sources: bool = True,
) -> PlannedStage:
    """The preflight stage of the plan: the same check list :func:`run_checks` runs."""
    where = (
        f"engine {config.engine}, image {config.image}"
        if config.mode == "container"
        else f"host, {config.host_python}"
    )
    found = checks(options, bundle, config, need_sources=need_sources)
    return PlannedStage(
        "preflight",
        facts=(
            f"mode {config.mode} ({where}), jobs {config.jobs}",
            "checks, in parallel, blockers reported together:",
            *(f"  {check.name}: {check.what}" for check in found),
        ),
        commands=tuple(command for check in found for command in check.commands),
    )
