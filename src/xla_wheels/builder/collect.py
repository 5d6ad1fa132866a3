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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from xla_host import filemode, log
from xla_host.errors import CheckFailed, PipelineError
from xla_host.filemode import file_sha256
from xla_wheels import disk_faults, wheel_stamp
from xla_wheels.layout import BundleLayout
from xla_wheels.wheels_lock import WheelRecord, record_wheels, stage_held_back, written_on_success


class ShipCheckFailed(CheckFailed):
    """The check on the staged wheels failed: they were not moved into dist/."""


def records(wheels: Sequence[Path]) -> list[WheelRecord]:
    """What the lock says of each wheel, the SBOM it carries included: verify-install and
    doctor fail an installed wheel without the SBOM the lock names."""
    return [
        WheelRecord(w.name, w.stat().st_size, file_sha256(w), wheel_stamp.sbom_path_in(w))
        for w in sorted(wheels)
    ]


def up_to_date(layout: BundleLayout, wheels: Sequence[Path]) -> bool:
    """dist/<bundle> already holds exactly these wheels (names and bytes)."""
    return set(records(list(layout.dist.glob("*.whl")))) == set(records(wheels))


@contextmanager
def staging(layout: BundleLayout, wheels: Sequence[Path]) -> Iterator[Path]:
    """``with staging(layout, wheels) as path:`` ... ``commit_with_lock(layout, path)``.

    A new directory in ``dist/`` holding copies of ``wheels``. Leaving the block without
    the commit removes it (and ``dist/`` itself when this run created it), whatever
    happened inside; after the commit, it is ``dist/<bundle>`` and nothing is removed.
    """
    dist = layout.dist_root
    created_dist = not dist.exists()
    if created_dist:
        dist.mkdir(parents=True)
    path: Path | None = None
    try:
        path = Path(tempfile.mkdtemp(prefix=layout.staging_prefix, dir=dist))
        # mkdtemp made it 0700: dist/<bundle> is read by web servers running as others.
        filemode.as_if_created(path)
        for wheel in wheels:
            copy = path / wheel.name
            # A full disk reports no file name for a copy's write: name the copy.
            with disk_faults.writing(copy, doing="staging the new wheels"):
                shutil.copy2(wheel, copy)
            # The mode the umask gives, whatever the stage cache's copy has (0600 there
            # from older pipelines' temporary files).
            filemode.as_if_created(copy)
            if file_sha256(copy) != file_sha256(wheel):
                raise PipelineError(f"copy of {wheel.name} into staging differs from the source")
        yield path
    finally:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)  # gone already once committed
        if created_dist and not any(dist.iterdir()):
            dist.rmdir()


def _commit(layout: BundleLayout, path: Path, alongside: Sequence[filemode.StagedFile]) -> Path:
    """Atomically make the staged wheels ``dist/<bundle>`` and rename ``alongside``
    (the new ``wheels.lock``, already written beside its file) into place with them.
    If any of it fails, ``dist/<bundle>`` is put back as it was, the files in
    ``alongside`` are discarded and the error is raised. Returns ``dist/<bundle>``."""
    target = layout.dist
    old: Path | None = None
    moved = False
    try:
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=layout.old_prefix, dir=layout.dist_root))
            os.replace(target, old / target.name)
        os.replace(path, target)
        moved = True
        for file in alongside:
            file.commit()
    except BaseException:
        # Back as before: the new wheels to staging (removed by staging()), the old ones
        # to dist/<bundle>. Renames within one directory: they need no space.
        if moved:
            os.replace(target, path)
        if old is not None:
            if (old / target.name).exists():
                os.replace(old / target.name, target)
            shutil.rmtree(old, ignore_errors=True)
        for file in alongside:
            file.discard()
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def commit_with_lock(layout: BundleLayout, path: Path) -> Path:
    """Record the staged wheels in ``wheels.lock`` and put both in place together.

    The new lock (with everything the run held back) is written beside ``wheels.lock``
    first; only then does ``dist/<bundle>`` change, and the lock is renamed in right
    after. A failure at any point (a full disk while writing the lock) leaves both as
    they were (:func:`_commit`)."""
    wheels = records(sorted(path.glob("*.whl")))
    with written_on_success():
        record_wheels(layout.lock_path, layout.bundle, wheels)
        target = _commit(layout, path, alongside=stage_held_back())
    for wheel in wheels:
        log.info(f"  {target / wheel.name}  {wheel.size} bytes  sha256:{wheel.sha256}")
    return target


def record_collected(layout: BundleLayout) -> None:
    wheels = records(sorted(layout.dist.glob("*.whl")))
    record_wheels(layout.lock_path, layout.bundle, wheels)
    for wheel in wheels:
        log.info(f"  {layout.dist / wheel.name}  {wheel.size} bytes  sha256:{wheel.sha256}")
