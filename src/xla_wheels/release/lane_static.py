"""A static lane: a directory that is a PEP 503 index (``path = "dist/lanes/validation"``).

Wheels are copied in by rename and ``simple/`` is rewritten over every wheel there
(``publish.static_index``); signature envelopes lie beside their wheels. The bundle
document is ``bundles/<bundle>.json`` in the lane, listed in ``bundles/index.html`` with
its ``#sha256=``; the install lists of the bundle it serves are ``requirements.txt`` (and
``pylock.toml`` once ``make requirements`` made one) at its top; cache packs are
``packs/sha256/<hex>.xlapack.tar``, listed in ``packs/index.json``
(``xla_host.lane_packs``): any static web server serves the lane whole, documents,
install lists and packs included.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_host import bundle_document as doc
from xla_host import filemode
from xla_host.filemode import file_sha256
from xla_host.redact import shown
from xla_host.tables import Field, Table
from xla_wheels.options import NetworkPolicy
from xla_wheels.publish.errors import HashMismatch
from xla_wheels.publish.requirements import REQUIREMENTS_NAME
from xla_wheels.publish.static_index import write_static_index
from xla_wheels.publish.upload import Outcome
from xla_wheels.publish.wheels import LocalWheel
from xla_wheels.release.lane_backend import LaneBackend, LaneKind
from xla_wheels.release.pack_store import DirectoryPacks, PackStore
from xla_wheels.wheels_lock import WheelRecord


@dataclass(frozen=True)
class StaticLane(LaneBackend):
    lane: str
    path: Path
    """Absolute."""
    pack_store: PackStore | None = field(default=None, kw_only=True)
    kind = "static"

    @property
    def where(self) -> str:
        return shown(str(self.path))

    @property
    def simple_url(self) -> str:
        return (self.path / "simple").resolve().as_uri() + "/"

    @property
    def directory(self) -> Path:
        return self.path

    def put(
        self, wheels: Sequence[LocalWheel], envelopes: Sequence[Path], *, network: NetworkPolicy
    ) -> list[Outcome]:
        self.path.mkdir(parents=True, exist_ok=True)
        # Every wheel the lane holds, hashed before anything is copied (the index lists them
        # all): a FIFO or device among them is refused while the lane is as it was.
        present = {p.name: file_sha256(p) for p in sorted(self.path.glob("*.whl"))}
        outcomes: list[Outcome] = []
        for wheel in wheels:
            if (there := present.get(wheel.record.name)) is not None:
                if there != wheel.sha256:
                    raise HashMismatch(
                        f"lane {self.lane} already holds {wheel.record.name} with sha256 "
                        f"{there}, not the locked {wheel.sha256} (nothing was changed)",
                        fix="never overwrite a published wheel: bump the build's version or label",
                    )
                outcomes.append(Outcome(wheel.record.name, "skipped", wheel.sha256))
                continue
            # A lane is read by others (a web server running as another user): the umask's mode.
            filemode.copy_by_rename(wheel.path, self.path / wheel.record.name)
            present[wheel.record.name] = wheel.sha256
            outcomes.append(Outcome(wheel.record.name, "copied", wheel.sha256))
        for envelope in envelopes:
            # Next to its wheel, for hosts and for a promotion out of this lane.
            filemode.copy_by_rename(envelope, self.path / envelope.name)
        records = [
            WheelRecord(name, (self.path / name).stat().st_size, sha256)
            for name, sha256 in sorted(present.items())
        ]
        write_static_index(self.path, records)
        return outcomes

    def fetch(
        self, records: Sequence[WheelRecord], workdir: Path, *, network: NetworkPolicy
    ) -> list[str]:
        missing = []
        for record in records:
            source = self.path / record.name
            if not source.is_file():
                missing.append(record.name)
                continue
            shutil.copyfile(source, workdir / record.name)
        return missing

    def served(self, projects: Sequence[str], *, network: NetworkPolicy) -> dict[str, str]:
        return {p.name: file_sha256(p) for p in sorted(self.path.glob("*.whl"))}

    def documents_dir(self, root: Path) -> Path:
        return self.path / doc.DIRNAME

    def install_dir(self, root: Path) -> Path:
        return self.path

    def install_list_url(self, root: Path) -> str:
        return (self.path / REQUIREMENTS_NAME).resolve().as_uri()

    def packs(self) -> PackStore:
        # The lane's own directory unless lanes.toml names another store.
        return self.pack_store or DirectoryPacks(self.path, self.lane)


def _make(name: str, table: Table, fields: Mapping[str, Any], root: Path) -> StaticLane:
    return StaticLane(name, (root / fields["path"]).resolve())


KIND = LaneKind("static", (Field("path", str, required=True),), _make)
