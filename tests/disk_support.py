"""A real tmpfs a test mounts (``tmpfs`` fixture, for every module through conftest):
filled to leave a chosen number of bytes, or remounted read-only, unmounted at teardown.
Mounting needs root: elsewhere the tests that ask for one skip, saying so."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PAGE = 4096


@dataclass(frozen=True)
class Tmpfs:
    path: Path

    def free(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int) -> None:
        """A ballast file that leaves exactly ``leave`` bytes (whole pages) free."""
        size = self.free() - leave
        assert size >= 0, f"the tmpfs has only {self.free()} bytes free, {leave} wanted"
        fd = os.open(self.path / "ballast", os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        assert self.free() == leave

    def remount_read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


MountTmpfs = Callable[[str, int], Tmpfs]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[MountTmpfs]:
    """``tmpfs(name, size)``: a real tmpfs of ``size`` bytes at ``tmp_path/name``."""
    mounted: list[Path] = []

    def mount(name: str, size: int) -> Tmpfs:
        path = tmp_path / name
        path.mkdir()
        if os.geteuid() != 0:
            pytest.skip(f"mounting a tmpfs needs root; these tests run as uid {os.geteuid()}")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"this machine forbids mounting a tmpfs: {done.stderr.strip()}")
        mounted.append(path)
        return Tmpfs(path)

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", str(path)], check=True)
