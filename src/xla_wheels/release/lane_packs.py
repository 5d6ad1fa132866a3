"""Cache packs in a lane, beside its bundles: publishing one, and which the lane keeps.

Publishing goes through one seam, :func:`publish_pack` (a lane and a verified pack in,
the lane's new index out): a static-directory lane stores the pack by its sha256 under
``<lane>/packs/sha256/`` and lists it in ``<lane>/packs/index.json`` (the format is
``xla_host.lane_packs``', which a host reads); another backend refuses, naming itself.

**Retention** (:func:`retained_bundles`): a lane keeps the packs of the bundle it serves
and of every bundle it can roll back to (the bundles of its history in ``lanes.lock``),
and of each (bundle, workload, topology) only the newest pack. The index records which
bundles it keeps and why (``retained``), and a publish says what it removed and why.
Everything is written by rename; a pack's file is never replaced (its name is its hash).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import cache_pack, lane_packs
from xla_host.errors import UsageError
from xla_host.filemode import file_sha256
from xla_wheels.release.lanes import Lane, LaneError, LanesRecord


@dataclass
class Published:
    row: lane_packs.PackRow
    index: Path
    added: bool
    """False: the lane had this pack already (same bytes)."""
    retained: dict[str | None, str]
    removed: list[tuple[lane_packs.PackRow, str]] = field(default_factory=list)
    """Packs the retention rule removed, with why."""


def retained_bundles(record: LanesRecord, lane: str) -> dict[str | None, str]:
    """The bundles whose packs ``lane`` keeps, with why: ``serves`` (its current bundle)
    or ``rollback`` (one it served before, which ``make rollback`` can return it to)."""
    kept: dict[str | None, str] = {e.bundle: "rollback" for e in record.lane_history(lane)}
    state = record.states.get(lane)
    if state is not None:
        kept[state.bundle] = "serves"
    return kept


def read_index(lane: Lane) -> tuple[list[lane_packs.PackRow], dict[str, str]]:
    """The lane's pack index (none yet: empty)."""
    if lane.backend.directory is None:
        return [], {}
    path = lane.backend.directory / lane_packs.INDEX
    if not path.exists():
        return [], {}
    return lane_packs.parse_index(path.read_text(), str(path))


def _row(manifest: cache_pack.Manifest, sha256: str, size: int) -> lane_packs.PackRow:
    workload = manifest.workload
    return lane_packs.PackRow(
        sha256=sha256,
        size=size,
        path=lane_packs.pack_path(sha256),
        bundle=manifest.bundle,
        workload=str(workload.get("name")),
        workload_sha256=workload.get("sha256"),
        topology=manifest.topology,
        device=manifest.device,
        torch_xla=manifest.torch_xla_version,
        libtpu=manifest.libtpu_version,
        receipt_digest=manifest.receipt_digest,
        created=manifest.created,
        published=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _write_by_rename(path: Path, text: str) -> None:
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


def publish_pack(
    lane: Lane,
    pack: Path,
    manifest: cache_pack.Manifest,
    retained: Mapping[str | None, str],
    *,
    dry_run: bool = False,
) -> Published:
    """The seam every lane backend implements: put ``pack`` (its signature already
    verified: ``manifest``) into ``lane`` by hash, list it in the lane's index and apply
    the retention rule (``retained``: bundle -> why; None: a gate run that named no bundle, a stock
    environment's pack). The caller holds the lane's lock."""
    if lane.backend.directory is None:
        raise LaneError(
            f"lane {lane.name} is a {lane.kind} index ({lane.where}): only a lane that is a "
            "static directory (path = …) keeps cache packs yet",
            fix="publish packs into a static-directory lane (build/lanes.toml: path = …)",
        )
    if manifest.bundle not in retained:
        raise UsageError(
            f"lane {lane.name} keeps no packs for bundle {manifest.bundle or 'none'}: it "
            f"neither serves it nor can roll back to it (it keeps: "
            f"{', '.join(sorted(str(b) for b in retained)) or 'none'})",
            fix="publish or promote the bundle into the lane first (make publish / make "
            "promote), then its pack",
        )
    sha256 = file_sha256(pack)
    return publish_row(lane, pack, _row(manifest, sha256, pack.stat().st_size), retained,
                       dry_run=dry_run)  # fmt: skip


def publish_row(
    lane: Lane,
    pack: Path,
    row: lane_packs.PackRow,
    retained: Mapping[str | None, str],
    *,
    dry_run: bool = False,
) -> Published:
    """:func:`publish_pack` of a pack whose index row is known (a promotion copies the
    source lane's row and file: ``pack`` must hash to ``row.sha256``)."""
    if lane.backend.directory is None:
        raise LaneError(
            f"lane {lane.name} is a {lane.kind} index ({lane.where}): only a lane that is a "
            "static directory (path = …) keeps cache packs yet",
            fix="publish packs into a static-directory lane (build/lanes.toml: path = …)",
        )
    sha256 = row.sha256
    rows, _ = read_index(lane)
    added = all(r.sha256 != sha256 for r in rows)
    rows = [r for r in rows if r.sha256 != sha256] + [row]
    keep: list[lane_packs.PackRow] = []
    removed: list[tuple[lane_packs.PackRow, str]] = []
    newest: dict[tuple[str | None, str, str], lane_packs.PackRow] = {}
    for r in rows:
        key = (r.bundle, r.workload, r.topology)
        if key not in newest or (r.created, r.published) > (
            newest[key].created,
            newest[key].published,
        ):
            newest[key] = r
    for r in rows:
        if r.bundle not in retained:
            removed.append((r, f"bundle {r.bundle} is neither served nor a rollback target"))
        elif newest[(r.bundle, r.workload, r.topology)] is not r:
            removed.append((r, "a newer pack of the same bundle, workload and topology"))
        else:
            keep.append(r)
    index = lane.backend.directory / lane_packs.INDEX
    done = Published(row, index, added, dict(retained), removed)
    if dry_run:
        return done
    target = lane.backend.directory / row.path
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        handle_no, name = tempfile.mkstemp(dir=target.parent, prefix=".pack.")
        os.close(handle_no)
        try:
            shutil.copyfile(pack, name)
            if file_sha256(Path(name)) != sha256:
                raise LaneError(f"{pack} changed while it was copied into lane {lane.name}",
                                fix="publish it again")  # fmt: skip
            os.chmod(name, 0o644)
            os.link(name, target)  # never replaces: the name is the content's hash
        except FileExistsError:
            pass
        finally:
            Path(name).unlink(missing_ok=True)
    # The index first: a host never finds a row whose file is gone.
    kept = {bundle or "none": why for bundle, why in retained.items()}
    _write_by_rename(index, lane_packs.index_json(keep, kept))
    for r, _why in removed:
        (lane.backend.directory / r.path).unlink(missing_ok=True)
    return done


def served_packs(lane: Lane) -> list[lane_packs.PackRow]:
    """The packs a lane's index lists (for ``make status``)."""
    return read_index(lane)[0]


def pack_file(lane: Lane, row: lane_packs.PackRow) -> Path:
    """The file of an index row in a static-directory lane."""
    if lane.backend.directory is None:
        raise LaneError(f"lane {lane.name} keeps no packs (not a static directory)",
                        fix="keep packs in a static-directory lane")  # fmt: skip
    return lane.backend.directory / row.path


def copy_packs(
    source: Lane,
    lane: Lane,
    bundle: str,
    retained: Mapping[str | None, str],
    *,
    dry_run: bool = False,
) -> list[Published]:
    """A promotion: every pack ``source`` keeps for ``bundle``, into ``lane`` by hash."""
    if source.backend.directory is None or lane.backend.directory is None:
        return []
    done = []
    for row in read_index(source)[0]:
        if row.bundle == bundle:
            done.append(publish_row(lane, pack_file(source, row), row, retained, dry_run=dry_run))
    return done
