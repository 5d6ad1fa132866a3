"""The one command-line edge: where a :class:`~xla_host.errors.PipelineError` becomes
``error:`` / ``fix:`` lines and an exit code, for both command lines.

The host's ``xla-host`` (``xla_host.cli``) and the builder's ``xla-wheels``
(``xla_wheels.cli``) run every command through :func:`exit_code_of`; the builder passes
its own reading of a disk fault (it names the mount and the free space), the host the
plain one here.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from xla_host import filemode, signals
from xla_host.errors import DiskError, ExitCode, PipelineError, UsageError

#: errno values of a write that failed for a reason of the disk, not of the run; EPERM is
#: what a directory made immutable (``chattr +i``) answers a new file or a removal with.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


class Parser(argparse.ArgumentParser):
    """argparse, with bad arguments as our :class:`UsageError` (``error:``/``fix:``, exit
    2) instead of a usage dump: a bad value raises :class:`argparse.ArgumentError` up to
    the caller (``exit_on_error=False``), which names the flag; the other mistakes
    (unknown or missing arguments) come through :meth:`error`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(
            f"{self.prog}: {message}", fix=f"see `{self.prog} --help` for its arguments"
        )


def plain_disk_error(error: OSError) -> DiskError | None:
    """A disk fault named by its file (the host has no mount table reader of its own)."""
    if error.errno not in DISK_ERRNOS or (error.errno == errno.EPERM and not error.filename):
        return None  # EPERM without a file: a signal or a process, not the disk
    where = os.fsdecode(error.filename) if error.filename is not None else "a file"
    directory = os.path.dirname(where) or "."
    return DiskError(
        f"cannot write {where}: {os.strerror(error.errno)}",
        fix=f"free space on its filesystem, or make {directory} writable (`ls -ld {directory}`;"
        f" `lsattr -d {directory}` shows an immutable one), then run the command again",
    )


def exit_code_of(
    action: Callable[[], int],
    *,
    disk_error: Callable[[OSError], PipelineError | None] = plain_disk_error,
) -> int:
    """``action``'s exit code; a :class:`PipelineError` is printed as ``error:`` and ``fix:``
    lines and gives its own code, an interruption 128 + its signal (130 Ctrl-C, 143
    SIGTERM, 129 SIGHUP: ``xla_host.signals``): never a traceback."""
    # Under make (which exports MAKELEVEL to its recipes), the run also ends with the
    # recipe's shell: make's SIGTERM reaches that shell only (signals.end_with_parent).
    with signals.handled():
        try:
            if "MAKELEVEL" in os.environ:
                signals.end_with_parent()
            return action()
        except PipelineError as error:
            return reported(error)
        except filemode.NotARegularFile as error:  # an output path, as the user gave it
            return reported(UsageError(error.message, fix=error.fix))
        except RuntimeError as error:
            # Path.resolve() before Python 3.13 says a loop this way, from wherever a path
            # the user gave (the cache, out, a lane, --out, DEMO_DIR) is resolved.
            match = _SYMLINK_LOOP.fullmatch(str(error))
            if match is None:
                raise
            return reported(symlink_loop(match.group(1)))
        except BrokenPipeError:  # an OSError: before the general reading of one
            return output_reader_gone()
        except OSError as error:
            if error.errno == errno.ELOOP and error.filename is not None:
                return reported(symlink_loop(os.fsdecode(error.filename)))
            if (in_the_way := file_in_the_way(error)) is not None:
                return reported(in_the_way)
            disk = disk_error(error)
            if disk is None:
                raise
            return reported(disk)
        except KeyboardInterrupt as interrupt:
            print(f"error: {signals.describe(interrupt)}", file=sys.stderr)
            return signals.exit_code(interrupt)


def output_reader_gone() -> int:
    """The reader of stdout closed it (``xla-wheels lanes | head``): the shell's convention
    (128 + SIGPIPE), silently, as ``yes | head`` ends. stdout is pointed at /dev/null so
    the interpreter's own flush at exit does not raise the same error again (the
    recipe of https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.SIGPIPE


_SYMLINK_LOOP = re.compile(r"Symlink loop from '(.*)'", re.DOTALL)


def symlink_loop(path: str) -> UsageError:
    """A path that is, or goes through, a symbolic link loop: bad input (exit 2)."""
    return UsageError(
        f"{path} is a symbolic link loop (or goes through one): it names no file or directory",
        fix=f"point the link at a real directory or file, or remove it (`ls -l {path}` shows "
        "where it points)",
    )


def file_in_the_way(error: OSError) -> UsageError | None:
    """A directory to be made (``--out``, ``--slice-dir``, a cache) where a file is, or
    below one (``mkdir`` says ENOTDIR or EEXIST): bad input naming the file (exit 2)."""
    if error.errno not in (errno.ENOTDIR, errno.EEXIST) or error.filename is None:
        return None
    wanted = Path(os.fsdecode(error.filename))
    for candidate in (wanted, *wanted.parents):
        if os.path.lexists(candidate):
            if candidate.is_symlink() and not candidate.exists():
                try:
                    candidate.stat()
                except OSError as looked:
                    if looked.errno == errno.ELOOP:
                        return symlink_loop(str(candidate))
            if candidate.is_dir():
                return None  # not a directory made over a file: another error, told as is
            return UsageError(
                f"{candidate} is a file, not a directory, so {wanted} cannot be made there",
                fix=f"pass a directory (a new or an existing one), or move {candidate} away",
            )
    return None


def reported(error: PipelineError) -> int:
    print(f"error: {error.message}", file=sys.stderr)
    if error.fix:
        print(f"  fix: {error.fix}", file=sys.stderr)
    return error.exit_code
