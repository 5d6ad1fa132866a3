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

from xla_wheels import filemode, log
from xla_wheels.errors import CheckFailed, PipelineError
from xla_wheels.layout import BundleLayout
from xla_wheels.wheels_lock import WheelRecord, file_sha256, record_wheels


class ShipCheckFailed(CheckFailed):
    """The check on the staged wheels failed: they were not moved into dist/."""


def records(wheels: Sequence[Path]) -> list[WheelRecord]:
    return [WheelRecord(w.name, w.stat().st_size, file_sha256(w)) for w in sorted(wheels)]


def up_to_date(layout: BundleLayout, wheels: Sequence[Path]) -> bool:
    """dist/<bundle> already holds exactly these wheels (names and bytes)."""
    target = layout.dist
    if not target.is_dir():
        return False
    present = sorted(target.glob("*.whl"))
    if [p.name for p in present] != sorted(w.name for w in wheels):
        return False
    by_name = {w.name: w for w in wheels}
    return all(file_sha256(p) == file_sha256(by_name[p.name]) for p in present)


class Staging:
    """``with Staging(layout, wheels) as staging:`` ... ``staging.commit()``.

    Leaving the block without ``commit()`` removes the staging directory (and ``dist/``
    itself when this run created it), whatever happened inside.
    """

    def __init__(self, layout: BundleLayout, wheels: Sequence[Path]) -> None:
        self.layout = layout
        self.wheels = list(wheels)
        self.dist = layout.dist_root
        self.created_dist = False
        self.path: Path | None = None
        self.committed = False

    def __enter__(self) -> Staging:
        if not self.dist.exists():
            self.dist.mkdir(parents=True)
            self.created_dist = True
        self.path = Path(tempfile.mkdtemp(prefix=self.layout.staging_prefix, dir=self.dist))
        # mkdtemp made it 0700: dist/<bundle> is read by web servers running as others.
        filemode.as_if_created(self.path)
        for wheel in self.wheels:
            shutil.copy2(wheel, self.path / wheel.name)
            # The mode the umask gives, whatever the stage cache's copy has (0600 there
            # from older pipelines' temporary files).
            filemode.as_if_created(self.path / wheel.name)
            if file_sha256(self.path / wheel.name) != file_sha256(wheel):
                raise PipelineError(f"copy of {wheel.name} into staging differs from the source")
        return self

    def commit(self) -> Path:
        """Atomically make the staged wheels ``dist/<bundle>``; returns that directory."""
        assert self.path is not None
        target = self.layout.dist
        old: Path | None = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=self.layout.old_prefix, dir=self.dist))
            os.replace(target, old / target.name)
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


def record_collected(layout: BundleLayout) -> list[WheelRecord]:
    """The wheels in dist/<bundle>, recorded in wheels.lock."""
    wheels = records(sorted(layout.dist.glob("*.whl")))
    record_wheels(layout.lock_path, layout.bundle, wheels)
    for wheel in wheels:
        log.info(f"  {layout.dist / wheel.name}  {wheel.size} bytes  sha256:{wheel.sha256}")
    return wheels
