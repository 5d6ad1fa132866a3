"""One per-machine cache entry built by one process at a time; the others wait.

The stock torch_xla environments, the stock wheels' shared libraries and the compiled
checks' Debian packages are each set up once per machine, possibly by two test sessions or
two ``make`` runs at once: the second waits for the first (and then finds the entry ready)
instead of building it alongside, which would race on the same directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path

from xla_wheels import log


@contextlib.contextmanager
def waiting_lock(lock_path: Path, doing: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path``; ``doing`` says what a waiter waits for
    (``"building <name>"``)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as handle:
        started = time.monotonic()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info(f"waiting for another process {doing} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
            log.info(f"lock acquired after {log.format_duration(time.monotonic() - started)}")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
