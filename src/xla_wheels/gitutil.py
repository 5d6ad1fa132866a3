"""Thin wrapper over the git command line.

Real git, always: the pipeline's correctness rests on git's own behaviour (fetch by SHA,
worktrees, apply), so nothing here reimplements or mocks it. Every failure becomes a
:class:`GitError` carrying git's stderr.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from xla_host import runner
from xla_host.errors import GitError, PipelineError
from xla_host.redact import mask_url_credentials
from xla_wheels.plan import PlannedCommand

# A fetch from an unreachable host must fail, not prompt for credentials on a build
# host without a terminal (GIT_TERMINAL_PROMPT=0), and a stalled connection must fail
# in bounded time instead of hanging a build forever (lowSpeedLimit/Time; a fetch of the
# sources stage sets its own, NET_TIMEOUT, which comes later on its command line and wins).
RUN_ENV: Mapping[str, str] = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
_NETWORK_CONFIG = ("-c", "http.lowSpeedLimit=1000", "-c", "http.lowSpeedTime=60")
# Submodules and mirrors given as local paths use the file transport, which git >= 2.38.1
# refuses for submodules by default (CVE-2022-39253). Our mirrors are trusted inputs.
# https://github.blog/2022-10-18-git-security-vulnerabilities-announced/#cve-2022-39253
_FILE_PROTOCOL = ("-c", "protocol.file.allow=always")


class GitRunner(Protocol):
    """What executes a composed git command: :func:`run_git`, or a test's recorder."""

    def __call__(
        self,
        command: PlannedCommand,
        *,
        check: bool = True,
        echo: bool = False,
        input_text: str | None = None,
        timeout: float | None = None,
        silence: runner.Silence | None = None,
    ) -> subprocess.CompletedProcess[str]: ...


#: Options every git command runs with, on top of its own argv (the plan prints them once).
RUN_OPTIONS: tuple[str, ...] = (*_FILE_PROTOCOL, *_NETWORK_CONFIG)


def run_git(
    command: PlannedCommand,
    *,
    check: bool = True,
    echo: bool = False,
    input_text: str | None = None,
    timeout: float | None = None,
    error: Callable[[subprocess.CompletedProcess[str]], PipelineError] | None = None,
    silence: runner.Silence | None = None,
) -> subprocess.CompletedProcess[str]:
    """Execute one composed ``git ...`` command: its argv, cwd and env, plus :data:`RUN_OPTIONS`.

    A failure raises :class:`GitError` with git's own stderr whole, or what ``error``
    makes of the result (a step with an error of its own), unless ``check`` is False.

    ``timeout`` (seconds) raises :class:`runner.StepTimedOut`, for callers that must
    answer quickly whatever the network does (preflight) or bound a whole fetch; git's
    progress meter is still shown. git's location variables
    (``GIT_DIR``...) of a surrounding hook never reach it (:func:`runner.child_env`).
    """
    if not command.argv or command.argv[0] != "git":
        raise ValueError(f"not a git command: {command.argv!r}")
    streaming = PROGRESS_FLAG in command.argv and input_text is None
    return runner.run(
        ["git", *RUN_OPTIONS, *command.argv[1:]],
        shown_argv=command.argv,
        shown_env=command.env,
        step=" ".join(command.argv[:2]),
        cwd=command.cwd,
        env={**RUN_ENV, **command.env},
        echo="terminal" if echo else "log",
        output="stream-stderr" if streaming else "capture",
        input_text=input_text,
        timeout=timeout,
        check=check,
        error=error or (lambda failed: _git_error(command, failed)),
        silence=silence,
    )


def _git_error(command: PlannedCommand, process: subprocess.CompletedProcess[str]) -> GitError:
    return GitError(
        mask_url_credentials(
            f"{' '.join(command.argv)} failed (exit {process.returncode})"
            + (f" in {command.cwd}" if command.cwd else "")
            + f": {process.stderr.strip() or process.stdout.strip()}"
        )
    )


#: git's own progress meter, asked for by a fetch on a terminal (``progress.on_terminal``).
PROGRESS_FLAG = "--progress"


def compose(
    args: Sequence[str],
    *,
    operands: Sequence[str] = (),
    end: str = "--",
    cwd: Path | None = None,
    git_dir: Path | None = None,
    config: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    note: str = "",
) -> PlannedCommand:
    """``git [config] [--git-dir=DIR] args [-- operands]`` as data.

    ``operands``: the values a user (or an upstream's ``.gitmodules``) gave, a remote, a
    path, a revision. They go after ``end`` (``--``, or ``--end-of-options`` where git's
    ``--`` starts paths), never among ``args``, and one starting with ``-`` is refused
    (:func:`runner.after_options`): none can be read as an option.
    """
    argv = ["git", *config]
    if git_dir is not None:
        argv.append(f"--git-dir={git_dir}")
    argv.extend(args)
    if operands:
        argv.extend(runner.after_options(*operands, separator=end))
    return PlannedCommand(
        tuple(argv), env=dict(env or {}), cwd=str(cwd) if cwd else None, note=note
    )


def git(
    args: Sequence[str],
    *,
    operands: Sequence[str] = (),
    end: str = "--",
    cwd: Path | None = None,
    git_dir: Path | None = None,
    config: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    echo: bool = False,
    check: bool = True,
    input_text: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Compose ``git [config] [--git-dir] args`` and run it with :func:`run_git`."""
    command = compose(
        args, operands=operands, end=end, cwd=cwd, git_dir=git_dir, config=config, env=env
    )
    return run_git(command, check=check, echo=echo, input_text=input_text, timeout=timeout)


def git_out(args: Sequence[str], **kwargs: object) -> str:
    return git(args, **kwargs).stdout.strip()  # type: ignore[arg-type]


def status_porcelain(worktree: Path) -> str:
    return git_out(["status", "--porcelain", "--untracked-files=all"], cwd=worktree)
