"""Stage 2, sources: each component at its pinned commit, in a worktree of its own.

Layout of the per-machine cache::

    <cache>/sources/<component>-<remote digest>.git   bare repository, fetched into

Each build gets ``out/<bundle>/src/<component>``, a detached ``git worktree`` of that bare
repository at the verified full SHA (an existing one is kept when it is exactly the pin or
the pin plus the listed series, see :mod:`xla_wheels.worktree_guard`). The cache itself
has no work tree, so it can never be patched in place, and a failed fetch leaves it as it
was (git only moves refs after the objects are complete).

Every git command of this stage is composed as data (``xla_wheels.plan.PlannedCommand``)
by the ``*_command`` functions below and executed through one ``gitutil.GitRunner``.
The real run executes those objects; :func:`plan_commands` composes the same objects, in
run order, for the dry-run plan of a cold cache. Commands whose arguments are discovered
at run time (a submodule's path and recorded commit, a temporary directory's name) are
composed by the same functions, which the plan calls with ``<placeholder>`` inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import posixpath
import re
import shutil
import subprocess
import tempfile
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from xla_host import filemode, log
from xla_host.errors import PipelineError, SourceError
from xla_host.net import (
    DEFAULT_NETWORK,
    RETRIES_SETTING,
    TIMEOUT_SETTING,
    NetworkPolicy,
    NetworkTimedOut,
    Transient,
    attempts_text,
    host_of,
    with_retries,
)
from xla_host.redact import mask_url_credentials
from xla_host.runner import Silence, StepStalled, StepTimedOut
from xla_host.tables import check_regular
from xla_host.values import REMOTE_RULE, BadValue, check_remote
from xla_wheels import progress, worktree_guard
from xla_wheels.bundle import Bundle, Component
from xla_wheels.gitutil import PROGRESS_FLAG, GitRunner, compose, run_git
from xla_wheels.patches import state_path
from xla_wheels.plan import PlannedCommand


@dataclass(frozen=True)
class CheckedOutSource:
    """Output of the sources stage for one component."""

    component: str
    commit: str
    """The verified full SHA checked out."""
    worktree: Path
    head: str = ""
    """The worktree's HEAD: the pin, or the series head when a patched worktree that is
    exactly the listed series was reused (the patch stage then has nothing to do)."""


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


_GITMODULES_KEYS = r"^submodule\..*\.(path|url)$"


def gitmodules_command(worktree: Path) -> PlannedCommand:
    return compose(
        ["config", "--file", ".gitmodules", "--null", "--get-regexp", _GITMODULES_KEYS],
        cwd=worktree,
        note="when the worktree has a .gitmodules file",
    )


def read_gitmodules(worktree: Path, runner: GitRunner = run_git) -> list[Submodule]:
    """The submodules ``.gitmodules`` declares, in file order."""
    if not (worktree / ".gitmodules").is_file():
        return []
    listing = runner(gitmodules_command(worktree), check=False).stdout
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


def recorded_commit_command(worktree: Path, path: str) -> PlannedCommand:
    return compose(["ls-tree", "HEAD"], operands=[path], cwd=worktree)


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


# --- the stage's git commands, as data -------------------------------------------------

_ALL_BRANCHES = ("+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*")


def init_bare_command(path: Path) -> PlannedCommand:
    return compose(["init", "--bare", "--quiet"], operands=[str(path)])


def is_bare_command(repo: Path) -> PlannedCommand:
    return compose(["rev-parse", "--is-bare-repository"], git_dir=repo)


def has_commit_command(repo: Path, rev: str) -> PlannedCommand:
    return compose(["cat-file", "-e"], operands=[f"{rev}^{{commit}}"], git_dir=repo)


def _verbosity() -> str:
    """git's own progress meter on a terminal; elsewhere quiet, and the stage prints a
    line every interval instead (``progress.heartbeat``)."""
    return PROGRESS_FLAG if progress.on_terminal() else "--quiet"


# A shallow remote or mirror (a CI snapshot of pytorch/xla is one) sends commits whose
# oldest parents it does not have; without --update-shallow git refuses to record those
# boundaries in the cache, which then holds commits it cannot walk (`git rebase` and
# `merge-base` fail with "Could not read <parent>"). A full remote sends no boundary, so
# the option changes nothing there.
_SHALLOW = ("--update-shallow",)


#: The most bytes a fetch is allowed for in its time limit (a full PyTorch fetch is about
#: 1 GiB): at the slowest allowed rate (``NetworkPolicy.min_bytes_per_s``) about 4.5 hours.
#: A stalled http(s) remote ends much sooner, by git's own stall limit (:func:`stall_config`);
#: this limit ends an ssh remote that stalls (git has no stall limit for ssh) and one that
#: trickles.
FETCH_BYTES_ALLOWANCE = 4 * 1024**3


def stall_config(network: NetworkPolicy) -> tuple[str, ...]:
    """git's own stall limit for http(s) remotes: a fetch that receives less than 1000
    bytes/s for ``NET_TIMEOUT`` seconds (a server that never answers included) fails."""
    seconds = math.ceil(network.timeout_s)
    return ("-c", "http.lowSpeedLimit=1000", "-c", f"http.lowSpeedTime={seconds}")


def fetch_command(
    repo: Path, url: str, commit: str, *, full: bool, network: NetworkPolicy
) -> PlannedCommand:
    """Fetching one SHA keeps the transfer small; GitHub and git >= 2.5 servers with
    uploadpack.allowReachableSHA1InWant allow it. A short SHA cannot be fetched by name,
    so it fetches every branch and tag and is resolved afterwards."""
    refspecs = (f"{commit}:refs/pinned/{commit}",) if full else _ALL_BRANCHES
    note = "when the cache lacks the commit"
    if full:
        note += "; if the server refuses a fetch by SHA: "
        note += fetch_branches_command(repo, url, network).render()
    return compose(
        ["fetch", _verbosity(), "--no-tags", *_SHALLOW],
        operands=[url, *refspecs],
        git_dir=repo,
        config=stall_config(network),
        note=note,
    )


def fetch_branches_command(repo: Path, url: str, network: NetworkPolicy) -> PlannedCommand:
    return compose(
        ["fetch", _verbosity(), *_SHALLOW],
        operands=[url, *_ALL_BRANCHES],
        git_dir=repo,
        config=stall_config(network),
    )


#: What git (through curl, or ssh) prints when retrying cannot help: credentials, a
#: missing repository, an unknown host, HTTP 4xx. Looked for first: ssh's "the remote
#: end hung up" follows a refused key too.
_FETCH_FINAL = re.compile(
    r"Authentication failed|Permission denied|could not read Username|not found|"
    r"does not appear to be a git repository|returned error: 4[0-9][0-9]|"
    r"Could not resolve host|not our ref|unadvertised object",
    re.I,
)
#: What git prints for a fault that may pass, by kind (``xla_host.net.Transient``).
_FETCH_TRANSIENT: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("timed out", re.compile(r"Operation too slow|timed out", re.I)),
    ("refused", re.compile(r"Connection refused|Couldn't connect to server", re.I)),
    (
        "reset",
        re.compile(
            r"Connection reset|Recv failure|RPC failed|early EOF|unexpected disconnect|"
            r"remote end hung up unexpectedly|Empty reply from server",
            re.I,
        ),
    ),
)
_FETCH_SERVER_ERROR = re.compile(r"returned error: (5[0-9][0-9])")


def fetch_fault(stderr: str, network_stall_s: float) -> Transient | None:
    """The transient fault a failed ``git fetch`` reports, or None when trying again
    cannot help (its message then stands as git wrote it)."""
    if _FETCH_FINAL.search(stderr):
        return None
    if server_error := _FETCH_SERVER_ERROR.search(stderr):
        return Transient(f"HTTP {server_error.group(1)}")
    for kind, pattern in _FETCH_TRANSIENT:
        if pattern.search(stderr):
            # git's stall limit is NET_TIMEOUT, not the whole fetch's limit.
            stalled = network_stall_s if kind == "timed out" else None
            return Transient(kind, _last_line(stderr), after_s=stalled)
    return None


_MIRROR_FIX = "or build from a mirror with --mirror DIR|URL (XLA_WHEELS_MIRROR, make: MIRROR=)"


def _keep_fix(repo: Path) -> str:
    """What a failed fetch leaves behind, said in its error's fix."""
    return (
        f"the failed fetch added nothing to the source cache but the bare repository {repo}, "
        "possibly empty, which the next run reuses"
    )


def _fetch_gave_up(
    fault: Transient, attempts: int, *, step: str, host: str, shown: str, repo: Path
) -> SourceError:
    """The error of a fetch whose every try failed as ``fault`` did."""
    return SourceError(
        f"{step}: {host} {fault.what_happened} ({attempts_text(attempts)}; from {shown})",
        fix=(
            f"the server fails on its side: try again later (retries: {RETRIES_SETTING}), "
            if fault.kind.startswith("HTTP ")
            else f"check that {host} is up and reachable from here, "
        )
        + f"{_MIRROR_FIX}; {_keep_fix(repo)}",
    )


def _unbounded_by_git(url: str) -> bool:
    """A network remote git fetches from without a stall limit of its own: git://, ssh://
    and scp-like ``host:path`` (http(s) has ``http.lowSpeedTime``; a path or file:// is
    local)."""
    scheme = url.partition("://")[0].lower() if "://" in url else None
    if scheme is None:
        return _scp_host(url) is not None
    return scheme in ("git", "ssh", "git+ssh", "ssh+git")


def _scp_host(url: str) -> str | None:
    """``github.com`` of ``git@github.com:owner/repo.git``; None for a local path."""
    if url.startswith("/") or ":" not in url.split("/", 1)[0]:
        return None
    return url.split(":", 1)[0].rsplit("@", 1)[-1]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("fatal: ").removeprefix("error: ") if lines else ""


def verify_command(repo: Path, commit: str) -> PlannedCommand:
    return compose(
        ["rev-parse", "--verify", "--quiet"],
        operands=[f"{commit}^{{commit}}"],
        end="--end-of-options",
        git_dir=repo,
    )


def disambiguate_command(repo: Path, commit: str) -> PlannedCommand:
    return compose(["rev-parse", "--disambiguate=" + commit], git_dir=repo)


def pin_ref_command(repo: Path, full: str) -> PlannedCommand:
    """A ref keeps the pinned commit alive through `git gc`, whichever branch held it."""
    return compose(["update-ref"], operands=[f"refs/pinned/{full}", full], git_dir=repo)


def worktree_remove_command(repo: Path, worktree: Path) -> PlannedCommand:
    return compose(
        ["worktree", "remove", "--force", "--force"], operands=[str(worktree)], git_dir=repo
    )


def worktree_prune_command(repo: Path) -> PlannedCommand:
    return compose(["worktree", "prune"], git_dir=repo)


def worktree_add_command(repo: Path, worktree: Path, commit: str) -> PlannedCommand:
    return compose(
        ["worktree", "add", "--detach", "--force"], operands=[str(worktree), commit], git_dir=repo
    )


def head_command(worktree: Path) -> PlannedCommand:
    return compose(["rev-parse", "HEAD"], cwd=worktree)


def submodule_update_command(
    worktree: Path, modules: list[tuple[Submodule, Path]]
) -> PlannedCommand:
    """Clone each submodule from its cache repository (``-c submodule.<name>.url=<cache>``)."""
    overrides: list[str] = []
    for module, repo in modules:
        overrides += ["-c", f"submodule.{module.name}.url={repo}"]
    return compose(
        ["submodule", "update", "--init"],
        operands=[module.path for module, _ in modules],
        cwd=worktree,
        config=overrides,
    )


def ls_remote_command(url: str) -> PlannedCommand:
    """The reachability probe preflight runs for a remote the cache cannot answer for."""
    return compose(["ls-remote"], operands=[url, "HEAD"])


def staging_name(repo: Path) -> str:
    """The prefix of the temporary directory a new cache repository is created under."""
    return f".{repo.name}."


@dataclass
class SourceCache:
    """Bare repositories under ``<cache>/sources``, one per (component, remote)."""

    root: Path
    mirror: str | None
    run: GitRunner = run_git
    network: NetworkPolicy = DEFAULT_NETWORK
    """Bounds and retries every fetch (``PipelineOptions.network``)."""

    def repo_for(self, component: Component) -> Path:
        digest = hashlib.sha256(component.remote.encode()).hexdigest()[:12]
        return self.root / f"{component.name}-{digest}.git"

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
        staging = Path(tempfile.mkdtemp(prefix=staging_name(repo), dir=repo.parent))
        self.run(init_bare_command(staging))
        filemode.as_if_created(staging)  # mkdtemp made it 0700; the cache may be shared
        staging.rename(repo)
        return repo

    def _check_usable(self, repo: Path) -> None:
        fix = f"remove it (`rm -rf {repo}`); the next run fetches it again"

        def damaged(message: str, **_: object) -> SourceError:
            return SourceError(f"source cache {message}", fix=fix)

        # Local git has no time limit: a FIFO as HEAD, config or packed-refs would hang
        # the first git command here forever. Judged from stat, before git opens them.
        for name in ("HEAD", "config", "packed-refs", "shallow"):
            with contextlib.suppress(FileNotFoundError):
                check_regular(repo / name, damaged, what=f"git {name} file")
        probe = self.run(is_bare_command(repo), check=False)
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
        repo = self._ensure_bare(self.repo_for(component))
        if not self.has_commit(repo, component.commit):
            if not allow_fetch:
                raise SourceError(
                    f"{component.name} commit {component.commit} is not in the source cache",
                    fix="run `make sources BUNDLE=<bundle>` where the remote or a mirror "
                    "is reachable",
                )
            self._fetch_commit(
                repo, component.remote, component.commit, component.name, component.is_full_sha
            )
        return self._verify(repo, component)

    def has_commit(self, repo: Path, rev: str) -> bool:
        return self.run(has_commit_command(repo, rev), check=False).returncode == 0

    def _fetch_commit(self, repo: Path, remote: str, commit: str, label: str, full: bool) -> None:
        """Fetch ``commit`` of ``remote`` (or its mirror) into ``repo``, bounded and retried
        as every network step is (:mod:`xla_host.net`): git's stall limit of
        ``NET_TIMEOUT`` for http(s), a time limit for the whole fetch by
        :data:`FETCH_BYTES_ALLOWANCE`, and ``NET_RETRIES`` more tries after a refused or
        reset connection, an HTTP 5xx or a stall; never after refused credentials, a
        missing repository or an unknown host."""
        url = effective_remote(remote, self.mirror)
        shown = mask_url_credentials(url)
        host = host_of(url) if "://" in url else (_scp_host(url) or shown)
        step = f"fetch {label}"
        network = self.network
        whole_limit = network.transfer_limit(FETCH_BYTES_ALLOWANCE)
        stall = float(math.ceil(network.timeout_s))
        keep_fix = _keep_fix(repo)
        # git has a stall limit only for http(s) (stall_config); over git:// and ssh a server
        # that accepts and never answers would be waited on for the whole limit (hours).
        # There, an attempt that received nothing within NET_TIMEOUT ends as a stall does.
        received = partial(progress.directory_bytes, repo / "objects")
        silence = (received, stall) if _unbounded_by_git(url) else None

        def run_fetch(command: PlannedCommand) -> subprocess.CompletedProcess[str]:
            return self._run_bounded(
                command, step=step, host=host, whole_limit=whole_limit, stall=stall,
                silence=silence, keep_fix=keep_fix,
            )  # fmt: skip

        def fetch(_limit: float) -> subprocess.CompletedProcess[str]:
            attempt = run_fetch(fetch_command(repo, url, commit, full=full, network=network))
            if attempt.returncode != 0 and full and not fetch_fault(attempt.stderr, stall):
                # The server may refuse a fetch by SHA: every branch and tag instead.
                attempt = run_fetch(fetch_branches_command(repo, url, network))
            if attempt.returncode != 0 and (fault := fetch_fault(attempt.stderr, stall)):
                raise fault
            return attempt

        def give_up(fault: Transient, attempts: int) -> SourceError:
            return _fetch_gave_up(fault, attempts, step=step, host=host, shown=shown, repo=repo)

        with (
            log.section(f"fetch {label} from {shown}"),
            progress.heartbeat(
                f"fetching {label}",
                received,
                0 if progress.on_terminal() else network.heartbeat_s,
            ),
        ):
            attempt = with_retries(
                step,
                host,
                fetch,
                give_up=give_up,
                timeout_fix=f"check that {host} is up and answering, {_MIRROR_FIX}; a slow "
                f"link: give it longer with {TIMEOUT_SETTING}; {keep_fix}",
                limit_s=whole_limit,
                long=True,
                # The fetch shows its own progress (git's meter, or the heartbeat above).
                network=replace(network, heartbeat_s=0),
            )
            if attempt.returncode != 0:
                raise SourceError(
                    f"cannot fetch {label} from {shown}: {attempt.stderr.strip()}",
                    fix=f"check the network or credentials, {_MIRROR_FIX}; {keep_fix}",
                )

    def _run_bounded(
        self,
        command: PlannedCommand,
        *,
        step: str,
        host: str,
        whole_limit: float,
        stall: float,
        silence: Silence | None,
        keep_fix: str,
    ) -> subprocess.CompletedProcess[str]:
        """One fetch attempt within ``whole_limit`` (and, through ``silence``, ``stall``
        where git has no stall limit): a stall may be tried again, the whole limit may not."""
        try:
            if silence is None:  # the executor's plain form (a test's recorder too)
                return self.run(command, echo=True, check=False, timeout=whole_limit)
            return self.run(command, echo=True, check=False, timeout=whole_limit, silence=silence)
        except StepStalled:
            raise Transient(
                "timed out", f"nothing received from {host} within {stall:g}s", after_s=stall
            ) from None
        except StepTimedOut:
            # Hours of a fetch that never completed: trying again would take as long.
            raise NetworkTimedOut(
                step,
                host,
                whole_limit,
                1,
                f"check the network to {host}, or build from a mirror with MIRROR=; {keep_fix}",
            ) from None

    def _verify(self, repo: Path, component: Component) -> str:
        commit = component.commit or ""
        probe = self.run(verify_command(repo, commit), check=False)
        if probe.returncode != 0:
            ambiguous = self.run(disambiguate_command(repo, commit), check=False)
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
        self.run(pin_ref_command(repo, full))
        return full

    def checkout(
        self, component: Component, commit: str, worktree: Path, *, bundle: str = "<bundle>"
    ) -> CheckedOutSource:
        """A worktree of ``commit`` at ``worktree``: the existing one when it is exactly what
        the pipeline makes (the pin, or the pin plus the listed series), else a fresh one.

        What is there is decided by content (:mod:`xla_wheels.worktree_guard`): work of the
        user's (edits, untracked files, commits not made by the patch stage) stops the run
        and nothing is touched.
        """
        repo = self._ensure_bare(self.repo_for(component))
        if worktree.exists():
            check = worktree_guard.inspect(worktree, repo, component, commit, self.run)
            worktree_guard.refuse_user_work(check, bundle, component.name)
            if check.reusable:
                where = "the patched series head" if check.head != commit else "the pin"
                log.info(f"{component.name}: reusing {worktree} (clean, at {where})")
                return CheckedOutSource(component.name, commit, worktree, check.head)
            worktree_guard.refuse_ignored_files(check)
        self._remove_previous_worktree(repo, worktree)
        worktree.parent.mkdir(parents=True, exist_ok=True)
        self.run(worktree_add_command(repo, worktree, commit), echo=True)
        head = self.run(head_command(worktree)).stdout.strip()
        if head != commit:
            raise SourceError(f"{component.name}: worktree is at {head}, expected {commit}")
        if component.submodules:
            with log.section(f"submodules of {component.name}"):
                self._checkout_submodules(worktree, component.remote, component.name)
        return CheckedOutSource(component.name, commit, worktree, head)

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
        modules = read_gitmodules(worktree, self.run)
        checked: list[tuple[Submodule, str, Path]] = []
        for module in modules:
            # "160000 commit <sha>\t<path>"
            parts = self.run(recorded_commit_command(worktree, module.path)).stdout.split()
            if len(parts) < 3 or parts[1] != "commit":
                continue  # listed in .gitmodules but not in this commit's tree
            commit = parts[2]
            url = absolute_submodule_url(module.url, parent_remote)
            try:
                check_remote(url)
            except BadValue as bad:
                # An upstream's .gitmodules is input like a manifest: its URL is fetched.
                raise SourceError(
                    f"{label}: submodule {module.name!r} has the URL {url!r}, which {bad.reason}",
                    fix="pin a commit of the component whose .gitmodules gives a URL or path "
                    f"({REMOTE_RULE})",
                ) from None
            repo = self._ensure_bare(self.module_repo_for(url))
            if not self.has_commit(repo, commit):
                self._fetch_commit(repo, url, commit, f"{label}/{module.path}", full=True)
            self.run(pin_ref_command(repo, commit))
            checked.append((module, url, repo))
        if not checked:
            return
        self.run(
            submodule_update_command(worktree, [(module, repo) for module, _, repo in checked]),
            echo=True,
        )
        for module, url, _ in checked:
            self._checkout_submodules(
                worktree / module.path, url, f"{label}/{module.path}", depth + 1
            )

    def _remove_previous_worktree(self, repo: Path, worktree: Path) -> None:
        """Remove a worktree that :mod:`xla_wheels.worktree_guard` found holds nothing of
        the user's (its content is the pipeline's, reproducible from pins and patches)."""
        if worktree.exists():
            self.run(worktree_remove_command(repo, worktree), check=False)
            if worktree.exists():
                shutil.rmtree(worktree)
        state_path(worktree).unlink(missing_ok=True)
        self.run(worktree_prune_command(repo), check=False)


def plan_commands(component: Component, cache: SourceCache, worktree: Path) -> list[PlannedCommand]:
    """The commands the sources stage runs for ``component`` on a cold cache, in run order.

    Composed by the same functions the run calls (see :meth:`SourceCache.resolve` and
    :meth:`SourceCache.checkout`); run-time discoveries are ``<placeholders>``. With a warm
    cache the run skips the ``init`` and the ``fetch`` (their notes say when).
    """
    if component.commit is None:
        return []
    repo = cache.repo_for(component)
    try:
        url = effective_remote(component.remote, cache.mirror)
    except SourceError as error:
        url = f"<{error.message}>"
    full = component.commit if component.is_full_sha else f"<full SHA of {component.commit}>"
    commands = [
        _planned_init(repo, "once per machine"),
        has_commit_command(repo, component.commit),
        fetch_command(
            repo, url, component.commit, full=component.is_full_sha, network=cache.network
        ),
        verify_command(repo, component.commit),
        pin_ref_command(repo, full),
        is_bare_command(repo),
        _with_note(
            worktree_prune_command(repo),
            "after `worktree remove` of a previous worktree whose content is the pipeline's "
            "(decided by content, see worktree_guard); one at the pin or the series head is "
            "reused instead, and any work of the user's stops the run (exit 4)",
        ),
        worktree_add_command(repo, worktree, full),
        head_command(worktree),
    ]
    if component.submodules:
        module = Submodule("<name>", "<path>", "<url>")
        module_repo = cache.root / "modules" / "<module cache>.git"
        per_module = "for each submodule in .gitmodules whose commit is in the tree"
        commands += [
            gitmodules_command(worktree),
            _with_note(recorded_commit_command(worktree, module.path), per_module),
            _planned_init(module_repo, f"{per_module}: its cache, once per machine"),
            has_commit_command(module_repo, "<commit>"),
            fetch_command(module_repo, module.url, "<commit>", full=True, network=cache.network),
            pin_ref_command(module_repo, "<commit>"),
            _with_note(
                submodule_update_command(worktree, [(module, module_repo)]),
                "all of them at once; then the same for nested submodules",
            ),
        ]
    return commands


def _planned_init(repo: Path, why: str) -> PlannedCommand:
    staging = repo.parent / f"{staging_name(repo)}XXXXXXXX"
    return _with_note(init_bare_command(staging), f"{why}; then renamed to {repo.name}")


def _with_note(command: PlannedCommand, note: str) -> PlannedCommand:
    return replace(command, note=f"{note}; {command.note}" if command.note else note)


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
                component, commit, src_dir / component.name, bundle=bundle.name
            )
    return checked_out


def known_commits(bundle: Bundle, cache: SourceCache) -> dict[str, str | None]:
    """Full SHAs known without the network: full pins, and short ones the cache resolves.

    Used where a run must not fetch (``make lock``, the plan): a short pin that the cache
    cannot resolve stays ``None`` and is recorded as unresolved, never guessed.
    """
    commits: dict[str, str | None] = {}
    for component in bundle.components.values():
        commits[component.name] = component.commit if component.is_full_sha else None
        if not component.is_full_sha and component.commit and cache.repo_for(component).exists():
            with suppress(PipelineError):
                commits[component.name] = cache.resolve(component, allow_fetch=False)
    return commits
