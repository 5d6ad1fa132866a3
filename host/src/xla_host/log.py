"""Progress output: folded, timed sections; the one way library code says anything.

Modelled on cibuildwheel's ``logger.py``: each stage opens a section that is folded in
CI systems that support it (GitHub Actions ``::group::``, Azure ``##[group]``) and
closes with its duration, so a long build shows where the time went. Everything goes to
stderr; stdout is kept for machine-readable output (plans, JSON, tables users pipe),
which a library module writes with :func:`result`. Library modules never print: only the
edges do (the command lines, the processes' entry points; ``tests/test_no_prints.py``).

While a stage log is open (:func:`stage_log`, e.g. ``out/<bundle>/logs/sources.log``),
every line printed here is also written to it, through the log's redactor, together
with what :func:`to_stage_logs` adds (the output of the commands the stage ran).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from xla_host.redact import mask_url_credentials, printable

_stage_logs: list[tuple[TextIO, Callable[[str], str]]] = []


def _fold_marks() -> tuple[str, str | None]:
    """The line that opens a section (before its title) and the one that closes it."""
    # Which CI is displaying the log, not a setting of ours (cli/settings.py reads those).
    if os.environ.get("GITHUB_ACTIONS"):
        return "::group::", "::endgroup::"
    if os.environ.get("TF_BUILD"):
        return "##[group]", "##[endgroup]"
    return "==> ", None


def info(message: str) -> None:
    message = printable(mask_url_credentials(message))
    print(message, file=sys.stderr, flush=True)
    to_stage_logs(message)


def warning(message: str) -> None:
    info(f"warning: {message}")


def result(message: str) -> None:
    """A line of what a command produced (a file it wrote, a line of a dry run's plan): on
    stdout, which users pipe and read last, redacted as :func:`info` and kept in the open
    stage logs."""
    message = printable(mask_url_credentials(message))
    print(message, flush=True)
    to_stage_logs(message)


def passthrough(text: str) -> None:
    """A child's output as it comes, already redacted (and logged) by its caller: to
    stderr, unchanged, so a long build shows what it is doing."""
    sys.stderr.write(text)
    sys.stderr.flush()


def to_stage_logs(text: str) -> None:
    """Write ``text`` (redacted) to every open stage log, not to the terminal."""
    if not text:
        return
    line = text if text.endswith("\n") else text + "\n"
    for handle, redact in _stage_logs:
        handle.write(redact(line))
        handle.flush()


def unredacted(text: str) -> str:
    return text


@contextlib.contextmanager
def stage_log(path: Path, redact: Callable[[str], str] = unredacted) -> Iterator[Path]:
    """Open ``path`` (replaced each run) as the log of the stage running inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        entry = (handle, redact)
        _stage_logs.append(entry)
        try:
            yield path
        finally:
            _stage_logs.remove(entry)


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def format_size(count: int, *, small: str = "bytes", top: str = "TiB") -> str:
    """``count`` bytes as ``<n> <small>`` below 1 KiB, else in KiB, MiB, ... up to ``top``."""
    if count < 1024:
        return f"{count} {small}"
    scaled = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        scaled /= 1024
        if scaled < 1024 or unit == top:
            break
    return f"{scaled:.1f} {unit}"


@contextlib.contextmanager
def section(title: str) -> Iterator[None]:
    """A folded section that reports its duration and whether it failed."""
    title = mask_url_credentials(title)
    opening, closing = _fold_marks()
    print(opening + title, file=sys.stderr, flush=True)
    to_stage_logs(f"==> {title}")
    start = time.monotonic()
    outcome = "failed"
    try:
        yield
        outcome = "done"
    finally:
        elapsed = format_duration(time.monotonic() - start)
        if closing is not None:
            print(closing, file=sys.stderr, flush=True)
        info(f"<== {title}: {outcome} in {elapsed}")


def format_command(
    argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> str:
    """A copy-pasteable shell line for a command (env assignments first); credentials in
    URLs are masked (:func:`mask_url_credentials`)."""
    parts: list[str] = []
    if cwd:
        parts.append(f"(cd {shlex.quote(cwd)} &&")
    if env:
        parts.extend(f"{key}={shlex.quote(value)}" for key, value in sorted(env.items()))
    parts.extend(shlex.quote(arg) for arg in argv)
    line = mask_url_credentials(" ".join(parts))
    return line + ")" if cwd else line


def command(
    argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> None:
    """Print a command before it runs, as JAX's build.py does."""
    info(f"+ {format_command(argv, env, cwd)}")
