"""Checks that need no fetch, run before the sources stage fetches anything.

With real sources the first fetch is PyTorch's multi-gigabyte history, so every input
problem that can be seen locally must stop the run before it: the manifest itself is
checked at load (:mod:`xla_wheels.bundle`: patch paths, components, remotes); this module
adds what needs more than the manifest, all local and quick (no network, nothing written):

- ``wheels.lock`` reads (UTF-8, TOML, known version, well-formed entries);
- every patch file's header is valid and names the component it is listed under;
- with a mirror *directory*, the mirror holds each pinned commit the source cache lacks
  (``git cat-file -e`` on the mirror's bare repository). A URL mirror can only be asked
  over the network; preflight probes it (``git ls-remote``).
"""

from __future__ import annotations

from pathlib import Path

from xla_host.errors import SourceError
from xla_wheels.bundle import Bundle, Component
from xla_wheels.gitutil import GitRunner, run_git
from xla_wheels.options import PipelineOptions
from xla_wheels.patches import parse_patch
from xla_wheels.sources import SourceCache, effective_remote, has_commit_command
from xla_wheels.wheels_lock import read_lock


def is_mirror_directory(mirror: str | None) -> bool:
    return bool(mirror) and "://" not in (mirror or "") and not (mirror or "").startswith("git@")


def mirror_problem(
    component: Component, cache: SourceCache, mirror: str | None, runner: GitRunner = run_git
) -> str | None:
    """Why the pinned commit cannot come from a mirror directory; None when it can (or
    when the source cache already holds it, or the mirror is a URL)."""
    if component.commit is None or not is_mirror_directory(mirror):
        return None
    repo = cache.repo_for(component)
    if repo.exists() and cache.has_commit(repo, component.commit):
        return None
    try:
        mirrored = Path(effective_remote(component.remote, mirror))
    except SourceError as error:
        return f"{component.name}: {error.message} ({error.fix})"
    if runner(has_commit_command(mirrored, component.commit), check=False).returncode != 0:
        return (
            f"{component.name}: commit {component.commit} is not in the mirror {mirrored} "
            f"(update the mirror: `git --git-dir={mirrored} remote update`, or pin a commit "
            "it has)"
        )
    return None


def check_before_fetch(options: PipelineOptions, bundle: Bundle) -> None:
    """Raise the first problem found; runs in well under a second and writes nothing."""
    read_lock(options.lock_path)
    for component in bundle.components.values():
        for ref in component.patches:
            parse_patch(ref.path, component=component.name)
    if is_mirror_directory(options.mirror):
        cache = SourceCache(options.source_cache, options.mirror)
        problems = [
            problem
            for component in bundle.components.values()
            if (problem := mirror_problem(component, cache, options.mirror)) is not None
        ]
        if problems:
            raise SourceError(
                f"bundle {bundle.name} cannot be fetched from the mirror "
                f"{options.mirror}:\n  " + "\n  ".join(problems),
                fix="update the mirror (or point --mirror/MIRROR at one that has these "
                "commits); nothing was fetched or written",
            )
