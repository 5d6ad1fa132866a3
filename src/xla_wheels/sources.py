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
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from xla_wheels import filemode, log
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


_MAX_SUBMODULE_DEPTH = 8


@dataclass(frozen=True)
class Submodule:
    name: str
    path: str
    url: str


def read_gitmodules(worktree: Path) -> list[Submodule]:
    """The submodules ``.gitmodules`` declares, in file order."""
    if not (worktree / ".gitmodules").is_file():
        return []
    listing = git(
        [
            "config",
            "--file",
            ".gitmodules",
            "--null",
            "--get-regexp",
            r"^submodule\..*\.(path|url)$",
        ],
        cwd=worktree,
        check=False,
    ).stdout
    fields: dict[str, dict[str, str]] = {}
    for record in filter(None, listing.split("\0")):
        key, _, value = record.partition("\n")
        name, _, attribute = key.removeprefix("submodule.").rpartition(".")
        fields.setdefault(name, {})[attribute] = value
    return [
        Submodule(name, values["path"], values["url"])
        for name, values in fields.items()
        if "path" in values and "url" in values
    ]


def _recorded_commit(worktree: Path, path: str) -> str | None:
    entry = git_out(["ls-tree", "HEAD", "--", path], cwd=worktree)  # "160000 commit <sha>\t<path>"
    parts = entry.split()
    if len(parts) < 3 or parts[1] != "commit":
        return None
    return parts[2]


def absolute_submodule_url(url: str, parent_remote: str) -> str:
    """Resolve a relative submodule URL (``../foo.git``) against the superproject's remote."""
    if not url.startswith(("./", "../")):
        return url
    if "://" in parent_remote:
        parts = urlsplit(parent_remote)
        path = posixpath.normpath(posixpath.join(parts.path.rstrip("/"), url))
        return parts._replace(path=path).geturl()
    # As git does: the parent's URL is the base, so "../x" is a sibling of the parent.
    return posixpath.normpath(posixpath.join(parent_remote.rstrip("/"), url))


class SourceCache:
    """Bare repositories under ``<cache>/sources``, one per (component, remote)."""

    def __init__(self, root: Path, mirror: str | None) -> None:
        self.root = root
        self.mirror = mirror

    def repo_for(self, component: Component) -> Path:
        digest = hashlib.sha256(component.remote.encode()).hexdigest()[:12]
        return self.root / f"{component.name}-{digest}.git"

    def ensure_repo(self, component: Component) -> Path:
        return self._ensure_bare(self.repo_for(component))

    def module_repo_for(self, url: str) -> Path:
        """The bare cache of one submodule remote (shared by every superproject)."""
        digest = hashlib.sha256(url.encode()).hexdigest()[:12]
        name = remote_path(url).removesuffix(".git").replace("/", "_")[-48:]
        return self.root / "modules" / f"{name}-{digest}.git"

    def _ensure_bare(self, repo: Path) -> Path:
        if repo.exists():
            self._check_usable(repo)
            return repo
        repo.parent.mkdir(parents=True, exist_ok=True)
        # Created under a temporary name and renamed, so an interrupted first run never
        # leaves a half-initialised repository that later runs would trust.
        staging = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=repo.parent))
        git(["init", "--bare", "--quiet", str(staging)])
        filemode.as_if_created(staging)  # mkdtemp made it 0700; the cache may be shared
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
        self._fetch_commit(
            repo, component.remote, component.commit or "", component.name, component.is_full_sha
        )

    def _fetch_commit(self, repo: Path, remote: str, commit: str, label: str, full: bool) -> None:
        url = effective_remote(remote, self.mirror)
        all_branches = ["+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*"]
        # Fetching one SHA keeps the transfer small; GitHub and git >= 2.5 servers with
        # uploadpack.allowReachableSHA1InWant allow it. Otherwise fall back to branches.
        refspecs = [f"{commit}:refs/pinned/{commit}"] if full else all_branches
        with log.section(f"fetch {label} from {url}"):
            attempt = git(
                ["fetch", "--quiet", "--no-tags", url, *refspecs],
                git_dir=repo,
                echo=True,
                check=False,
            )
            if attempt.returncode != 0 and full:
                attempt = git(
                    ["fetch", "--quiet", url, *all_branches], git_dir=repo, echo=True, check=False
                )
            if attempt.returncode != 0:
                raise SourceError(
                    f"cannot fetch {label} from {url}: {attempt.stderr.strip()}",
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
        # A ref keeps the pinned commit alive through `git gc`, whichever branch held it.
        git(["update-ref", f"refs/pinned/{full}", full], git_dir=repo)
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
                self._checkout_submodules(worktree, component.remote, component.name)
        return CheckedOutSource(component.name, commit, worktree, repo)

    def _checkout_submodules(
        self, worktree: Path, parent_remote: str, label: str, depth: int = 0
    ) -> None:
        """Check out every submodule at its recorded commit from the per-machine cache.

        Each submodule remote gets a bare repository under ``<cache>/modules``, fetched
        only when the recorded commit is missing (through the mirror, if one is set); the
        checkout then clones from that cache (``-c submodule.<name>.url=<cache repo>``),
        so a rebuild needs no network and PyTorch's submodules are downloaded once per
        machine, not once per build. Nested submodules are handled the same way.
        """
        if depth > _MAX_SUBMODULE_DEPTH:
            raise SourceError(f"{label}: submodules nested deeper than {_MAX_SUBMODULE_DEPTH}")
        modules = read_gitmodules(worktree)
        overrides: list[str] = []
        checked: list[tuple[Submodule, str]] = []
        for module in modules:
            commit = _recorded_commit(worktree, module.path)
            if commit is None:
                continue  # listed in .gitmodules but not in this commit's tree
            url = absolute_submodule_url(module.url, parent_remote)
            repo = self._ensure_bare(self.module_repo_for(url))
            if not has_commit(repo, commit):
                self._fetch_commit(repo, url, commit, f"{label}/{module.path}", full=True)
            git(["update-ref", f"refs/pinned/{commit}", commit], git_dir=repo)
            overrides += ["-c", f"submodule.{module.name}.url={repo}"]
            checked.append((module, url))
        if not checked:
            return
        git(
            ["submodule", "update", "--init", "--", *(module.path for module, _ in checked)],
            cwd=worktree,
            config=overrides,
            echo=True,
        )
        for module, url in checked:
            self._checkout_submodules(
                worktree / module.path, url, f"{label}/{module.path}", depth + 1
            )

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
