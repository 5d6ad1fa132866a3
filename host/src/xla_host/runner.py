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
- raises :class:`CommandFailed` (exit 1), naming the command and the tail of its stderr,
  when it exits non-zero, unless the caller asks ``check=False`` to judge the code itself
  (as ``subprocess.run(check=True)``, pypa/build's and cibuildwheel's runners do);
- stops at ``timeout`` seconds with :class:`StepTimedOut`, which the CLI edge prints as
  ``error:`` naming the step and ``fix:``. The default is no limit: a build step may
  legitimately take hours;
- is ended when the run is interrupted (Ctrl-C, or SIGTERM/SIGHUP, which
  ``xla_host.signals`` turns into the same exception): it gets the run's own signal,
  then SIGKILL after :data:`STOP_GRACE_S`, so that no child outlives the run and commits
  half-done work. With ``own_group`` (a build recipe, a whole CLI run) the child and
  everything it starts are one process group, ended as one;
- is SIGKILLed by the kernel should this process die without a word (SIGKILL, the OOM
  killer), through the parent-death signal :func:`xla_host.lineage.popen` sets.

Standard library only (and this package's stdlib-only ``log`` and ``errors``): the build
steps run it inside the builder image.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Literal, TypeVar

from xla_host import lineage, log, signals
from xla_host.errors import ExitCode, PipelineError

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

STOP_GRACE_S = 10.0
"""How long an interrupted child has to end on its signal before it is killed."""


class StepTimedOut(PipelineError):
    """A command did not finish within the time its step allows (exit 8). ``output``: what
    a captured command printed on stdout before it was stopped."""

    exit_code = ExitCode.TIMED_OUT

    def __init__(self, step: str, seconds: float, fix: str, output: str = "") -> None:
        super().__init__(f"{step} did not finish within {seconds:g}s", fix=fix)
        self.output = output


class StepStalled(StepTimedOut):
    """A command given a ``silence`` limit received nothing within it (exit 8): a server
    that accepted the connection and never answered."""

    def __init__(self, step: str, seconds: float, fix: str) -> None:
        PipelineError.__init__(self, f"{step} received nothing within {seconds:g}s", fix=fix)
        self.output = ""


Silence = tuple[Callable[[], int], float]
"""``(measure, seconds)``: the command is ended when ``measure()`` (bytes received so far)
has not moved from its first value within ``seconds``. Once it moved, only the timeout
bounds the command (a long silent phase after the transfer, git's delta resolution, is
not a stall)."""

#: How often a silence limit looks at its measure.
SILENCE_POLL_S = 0.5


class _Silent(Exception):
    pass


_T = TypeVar("_T")


def _bounded(
    wait: Callable[[float | None], _T], timeout: float | None, silence: Silence | None
) -> _T:
    """``wait(limit)`` within ``timeout`` (raising ``TimeoutExpired`` as ``wait`` does),
    and with ``silence``, :class:`_Silent` once nothing was received within its seconds."""
    if silence is None:
        return wait(timeout)
    measure, seconds = silence
    started, first = time.monotonic(), measure()
    heard = False
    while True:
        elapsed = time.monotonic() - started
        limit = SILENCE_POLL_S
        if timeout is not None:
            limit = max(min(limit, timeout - elapsed), 0)
        try:
            return wait(limit)
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            if timeout is not None and elapsed >= timeout:
                raise
            heard = heard or measure() != first
            if not heard and elapsed >= seconds:
                raise _Silent from None


class CommandFailed(PipelineError):
    """A command exited non-zero (exit 1): the message names it (credentials masked) and
    ends with the last lines of its stderr (else stdout); ``result`` is what it returned."""

    TAIL_LINES = 15

    def __init__(
        self, result: subprocess.CompletedProcess[str], shown: str, fix: str | None
    ) -> None:
        said = (result.stderr or "").strip() or (result.stdout or "").strip()
        tail = "\n".join(said.splitlines()[-self.TAIL_LINES :])
        super().__init__(
            f"`{shown}` failed (exit {result.returncode})" + (f":\n{tail}" if tail else ""),
            fix=fix
            or "read the command's output above (and the stage log, when one is "
            "open); fix what it names, then run again",
        )
        self.result = result
        self.returncode = result.returncode


class OptionLikeArgument(PipelineError):
    """A value given by a user (a remote, a path, a revision, a URL) would reach a command
    line where the program could read it as an option (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


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
    own_group: bool = False,
    check: bool = True,
    fix: str | None = None,
    error: Callable[[subprocess.CompletedProcess[str]], PipelineError] | None = None,
    silence: Silence | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return its result; a non-zero exit raises :class:`CommandFailed`
    (with ``fix``, when given), or what ``error`` makes of the result (a step whose failure
    has an error class and exit code of its own), unless ``check`` is False.

    ``env`` is added to ``base_env`` (default: ours) minus :data:`GIT_LOCATION_VARS`;
    ``shown_env`` is the part of it the printed line shows, ``shown_argv`` the command
    it shows when options printed once elsewhere are left out (git's ``RUN_OPTIONS``).
    ``output``: ``capture`` keeps stdout and stderr; ``stream-stderr`` also passes
    stderr on to ours as it comes (git's progress meter); ``inherit`` leaves both on the
    terminal; an open file gets both. ``tee``: both, merged, line by line through
    ``redact``, to that file and to our stderr (a build step, whose build system may
    echo its environment, credentials included).
    ``step`` names the command in a :class:`StepTimedOut` (default: the program).
    ``own_group``: the child starts its own process group (``process_group=0``), ended as
    one on an interruption or a timeout. A terminal's Ctrl-C then reaches only us, and we
    pass it on; a SIGTERM sent to us alone (``kill <pid>``, make's) reaches it too. Only
    for children that need no terminal input (a background group cannot read it).
    ``silence``: end the command, :class:`StepStalled`, when it received nothing within a
    time (:data:`Silence`; not with ``tee``).
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
            assert silence is None, "a silence limit is not for teed build steps"
            result = _run_teeing(argv, cwd, full_env, timeout, tee, clean, own_group)
        elif output == "stream-stderr":
            result = _run_showing_stderr(argv, cwd, full_env, timeout, own_group, silence)
        else:
            result = _run(argv, cwd, full_env, output, input_text, timeout, own_group, silence)
    except _Silent:
        assert silence is not None
        raise StepStalled(step or Path(argv[0]).name, silence[1], timeout_fix) from None
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
    if check and result.returncode != 0:
        raise CommandFailed(result, line, fix) if error is None else error(result)
    return result


def _run(
    argv: Sequence[str],
    cwd: str | Path | None,
    env: Mapping[str, str],
    output: str | IO[str],
    input_text: str | None,
    timeout: float | None,
    own_group: bool,
    silence: Silence | None = None,
) -> subprocess.CompletedProcess[str]:
    """What :func:`subprocess.run` does, except that an interrupted child is ended with
    the run's signal and a grace (``subprocess.run`` SIGKILLs it at once, which leaves a
    recipe's own children running)."""
    if output == "capture":
        streams: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    elif output == "inherit":
        streams = {}
    else:
        streams = {"stdout": output, "stderr": subprocess.STDOUT}
    with (
        lineage.popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            text=True,
            errors="replace",
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            process_group=0 if own_group else None,
            **streams,
        ) as process,
        _ended_if_interrupted(process, own_group),
    ):
        try:
            stdout, stderr = _bounded(
                lambda limit: process.communicate(input_text, timeout=limit), timeout, silence
            )
        except (subprocess.TimeoutExpired, _Silent):
            _kill(process, own_group)
            raise  # a timeout carries the output so far, as subprocess.run's does on POSIX
        return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)


def _run_showing_stderr(
    argv: Sequence[str],
    cwd: str | Path | None,
    env: Mapping[str, str],
    timeout: float | None,
    own_group: bool,
    silence: Silence | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run with the child's stderr passed on to ours as it comes, and kept for the error
    message; stdout is collected as :func:`subprocess.run` would."""
    with lineage.popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0 if own_group else None,
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
            with _ended_if_interrupted(process, own_group):
                returncode = _bounded(process.wait, timeout, silence)
        except (subprocess.TimeoutExpired, _Silent):
            _kill(process, own_group)
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
    own_group: bool,
) -> subprocess.CompletedProcess[str]:
    tee.flush()
    with lineage.popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
        process_group=0 if own_group else None,
    ) as process:
        out = process.stdout
        assert out is not None

        # The lines are copied on this thread, so that Ctrl-C stops the copy at once (what
        # a step prints while it is stopped, its traceback, is not ours); a timer ends a
        # step past its timeout.
        timed_out = threading.Event()

        def kill_on_timeout() -> None:
            timed_out.set()
            _signal(process, signal.SIGKILL, own_group)  # the main thread waits for it

        timer = threading.Timer(timeout, kill_on_timeout) if timeout is not None else None
        if timer is not None:
            timer.start()
        try:
            # A step may ignore the signal (a build server): it is stopped either way.
            with _ended_if_interrupted(process, own_group):
                for line in out:
                    clean = redact(line)
                    tee.write(clean)
                    log.passthrough(clean)
                returncode = process.wait()
        finally:
            if timer is not None:
                timer.cancel()
        if timed_out.is_set():
            raise subprocess.TimeoutExpired(list(argv), timeout or 0)
    return subprocess.CompletedProcess(list(argv), returncode, "", "")


AnyPopen = subprocess.Popen[str] | subprocess.Popen[bytes]


@contextmanager
def _ended_if_interrupted(process: AnyPopen, own_group: bool) -> Iterator[None]:
    """End ``process`` when the block is left by an interruption (with the run's own
    signal) or any other error (SIGTERM), then let the exception go on."""
    try:
        yield
    except KeyboardInterrupt as interrupt:
        stop(process, sig=signals.signal_of(interrupt), group=own_group)
        raise
    except BaseException:
        stop(process, group=own_group)
        raise


def _signal(process: AnyPopen, sig: int, group: bool) -> None:
    with suppress(ProcessLookupError):
        if group:
            os.killpg(process.pid, sig)
        elif process.returncode is None:
            process.send_signal(sig)


def _kill(process: AnyPopen, group: bool) -> None:
    _signal(process, signal.SIGKILL, group)
    process.wait()


def stop(
    process: AnyPopen,
    grace_s: float = STOP_GRACE_S,
    *,
    sig: int = signal.SIGTERM,
    group: bool = False,
) -> None:
    """Ask ``process`` (with ``group``: its whole process group) to end with ``sig``
    (SIGTERM unless told) and kill it if it has not within ``grace_s``; with ``group``,
    what is left of the group is killed once the leader has ended."""
    _signal(process, sig, group)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _signal(process, signal.SIGKILL, False)
        process.wait()
    if group:
        _signal(process, signal.SIGKILL, True)
