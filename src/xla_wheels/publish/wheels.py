"""The wheels a bundle publishes: the ones in ``dist/<bundle>/`` that match wheels.lock.

The lock is the authority: a wheel is published (or written into a requirements file)
only if its sha256 is the one the build stage recorded, so a file that changed after
locking (a rebuild that was not locked, a corrupted copy, tampering) never leaves the
machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from xla_host import log
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import WheelName, parse_wheel_name
from xla_wheels.publish.errors import HashMismatch, PublishError
from xla_wheels.wheels_lock import Lock, WheelRecord


@dataclass(frozen=True)
class LocalWheel:
    path: Path
    record: WheelRecord
    name: WheelName

    @property
    def sha256(self) -> str:
        return self.record.sha256


def locked_versions(records: Iterable[WheelRecord]) -> dict[str, str]:
    """Normalized project -> version, of each locked wheel."""
    names = (parse_wheel_name(record.name) for record in records)
    return {name.normalized: name.version for name in names}


def locked_sboms(records: Iterable[WheelRecord]) -> dict[str, str]:
    """Project -> the SBOM path the lock says its wheel carries (wheels that have one)."""
    return {
        parse_wheel_name(record.name).project: record.sbom
        for record in records
        if record.sbom is not None
    }


def locked_records(lock: Lock, bundle_name: str) -> list[WheelRecord]:
    """The bundle's locked wheels, read from the lock its command parsed once."""
    entry = lock.entry(bundle_name)
    records = list(entry.wheels or ())
    if not records:
        raise PublishError(
            f"wheels.lock records no wheels for bundle {bundle_name}",
            fix=f"build them first: `make wheels BUNDLE={bundle_name}`",
        )
    return records


def locked_wheels(lock: Lock, bundle_name: str, directory: Path) -> list[LocalWheel]:
    """Every locked wheel of the bundle, found in ``directory`` and checked by sha256."""
    records = locked_records(lock, bundle_name)
    wheels: list[LocalWheel] = []
    problems: list[str] = []
    for record in records:
        path = directory / record.name
        if not path.is_file():
            problems.append(f"{record.name}: locked but missing from {directory}")
            continue
        actual = file_sha256(path)
        if actual != record.sha256:
            problems.append(
                f"{record.name}: sha256 {actual} on disk, {record.sha256} in wheels.lock"
            )
            continue
        wheels.append(LocalWheel(path=path, record=record, name=parse_wheel_name(record.name)))
    if problems:
        raise HashMismatch(
            f"the wheels of {bundle_name} do not match wheels.lock; refusing to use them:\n  "
            + "\n  ".join(problems),
            fix=f"rebuild and re-lock them with `make wheels BUNDLE={bundle_name}`, or restore "
            "the locked files into " + str(directory),
        )
    locked = {record.name for record in records}
    for stray in sorted(p.name for p in directory.glob("*.whl") if p.name not in locked):
        log.warning(f"{directory / stray} is not in wheels.lock: not published")
    return wheels
