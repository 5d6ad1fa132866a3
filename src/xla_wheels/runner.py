"""One way to run a child process: print it, run it, keep or stream its output, time it out.

Every command the pipeline runs outside the gate's own children (git, the build recipes'
tools, pip, twine, the container engines) goes through :func:`run`, so each of them

- is printed before it runs (``+ cmd``, as JAX's ``build.py`` does), on the terminal or
  only in the open stage log, unless it is a silent probe (``echo="none"``);
- sees our environment without git's location variables (``GIT_DIR``, ``GIT_WORK_TREE``,
  ``GIT_INDEX_FILE``...): a git hook exports them, and a pipeline run from inside one
  would otherwise point every git command at the hook's repository instead of its cwd;
- has its captured output written to the open stage log, and both the printed line and
  the output passed through the caller's ``redact`` (the one secret masker);
- stops at ``timeout`` seconds with :class:`StepTimedOut`, which the CLI edge prints as
  ``error:`` naming the step and ``fix:``. The default is no limit: a build step may
  legitimately take hours.

Standard library only (and this package's stdlib-only ``log`` and ``errors``): the build
steps run it inside the builder image.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

from xla_wheels import log
from xla_wheels.errors import PipelineError

Redact = Callable[[str], str]

GIT_LOCATION_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)
"""Variables that point git at another repository, index or work tree than the cwd."""


class StepTimedOut(PipelineError):
    """A command did not finish within the time its step allows (exit 8). ``output``: what
    a captured command printed on stdout before it was stopped."""

    exit_code = 8

    def __init__(self, step: str, seconds: float, fix: str, output: str = "") -> None:
        super().__init__(f"{step} did not finish within {seconds:g}s", fix=fix)
        self.output = output


class OptionLikeArgument(PipelineError):
    """A value given by a user (a remote, a path, a revision, a URL) would reach a command
    line where the program could read it as an option (exit 2)."""

    exit_code = 2


#: What ends a program's options: ``--`` for most; ``--end-of-options`` for git commands
#: whose ``--`` starts a list of paths instead (``rev-parse``, ``rev-list``, ``log``).
END_OF_OPTIONS = ("--", "--end-of-options")


def after_options(*values: str, separator: str = "--") -> list[str]:
    """``[separator, *values]``: how every value a user gave reaches a command line.

    The separator makes the program read each value as an operand even if it starts with
    ``-``; a value that does is refused all the same (:class:`OptionLikeArgument`), since
    no remote, path or revision of ours does and a program without a separator would run
    it (``git fetch --upload-pack=<command>`` runs the command).
    """
    if separator not in END_OF_OPTIONS:
        raise ValueError(f"not an end of options: {separator!r}")
    for value in values:
        if value.startswith("-"):
            raise OptionLikeArgument(
                f"{value!r} starts with '-': it would reach a command line as an option",
                fix="give a URL, a path or a revision that does not start with '-' "
                "(a relative path: write ./" + value + ")",
            )
    return [separator, *values]


def child_env(
    extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (default: our environment) without git's location variables, plus ``extra``."""
    environ = os.environ if base is None else base
    env = {key: value for key, value in environ.items() if key not in GIT_LOCATION_VARS}
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str],
    *,
    step: str | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    echo: Literal["terminal", "log", "none"] = "terminal",
    shown_argv: Sequence[str] | None = None,
    shown_env: Mapping[str, str] | None = None,
    output: Literal["capture", "stream-stderr", "inherit"] | IO[str] = "capture",
    tee: IO[str] | None = None,
    input_text: str | None = None,
    timeout: float | None = None,
    timeout_fix: str = "check the network or the machine's load, then run it again",
    redact: Redact | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return its result (never raises for a non-zero exit).

    ``env`` is added to ``base_env`` (default: ours) minus :data:`GIT_LOCATION_VARS`;
    ``shown_env`` is the part of it the printed line shows, ``shown_argv`` the command
    it shows when options printed once elsewhere are left out (git's ``RUN_OPTIONS``).
    ``output``: ``capture`` keeps stdout and stderr; ``stream-stderr`` also passes
    stderr on to ours as it comes (git's progress meter); ``inherit`` leaves both on the
    terminal; an open file gets both. ``tee``: both, merged, line by line through
    ``redact``, to that file and to our stderr (a build step, whose build system may
    echo its environment, credentials included).
    ``step`` names the command in a :class:`StepTimedOut` (default: the program).
    """
    clean = redact or log.unredacted
    shown = list(shown_argv or argv)
    where = None if cwd is None else str(cwd)
    line = clean(log.format_command(shown, dict(shown_env or {}) or None, where))
    if echo == "terminal":
        log.info(f"+ {line}")
    elif echo == "log":
        log.to_stage_logs(f"+ {line}")
    full_env = child_env(env, base_env)
    try:
        if tee is not None:
            result = _run_teeing(argv, cwd, full_env, timeout, tee, clean)
        elif output == "stream-stderr":
            result = _run_showing_stderr(argv, cwd, full_env, timeout)
        else:
            result = _run(argv, cwd, full_env, output, input_text, timeout)
    except subprocess.TimeoutExpired as expired:
        partial = expired.stdout  # bytes from subprocess.run, whatever its text mode
        printed = clean(partial.decode(errors="replace")) if isinstance(partial, bytes) else ""
        raise StepTimedOut(step or Path(argv[0]).name, timeout or 0, timeout_fix, printed) from None
    result.stdout, result.stderr = clean(result.stdout or ""), clean(result.stderr or "")
    if echo != "none":  # a silent probe leaves no trace; anything else is in the log
        # The stage's log (out/<bundle>/logs/<stage>.log, when one is open) keeps the output.
        log.to_stage_logs(result.stdout)
        log.to_stage_logs(result.stderr)
        if result.returncode != 0:
            log.to_stage_logs(f"# exit {result.returncode}")
    return result


def _run(
    argv: Sequence[str],
    cwd: str | Path | None,
    env: Mapping[str, str],
    output: str | IO[str],
    input_text: str | None,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    if output == "capture":
        streams: dict[str, object] = {"capture_output": True}
    elif output == "inherit":
        streams = {}
    else:
        streams = {"stdout": output, "stderr": subprocess.STDOUT}
    return subprocess.run(  # type: ignore[call-overload]
        list(argv),
        cwd=cwd,
        env=dict(env),
        text=True,
        errors="replace",
        input=input_text,
        stdin=None if input_text is not None else subprocess.DEVNULL,
        check=False,
        timeout=timeout,
        **streams,
    )


def _run_showing_stderr(
    argv: Sequence[str], cwd: str | Path | None, env: Mapping[str, str], timeout: float | None
) -> subprocess.CompletedProcess[str]:
    """Run with the child's stderr passed on to ours as it comes, and kept for the error
    message; stdout is collected as :func:`subprocess.run` would."""
    with subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        out, err = process.stdout, process.stderr
        assert out is not None and err is not None
        stdout_chunks: list[bytes] = []
        stderr_chunks: list[bytes] = []

        def pass_stderr_on() -> None:
            while chunk := os.read(err.fileno(), 4096):
                stderr_chunks.append(chunk)
                sys.stderr.buffer.write(chunk)
                sys.stderr.buffer.flush()

        readers = [
            threading.Thread(target=lambda: stdout_chunks.append(out.read())),
            threading.Thread(target=pass_stderr_on),
        ]
        for reader in readers:
            reader.start()
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        finally:
            for reader in readers:
                reader.join()
    return subprocess.CompletedProcess(
        list(argv),
        returncode,
        b"".join(stdout_chunks).decode(errors="replace"),
        # The stage log keeps the final state of each meter line, not every redraw.
        "\n".join(
            line.rstrip("\r").rsplit("\r", 1)[-1]
            for line in b"".join(stderr_chunks).decode(errors="replace").split("\n")
        ).strip(),
    )


def _run_teeing(
    argv: Sequence[str],
    cwd: str | Path | None,
    env: Mapping[str, str],
    timeout: float | None,
    tee: IO[str],
    redact: Redact,
) -> subprocess.CompletedProcess[str]:
    tee.flush()
    with subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    ) as process:
        out = process.stdout
        assert out is not None

        # The lines are copied on this thread, so that Ctrl-C stops the copy at once (what
        # a step prints while it is stopped, its traceback, is not ours); a timer ends a
        # step past its timeout.
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            process.kill()

        timer = threading.Timer(timeout, kill_on_timeout) if timeout is not None else None
        if timer is not None:
            timer.start()
        try:
            for line in out:
                clean = redact(line)
                tee.write(clean)
                sys.stderr.write(clean)
                sys.stderr.flush()
        except KeyboardInterrupt:
            # Ctrl-C reaches the whole process group, but a step may ignore SIGINT (a
            # build server): stop it, so that no child outlives the run.
            stop(process)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        returncode = process.wait()
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(list(argv), timeout or 0)
    return subprocess.CompletedProcess(list(argv), returncode, "", "")


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Ask ``process`` to end (SIGTERM) and kill it if it has not within ``grace_s``.
    (A process group: :func:`xla_wheels.gate.children.kill_group`.)"""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
