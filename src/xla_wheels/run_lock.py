"""One run at a time per bundle: an advisory file lock on ``out/<bundle>/.lock``.

Every subcommand that writes a bundle's work or products (``out/<bundle>``,
``dist/<bundle>``, its entry in ``wheels.lock``) takes the lock first, at the CLI edge
(``xla_wheels.cli.bundle_lock``, from each subcommand's declaration): sources, patch, wheels,
patch-export, patch-rebase, lock, publish, requirements, verify-install, attest and
rebuild-check. A second run on the same bundle refuses at once (exit 5) naming the first
run's pid and command, instead of two runs interleaving ``git worktree`` and patch
commands in one tree or one venv. ``fcntl.flock`` is released by the kernel when the
holder exits, killed or not, so a crashed run leaves no stale lock (a file a killed run
left behind is taken over by the next run); the pid written in the file is only for the
message. Dry runs change nothing and take no lock.

The lock leaves no trace: on release the file is removed, and so is each directory the
lock itself made that is still empty, so a run refused by a check (bad input, a preflight
blocker) writes nothing. Removing a lock file is safe because a taker checks, once it holds
the lock, that the path still names the file it locked, and starts again if not. A run
takes it once, at the CLI edge; the stages below never take it again (a second take in the
same process is refused like any other holder's, as a new descriptor's flock is).
"""

from __future__ import annotations

import fcntl
import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from xla_host.errors import BundleBusy

LOCK_NAME = ".lock"


@contextmanager
def bundle_run_lock(out_dir: Path, bundle: str, command: str) -> Iterator[Path]:
    """Hold ``out_dir/bundle/.lock`` for the block; :class:`BundleBusy` if another run has it."""
    directory = out_dir / bundle
    path = directory / LOCK_NAME
    # The directories the lock itself makes, innermost first: removed on release if empty.
    made = list(itertools.takewhile(lambda d: not d.exists(), [directory, *directory.parents]))
    fd = _locked_descriptor(directory, path, bundle)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {command}\n".encode(), 0)
        yield path
    finally:
        # Removed while still held: a run waiting on this file finds it gone and retries.
        path.unlink(missing_ok=True)
        os.close(fd)  # releases the lock
        for made_directory in made:  # innermost first; kept when anything is in it
            try:
                made_directory.rmdir()
            except OSError:
                break


def _locked_descriptor(directory: Path, path: Path, bundle: str) -> int:
    while True:
        directory.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # the directory went with another run's release
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise _busy(bundle, path, holder) from None
        with suppress(FileNotFoundError):
            held, named = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                return fd
        os.close(fd)  # we locked a file its holder removed on release: take the new one


def _busy(bundle: str, path: Path, holder: str) -> BundleBusy:
    """The refusal, naming the holder and how to look at it. Only a live process can hold
    the lock (the kernel releases it with its last holder, and the next run takes it
    over), so the fix never says to remove the file or kill a pid unseen."""
    pid, _, command = holder.partition(" ")
    if not pid.isdigit():  # written by nothing we know: say what the file holds
        return BundleBusy(
            f"another process holds the lock of bundle {bundle} ({path}: "
            f"{holder[:80] or 'empty'})",
            fix=f"find it with `fuser -v {path}`; wait for it to end, then run this again",
        )
    return BundleBusy(
        f"another run is working on bundle {bundle}: pid {pid}, `{command}` (lock {path})",
        fix=(
            f"wait for it to end; `ps -o pid,etime,args -p {pid}` shows it (no output: it "
            f"runs in another container or on another machine sharing {path.parent}). A "
            "run that died releases the lock by itself, so this one is alive. To stop it: "
            f"`kill {pid}` (SIGTERM: it ends its children, releases the lock, keeps nothing "
            "half-done, exit 143), then run this again"
        ),
    )
