"""Progress output: folded, timed sections.

Modelled on cibuildwheel's ``logger.py``: each stage opens a section that is folded in
CI systems that support it (GitHub Actions ``::group::``, Azure ``##[group]``) and
closes with its duration, so a long build shows where the time went. Everything goes to
stderr; stdout is kept for machine-readable output (plans, JSON, tables users pipe).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TextIO


def _fold_style() -> str | None:
    # Which CI is displaying the log, not a setting of ours (options.py reads those).
    if os.environ.get("GITHUB_ACTIONS"):
        return "github"
    if os.environ.get("TF_BUILD"):
        return "azure"
    return None


def _stream() -> TextIO:
    return sys.stderr


def info(message: str) -> None:
    print(message, file=_stream(), flush=True)


def warning(message: str) -> None:
    print(f"warning: {message}", file=_stream(), flush=True)


def format_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


@contextlib.contextmanager
def section(title: str) -> Iterator[None]:
    """A folded section that reports its duration and whether it failed."""
    style = _fold_style()
    stream = _stream()
    if style == "github":
        print(f"::group::{title}", file=stream, flush=True)
    elif style == "azure":
        print(f"##[group]{title}", file=stream, flush=True)
    else:
        print(f"==> {title}", file=stream, flush=True)
    start = time.monotonic()
    outcome = "failed"
    try:
        yield
        outcome = "done"
    finally:
        elapsed = format_duration(time.monotonic() - start)
        if style == "github":
            print("::endgroup::", file=stream, flush=True)
        elif style == "azure":
            print("##[endgroup]", file=stream, flush=True)
        print(f"<== {title}: {outcome} in {elapsed}", file=stream, flush=True)


def format_command(
    argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> str:
    """A copy-pasteable shell line for a command (env assignments first)."""
    parts: list[str] = []
    if cwd:
        parts.append(f"(cd {shlex.quote(cwd)} &&")
    if env:
        parts.extend(f"{key}={shlex.quote(value)}" for key, value in sorted(env.items()))
    parts.extend(shlex.quote(arg) for arg in argv)
    line = " ".join(parts)
    return line + ")" if cwd else line


def command(
    argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None
) -> None:
    """Print a command before it runs, as JAX's build.py does."""
    info(f"+ {format_command(argv, env, cwd)}")
