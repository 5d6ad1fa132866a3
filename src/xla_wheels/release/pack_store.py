"""Where a lane keeps its cache packs: a directory or a Cloud Storage bucket, whatever the
lane's backend.

A static lane keeps them in its own directory unless told otherwise; any lane may name a
store in ``build/lanes.toml`` (``packs = "gs://bucket/prefix"`` or ``packs = "<directory>"``),
and then a lane on a package index or devpi keeps packs too. Either store has the layout
of :mod:`xla_host.lane_packs` under its root: ``packs/sha256/<hex>.xlapack.tar``, each
named by the sha256 of its bytes, and ``packs/index.json``. The lane's bundle document
names a store that is not the lane itself (``packs``), so a host needs only the lane's
address.

- :class:`DirectoryPacks`: each pack linked into place from a checked copy (never
  replaced), the index written by rename; the caller holds the lane's lock.
- :class:`GcsPacks`: each pack uploaded create-only (``if_generation_match=0``) through
  :mod:`xla_host.gcs`; the index replaced only over the generation it was read at, so a
  publisher that raced another (from another checkout: the lane's lock is this
  machine's) is refused and runs again, never merged.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import filemode, gcs, lane_packs, log
from xla_host.errors import PipelineError, UsageError
from xla_host.filemode import file_sha256
from xla_host.net import NetworkPolicy, policy_from
from xla_host.redact import shown

_FIX = 'packs = "gs://bucket/prefix" | "<directory>" (docs/cache-packs.md "Any lane")'


class PackStoreError(PipelineError):
    """A pack store refused a step (a pack of other bytes under its hash, an index another
    publisher changed): exit 1."""


class PackStore:
    """The interface :class:`~xla_wheels.release.lane_backend.LaneBackend` keeps packs
    through (its ``pack_*`` methods, which the retention rule of ``release.lane_packs``
    drives)."""

    @property
    def location(self) -> str:
        """The store as lanes.toml names it and the bundle document carries it."""
        raise NotImplementedError

    def index(self) -> tuple[list[lane_packs.PackRow], dict[str, str]]:
        raise NotImplementedError

    def file(self, row: lane_packs.PackRow) -> Path:
        """The pack of ``row`` as a file on this machine (checked against its hash)."""
        raise NotImplementedError

    def store(
        self, pack: Path, row: lane_packs.PackRow, keep: Sequence[lane_packs.PackRow],
        retained: Mapping[str, str], removed: Sequence[lane_packs.PackRow], *, dry_run: bool,
    ) -> str:  # fmt: skip
        """``LaneBackend.store_packs``: the pack, then the index, then the removals."""
        raise NotImplementedError

    def index_file(self, retained: Mapping[str, str]) -> tuple[Path, str] | None:
        """The index as a file of this machine for the lane's update to write (a
        directory store), else None (:meth:`retain` rewrites it in place)."""
        return None

    def retain(self, retained: Mapping[str, str]) -> None:
        """Record ``retained`` in a store whose index is not a local file."""


@dataclass(frozen=True)
class DirectoryPacks(PackStore):
    root: Path
    """Absolute: the lane's directory, or the directory lanes.toml names."""
    lane: str

    @property
    def location(self) -> str:
        return str(self.root)

    def index(self) -> tuple[list[lane_packs.PackRow], dict[str, str]]:
        path = self.root / lane_packs.INDEX
        if not path.exists():
            return [], {}
        return lane_packs.parse_index(path.read_text(), str(path))

    def file(self, row: lane_packs.PackRow) -> Path:
        return self.root / row.path

    def index_file(self, retained: Mapping[str, str]) -> tuple[Path, str] | None:
        rows, _ = self.index()
        index = self.root / lane_packs.INDEX
        return (index, lane_packs.index_json(rows, retained)) if index.exists() else None

    def store(
        self, pack: Path, row: lane_packs.PackRow, keep: Sequence[lane_packs.PackRow],
        retained: Mapping[str, str], removed: Sequence[lane_packs.PackRow], *, dry_run: bool,
    ) -> str:  # fmt: skip
        index = self.root / lane_packs.INDEX
        if dry_run:
            return str(index)
        target = self.file(row)
        target.parent.mkdir(parents=True, exist_ok=True)
        listed = {r.sha256 for r in (*keep, *removed, row)}
        self._remove_leftovers(target.parent, listed)
        if not target.exists():
            self._link_pack(pack, row.sha256, target)
        # The index first: a host never finds a row whose file is gone.
        filemode.write_by_rename(index, lane_packs.index_json(list(keep), dict(retained)))
        for gone in removed:
            self.file(gone).unlink(missing_ok=True)
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
                raise PackStoreError(f"{pack} changed while it was copied into lane "
                                     f"{self.lane}", fix="publish it again")  # fmt: skip
            os.chmod(name, 0o644)
            os.link(name, target)
        except FileExistsError:
            pass
        finally:
            Path(name).unlink(missing_ok=True)


#: A pack's copy on its way in (``_link_pack``'s mkstemp), and a pack stored by its hash.
_TEMPORARY = re.compile(r"\.pack\.[A-Za-z0-9_]{8}")
_PACK_FILE = re.compile(r"([0-9a-f]{64})\.xlapack\.tar")


@dataclass
class GcsPacks(PackStore):
    url: str
    """``gs://bucket/prefix``."""
    lane: str
    network: NetworkPolicy
    _downloads: list[Path] = field(default_factory=list)

    @property
    def location(self) -> str:
        return self.url

    def _bucket(self) -> gcs.Bucket:
        return gcs.bucket_at(self.url, self.network, fix=_FIX)

    def _read(self) -> tuple[list[lane_packs.PackRow], dict[str, str], int | None]:
        try:
            raw, generation = self._bucket().read(
                lane_packs.INDEX, max_bytes=lane_packs.MAX_INDEX_BYTES
            )
        except gcs.ObjectMissing:
            return [], {}, None
        rows, retained = lane_packs.parse_index(
            raw.decode(errors="replace"), f"{self.url}/{lane_packs.INDEX}"
        )
        return rows, retained, generation

    def index(self) -> tuple[list[lane_packs.PackRow], dict[str, str]]:
        rows, retained, _ = self._read()
        return rows, retained

    def file(self, row: lane_packs.PackRow) -> Path:
        # A promotion's copy by hash: downloaded into a temporary file, its sha256 checked
        # against the index's row before anything is published from it.
        handle, name = tempfile.mkstemp(prefix=".xlapack-", suffix=".tar")
        path = Path(name)
        with os.fdopen(handle, "wb") as out:

            def fresh() -> Callable[[bytes], object]:
                out.seek(0)
                out.truncate()
                return out.write

            self._bucket().download(row.path, fresh, lambda: row.size, size=row.size)
        if file_sha256(path) != row.sha256:
            path.unlink(missing_ok=True)
            raise PackStoreError(
                f"{self.url}/{row.path} is not the pack its index names (another sha256)",
                fix="remove the object from the bucket and publish the pack again",
            )
        return path

    def store(
        self, pack: Path, row: lane_packs.PackRow, keep: Sequence[lane_packs.PackRow],
        retained: Mapping[str, str], removed: Sequence[lane_packs.PackRow], *, dry_run: bool,
    ) -> str:  # fmt: skip
        where = f"{self.url}/{lane_packs.INDEX}"
        if dry_run:
            return where
        bucket = self._bucket()
        rows, _, generation = self._read()
        expected = {r.sha256 for r in (*keep, *removed)} - {row.sha256}
        if {r.sha256 for r in rows} - {row.sha256} != expected:
            raise PackStoreError(
                f"{where} changed since it was read (another publisher): nothing was written",
                fix="run the command again: it reads the new index first",
            )
        with pack.open("rb") as data:
            try:
                bucket.create(row.path, data, size=row.size)
            except gcs.ObjectExists:
                raise PackStoreError(
                    f"{self.url}/{row.path} holds other bytes than its name's sha256: the "
                    "store was written by something else, and nothing was published",
                    fix="remove that object from the bucket, then publish the pack again",
                ) from None
        # The index over the generation it was read at, then the removals: a host never
        # finds a row whose object is gone.
        try:
            bucket.replace(
                lane_packs.INDEX,
                lane_packs.index_json(list(keep), dict(retained)).encode(),
                generation=generation,
            )
        except gcs.ObjectChanged as changed:
            raise PackStoreError(changed.message, fix=changed.fix) from None
        for gone in removed:
            bucket.delete(gone.path)
        return where

    def retain(self, retained: Mapping[str, str]) -> None:
        rows, before, generation = self._read()
        if generation is None or before == dict(retained):
            return
        self._bucket().replace(
            lane_packs.INDEX, lane_packs.index_json(rows, retained).encode(), generation=generation
        )


def network_from_environment() -> NetworkPolicy:
    """The network policy of a pack store's calls: the ``XLA_WHEELS_NET_*`` settings
    (a store is opened where lanes.toml is read, before a command's flags are at hand)."""
    return policy_from(argparse.Namespace(), os.environ)


def store_for(value: str, lane: str, root: Path) -> PackStore:
    """The store ``packs = value`` names (a directory relative to the checkout)."""
    if not value.strip():
        raise UsageError("a pack store's location is empty", fix=_FIX)
    if gcs.is_gs(value):
        return GcsPacks(gcs.parse(value, fix=_FIX).url, lane, network_from_environment())
    if "://" in value:
        raise UsageError(f"{shown(value)}: a pack store is a gs:// URL or a directory", fix=_FIX)
    path = Path(value).expanduser()
    return DirectoryPacks(path if path.is_absolute() else (root / path).resolve(), lane)
