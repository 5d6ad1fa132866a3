"""``make status``: every bundle and every lane at a glance, read only.

Per bundle: built or not (wheels in ``wheels.lock``), which lanes serve it now, its
receipts (device, chip, topology, workload, profile, verdict, age; a field a receipt does
not record is shown as "—") and, for each lane a bundle is
promoted into, why a promotion would be refused today (the same pure verdict
``make promote`` applies, ``release.policy``).

Per lane: whether the index serves byte for byte what ``lanes.lock`` says it received.
The files a lane should hold are those of every entry of its history (a lane keeps the
bundles it served, so a rollback can return to them): a file it serves that no entry
recorded is *extra*, one recorded but not served *missing*, one served with other bytes
*changed*. The lane's install lists (``requirements.txt``, ``pylock.toml``), its document
of the bundle it serves and its pack index's "serves" must all be of that bundle: one that
is not (or is missing) is a FAILURE naming the file and the fix (``release.lane_state``).
Only the projects of those files are read from a remote index (PEP 503 has no
listing of everything that is cheap to read); a static lane's directory is read whole.
An index that does not answer is named and the others are still reported: each read ends
within the network settings (``--net-timeout``, ``--net-retries``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xla_host import receipt_verdict
from xla_host.bundle_document import DOCUMENT_PROJECT_PREFIX
from xla_host.errors import PipelineError
from xla_host.net import DEFAULT_NETWORK, NetworkPolicy
from xla_host.receipts import StoredReceipt
from xla_host.redact import shown
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.release import host_document, lane_packs, lane_state, promote
from xla_wheels.release.lanes import Lane, LanesConfig, LanesRecord
from xla_wheels.wheels_lock import read_lock


@dataclass(frozen=True)
class ReceiptStatus:
    path: str
    device: str
    chip: str | None
    workload: str | None
    profile: str | None
    verdict: str
    """``passed``, ``failed`` (a check failed), ``not for the locked wheels`` (every check
    passed on other wheels) or ``edited`` (its seal does not hold): receipt_verdict's."""
    created: str
    age_days: float | None
    topology: str | None = None
    """The slice the receipt was measured on (e.g. ``v6e-8``, ``2x4``); None when the
    receipt records none (one host, no slice; or written before topologies were)."""
    reasons: list[str] = field(default_factory=list)
    """Why it did not pass (receipt_verdict), empty when it passed."""


@dataclass(frozen=True)
class BundleStatus:
    name: str
    built: bool
    served_by: list[str]
    receipts: list[ReceiptStatus]
    refused: dict[str, list[str]] = field(default_factory=dict)
    """Per lane a promotion goes into (it has ``promote-from``) and does not serve this
    bundle now: the rules that refuse it today; an empty list: it would be admitted."""
    unread: list[str] = field(default_factory=list)
    """Why the receipts of a lane's store could not be read (down, refused)."""


@dataclass(frozen=True)
class LaneStatus:
    name: str
    where: str
    bundle: str | None
    reachable: bool
    problem: str | None
    """Why the index could not be read (down, refused, timed out)."""
    extra: list[str]
    missing: list[str]
    changed: list[str]
    packs: list[str] = field(default_factory=list)
    """The cache packs the lane serves (``bundle / workload / topology, size, sha256``)."""
    retained: dict[str | None, str] = field(default_factory=dict)
    """The bundles whose packs the lane keeps, with why (``serves``, ``rollback``)."""
    stale: list[str] = field(default_factory=list)
    """The lane's install lists, document or pack index that belong to another bundle
    than the one it serves, or are missing, each with its fix (``release.lane_state``)."""

    @property
    def in_sync(self) -> bool:
        return self.reachable and not (self.extra or self.missing or self.changed or self.stale)


@dataclass(frozen=True)
class Status:
    bundles: list[BundleStatus]
    lanes: list[LaneStatus]

    @property
    def ok(self) -> bool:
        """Every lane in sync, and every receipt store read."""
        unread = any(bundle.unread for bundle in self.bundles)
        return all(lane.in_sync for lane in self.lanes) and not unread

    def as_json(self) -> dict[str, Any]:
        return {
            "bundles": [asdict(b) for b in self.bundles],
            "lanes": [{**asdict(lane), "in-sync": lane.in_sync} for lane in self.lanes],
        }


def _age_days(created: str, now: datetime.datetime) -> float | None:
    try:
        then = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return round((now - then).total_seconds() / 86400, 2)


def receipt_status(root: Path, stored: StoredReceipt, now: datetime.datetime) -> ReceiptStatus:
    receipt = stored.receipt
    verdict = receipt_verdict.judge_stored(stored)
    profile = (receipt.profile or {}).get("name")
    return ReceiptStatus(
        path=stored.origin or stored.path.relative_to(root).as_posix(),
        device=receipt.device,
        chip=_shown(getattr(receipt, "chip", None)),
        workload=_shown(getattr(receipt, "workload", None)),
        profile=str(profile) if profile is not None else None,
        verdict=verdict.word,
        created=receipt.created,
        age_days=_age_days(receipt.created, now),
        # Read defensively: receipts of every version are shown, with or without it.
        topology=_shown(getattr(receipt, "topology", None)),
        reasons=[reason.said() for reason in verdict.reasons],
    )


def _shown(value: Any) -> str | None:
    """A receipt field as one word: a table by its name (``{"name": "v6e-8", ...}``), a
    list joined, else its text; None when absent or empty."""
    if isinstance(value, Mapping):
        value = (
            value.get("name")
            or value.get("topology")
            or ",".join(f"{k}={v}" for k, v in sorted(value.items()))
        )
    elif isinstance(value, list | tuple):
        value = "x".join(str(v) for v in value)
    return str(value) if value not in (None, "") else None


def _refusals(
    root: Path, lock_path: Path, bundle: str, lane: Lane, stores: Sequence[str],
    source: Lane | None,
    network: NetworkPolicy,
) -> list[str]:  # fmt: skip
    try:
        verdict = promote.judge(root, read_lock(lock_path), bundle, lane, stores, source, network)
    except PipelineError as error:  # e.g. the lane's current receipt was edited
        return [f"cannot judge: {error.message}"]
    return [f"{f.rule}: {f.detail}" for f in verdict.failures]


def bundle_statuses(
    root: Path, lock_path: Path, config: LanesConfig, record: LanesRecord, now: datetime.datetime,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> list[BundleStatus]:  # fmt: skip
    locked = read_lock(lock_path).bundles
    names = sorted({p.stem for p in (root / "build" / "bundles").glob("*.toml")} | set(locked))
    statuses = []
    down: dict[str, str] = {}
    """Stores that did not answer: named for every bundle, asked once."""
    for name in names:
        entry = locked.get(name)
        built = bool(entry and entry.wheels)
        served_by = sorted(lane for lane, s in record.states.items() if s.bundle == name)
        stores = []
        for location in config.receipt_stores:
            if location in down:
                continue
            try:  # read once here: a store that does not answer is named, not fatal
                promote.bundle_evidence(root, name, [location], network)
                stores.append(location)
            except PipelineError as error:
                down[location] = f"receipt store {shown(location)}: {error.message}"
        unread = [down[location] for location in config.receipt_stores if location in down]
        refused = {
            lane.name: _refusals(
                root,
                lock_path,
                name,
                lane,
                stores,
                config.lanes.get(lane.promote_from or ""),
                network,
            )
            for lane in sorted(config.lanes.values(), key=lambda lane: lane.name)
            if built and lane.promote_from and lane.name not in served_by
        }
        evidence = promote.bundle_evidence(root, name, stores, network)
        receipts = [receipt_status(root, r, now) for r in evidence]
        statuses.append(BundleStatus(name, built, served_by, receipts, refused, unread))
    return statuses


def recorded_files(record: LanesRecord, lane: str) -> dict[str, str]:
    """Every file ``lane``'s history (and its current state) says it received: name -> sha256."""
    files: dict[str, str] = {}
    for entry in record.lane_history(lane):
        files.update(entry.wheels)
    if state := record.states.get(lane):
        files.update(state.wheels)
    return files


def _served(lane: Lane, projects: Sequence[str], network: NetworkPolicy) -> dict[str, str]:
    """name -> sha256 of what the lane serves (of ``projects``, for a remote index). The host
    package and the document wheels are published beside every bundle and recorded by no
    entry of lanes.lock (release.host_document): not drift."""
    ours = (host_document.HOST_PROJECT, DOCUMENT_PROJECT_PREFIX)
    return {
        name: sha256
        for name, sha256 in lane.backend.served(projects, network=network).items()
        if not parse_wheel_name(name).normalized.startswith(ours)
    }


def lane_status(
    lane: Lane, record: LanesRecord, network: NetworkPolicy, root: Path | None = None
) -> LaneStatus:
    """``root``: the checkout, whose lane files (install lists, documents) are compared
    with the bundle lanes.lock says the lane serves; None compares the served wheels only."""
    expected = recorded_files(record, lane.name)
    state = record.states.get(lane.name)
    bundle = state.bundle if state else None
    projects = sorted({parse_wheel_name(n).normalized for n in expected})
    try:
        served = _served(lane, projects, network)
    except PipelineError as error:
        return LaneStatus(lane.name, lane.where, bundle, False, error.message, [], [], [])
    changed = [
        f"{name}: lanes.lock has sha256 {sha}, the index serves {served[name]}"
        for name, sha in sorted(expected.items())
        if name in served and served[name] != sha
    ]
    rows, _ = lane_packs.read_index(lane)
    return LaneStatus(
        lane.name,
        lane.where,
        bundle,
        True,
        None,
        extra=sorted(set(served) - set(expected)),
        missing=sorted(set(expected) - set(served)),
        changed=changed,
        packs=[f"{r.label}, {r.size:,} bytes, sha256:{r.sha256[:16]}…" for r in rows],
        # Which bundles' packs it keeps: none, when its backend keeps no packs at all.
        retained={}
        if lane.backend.refuses_packs()
        else lane_packs.retained_bundles(record, lane.name),  # fmt: skip
        stale=lane_state.check(root, lane, record) if root is not None else [],
    )


def collect(
    root: Path, lock_path: Path, config: LanesConfig, record: LanesRecord, network: NetworkPolicy
) -> Status:
    now = datetime.datetime.now(datetime.UTC)
    return Status(
        bundle_statuses(root, lock_path, config, record, now, network),
        [lane_status(config.lanes[name], record, network, root) for name in sorted(config.lanes)],
    )


#: What ``make status`` shows for a field a receipt does not record.
NONE = "—"
#: A receipt that records no topology: one host, not a slice (the gate records a slice's).
ONE_HOST = "one host"


def render(status: Status) -> str:
    lines = ["bundles:"]
    for bundle in status.bundles:
        served = f"served by {', '.join(bundle.served_by)}" if bundle.served_by else "in no lane"
        lines.append(f"  {bundle.name}: {'built' if bundle.built else 'not built'}, {served}")
        for r in bundle.receipts:
            age = f"{r.age_days:g} days old" if r.age_days is not None else "age unknown"
            lines.append(
                f"    receipt {r.path}: {r.verdict} on {r.device}"
                + (f" ({r.chip})" if r.chip else "")
                + f", topology {r.topology or ONE_HOST}, workload {r.workload or NONE}"
                + (f", profile {r.profile}" if r.profile else "")
                + f", {age}"
            )
            lines += [f"      why: {reason}" for reason in r.reasons]
        if not bundle.receipts:
            lines.append("    no receipt")
        lines += [f"    UNREAD: {problem}" for problem in bundle.unread]
        for target, rules in bundle.refused.items():
            if not rules:
                lines.append(f"    promotion into {target}: would be admitted")
            for rule in rules:
                lines.append(f"    promotion into {target} refused: {rule}")
    lines.append("lanes:")
    for lane in status.lanes:
        current = lane.bundle or "(none)"
        if not lane.reachable:
            lines.append(
                f"  {lane.name} ({lane.where}): serves {current}; UNREACHABLE: {lane.problem}"
            )
            continue
        verdict = (
            "in sync with lanes.lock" if lane.in_sync else "FAILURE" if lane.stale else "DRIFT"
        )
        lines.append(f"  {lane.name} ({lane.where}): serves {current}; {verdict}")
        lines += [f"    extra (no entry of lanes.lock put it there): {n}" for n in lane.extra]
        lines += [f"    missing (lanes.lock says the lane received it): {n}" for n in lane.missing]
        lines += [f"    changed: {n}" for n in lane.changed]
        lines += [f"    FAILURE: {n}" for n in lane.stale]
        lines += [f"    cache pack: {p}" for p in lane.packs]
        if lane.retained:
            kept = ", ".join(f"{b} ({why})" for b, why in sorted(
                (str(b), why) for b, why in lane.retained.items()))  # fmt: skip
            lines.append(f"    keeps the cache packs of: {kept}")
    return "\n".join(lines) + "\n"


def summary(status: Status) -> Mapping[str, list[str]]:
    """The lanes that drift and those that could not be read (for the exit status)."""
    return {
        "drift": [lane.name for lane in status.lanes if lane.reachable and not lane.in_sync],
        "files of another bundle": [lane.name for lane in status.lanes if lane.stale],
        "unreachable": [lane.name for lane in status.lanes if not lane.reachable],
    }
