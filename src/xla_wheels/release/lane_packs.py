"""Cache packs in a lane, beside its bundles: publishing one, and which the lane keeps.

Publishing goes through one seam, :func:`publish_pack` (a lane and a verified pack in,
the lane's new index out), and the storage through the lane's backend
(``LaneBackend.store_packs``): a static-directory lane stores the pack by its sha256 under
``<lane>/packs/sha256/`` and lists it in ``<lane>/packs/index.json`` (the format is
``xla_host.lane_packs``', which a host reads); a kind that keeps no packs refuses, naming
itself (``LaneBackend.refuses_packs``). Nothing here asks which kind a lane is.

**Retention** (:func:`retained_bundles`): a lane keeps the packs of the bundle it serves
and of every bundle it can roll back to (the bundles of its history in ``lanes.lock``),
and of each (bundle, workload, topology) only the newest pack. The index records which
bundles it keeps and why (``retained``), and a publish says what it removed and why. A pack
older than the lane's of the same (bundle, workload, topology) is refused (:class:`OlderPack`,
the lane unchanged), never stored and removed in one go; a promotion keeps the target's
newer pack and says so.
Everything is written by rename; a pack's file is never replaced (its name is its hash).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import cache_pack, lane_packs, log
from xla_host.errors import UsageError
from xla_host.filemode import file_sha256
from xla_wheels.release.lanes import Lane, LanesRecord


class OlderPack(UsageError):
    """A pack older than the lane's own of the same bundle, workload and topology, which
    the retention rule would remove as it is published: refused (exit 2)."""


@dataclass
class Published:
    row: lane_packs.PackRow
    index: str
    """Where the lane's pack index is (for the user)."""
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
    """The lane's pack index (none yet, or a kind that keeps none: empty)."""
    return lane.backend.pack_index()


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
    environment's pack). The caller holds the lane's lock. A lane whose kind keeps no packs
    refuses (:meth:`LaneBackend.refuses_packs`)."""
    if (refusal := lane.backend.refuses_packs()) is not None:
        raise refusal
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
    rows, _ = read_index(lane)
    added = all(r.sha256 != row.sha256 for r in rows)
    keep, removed = _retention([r for r in rows if r.sha256 != row.sha256] + [row], retained)
    if any(r is row for r, _ in removed):
        # Stored and then removed by the same publish, "published" would be a lie and the
        # hosts would still fetch the other one: refused, the lane as it was.
        newer = next(r for r in keep if (r.bundle, r.workload, r.topology) ==
                     (row.bundle, row.workload, row.topology))  # fmt: skip
        raise OlderPack(
            f"{pack.name} ({row.label}, made {row.created}) is older than the pack lane "
            f"{lane.name} has for it, {newer.path} (made {newer.created}): the lane keeps "
            "only the newest, so nothing was published and the lane is unchanged",
            fix="publish a pack made after it (run the gate again with --pack), or keep the "
            "lane's newer pack",
        )
    kept = {bundle or "none": why for bundle, why in retained.items()}
    index = lane.backend.store_packs(
        pack, row, keep, kept, [r for r, _ in removed], dry_run=dry_run
    )
    return Published(row, index, added, dict(retained), removed)


def _retention(
    rows: list[lane_packs.PackRow], retained: Mapping[str | None, str]
) -> tuple[list[lane_packs.PackRow], list[tuple[lane_packs.PackRow, str]]]:
    """``rows`` split into the packs the lane keeps and those it removes (with why): only
    ``retained`` bundles', and of each (bundle, workload, topology) only the newest."""
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
    return keep, removed


def copy_packs(
    source: Lane,
    lane: Lane,
    bundle: str,
    retained: Mapping[str | None, str],
    *,
    dry_run: bool = False,
) -> list[Published]:
    """A promotion: every pack ``source`` keeps for ``bundle``, into ``lane`` by hash. A
    lane whose kind keeps no packs takes the wheels without them (said in the log: the
    packs stay in ``source``), as a promotion is about the wheels."""
    rows = [row for row in read_index(source)[0] if row.bundle == bundle]
    if rows and (refusal := lane.backend.refuses_packs()) is not None:
        log.info(f"promote: {len(rows)} cache pack(s) of {bundle} stay in lane {source.name}: "
                 f"{refusal.message}")  # fmt: skip
        return []
    published = []
    for row in rows:
        try:
            published.append(
                publish_row(lane, source.backend.pack_file(row), row, retained, dry_run=dry_run)
            )
        except OlderPack as older:
            log.info(f"promote: {older.message}")
    return published
