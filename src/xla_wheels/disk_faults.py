"""Disk faults as one error: a full disk, a quota, a read-only or an unwritable directory.

Any write the pipeline makes (the run lock, logs, worktrees, the stage cache, ``dist/``,
``wheels.lock``, the ship check's environment) can fail with ENOSPC, EDQUOT, EROFS or
EACCES. None of them says anything about the inputs or the build, and each has a fix the
user can apply (free space, another directory, permissions), so they are one class:
:func:`disk_error` turns such an ``OSError`` into :class:`~xla_host.errors.DiskError`
(exit 10) naming the path and that fix. The CLI edge applies it to any such ``OSError``
that escapes a subcommand; a writer whose ``OSError`` carries no file name (``write`` or
``close`` on a full disk report none) wraps the write in :func:`writing` to name it.

A build step runs in another process (``builder.run_recipe``), whose tools report a disk
fault only as text (:func:`fault_in_text` finds it there) or not at all (then the
filesystems the step writes say it: :func:`exhausted`); the recipe exits
:data:`DISK_FAULT_EXIT`, and the pipeline names the directory the step writes that is
read-only, unwritable or the fullest (:func:`step_disk_error`).

Standard library only (and ``errors``): ``builder.run_recipe`` uses it in the builder image.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from xla_host import log
from xla_host.errors import DiskError
from xla_host.filemode import mount_of

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})
"""The errnos that are the disk's, not the run's."""

DISK_FAULT_EXIT = DiskError.exit_code
"""What ``builder.run_recipe`` exits with when a step hit a disk fault."""

# What a tool prints for these errnos (strerror): pip, venv, cp, tar and Python's own
# tracebacks all use it. EACCES ("Permission denied") is left out on purpose: a tool says
# it for files that are not the disk's (a socket, a device, a remote), and reading it as
# a disk fault would hide a real failure of the build.
_FAULT_TEXTS = [os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS)]


def is_disk_fault(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DISK_ERRNOS


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds ``path`` (or would hold it)."""
    return Path(mount_of(existing(path).resolve())[0])


def existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists."""
    current = Path(os.path.abspath(path))
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    stat = os.statvfs(existing(path))
    return stat.f_bavail * stat.f_frsize


ELSEWHERE = (
    "or give the run a directory on another filesystem (--out-dir or XLA_WHEELS_OUT for "
    "out/, --cache-dir or XLA_WHEELS_CACHE for the cache; dist/ and wheels.lock are in the "
    "checkout)"
)


def disk_error(
    error: OSError, path: Path | str | None = None, *, doing: str = ""
) -> DiskError | None:
    """``error`` as a :class:`DiskError` naming ``path`` (else the error's own file name),
    or None when its errno is not a disk fault."""
    if error.errno not in DISK_ERRNOS:
        return None
    named = path if path is not None else error.filename
    where = Path(os.fsdecode(named)) if named is not None else None
    what = f" {doing}" if doing else ""
    if where is None:
        return DiskError(
            f"a write failed{what}: {os.strerror(error.errno)}",
            fix=f"free space or fix the permissions of the directories the run writes, {ELSEWHERE}",
        )
    directory = where if where.is_dir() else where.parent
    mount = mount_point(where)
    problem = f"cannot write {where}{what}: {os.strerror(error.errno)}"
    if error.errno == errno.ENOSPC:
        free = log.format_size(free_bytes(where))
        return DiskError(
            f"{problem} (the filesystem at {mount} is full: {free} free)",
            fix=f"free space on {mount} (`df -h {mount}` shows it), {ELSEWHERE}; then run "
            "the same command again",
        )
    if error.errno == errno.EDQUOT:
        return DiskError(
            f"{problem} (your disk quota on {mount} is used up)",
            fix=f"free space within your quota on {mount} (`quota -s` shows it), {ELSEWHERE}; "
            "then run the same command again",
        )
    if error.errno == errno.EROFS:
        return DiskError(
            f"{problem} (the filesystem at {mount} is mounted read-only)",
            fix=f"remount {mount} read-write (`mount -o remount,rw {mount}`), {ELSEWHERE}",
        )
    return DiskError(
        f"{problem} (user {os.getuid()} may not write {directory})",
        fix=f"give your user write access to {directory} (`ls -ld {directory}` shows its "
        f"owner and mode; `chown`/`chmod` it), {ELSEWHERE}",
    )


@contextmanager
def writing(path: Path, *, doing: str = "") -> Iterator[None]:
    """Inside the block, a disk fault is a :class:`DiskError` naming ``path`` (for writes
    whose ``OSError`` names no file, or names a temporary file instead of the target)."""
    try:
        yield
    except OSError as error:
        converted = disk_error(error, path, doing=doing)
        if converted is None:
            raise
        raise converted from error


def fault_in_text(text: str) -> str | None:
    """The first line of a tool's output that reports a disk fault, or None."""
    faults = [line for line in text.splitlines() if any(f in line for f in _FAULT_TEXTS)]
    return faults[0].strip() if faults else None


NEARLY_FULL = 1 << 20
"""Free bytes below which a filesystem a failed step wrote to counts as full: a healthy
build disk never has less, and a write that just failed for space leaves about nothing."""


def exhausted(paths: Iterable[Path]) -> str | None:
    """For a step that failed without saying why (``venv`` hides ``ensurepip``'s output):
    the first of the directories it writes that is read-only or nearly full, described,
    or None."""
    for path in paths:
        if _blocked(path) == errno.EROFS:
            return f"{path}: {os.strerror(errno.EROFS)}"
        if free_bytes(path) < NEARLY_FULL:
            return f"{path}: {os.strerror(errno.ENOSPC)} ({log.format_size(free_bytes(path))} free)"
    return None


def _blocked(path: Path) -> int | None:
    """EROFS or EACCES when ``path`` (or its nearest existing parent) cannot be written."""
    nearest = existing(path)
    if os.statvfs(nearest).f_flag & os.ST_RDONLY:
        return errno.EROFS
    return None if os.access(nearest, os.W_OK) else errno.EACCES


def step_disk_error(step: str, paths: Iterable[Path]) -> DiskError:
    """A build step (another process, which printed its tool's message) stopped on a disk
    fault: name the directory it writes that is read-only or unwritable, else the one
    with the least free space, and the fix for that."""
    candidates = list(paths)
    blocked = [(path, code) for path in candidates if (code := _blocked(path)) is not None]
    where, code = blocked[0] if blocked else (min(candidates, key=free_bytes), errno.ENOSPC)
    converted = disk_error(OSError(code, os.strerror(code)), where, doing=f"in {step}")
    assert converted is not None  # code is one of DISK_ERRNOS
    return converted
