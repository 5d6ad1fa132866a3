"""Throwaway git repositories and project roots for the tests: real git, no mocks."""

from __future__ import annotations

import hashlib
import os
import subprocess
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.bundles import LIBTPU_RUNTIME, Pin, write_bundle

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Where the checkout's two packages are: the builder side (src/xla_wheels) and the host
#: side (host/src/xla_host), as a PYTHONPATH for a process that has no editable install.
SOURCE_DIRS = (REPO_ROOT / "src", REPO_ROOT / "host" / "src")
SOURCE_PATH = os.pathsep.join(str(d) for d in SOURCE_DIRS)

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
    "PATH": "/usr/bin:/bin:/usr/local/bin",
}


def git(
    cwd: Path, *args: str, env: Mapping[str, str] | None = None, input_text: str | None = None
) -> str:
    """Run git; output without surrounding white space (use ``git_raw`` for diffs)."""
    return git_raw(cwd, *args, env=env, input_text=input_text).strip()


def git_raw(
    cwd: Path, *args: str, env: Mapping[str, str] | None = None, input_text: str | None = None
) -> str:
    result = subprocess.run(
        ["git", "-c", "protocol.file.allow=always", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        env={**GIT_ENV, **(env or {})},
        input=input_text,
        text=True,
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def make_repo(
    path: Path,
    files: Mapping[str, str],
    message: str = "initial",
    *,
    env: Mapping[str, str] | None = None,
) -> str:
    """A new repository at ``path`` with ``files`` (path -> text) in one commit; its SHA."""
    path.mkdir(parents=True)
    git(path, "init", "-q", env=env)
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A", env=env)
    git(path, "commit", "-q", "-m", message, env=env)
    return git(path, "rev-parse", "HEAD", env=env)


@dataclass
class Upstream:
    """A tiny upstream project: ``path`` is its repository, ``commits`` oldest first."""

    path: Path
    commits: list[str]

    @property
    def url(self) -> str:
        return str(self.path)

    def commit_file(self, name: str, content: str, message: str) -> str:
        target = self.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        git(self.path, "add", name)
        git(self.path, "commit", "-q", "-m", message)
        sha = git(self.path, "rev-parse", "HEAD")
        self.commits.append(sha)
        return sha


RUNTIME_CC = textwrap.dedent("""\
    #include "runtime.h"

    int Deserialize(const char* blob) {
      // two-step path
      return Load(DeserializeExecutable(blob));
    }

    int MemoryInfo(int device) {
      return Stats(device).value();
    }
    """)


def make_upstream(root: Path, name: str = "upstream") -> Upstream:
    """An upstream with three commits touching ``src/runtime.cc`` and ``README``."""
    path = root / name
    path.mkdir(parents=True)
    git(path, "init", "-q")
    upstream = Upstream(path, [])
    upstream.commit_file("README", "tiny upstream\n", "initial")
    upstream.commit_file("src/runtime.cc", RUNTIME_CC, "add runtime")
    upstream.commit_file("src/runtime.h", "int Load(int);\n", "add header")
    return upstream


def make_upstreams(root: Path) -> dict[str, Upstream]:
    """One tiny upstream per component (torch, torch_xla, openxla) under ``root/remotes``."""
    return {
        name: make_upstream(root / "remotes", name) for name in ("torch", "torch_xla", "openxla")
    }


def diff_for(upstream: Upstream, commit: str, edits: dict[str, str]) -> str:
    """A real ``git diff`` of ``edits`` (path -> new content) against ``commit``."""
    scratch = upstream.path.parent / f"scratch-{hashlib.sha1(repr(edits).encode()).hexdigest()[:8]}"
    git(upstream.path.parent, "clone", "-q", upstream.url, str(scratch))
    git(scratch, "checkout", "-q", commit)
    for name, content in edits.items():
        target = scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    git(scratch, "add", "-A")
    return git_raw(scratch, "diff", "--cached")


def patch_text(component: str, base: str, diff: str, subject: str = "A test patch") -> str:
    files = sorted(
        {line.split(" b/", 1)[1] for line in diff.splitlines() if line.startswith("diff --git ")}
    )
    return (
        f"Subject: {subject}\n"
        f"Component: {component}\n"
        f"Base: {base}\n"
        "Fixes: a defect in the tiny upstream\n"
        "Why: the tests need a patch that applies\n"
        "Upstream: not upstreamed\n"
        f"Files: {', '.join(files)}\n"
        "\n"
        "Longer reasoning.\n"
        "\n"
        f"{diff}"
    )


def make_project(
    root: Path,
    upstreams: dict[str, Upstream],
    *,
    patches: dict[str, dict[str, str]] | None = None,
    commits: dict[str, str] | None = None,
    bundle: str = "test-1",
) -> Path:
    """A project root with ``build/bundles/<bundle>.toml`` pointing at the upstreams.

    ``patches`` maps component -> {file name under patches/<component>/: text}.
    """
    project = root / "project"
    patches = patches or {}
    commits = commits or {}
    pins = {}
    for component in ("torch", "torch_xla", "openxla"):
        upstream = upstreams[component]
        names = []
        for file_name, text in patches.get(component, {}).items():
            target = project / "patches" / component / file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            names.append(f"{component}/{file_name}")
        pins[component] = Pin(
            remote=upstream.url,
            commit=commits.get(component, upstream.commits[-1]),
            version=None if component == "openxla" else "2.9.0",
            patches=names,
        )
    write_bundle(project, bundle, pins, runtime=LIBTPU_RUNTIME)
    (project / "patches").mkdir(exist_ok=True)
    return project
