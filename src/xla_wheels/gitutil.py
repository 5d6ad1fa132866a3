"""Thin wrapper over the git command line.

Real git, always: the pipeline's correctness rests on git's own behaviour (fetch by SHA,
worktrees, apply), so nothing here reimplements or mocks it. Every failure becomes a
:class:`GitError` carrying git's stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from xla_wheels import log
from xla_wheels.errors import GitError

# A fetch from an unreachable host must fail, not prompt for credentials on a build
# host without a terminal (GIT_TERMINAL_PROMPT=0), and a stalled connection must fail
# in bounded time instead of hanging a build forever (lowSpeedLimit/Time).
_NONINTERACTIVE_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
_NETWORK_CONFIG = ("-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60")
# Submodules and mirrors given as local paths use the file transport, which git >= 2.38.1
# refuses for submodules by default (CVE-2022-39253). Our mirrors are trusted inputs.
# https://github.blog/2022-10-18-git-security-vulnerabilities-announced/#cve-2022-39253
_FILE_PROTOCOL = ("-c", "protocol.file.allow=always")


def git(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    git_dir: Path | None = None,
    config: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    echo: bool = False,
    check: bool = True,
    input_text: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``git [config] [--git-dir] args`` and return the completed process.

    ``timeout`` (seconds) raises :class:`subprocess.TimeoutExpired`, for callers that
    must answer quickly whatever the network does (preflight).
    """
    argv = ["git", *_FILE_PROTOCOL, *_NETWORK_CONFIG, *config]
    if git_dir is not None:
        argv.append(f"--git-dir={git_dir}")
    argv.extend(args)
    # The git child inherits this environment (PATH, proxies, credentials helpers).
    full_env = {**os.environ, **_NONINTERACTIVE_ENV, **(env or {})}
    if echo:
        log.command(
            ["git", *config, *([f"--git-dir={git_dir}"] if git_dir else []), *args],
            cwd=str(cwd) if cwd else None,
        )
    process = subprocess.run(
        argv,
        cwd=cwd,
        env=full_env,
        text=True,
        capture_output=True,
        input=input_text,
        check=False,
        timeout=timeout,
    )
    if check and process.returncode != 0:
        raise GitError(
            f"git {' '.join(args)} failed (exit {process.returncode})"
            + (f" in {cwd}" if cwd else "")
            + f": {process.stderr.strip() or process.stdout.strip()}"
        )
    return process


def git_out(args: Sequence[str], **kwargs: object) -> str:
    return git(args, **kwargs).stdout.strip()  # type: ignore[arg-type]


def has_commit(git_dir: Path, rev: str) -> bool:
    return (
        git(["cat-file", "-e", f"{rev}^{{commit}}"], git_dir=git_dir, check=False).returncode == 0
    )


def status_porcelain(worktree: Path) -> str:
    return git_out(["status", "--porcelain", "--untracked-files=all"], cwd=worktree)
