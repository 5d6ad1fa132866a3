"""Stage 5, collect: staging, the ship check, an atomic move into ``dist/<bundle>``.

Wheels are copied from the stage cache into ``dist/.staging-<bundle>-XXXX`` (same
filesystem as the destination), installed into a clean environment inside the builder
and checked there; only when the check passes does the staging directory become
``dist/<bundle>`` by ``rename``. A failed build or check leaves ``dist/`` as it was: a
reader never sees half a set of wheels.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xla_wheels import log
from xla_wheels.errors import CheckFailed, PipelineError
from xla_wheels.lockfile import WheelRecord, file_sha256, record_wheels


class ShipCheckFailed(CheckFailed):
    """The check on the staged wheels failed: they were not moved into dist/."""


def dist_dir(root: Path, bundle: str) -> Path:
    return root / "dist" / bundle


def records(wheels: Sequence[Path]) -> list[WheelRecord]:
    return [WheelRecord(w.name, w.stat().st_size, file_sha256(w)) for w in sorted(wheels)]


def up_to_date(root: Path, bundle: str, wheels: Sequence[Path]) -> bool:
    """dist/<bundle> already holds exactly these wheels (names and bytes)."""
    target = dist_dir(root, bundle)
    if not target.is_dir():
        return False
    present = sorted(target.glob("*.whl"))
    if [p.name for p in present] != sorted(w.name for w in wheels):
        return False
    by_name = {w.name: w for w in wheels}
    return all(file_sha256(p) == file_sha256(by_name[p.name]) for p in present)


class Staging:
    """``with Staging(root, bundle, wheels) as staging:`` ... ``staging.commit()``.

    Leaving the block without ``commit()`` removes the staging directory (and ``dist/``
    itself when this run created it), whatever happened inside.
    """

    def __init__(self, root: Path, bundle: str, wheels: Sequence[Path]) -> None:
        self.root = root
        self.bundle = bundle
        self.wheels = list(wheels)
        self.dist = root / "dist"
        self.created_dist = False
        self.path: Path | None = None
        self.committed = False

    def __enter__(self) -> Staging:
        if not self.dist.exists():
            self.dist.mkdir(parents=True)
            self.created_dist = True
        self.path = Path(tempfile.mkdtemp(prefix=f".staging-{self.bundle}-", dir=self.dist))
        self.path.chmod(0o755)
        for wheel in self.wheels:
            shutil.copy2(wheel, self.path / wheel.name)
            if file_sha256(self.path / wheel.name) != file_sha256(wheel):
                raise PipelineError(f"copy of {wheel.name} into staging differs from the source")
        return self

    def commit(self) -> Path:
        """Atomically make the staged wheels ``dist/<bundle>``; returns that directory."""
        assert self.path is not None
        target = dist_dir(self.root, self.bundle)
        old: Path | None = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".old-{self.bundle}-", dir=self.dist))
            os.replace(target, old / self.bundle)
        os.replace(self.path, target)
        self.committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def __exit__(self, *exc: object) -> None:
        if not self.committed and self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            if self.created_dist and not any(self.dist.iterdir()):
                self.dist.rmdir()


def record(lock_path: Path, bundle: str, target: Path) -> list[WheelRecord]:
    wheels = records(sorted(target.glob("*.whl")))
    record_wheels(lock_path, bundle, wheels)
    for wheel in wheels:
        log.info(f"  dist/{bundle}/{wheel.name}  {wheel.size} bytes  sha256:{wheel.sha256}")
    return wheels
