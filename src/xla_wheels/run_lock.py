"""One run at a time per bundle: an advisory file lock on ``out/<bundle>/.lock``.

Every subcommand that writes a bundle's work (its worktrees, logs, the stage cache entries
it stages, its entry in ``wheels.lock``) takes the lock first: sources, patch, wheels,
patch-export, patch-rebase, lock. A second run on the same bundle refuses at once (exit 5)
naming the first run's pid and command, instead of two runs interleaving ``git worktree``
and patch commands in one tree. ``fcntl.flock`` is released by the kernel when the holder
exits, killed or not, so a crashed run leaves no stale lock; the pid written in the file is
only for the message. Dry runs change nothing and take no lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from xla_wheels.errors import BundleBusy

LOCK_NAME = ".lock"


@contextmanager
def bundle_run_lock(out_dir: Path, bundle: str, command: str) -> Iterator[Path]:
    """Hold ``out_dir/bundle/.lock`` for the block; :class:`BundleBusy` if another run has it."""
    directory = out_dir / bundle
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            raise BundleBusy(
                f"another run is working on bundle {bundle} (pid and command: {holder}; "
                f"lock {path})",
                fix="wait for it to finish or stop it (kill <pid>), then run this again",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


def unless_dry_run(
    dry_run: bool, out_dir: Path, bundle: str, command: str
) -> AbstractContextManager[object]:
    """The bundle's lock for a real run; nothing for a dry run (which writes nothing)."""
    return nullcontext() if dry_run else bundle_run_lock(out_dir, bundle, command)
