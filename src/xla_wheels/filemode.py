"""Modes for files the pipeline writes for others to read: what the umask allows.

``tempfile.mkstemp``/``NamedTemporaryFile`` create files 0600 and ``mkdtemp`` creates
directories 0700, on purpose (they are private scratch space). When such a file or
directory is renamed into a place others read (a wheel in ``dist/``, the static index,
``wheels.lock``), it must get the mode an ordinary ``open()``/``mkdir()`` would have given
it, or a static web server running as another user answers 404. So: chmod to
``0o666 & ~umask`` (files) or ``0o777 & ~umask`` (directories) before the rename.

This module imports only the standard library (it runs inside the builder image).
"""

from __future__ import annotations

import os
from pathlib import Path


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


def file_mode() -> int:
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    return 0o777 & ~current_umask()


def as_if_created(path: Path) -> None:
    """Give ``path`` the mode a plain ``open()`` or ``mkdir()`` would have given it."""
    path.chmod(dir_mode() if path.is_dir() else file_mode())
