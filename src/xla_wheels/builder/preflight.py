"""Preflight: every reason the build cannot succeed, found in seconds, reported at once.

Runs before anything is fetched or built, so a hopeless `make wheels` stops within
seconds instead of after an hour of compiling. The checks that wait on something (the
engine's daemon, each remote) run in parallel with short timeouts.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from xla_wheels.builder.config import BuildConfig
from xla_wheels.builder.container import image_present, probe_engine
from xla_wheels.bundle import Bundle, Component
from xla_wheels.errors import PipelineError, SourceError
from xla_wheels.gitutil import git, has_commit
from xla_wheels.options import PipelineOptions
from xla_wheels.sources import SourceCache, effective_remote

GIB = 1024**3


class PreflightError(PipelineError):
    """One or more blockers; the message lists all of them."""

    def __init__(self, bundle: str, blockers: list[str]) -> None:
        self.blockers = blockers
        text = f"preflight: bundle {bundle} cannot be built here ({len(blockers)} blocker(s)):"
        text += "".join(f"\n  - {blocker}" for blocker in blockers)
        super().__init__(text, fix="fix each blocker above, then run `make wheels` again")


def _ls_remote(url: str, timeout: float) -> str | None:
    try:
        process = git(["ls-remote", url, "HEAD"], check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:.0f}s"
    if process.returncode != 0:
        lines = process.stderr.strip().splitlines()
        return lines[-1] if lines else f"git ls-remote exit {process.returncode}"
    return None


def _component_blockers(
    component: Component, cache: SourceCache, mirror: str | None, timeout: float
) -> list[str]:
    problem = _check_component(component, cache, mirror, timeout)
    return [problem] if problem else []


def _check_component(
    component: Component, cache: SourceCache, mirror: str | None, timeout: float
) -> str | None:
    if component.commit is None:
        return None  # reported by the pin check
    repo = cache.repo_for(component)
    if repo.exists() and has_commit(repo, component.commit):
        return None  # the source cache already holds the pin: no network needed
    try:
        url = effective_remote(component.remote, mirror)
    except SourceError as error:
        return f"{component.name}: {error.message}"
    problem = _ls_remote(url, timeout)
    if problem is None:
        return None
    what = (
        f"short SHA {component.commit} cannot be resolved"
        if not component.is_full_sha
        else f"commit {component.commit[:12]} cannot be fetched"
    )
    fix = (
        "configure a mirror (MIRROR=DIR|URL)"
        if not mirror
        else "check the mirror has this repository"
    )
    return f"{component.name}: {what}: remote {url} unreachable ({problem}); {fix}"


def _check_engine(options: PipelineOptions, config: BuildConfig) -> list[str]:
    if config.mode == "host":
        problems = []
        for tool in [config.host_python, *config.host_tools]:
            if shutil.which(tool) is None:
                problems.append(f"host mode: `{tool}` is not on PATH")
        return problems
    problem = probe_engine(config.engine)
    if problem:
        return [
            f"engine {config.engine}: {problem}; install/start it, or pick another with "
            "ENGINE=docker|podman|buildah (or BUILD_MODE=host on a prepared builder)"
        ]
    if not image_present(config.engine, config.image):
        return [
            f"engine {config.engine}: builder image {config.image} not found; build it with "
            f"`make builder-image ENGINE={config.engine}`"
        ]
    return []


def _check_python(bundle: Bundle, config: BuildConfig) -> list[str]:
    if config.mode != "host" or shutil.which(config.host_python) is None:
        return []
    process = subprocess.run(
        [config.host_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    found = process.stdout.strip()
    if found != bundle.python:
        return [
            f"host mode: {config.host_python} is Python {found or '?'}, bundle {bundle.name} "
            f"needs {bundle.python}; pass HOST_PYTHON=python{bundle.python}"
        ]
    return []


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GIB
    except OSError:
        return None
    return None


def _check_resources(options: PipelineOptions, config: BuildConfig) -> list[str]:
    problems = []
    free = shutil.disk_usage(_existing(options.out_dir)).free / GIB
    if free < config.min_disk_gib:
        problems.append(
            f"disk: {free:.0f} GiB free under {_existing(options.out_dir)}, a build needs "
            f"about {config.min_disk_gib:.0f} GiB; free space or point --out-dir elsewhere"
        )
    total = _mem_total_gib()
    need = config.mem_base_gib + config.jobs * config.mem_per_job_gib
    if total is not None and total < need:
        fits = int((total - config.mem_base_gib) // config.mem_per_job_gib)
        problems.append(
            f"memory: {total:.0f} GiB here, JOBS={config.jobs} needs about {need:.0f} GiB "
            f"({config.mem_per_job_gib:.0f} GiB per job + {config.mem_base_gib:.0f}); "
            + (f"use JOBS={fits}" if fits >= 1 else "use a larger builder")
        )
    return problems


def preflight(
    options: PipelineOptions,
    bundle: Bundle,
    config: BuildConfig,
    *,
    need_sources: bool = True,
) -> list[str]:
    """Every blocker, in a stable order. ``need_sources=False`` when all stages are cached."""
    blockers = [f"pin: {problem}" for problem in bundle.unresolved_pins()]
    cache = SourceCache(options.source_cache, options.mirror)
    jobs: list[Callable[[], list[str]]] = [lambda: _check_engine(options, config)]
    if need_sources:
        for component in bundle.components.values():
            jobs.append(
                functools.partial(
                    _component_blockers, component, cache, options.mirror, config.remote_timeout
                )
            )
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: job(), jobs))
    blockers.extend(problem for result in results[1:] for problem in result)
    blockers.extend(results[0])
    blockers.extend(_check_python(bundle, config))
    blockers.extend(_check_resources(options, config))
    return blockers
