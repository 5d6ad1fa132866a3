"""Publishing into a lane and promoting a bundle from one lane to another.

A lane is a PEP 503 index of one of the kinds of ``release.lane_kinds`` (a static
directory, an index that takes uploads, a devpi index): its backend puts the files in and
fetches them back (``release.lane_backend``). Promotion copies
exactly the files ``wheels.lock`` records for the bundle, taken from the lane it is
promoted from and checked by sha256 on the way, and only when the target lane's policy
holds (``release.policy``); where the target's backend can push from the source (two devpi
lanes of one server) it is the server's own push instead (``release.devpi``: same bytes, no
download or upload). The lane's record in ``lanes.lock``, its document, install lists and
pack index are then written as one update, lanes.lock last (``release.lane_state``).

A rollback returns a lane to a bundle its history shows it served: no policy (going back
is the point) but the same integrity checks: the locked hashes are the ones the lane
served, the lane's index serves exactly those bytes (fetched and hashed as a promotion
does), and the receipt it was served with is the one recorded.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host import filemode, log, receipt_store
from xla_host.errors import PipelineError, UsageError
from xla_host.filemode import file_sha256
from xla_host.net import (
    DEFAULT_NETWORK,
    NetworkPolicy,
)
from xla_host.receipts import RECEIPTS_DIRNAME, StoredReceipt, bundle_receipts, read_receipt
from xla_host.redact import one_line
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.publish.errors import HashMismatch, PublishError
from xla_wheels.publish.upload import Outcome
from xla_wheels.publish.wheels import LocalWheel, locked_records, locked_wheels
from xla_wheels.release import host_document, lane_packs, lane_state, receipt_trust
from xla_wheels.release import lanes as lanes_mod
from xla_wheels.release.lanes import HistoryEntry, Lane, LaneError, LaneState
from xla_wheels.release.policy import PromotionVerdict, judge_promotion
from xla_wheels.wheels_lock import Lock, WheelRecord


class PromotionRefused(PipelineError):
    """The lane's policy does not hold for this bundle; the message names each rule."""


def required_signatures(
    lane: Lane, records: Sequence[WheelRecord], search: Sequence[Path]
) -> list[Path]:
    """For a lane that requires signatures: each record's envelope, verified with the
    lane's public key for exactly that file (raises naming each unsigned or bad one)."""
    if lane.signing_public_key is None:
        return []
    from xla_wheels import attestation as attest  # lazy: the crypto libraries only when required

    key = attest.load_public_key(lane.signing_public_key)
    signed = attest.check_signed(
        [(r.name, r.sha256) for r in records], search, key, f"lane {lane.name}"
    )
    return [s.envelope for s in signed]


def put_into_lane(
    lane: Lane,
    wheels: Sequence[LocalWheel],
    envelopes: Sequence[Path] = (),
    *,
    network: NetworkPolicy,
) -> list[Outcome]:
    """``wheels`` (and their envelopes) into ``lane``, as its kind puts them."""
    return lane.backend.put(wheels, envelopes, network=network)


def fetch_from_lane(
    lane: Lane, records: Sequence[WheelRecord], workdir: Path, *, network: NetworkPolicy
) -> list[LocalWheel]:
    """The locked files as ``lane`` serves them, in ``workdir``, each checked by sha256."""
    missing = lane.backend.fetch(records, workdir, network=network)
    if missing:
        raise PublishError(
            f"lane {lane.name} ({lane.where}) does not hold {', '.join(missing)}",
            fix="publish the bundle there first: `make publish BUNDLE=<bundle>`",
        )
    return _checked(records, workdir)


def _search(*places: Path | None) -> list[Path]:
    """Where envelopes are looked up: the places that are directories on this machine."""
    return [p for p in places if p is not None]


def _checked(records: Sequence[WheelRecord], directory: Path) -> list[LocalWheel]:
    problems = []
    wheels = []
    for record in records:
        path = directory / record.name
        actual = file_sha256(path)
        if actual != record.sha256:
            problems.append(
                f"{record.name}: the lane serves sha256 {actual}, wheels.lock has "
                f"{record.sha256}"
            )
        wheels.append(LocalWheel(path, record, parse_wheel_name(record.name)))
    if problems:
        raise HashMismatch(
            "refusing to promote files that are not the locked ones:\n  " + "\n  ".join(problems),
            fix="investigate the source lane's index before promoting",
        )
    return wheels


def publish_to_lane(
    root: Path,
    lock: Lock,
    bundle: str,
    dist: Path,
    lane: Lane,
    *,
    network: NetworkPolicy,
    dry_run: bool = False,
    expected_head: str | None = None,
) -> list[Outcome]:
    """``make publish``: the bundle's locked wheels from ``dist`` into ``lane``; run under
    :func:`~xla_wheels.release.lanes.lane_lock`, whose head is ``expected_head``."""
    wheels = locked_wheels(lock, bundle, dist)
    envelopes = required_signatures(lane, [w.record for w in wheels], [dist])
    if dry_run:
        return [Outcome(w.record.name, "would copy", w.sha256) for w in wheels]
    with log.section(f"publish: {bundle} to lane {lane.name} ({lane.where})"):
        outcomes = put_into_lane(lane, wheels, envelopes, network=network)
    lane_state.update(
        root,
        lock,
        lane,
        LaneState(bundle, tuple((w.record.name, w.sha256) for w in wheels), None, None),
        network=network,
        expected_head=expected_head,
    )
    return outcomes


def current_receipt(root: Path, lane: str) -> StoredReceipt | None:
    state = lanes_mod.read_state(root).get(lane)
    if state is None or not state.receipt:
        return None
    stored = read_receipt(root / state.receipt)
    if not stored.digest_ok or stored.digest != state.receipt_digest:
        # The regression gate compares with this receipt: an edited one would move the bar.
        raise PromotionRefused(
            f"lane {lane}'s current receipt {state.receipt} is not the one lanes.lock recorded "
            f"(digest {stored.digest}, lanes.lock has {state.receipt_digest})",
            fix=f"restore {state.receipt} from git",
        )
    return stored


def bundle_evidence(
    root: Path, bundle: str, stores: Sequence[str] = (), network: NetworkPolicy = DEFAULT_NETWORK
) -> list[StoredReceipt]:
    """Every receipt of ``bundle``: ``receipts/<bundle>/`` in the checkout and
    ``<store>/<bundle>/`` of each of ``stores`` (build/lanes.toml's ``receipts``), oldest
    first (file names start with the UTC time). One receipt found in several places counts
    once (by its digest; a signed copy is kept over an unsigned one, the checkout's over a
    store's); an edited one is always kept, for the verdict to name."""
    found = bundle_receipts(root, bundle)
    for location in stores:
        found += receipt_store.store_for(location, root=root, network=network).receipts(bundle)
    kept: dict[str, StoredReceipt] = {}
    unsealed: list[StoredReceipt] = []
    for stored in found:
        if not stored.digest_ok:
            unsealed.append(stored)
        elif stored.digest not in kept or (
            kept[stored.digest].envelope is None and stored.envelope is not None
        ):
            kept[stored.digest] = stored
    return sorted([*kept.values(), *unsealed], key=lambda r: r.path.name)


def judge(
    root: Path, lock: Lock, bundle: str, lane: Lane, stores: Sequence[str] = (),
    source: Lane | None = None,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> PromotionVerdict:  # fmt: skip
    """``stores``: the receipt stores to read besides ``receipts/`` (every lane's);
    ``source``: the lane it is promoted from, whose cache packs count (and the lane's own)."""
    records = locked_records(lock, bundle)
    current = current_receipt(root, lane.name)
    profile = lane.policy.profile
    evidence = bundle_evidence(root, bundle, stores, network)
    return judge_promotion(
        bundle,
        {(r.name, r.sha256) for r in records},
        evidence,
        lane.policy,
        current.receipt if current else None,
        lock.entry(bundle).profiles.get(profile) if profile else None,
        None if lane.policy.empty else host_document.published_digests(root, lock, bundle),
        receipt_trust.signature_problems(evidence, lane.policy.receipt_keys),
        [row for where in (source, lane) if where is not None
         for row in lane_packs.read_index(where)[0]] if lane.policy.packs else (),
    )  # fmt: skip


def brought_home(root: Path, stored: StoredReceipt) -> Path:
    """The checkout's copy of a receipt read from a store, byte for byte (a signed one
    stays signed): ``receipts/<bundle>/<file>``, written by rename beside the others, so
    lanes.lock names a file the checkout holds (the next promotion's regression bar)."""
    if stored.origin is None:
        return stored.path
    directory = root / RECEIPTS_DIRNAME / str(stored.receipt.bundle)
    candidate, n = directory / stored.path.name, 1
    while candidate.exists() and filemode.read_shared(candidate, what="receipt") != stored.raw:
        n += 1
        candidate = directory / f"{stored.path.stem}-{n}{stored.path.suffix}"
    if not candidate.exists():
        directory.mkdir(parents=True, exist_ok=True)
        filemode.write_by_rename(candidate, stored.raw)
    return candidate


def refusal(
    bundle: str, lane: Lane, verdict: PromotionVerdict, source: Lane | None = None
) -> PromotionRefused:
    lines = [f"{f.rule}: {f.detail}" for f in verdict.failures]
    # Where the receipt goes: the store of the lane the gate's hosts install from, if any.
    store = next((x.receipts for x in (source, lane) if x is not None and x.receipts), None)
    signed = " --sign-key <key>" if lane.policy.receipt_keys else ""
    home = f'with GATE_ARGS="--receipts {store}{signed}"' if store else "and commit the receipt"
    return PromotionRefused(
        f"lane {lane.name} refuses bundle {bundle}; rule(s) not met:\n  " + "\n  ".join(lines),
        fix=f"run the gate on the lane's device for exactly these wheels (`make gate "
        f"BUNDLE={bundle} PYTHON=<env installed from the lock>"
        + (f" PROFILE={lane.policy.profile}" if lane.policy.profile else "")
        + f"`) {home}"
        + (f"; the lane requires device {lane.policy.device}" if lane.policy.device else "")
        + (
            f"; and a receipt from each slice topology {', '.join(lane.policy.topologies)} "
            "(worker 0's of `xla-host gate` on every worker)"
            if lane.policy.topologies
            else ""
        ),
    )


def promote(
    root: Path, lock: Lock, bundle: str, lane: Lane, source: Lane, *, dry_run: bool = False,
    dist: Path | None = None, network: NetworkPolicy, stores: Sequence[str] = (),
    expected_head: str | None = None,
) -> tuple[PromotionVerdict, list[Outcome]]:  # fmt: skip
    """``dist``: the bundle's dist directory, where its envelopes are looked up after the
    source lane's own directory; ``stores``: the receipt stores read besides receipts/."""
    verdict = judge(root, lock, bundle, lane, stores, source, network)
    if not verdict.passed:
        raise refusal(bundle, lane, verdict, source)
    # The bundle's cache packs go with it, by hash (the lane keeps them: it will serve it).
    retained = lane_packs.retained_bundles(lanes_mod.read_record(root), lane.name)
    retained[bundle] = "serves"  # fmt: skip
    for published in lane_packs.copy_packs(source, lane, bundle, retained, dry_run=dry_run):
        log.info(f"promote: cache pack {published.row.label} into lane {lane.name}")
    records = locked_records(lock, bundle)
    envelopes = required_signatures(lane, records, _search(source.backend.directory, dist))
    by_push = lane.backend.can_push_from(source.backend)
    if dry_run:
        action = "would push" if by_push else "would copy"
        return verdict, [Outcome(r.name, action, r.sha256) for r in records]
    if by_push:
        with log.section(
            f"promote: {lane.kind} push {bundle} from lane {source.name} ({source.where}) to "
            f"lane {lane.name} ({lane.where})"
        ):
            outcomes = lane.backend.push_from(source.backend, records, network=network)
    else:
        with tempfile.TemporaryDirectory(prefix="xla-wheels-promote-") as tmp:
            with log.section(f"promote: fetch {bundle} from lane {source.name} ({source.where})"):
                wheels = fetch_from_lane(source, records, Path(tmp), network=network)
            with log.section(f"promote: {bundle} into lane {lane.name} ({lane.where})"):
                outcomes = put_into_lane(lane, wheels, envelopes, network=network)
    chosen = verdict.chosen
    home = brought_home(root, chosen) if chosen else None
    lane_state.update(
        root,
        lock,
        lane,
        LaneState(
            bundle,
            tuple((r.name, r.sha256) for r in records),
            home.relative_to(root).as_posix() if home else None,
            chosen.digest if chosen else None,
        ),
        network=network,
        action="promote",
        expected_head=expected_head,
    )
    return verdict, outcomes


@dataclass(frozen=True)
class RollbackPlan:
    """What ``make rollback`` does: the lane's record moves from ``current`` to ``to``'s
    last entry's state (its wheels and receipt), after the checks."""

    lane: Lane
    current: str
    to: HistoryEntry
    """The lane's last entry that made ``to`` its current bundle."""
    reason: str
    checked: tuple[Outcome, ...]

    def lines(self) -> list[str]:
        receipt = self.to.receipt or "no receipt"
        return [
            f"rollback lane {self.lane.name}: {self.current} -> {self.to.bundle}",
            one_line(f"  served before: {self.to.action} by {self.to.who} at {self.to.when}"),
            f"  receipt: {one_line(receipt)}",
            f"  reason: {one_line(self.reason)}",
            *(f"  {o.action:<10} {o.filename}  sha256:{o.sha256}" for o in self.checked),
        ]


def rollback(
    root: Path, lock: Lock, lane: Lane, to: str, reason: str, *, dry_run: bool = False,
    dist: Path | None = None, network: NetworkPolicy, expected_head: str | None = None,
) -> RollbackPlan:  # fmt: skip
    """``make rollback``: ``lane`` back to bundle ``to``, which its history shows it served.
    ``dist``: the bundle's dist directory, where its envelopes are looked up after the
    lane's own directory (as for a promotion)."""
    if not reason.strip():
        raise UsageError(
            "a rollback needs a reason (it is kept in lanes.lock's history)",
            fix=f'make rollback LANE={lane.name} TO={to} REASON="<why, e.g. the incident>"',
        )
    record = lanes_mod.read_record(root)
    state = record.states.get(lane.name)
    history = record.lane_history(lane.name)
    served = [e for e in history if e.bundle == to]
    if state is None:
        raise UsageError(f"lane {lane.name} has no current bundle", fix="nothing to roll back")
    if state.bundle == to:
        raise UsageError(
            f"lane {lane.name} serves {to} now", fix="name an earlier bundle (make lanes HISTORY=1)"
        )
    if not served:
        before = sorted({e.bundle for e in history} - {state.bundle})
        raise LaneError(
            f"lane {lane.name} never served bundle {to}: a rollback returns a lane to a bundle "
            "it served before"
            + (f" (it served: {', '.join(before)})" if before else " (it served no other)"),
            fix=(
                f"roll back to one of those: make rollback LANE={lane.name} TO={before[-1]} "
                'REASON="…"; or promote ' + to + " (make promote, under the lane's policy)"
            )
            if before
            else f"promote it instead: make promote BUNDLE={to} LANE={lane.name}",
        )
    entry = served[-1]
    records = locked_records(lock, to)
    if {(r.name, r.sha256) for r in records} != set(entry.wheels):
        raise LaneError(
            f"wheels.lock's files for {to} are not the ones lane {lane.name} served "
            f"({entry.action} at {entry.when}): the lock was changed since",
            fix=f"promote {to} as it is locked now (make promote BUNDLE={to}), or restore "
            "wheels.lock from git",
        )
    if entry.receipt:
        stored = read_receipt(root / entry.receipt)
        if not stored.digest_ok or stored.digest != entry.receipt_digest:
            # Its receipt becomes the bar the next promotion is held to.
            raise LaneError(
                f"{entry.receipt}, the receipt {to} was served with, is not the one lanes.lock "
                f"recorded (digest {stored.digest}, recorded {entry.receipt_digest})",
                fix=f"restore {entry.receipt} from git",
            )
    with tempfile.TemporaryDirectory(prefix="xla-wheels-rollback-") as tmp:
        try:
            wheels = fetch_from_lane(lane, records, Path(tmp), network=network)
        except HashMismatch as error:
            raise LaneError(
                f"cannot roll back lane {lane.name} to {to}: {error.message}",
                fix=f"the lane's index serves other bytes than it served as {to}: investigate "
                "it (make status shows the drift) before anyone installs from it",
            ) from None
        except PublishError as error:
            if type(error) is not PublishError or "does not hold" not in error.message:
                raise  # the index is down or refused: its own message and exit code
            raise LaneError(
                f"cannot roll back to {to}: {error.message}",
                fix=f"promote {to} again (make promote BUNDLE={to} LANE={lane.name}), which "
                "puts its files back under the lane's policy",
            ) from None
        required_signatures(lane, records, _search(lane.backend.directory, dist))
    action = "would keep" if dry_run else "verified"
    checked = tuple(Outcome(w.record.name, action, w.sha256) for w in wheels)
    plan = RollbackPlan(lane, state.bundle, entry, reason.strip(), checked)
    if not dry_run:
        lane_state.update(
            root, lock, lane, entry.state, network=network, action="rollback",
            reason=plan.reason, expected_head=expected_head,
        )  # fmt: skip
    return plan
