"""Modes for files the pipeline writes for others to read: what the umask allows.

``tempfile.mkstemp``/``NamedTemporaryFile`` create files 0600 and ``mkdtemp`` creates
directories 0700, on purpose (they are private scratch space). When such a file or
directory is renamed into a place others read (a wheel in ``dist/``, the static index,
``wheels.lock``), it must get the mode an ordinary ``open()``/``mkdir()`` would have given
it, or a static web server running as another user answers 404. So: chmod to
``0o666 & ~umask`` (files) or ``0o777 & ~umask`` (directories) before the rename.

:func:`write_by_rename` and :func:`copy_by_rename` are the one way the pipeline replaces a
file others read: a temporary file in the same directory (so the rename is atomic and a
crash never leaves half a file), given that mode, then renamed into place.
:func:`write_all` is the same for a set of files that belong together (a report and its
JUnit twin, ``requirements.txt`` and the ``wheels.lock`` that records its inputs, one
envelope per wheel): every one complete beside its target first, then all renamed, and
the ones already renamed put back if a later one fails.

Only a regular file is replaced (:func:`output_target`): a device node, a FIFO, a socket
or a directory at the output path is refused (:class:`NotARegularFile`) and left as it
is; a symbolic link to a regular file is written through (the file it names is replaced
by rename, the link kept: a user who linked an output meant that file); a link to
anything else, a dangling link or a link loop is refused. Before this, ``doctor --stamp
/dev/zero`` as root replaced the device with a JSON file.

This module imports only the standard library (it runs inside the builder image).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from xla_host.tables import MAX_FILE_BYTES, check_regular, kind_of, read_regular


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # Elsewhere: set and restore (not thread-safe; the pipeline is single-threaded here).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_if_created(path: Path) -> None:
    """Give ``path`` the mode a plain ``open()`` or ``mkdir()`` would have given it."""
    path.chmod((0o777 if path.is_dir() else 0o666) & ~current_umask())


class NotARegularFile(Exception):
    """An output path names something that writing by rename would destroy or that is no
    file (a device, a FIFO, a directory, a link to one): nothing was written. The CLI edge
    reports it as bad input (exit 2) with :attr:`fix`."""

    def __init__(self, message: str, *, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


def output_target(path: Path) -> Path:
    """The file writing ``path`` by rename replaces: ``path`` when nothing or a regular
    file is there, the regular file a symbolic link names (the link is kept), else
    :class:`NotARegularFile`, decided from ``lstat``/``stat`` (nothing is opened)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError:
        return path  # ENOTDIR, EACCES: the write itself fails and names the reason
    if stat.S_ISREG(status.st_mode):
        return path
    fix = (
        f"pass another path, or move {path} away if a file belongs there "
        f"(`ls -l {path}` shows what it is)"
    )
    if not stat.S_ISLNK(status.st_mode):
        raise NotARegularFile(
            f"{path} is {kind_of(status.st_mode)}, not a regular file: it was left as it is "
            "and nothing was written",
            fix=fix,
        )
    link = os.readlink(path)
    try:
        target = os.stat(path)
    except FileNotFoundError:
        problem = f"a symbolic link to {link}, which does not exist"
    except OSError as error:
        problem = (
            "a symbolic link loop"
            if error.errno == errno.ELOOP
            else f"a symbolic link to {link}, which cannot be read ({error.strerror})"
        )
    else:
        if stat.S_ISREG(target.st_mode):
            return Path(os.path.realpath(path))
        problem = f"a symbolic link to {link}, which is {kind_of(target.st_mode)}"
    raise NotARegularFile(
        f"{path} is {problem}: only a link to a regular file is written through; it was "
        "left as it is and nothing was written",
        fix=fix,
    )


@contextlib.contextmanager
def _replacing(path: Path, *, rename: bool = True) -> Iterator[IO[bytes]]:
    """A temporary file beside ``path``; renamed onto it, with the umask's mode, if the
    block succeeds, removed if anything fails (the block, or the flush, fsync or close
    where a full disk is reported): ``path`` is then as it was.

    An ``OSError`` that names no file or the temporary one names ``path`` instead (a full
    disk reports none on ``write``/``close``, a failed rename names the temporary file),
    so the message says which file could not be written. ``rename=False`` leaves the
    finished temporary file beside ``path`` (:func:`stage_by_rename`). ``path`` is first
    :func:`output_target`: what is there must be a regular file, or a link to one."""
    path = output_target(path)
    try:
        # Closed by `with out:` below; opened apart so that its failure names ``path``.
        out = tempfile.NamedTemporaryFile(  # noqa: SIM115
            dir=path.parent, prefix=f".{path.name}.", delete=False
        )
    except OSError as error:
        raise OSError(error.errno, error.strerror, str(path)) from error
    temporary = Path(out.name)
    try:
        with out:
            yield out
            out.flush()
            # Before the rename: a filesystem that allocates late reports no space here,
            # not after the rename has put an empty file in place.
            os.fsync(out.fileno())
        as_if_created(temporary)  # NamedTemporaryFile made it 0600
        if rename:
            os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename in (None, out.name):
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise


def write_by_rename(path: Path, content: bytes | str) -> None:
    """Replace ``path`` with ``content`` (text as UTF-8) atomically, readable as if created."""
    with _replacing(path) as out:
        out.write(content.encode("utf-8") if isinstance(content, str) else content)


def copy_by_rename(source: Path, path: Path) -> None:
    """Replace ``path`` with a copy of ``source`` atomically, readable as if created."""
    with _replacing(path) as out, source.open("rb") as data:
        shutil.copyfileobj(data, out)


@dataclass(frozen=True)
class StagedFile:
    """New content for :attr:`path`, complete in a temporary file beside it: nothing of it
    is visible at :attr:`path` until :meth:`commit`."""

    path: Path
    temporary: Path

    def commit(self) -> None:
        """Rename it into place (atomic); on failure the temporary file is removed."""
        try:
            os.replace(self.temporary, self.path)
        except BaseException as error:
            self.discard()
            if isinstance(error, OSError):
                raise OSError(error.errno, error.strerror, str(self.path)) from error
            raise

    def discard(self) -> None:
        self.temporary.unlink(missing_ok=True)


def stage_by_rename(path: Path, content: bytes | str) -> StagedFile:
    """:func:`write_by_rename` up to the rename: for a file that must change together with
    others (``wheels.lock`` with ``dist/<bundle>``), written before any of them changes."""
    target = output_target(path)
    with _replacing(target, rename=False) as out:
        out.write(content.encode("utf-8") if isinstance(content, str) else content)
    return StagedFile(target, Path(out.name))


def stage_all(files: Sequence[tuple[Path, bytes | str]]) -> list[StagedFile]:
    """:func:`stage_by_rename` for each of ``files``, or for none: a failure (a full disk
    on the third) removes the temporary files already written and raises."""
    staged: list[StagedFile] = []
    try:
        for path, content in files:
            staged.append(stage_by_rename(path, content))
    except BaseException:
        for file in staged:
            file.discard()
        raise
    return staged


def commit_all(staged: Sequence[StagedFile]) -> None:
    """Rename every staged file into place, in order, all or none.

    Each file that will be replaced is first kept under a second name (a hard link: no
    data is copied, so a full disk allows it); then the renames run in order. If one
    fails, the ones already renamed are put back (the kept original renamed onto its
    name, or the new file removed where there was none) and every temporary file is
    removed: each path is byte for byte what it was. Put the file that records the
    others (``wheels.lock``) last, so that no reader sees it before what it records."""
    kept: list[Path | None] = []
    done = 0
    try:
        for file in staged:
            kept.append(_keep_original(file.path))
        for file in staged:
            file.commit()
            done += 1
    except BaseException:
        for file, original in reversed(list(zip(staged[:done], kept, strict=False))):
            if original is not None:
                os.replace(original, file.path)
            else:
                file.path.unlink(missing_ok=True)
        for file in staged:
            file.discard()
        for original in kept:
            if original is not None:
                original.unlink(missing_ok=True)
        raise
    for original in kept:
        if original is not None:
            original.unlink(missing_ok=True)


def _keep_original(path: Path) -> Path | None:
    """A second name beside ``path`` for its current content (None: no file there yet)."""
    if not os.path.lexists(path) or path.is_dir():
        return None  # a directory in the way: the rename onto it fails and says so
    keep = path.parent / f".{path.name}.{secrets.token_hex(4)}.old"
    try:
        os.link(path, keep, follow_symlinks=False)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise OSError(error.errno, error.strerror, str(path)) from error
        # A filesystem without hard links: keep a copy instead (it needs the space).
        try:
            shutil.copy2(path, keep, follow_symlinks=False)
        except OSError as copying:
            keep.unlink(missing_ok=True)
            raise OSError(copying.errno, copying.strerror, str(path)) from copying
    return keep


def write_all(files: Sequence[tuple[Path, bytes | str]]) -> None:
    """Replace each of ``files`` with its content, all or none (:func:`stage_all`, then
    :func:`commit_all`): a failure anywhere leaves every path as it was, with no
    temporary file beside it. Give them in the order they may appear in."""
    commit_all(stage_all(files))


def _not_regular(message: str, *, fix: str | None = None) -> NotARegularFile:
    return NotARegularFile(message, fix=fix or f"`ls -l` the file named: {message}")


def read_shared(path: Path, *, what: str = "file", limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a file in a cache, lane, store or shared directory, where anyone with
    access may have put a FIFO or a device: :func:`xla_host.tables.read_regular` (refused
    from ``stat`` before any open that could block, size checked before reading, opened
    without blocking), refused as :class:`NotARegularFile` (exit 2 at the CLI edge).
    ``FileNotFoundError`` is left to the caller."""
    return read_regular(path, _not_regular, what=what, limit=limit)


def check_shared(path: Path, *, what: str = "file") -> None:
    """``path`` is a regular file (of any size), else :class:`NotARegularFile`, decided
    from ``stat`` (nothing is opened): for a path another library opens (urllib's
    ``file://`` handler). ``FileNotFoundError`` is left to the caller."""
    check_regular(path, _not_regular, what=what, limit=sys.maxsize)


@contextlib.contextmanager
def open_shared(path: Path, *, what: str = "file") -> Iterator[io.BufferedReader]:
    """``path`` opened for reading as a stream, of any size (a cache entry, a wheel), where
    anyone with access may have put a FIFO or a device: refused like :func:`read_shared`
    from ``stat`` before the open, opened without blocking and checked again once open (a
    FIFO put there after the ``stat`` cannot hang the run either), then read as usual.
    ``FileNotFoundError`` is left to the caller."""
    check_regular(path, _not_regular, what=what, limit=sys.maxsize)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # replaced after the stat
            raise _not_regular(f"{path} changed while it was read", fix="run it again")
        os.set_blocking(descriptor, True)
        yield handle


def file_sha256(path: Path) -> str:
    """sha256 of a regular file of any size (a wheel), refused like :func:`read_shared`
    when it is not one: a FIFO in a lane directory once hung ``status`` here."""
    with open_shared(path) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def mount_of(path: Path, mountinfo: str | None = None) -> tuple[str, str]:
    """(mount point, file system type) of the mount holding ``path`` (``/proc/self/mountinfo``
    unless ``mountinfo`` is given): the builder's disk faults and the doctor's shared-cache
    check read it."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return ("/", "unknown")
    best = ("/", "unknown")
    target = str(path)
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ")
        fstype = right.split()[0]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fstype)
    return best
