"""Stage 2, sources: each component at its pinned commit, in a worktree of its own.

Layout of the per-machine cache::

    <cache>/sources/<component>-<remote digest>.git   bare repository, fetched into

Each build gets ``out/<bundle>/src/<component>``, a detached ``git worktree`` of that bare
repository at the verified full SHA. The cache itself has no work tree, so it can never
be patched in place, and a failed fetch leaves it as it was (git only moves refs after
the objects are complete).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from xla_wheels import log
from xla_wheels.bundle import Bundle, Component
from xla_wheels.errors import GitError, PipelineError, SourceError
from xla_wheels.gitutil import git, git_out, has_commit, status_porcelain

# The state file the patch stage leaves next to a worktree; its presence says the
# worktree's changes are ours (an applied series), so recreating it loses nothing.
STATE_SUFFIX = ".applied.json"


@dataclass(frozen=True)
class CheckedOutSource:
    """Output of the sources stage for one component."""

    component: str
    commit: str
    """The verified full SHA checked out."""
    worktree: Path
    cache_repo: Path


def remote_path(remote: str) -> str:
    """``https://github.com/pytorch/xla.git`` -> ``pytorch/xla.git`` (what a mirror holds)."""
    if "://" in remote:
        path = urlsplit(remote).path
    elif ":" in remote and not remote.startswith("/"):  # scp-like git@host:owner/repo.git
        path = remote.split(":", 1)[1]
    else:
        path = remote
    path = path.strip("/")
    return path if path.endswith(".git") else f"{path}.git"


def effective_remote(remote: str, mirror: str | None) -> str:
    """The URL to fetch from: the remote itself, or its counterpart in the mirror."""
    if not mirror:
        return remote
    relative = remote_path(remote)
    if "://" in mirror or mirror.startswith("git@"):
        return f"{mirror.rstrip('/')}/{relative}"
    directory = Path(mirror)
    for candidate in (directory / relative, directory / relative.removesuffix(".git")):
        if candidate.exists():
            return str(candidate.resolve())
    raise SourceError(
        f"mirror directory {directory} has no repository for {remote}",
        fix=f"create it with `git clone --mirror {remote} {directory / relative}` on a "
        "host that reaches the remote, or point --mirror at the right directory",
    )


def submodule_rewrites(remote: str, mirror: str | None) -> list[str]:
    """git ``-c`` options that send submodule URLs of the remote's host to the mirror."""
    if not mirror or "://" not in remote:
        return []
    parts = urlsplit(remote)
    host_prefix = f"{parts.scheme}://{parts.netloc}/"
    if "://" in mirror or mirror.startswith("git@"):
        target = mirror.rstrip("/") + "/"
    else:
        target = Path(mirror).resolve().as_uri() + "/"
    return ["-c", f"url.{target}.insteadOf={host_prefix}"]


class SourceCache:
    """Bare repositories under ``<cache>/sources``, one per (component, remote)."""

    def __init__(self, root: Path, mirror: str | None) -> None:
        self.root = root
        self.mirror = mirror

    def repo_for(self, component: Component) -> Path:
        digest = hashlib.sha256(component.remote.encode()).hexdigest()[:12]
        return self.root / f"{component.name}-{digest}.git"

    def ensure_repo(self, component: Component) -> Path:
        repo = self.repo_for(component)
        if repo.exists():
            self._check_usable(repo)
            return repo
        self.root.mkdir(parents=True, exist_ok=True)
        # Created under a temporary name and renamed, so an interrupted first run never
        # leaves a half-initialised repository that later runs would trust.
        staging = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=self.root))
        git(["init", "--bare", "--quiet", str(staging)])
        staging.rename(repo)
        return repo

    def _check_usable(self, repo: Path) -> None:
        probe = git(["rev-parse", "--is-bare-repository"], git_dir=repo, check=False)
        if probe.returncode != 0 or probe.stdout.strip() != "true":
            raise SourceError(
                f"source cache {repo} is not a bare git repository (damaged or edited by hand)",
                fix=f"remove it (`rm -rf {repo}`); the next run fetches it again",
            )
        for lock in ("shallow.lock", "packed-refs.lock", "index.lock", "config.lock"):
            if (repo / lock).exists():
                raise SourceError(
                    f"source cache {repo} has a stale {lock} (an interrupted git run?)",
                    fix=f"make sure no other build is running, then `rm {repo / lock}`",
                )

    def resolve(self, component: Component, *, allow_fetch: bool = True) -> str:
        """The full SHA of the component's pin, fetching it into the cache if needed."""
        if component.commit is None:
            raise SourceError(
                f"{component.name} has no pinned commit: {component.unpinned_reason}",
                fix=f'set [components.{component.name}] commit = "<sha>" in the bundle',
            )
        repo = self.ensure_repo(component)
        if not has_commit(repo, component.commit):
            if not allow_fetch:
                raise SourceError(
                    f"{component.name} commit {component.commit} is not in the source cache",
                    fix="run `make sources BUNDLE=<bundle>` where the remote or a mirror "
                    "is reachable",
                )
            self._fetch(repo, component)
        return self._verify(repo, component)

    def _fetch(self, repo: Path, component: Component) -> None:
        url = effective_remote(component.remote, self.mirror)
        refspecs: Sequence[str]
        if component.is_full_sha:
            # Fetching one SHA keeps the transfer small; GitHub and git >= 2.5 servers with
            # uploadpack.allowReachableSHA1InWant allow it. Otherwise fall back to branches.
            refspecs = [component.commit or ""]
        else:
            refspecs = ["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"]
        with log.section(f"fetch {component.name} from {url}"):
            attempt = git(
                ["fetch", "--quiet", "--no-tags", url, *refspecs],
                git_dir=repo,
                echo=True,
                check=False,
            )
            if attempt.returncode != 0 and component.is_full_sha:
                attempt = git(
                    [
                        "fetch",
                        "--quiet",
                        url,
                        "+refs/heads/*:refs/remotes/origin/*",
                        "+refs/tags/*:refs/tags/*",
                    ],
                    git_dir=repo,
                    echo=True,
                    check=False,
                )
            if attempt.returncode != 0:
                raise SourceError(
                    f"cannot fetch {component.name} from {url}: {attempt.stderr.strip()}",
                    fix="check the network or credentials, or build from a mirror with "
                    "--mirror DIR|URL (XLA_WHEELS_MIRROR); the source cache is unchanged",
                )

    def _verify(self, repo: Path, component: Component) -> str:
        commit = component.commit or ""
        probe = git(
            ["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], git_dir=repo, check=False
        )
        if probe.returncode != 0:
            ambiguous = git(["rev-parse", "--disambiguate=" + commit], git_dir=repo, check=False)
            if len(ambiguous.stdout.split()) > 1:
                raise SourceError(
                    f"{component.name} short commit {commit} is ambiguous",
                    fix="write more hex digits (the full 40-digit SHA) in the bundle",
                )
            raise SourceError(
                f"{component.name} commit {commit} does not exist in {component.remote}",
                fix="check the SHA in the bundle manifest (a force-pushed branch can lose "
                "commits; pin one that is on a branch or tag)",
            )
        full = probe.stdout.strip()
        if not full.startswith(commit):
            raise SourceError(f"{component.name}: {commit} resolved to {full}, which differs")
        return full

    def checkout(self, component: Component, commit: str, worktree: Path) -> CheckedOutSource:
        """A fresh detached worktree of ``commit`` at ``worktree``."""
        repo = self.ensure_repo(component)
        self._remove_previous_worktree(repo, worktree)
        worktree.parent.mkdir(parents=True, exist_ok=True)
        git(
            ["worktree", "add", "--detach", "--force", str(worktree), commit],
            git_dir=repo,
            echo=True,
        )
        head = git_out(["rev-parse", "HEAD"], cwd=worktree)
        if head != commit:
            raise SourceError(f"{component.name}: worktree is at {head}, expected {commit}")
        if component.submodules:
            with log.section(f"submodules of {component.name}"):
                git(
                    ["submodule", "update", "--init", "--recursive", "--jobs", "4"],
                    cwd=worktree,
                    config=submodule_rewrites(component.remote, self.mirror),
                    echo=True,
                )
        return CheckedOutSource(component.name, commit, worktree, repo)

    def _remove_previous_worktree(self, repo: Path, worktree: Path) -> None:
        state = worktree.with_name(worktree.name + STATE_SUFFIX)
        if worktree.exists():
            try:
                dirty = status_porcelain(worktree)
            except GitError:
                dirty = "(not a git worktree)"
            if dirty and not state.exists():
                raise SourceError(
                    f"{worktree} has changes that the pipeline did not make:\n{dirty}",
                    fix="save what you need from it, then remove the directory; nothing was "
                    "changed",
                )
            git(
                ["worktree", "remove", "--force", "--force", str(worktree)],
                git_dir=repo,
                check=False,
            )
            if worktree.exists():
                shutil.rmtree(worktree)
        state.unlink(missing_ok=True)
        git(["worktree", "prune"], git_dir=repo, check=False)


def fetch_sources(bundle: Bundle, cache: SourceCache, src_dir: Path) -> dict[str, CheckedOutSource]:
    """Run the sources stage for every pinned component of ``bundle``."""
    unresolved = bundle.unresolved_pins()
    if unresolved:
        raise SourceError(
            f"bundle {bundle.name} cannot be built: " + "; ".join(unresolved),
            fix=f"pin the missing commits in {bundle.path}",
        )
    checked_out = {}
    for component in bundle.components.values():
        with log.section(f"sources: {component.name} @ {component.commit}"):
            commit = cache.resolve(component)
            checked_out[component.name] = cache.checkout(
                component, commit, src_dir / component.name
            )
    return checked_out


def known_commits(bundle: Bundle, cache: SourceCache) -> dict[str, str | None]:
    """Full SHAs known without the network: full pins, and short ones the cache resolves.

    Used where a run must not fetch (``make lock``, the plan): a short pin that the cache
    cannot resolve stays ``None`` and is recorded as unresolved, never guessed.
    """
    commits: dict[str, str | None] = {}
    for component in bundle.components.values():
        commits[component.name] = None
        if component.is_full_sha:
            commits[component.name] = component.commit
        elif component.commit and cache.repo_for(component).exists():
            try:
                commits[component.name] = cache.resolve(component, allow_fetch=False)
            except PipelineError:
                commits[component.name] = None
    return commits
