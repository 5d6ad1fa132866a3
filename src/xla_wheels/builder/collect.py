"""Stage 5, collect: staging, the ship check, an atomic move into ``dist/<bundle>``.

Wheels are copied from the stage cache into ``dist/.staging-<bundle>-XXXX`` (same
filesystem as the destination), installed into a clean environment inside the builder
and checked there; only when the check passes does the staging directory become
``dist/<bundle>`` by ``rename``, together with the new ``wheels.lock`` (written beside it
first, renamed right after: :func:`commit_with_lock`). A failed build or check, or a
write that fails on the way (a full disk), leaves ``dist/`` and ``wheels.lock`` as they
were: a reader never sees half a set of wheels, nor wheels the lock does not record.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xla_wheels import disk_faults, filemode, log
from xla_wheels.errors import CheckFailed, PipelineError
from xla_wheels.layout import BundleLayout
from xla_wheels.wheels_lock import (
    WheelRecord,
    file_sha256,
    record_wheels,
    stage_held_back,
    written_on_success,
)


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
        try:
            self.path = Path(tempfile.mkdtemp(prefix=self.layout.staging_prefix, dir=self.dist))
            # mkdtemp made it 0700: dist/<bundle> is read by web servers running as others.
            filemode.as_if_created(self.path)
            for wheel in self.wheels:
                copy = self.path / wheel.name
                # A full disk reports no file name for a copy's write: name the copy.
                with disk_faults.writing(copy, doing="staging the new wheels"):
                    shutil.copy2(wheel, copy)
                # The mode the umask gives, whatever the stage cache's copy has (0600 there
                # from older pipelines' temporary files).
                filemode.as_if_created(copy)
                if file_sha256(copy) != file_sha256(wheel):
                    raise PipelineError(
                        f"copy of {wheel.name} into staging differs from the source"
                    )
        except BaseException:
            # `with` calls __exit__ only once __enter__ has returned: clean up here.
            self.__exit__()
            raise
        return self

    def commit(self, alongside: Sequence[filemode.StagedFile] = ()) -> Path:
        """Atomically make the staged wheels ``dist/<bundle>`` and rename ``alongside``
        (the new ``wheels.lock``, already written beside its file) into place with them.
        If any of it fails, ``dist/<bundle>`` is put back as it was, the files in
        ``alongside`` are discarded and the error is raised. Returns ``dist/<bundle>``."""
        assert self.path is not None
        target = self.layout.dist
        old: Path | None = None
        moved = False
        try:
            if target.exists():
                old = Path(tempfile.mkdtemp(prefix=self.layout.old_prefix, dir=self.dist))
                os.replace(target, old / target.name)
            os.replace(self.path, target)
            moved = True
            for file in alongside:
                file.commit()
        except BaseException:
            # Back as before: the new wheels to staging (removed by __exit__), the old ones
            # to dist/<bundle>. Renames within one directory: they need no space.
            if moved:
                os.replace(target, self.path)
            if old is not None:
                if (old / target.name).exists():
                    os.replace(old / target.name, target)
                shutil.rmtree(old, ignore_errors=True)
            for file in alongside:
                file.discard()
            raise
        self.committed = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return target

    def __exit__(self, *exc: object) -> None:
        if not self.committed and self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
        if not self.committed and self.created_dist and not any(self.dist.iterdir()):
            self.dist.rmdir()


def commit_with_lock(staging: Staging) -> Path:
    """Record the staged wheels in ``wheels.lock`` and put both in place together.

    The new lock (with everything the run held back) is written beside ``wheels.lock``
    first; only then does ``dist/<bundle>`` change, and the lock is renamed in right
    after. A failure at any point (a full disk while writing the lock) leaves both as
    they were (:meth:`Staging.commit`)."""
    assert staging.path is not None
    layout = staging.layout
    wheels = records(sorted(staging.path.glob("*.whl")))
    with written_on_success():
        record_wheels(layout.lock_path, layout.bundle, wheels)
        target = staging.commit(alongside=stage_held_back())
    for wheel in wheels:
        log.info(f"  {target / wheel.name}  {wheel.size} bytes  sha256:{wheel.sha256}")
    return target


def record_collected(layout: BundleLayout) -> None:
    """Record the wheels in dist/<bundle> in wheels.lock."""
    wheels = records(sorted(layout.dist.glob("*.whl")))
    record_wheels(layout.lock_path, layout.bundle, wheels)
    for wheel in wheels:
        log.info(f"  {layout.dist / wheel.name}  {wheel.size} bytes  sha256:{wheel.sha256}")
