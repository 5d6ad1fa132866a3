"""Signs of life while a long command runs, and the table of stage timings.

A fetch of PyTorch is hundreds of MB and prints nothing with ``--quiet``. On a terminal
the fetch runs with git's own ``--progress`` (see ``sources.fetch_command``); elsewhere
(CI, a log file, ``make ... 2>&1 | tee``) git's carriage-return progress would be noise,
so :func:`heartbeat` prints one line every interval instead, with the bytes received so
far when the caller can measure them. The interval comes from
``XLA_WHEELS_PROGRESS_INTERVAL`` (seconds, default 30), so a test can make it short.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import log
from xla_host.net import repeating


def on_terminal() -> bool:
    """Whether stderr is a terminal: then git shows its own progress."""
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def directory_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (files vanishing meanwhile are skipped)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def heartbeat(
    what: str, measure: Callable[[], int] | None, every: float
) -> contextlib.AbstractContextManager[None]:
    """Print ``still <what>: <elapsed>[, <bytes> received so far]`` every ``every``
    seconds until the block ends (0: never). ``measure`` returns a byte count; its growth
    is reported."""
    baseline = measure() if measure and every > 0 else 0

    def line(elapsed: float) -> str:
        text = f"still {what}: {log.format_duration(elapsed)}"
        if measure is not None:
            received = log.format_size(max(measure() - baseline, 0), small="B", top="GiB")
            text += f", {received} received so far"
        return text

    return repeating(line, first=every, every=every)


@dataclass
class Timings:
    """Every stage of a run, in order, whether it ran, was cached or failed."""

    rows: list[tuple[str, float, str]] = field(default_factory=list)
    """(stage, seconds, status: ran, cached, up to date, or failed)."""

    def add(self, name: str, seconds: float, status: str) -> None:
        self.rows.append((name, seconds, status))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """A folded, timed section recorded as ``ran``, or ``failed`` if it raises."""
        start = time.monotonic()
        outcome = "failed"
        try:
            with log.section(name):
                yield
            outcome = "ran"
        finally:
            self.add(name, time.monotonic() - start, outcome)

    def report(self) -> None:
        if not self.rows:
            return
        width = max(24, *(len(name) for name, _, _ in self.rows))
        log.info("stage timings:")
        for name, seconds, status in self.rows:
            log.info(f"  {name:<{width}} {log.format_duration(seconds):>8}  {status}")
