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

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import bundle_document as doc
from xla_host import filemode, lane_packs, log
from xla_host.filemode import file_sha256
from xla_host.redact import shown
from xla_host.tables import Field, Table
from xla_wheels.options import NetworkPolicy
from xla_wheels.publish.errors import HashMismatch
from xla_wheels.publish.requirements import REQUIREMENTS_NAME
from xla_wheels.publish.static_index import write_static_index
from xla_wheels.publish.upload import Outcome
from xla_wheels.publish.wheels import LocalWheel
from xla_wheels.release.lane_backend import LaneBackend, LaneError, LaneKind
from xla_wheels.wheels_lock import WheelRecord


@dataclass(frozen=True)
class StaticLane(LaneBackend):
    lane: str
    path: Path
    """Absolute."""
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

    def pack_index_file(self, retained: Mapping[str, str]) -> tuple[Path, str] | None:
        rows, _ = self.pack_index()
        index = self.path / lane_packs.INDEX
        return (index, lane_packs.index_json(rows, retained)) if index.exists() else None

    def refuses_packs(self) -> None:
        return None

    def pack_index(self) -> tuple[list[lane_packs.PackRow], dict[str, str]]:
        path = self.path / lane_packs.INDEX
        if not path.exists():
            return [], {}
        return lane_packs.parse_index(path.read_text(), str(path))

    def pack_file(self, row: lane_packs.PackRow) -> Path:
        return self.path / row.path

    def store_packs(
        self,
        pack: Path,
        row: lane_packs.PackRow,
        keep: Sequence[lane_packs.PackRow],
        retained: Mapping[str, str],
        removed: Sequence[lane_packs.PackRow],
        *,
        dry_run: bool,
    ) -> str:
        index = self.path / lane_packs.INDEX
        if dry_run:
            return str(index)
        target = self.pack_file(row)
        target.parent.mkdir(parents=True, exist_ok=True)
        listed = {r.sha256 for r in (*keep, *removed, row)}
        self._remove_leftovers(target.parent, listed)
        if not target.exists():
            self._link_pack(pack, row.sha256, target)
        # The index first: a host never finds a row whose file is gone.
        filemode.write_by_rename(index, lane_packs.index_json(list(keep), dict(retained)))
        for gone in removed:
            self.pack_file(gone).unlink(missing_ok=True)
        return str(index)

    def _remove_leftovers(self, directory: Path, listed: set[str]) -> None:
        """What a killed publish of a pack left in ``directory`` (the caller holds the
        lane's lock, so no live publish is writing there): its copy's temporary file
        (``.pack.*``, :func:`tempfile.mkstemp`'s name) and a pack linked by its hash that
        the index it never wrote does not list. Nothing else is touched: another name,
        a listed pack, anything that is not a regular file."""
        gone = []
        for path in sorted(directory.iterdir()):
            temporary = _TEMPORARY.fullmatch(path.name) is not None
            unlisted = (match := _PACK_FILE.fullmatch(path.name)) is not None and (
                match.group(1) not in listed
            )
            if (temporary or unlisted) and stat.S_ISREG(path.lstat().st_mode):
                path.unlink(missing_ok=True)
                gone.append(path.name)
        if gone:
            log.info(f"lane {self.lane}: removed what a killed publish left in {directory}: "
                     f"{', '.join(gone)}")  # fmt: skip

    def _link_pack(self, pack: Path, sha256: str, target: Path) -> None:
        """``pack`` at ``target`` by a hard link of a checked copy: never replaces a file
        there (the name is the content's hash), never leaves half a pack."""
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=".pack.")
        os.close(handle)
        try:
            shutil.copyfile(pack, name)
            if file_sha256(Path(name)) != sha256:
                raise LaneError(f"{pack} changed while it was copied into lane {self.lane}",
                                fix="publish it again")  # fmt: skip
            os.chmod(name, 0o644)
            os.link(name, target)
        except FileExistsError:
            pass
        finally:
            Path(name).unlink(missing_ok=True)


#: A pack's copy on its way in (``_link_pack``'s mkstemp), and a pack stored by its hash.
_TEMPORARY = re.compile(r"\.pack\.[A-Za-z0-9_]{8}")
_PACK_FILE = re.compile(r"([0-9a-f]{64})\.xlapack\.tar")


def _make(name: str, table: Table, fields: Mapping[str, Any], root: Path) -> StaticLane:
    return StaticLane(name, (root / fields["path"]).resolve())


KIND = LaneKind("static", (Field("path", str, required=True),), _make)
