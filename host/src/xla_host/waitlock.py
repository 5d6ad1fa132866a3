"""One per-machine cache entry built by one process at a time; the others wait.

The stock torch_xla environments, the stock wheels' shared libraries and the compiled
checks' Debian packages are each set up once per machine, possibly by two test sessions or
two ``make`` runs at once: the second waits for the first (and then finds the entry ready)
instead of building it alongside, which would race on the same directory.

:func:`make_once` is the whole pattern for a directory entry: the lock, a temporary
sibling the maker fills, the marker file written last, and the rename into place as the
commit point. An entry without its marker is never trusted, so a maker that fails or is
killed half-way leaves nothing a later run takes as done.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from xla_host import filemode, log


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


def make_once(
    target: Path,
    make: Callable[[Path], Mapping[str, object]],
    *,
    marker: str,
    doing: str,
    usable: Callable[[Path], bool] = lambda _: True,
    in_place: bool = False,
) -> Path:
    """``target``, made by ``make`` unless a complete one is there; returns ``target``.

    ``make(tmp)`` fills ``tmp`` (a sibling of ``target``) and returns what the marker
    records. Complete means: ``marker`` is in it and ``usable(target)`` holds. Makers of
    the same target wait for each other (``doing`` says what they wait for) and then reuse
    the first one's result.

    ``in_place``: ``make`` is handed ``target`` itself, for results that name their own
    path (a gate report, a ``TMPDIR``) and would be wrong after a rename. The marker,
    written last, is then the only commit point: a half-made target has none and is made
    again.
    """

    def complete() -> bool:
        return (target / marker).is_file() and usable(target)

    if complete():
        return target
    with waiting_lock(target.parent / f"{target.name}.lock", doing):
        # Another process may have finished it while we waited for the lock.
        if complete():
            return target
        # Under the lock nobody else makes this target: leftovers are a crashed maker's.
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():
            shutil.rmtree(target)  # no marker: never completed, never trusted
        if in_place:
            target.mkdir()
            _write_marker(target / marker, make(target))
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _write_marker(tmp / marker, make(tmp))
            filemode.as_if_created(tmp)  # mkdtemp made it 0700; the cache is per machine
            os.rename(tmp, target)  # the commit point: before it, target does not exist
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _write_marker(path: Path, record: Mapping[str, object]) -> None:
    path.write_text(json.dumps(record, indent=2) + "\n")
