"""Publishing into a lane and promoting a bundle from one lane to another.

A lane is a PEP 503 index: a remote one (uploads with twine through
``publish.upload.publish_remote``: same hash checks, idempotent) or a static directory
(files copied in by rename, index rewritten over every wheel in it). Promotion copies
exactly the files ``wheels.lock`` records for the bundle, taken from the lane it is
promoted from and checked by sha256 on the way, and only when the target lane's policy
holds (``release.policy``); between two devpi lanes of one server it is devpi's own push
instead (``release.devpi``: same bytes, no download or upload). ``lanes.lock`` is written
last, by rename.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from xla_wheels import filemode, log
from xla_wheels.errors import PipelineError
from xla_wheels.options import NetworkPolicy
from xla_wheels.publish.errors import HashMismatch, PublishError
from xla_wheels.publish.index import (
    credentials_for,
    project_files,
    upload_url_for,
)
from xla_wheels.publish.static_index import write_static_index
from xla_wheels.publish.upload import Outcome, publish_remote
from xla_wheels.publish.wheels import LocalWheel, locked_records, locked_wheels
from xla_wheels.redact import scrub
from xla_wheels.release import devpi
from xla_wheels.release import lanes as lanes_mod
from xla_wheels.release.lanes import Lane, LaneState
from xla_wheels.release.policy import PromotionVerdict, judge_promotion
from xla_wheels.release.receipts import StoredReceipt, bundle_receipts, read_receipt
from xla_wheels.retrying import (
    TIMEOUT_SETTING,
    Transient,
    attempts_text,
    host_of,
    read_url,
    with_retries,
)
from xla_wheels.wheel_filename import parse_wheel_name
from xla_wheels.wheels_lock import WheelRecord, file_sha256, read_lock


class PromotionRefused(PipelineError):
    """The lane's policy does not hold for this bundle; the message names each rule."""


def _upload_url(lane: Lane) -> str:
    assert lane.index_url is not None
    return lane.upload_url or upload_url_for(lane.index_url)


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
    if lane.index_url:
        result = publish_remote(list(wheels), lane.index_url, lane.upload_url, network=network)
        return result.outcomes
    assert lane.path is not None
    lane.path.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    for wheel in wheels:
        target = lane.path / wheel.record.name
        if target.exists():
            there = file_sha256(target)
            if there != wheel.sha256:
                raise HashMismatch(
                    f"lane {lane.name} already holds {wheel.record.name} with sha256 {there}, "
                    f"not the locked {wheel.sha256} (nothing was changed)",
                    fix="never overwrite a published wheel: bump the build's version or label",
                )
            outcomes.append(Outcome(wheel.record.name, "skipped", wheel.sha256))
            continue
        # A lane is read by others (a web server running as another user): the umask's mode.
        filemode.copy_by_rename(wheel.path, target)
        outcomes.append(Outcome(wheel.record.name, "copied", wheel.sha256))
    for envelope in envelopes:
        # Next to its wheel, for hosts and for a promotion out of this lane.
        filemode.copy_by_rename(envelope, lane.path / envelope.name)
    everything = sorted(lane.path.glob("*.whl"))
    records = [WheelRecord(p.name, p.stat().st_size, file_sha256(p)) for p in everything]
    write_static_index(lane.path, records)
    return outcomes


def _download(url: str, lane: Lane, dest: Path, size: int, network: NetworkPolicy) -> None:
    credentials = credentials_for(_upload_url(lane))
    request = credentials.request(url)
    shown = scrub(url, credentials.secrets)

    def download(limit: float) -> None:
        try:
            with dest.open("wb") as handle:
                read_url(request, write=handle.write, limit_s=limit, idle_s=network.timeout_s)
        except OSError as error:
            raise PublishError(
                f"could not download {shown} from lane {lane.name}: "
                f"{scrub(str(error), credentials.secrets)}",
                fix="check that the lane's index is up and the credentials may read it",
            ) from None

    def give_up(fault: Transient, attempts: int) -> PublishError:
        return PublishError(
            f"downloading {shown} from lane {lane.name}: {host_of(url)} "
            f"{scrub(fault.what_happened, credentials.secrets)} ({attempts_text(attempts)})",
            fix="check that the lane's index is up and answering, then run it again",
        )

    with_retries(
        f"downloading {dest.name} from lane {lane.name}",
        host_of(url),
        download,
        give_up=give_up,
        timeout_fix=f"check the lane's index and the network, or give it longer with "
        f"{TIMEOUT_SETTING}",
        limit_s=network.transfer_limit(size),
        long=True,
        network=network,
    )


def fetch_from_lane(
    lane: Lane, records: Sequence[WheelRecord], workdir: Path, *, network: NetworkPolicy
) -> list[LocalWheel]:
    """The locked files as ``lane`` serves them, in ``workdir``, each checked by sha256."""
    missing: list[str] = []
    for record in records:
        dest = workdir / record.name
        if lane.path is not None:
            source = lane.path / record.name
            if not source.is_file():
                missing.append(record.name)
                continue
            shutil.copyfile(source, dest)
        else:
            assert lane.index_url is not None
            project = parse_wheel_name(record.name).normalized
            listed = project_files(
                lane.index_url, project, credentials_for(_upload_url(lane)), network=network
            )
            if record.name not in listed:
                missing.append(record.name)
                continue
            _download(listed[record.name].url, lane, dest, record.size, network)
    if missing:
        raise PublishError(
            f"lane {lane.name} ({lane.where}) does not hold {', '.join(missing)}",
            fix="publish the bundle there first: `make publish BUNDLE=<bundle>`",
        )
    return _checked(records, workdir)


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
    lock_path: Path,
    bundle: str,
    dist: Path,
    lane: Lane,
    *,
    network: NetworkPolicy,
    dry_run: bool = False,
) -> list[Outcome]:
    """``make publish``: the bundle's locked wheels from ``dist`` into ``lane``."""
    wheels = locked_wheels(lock_path, bundle, dist)
    envelopes = required_signatures(lane, [w.record for w in wheels], [dist])
    if dry_run:
        return [Outcome(w.record.name, "would copy", w.sha256) for w in wheels]
    with log.section(f"publish: {bundle} to lane {lane.name} ({lane.where})"):
        outcomes = put_into_lane(lane, wheels, envelopes, network=network)
    lanes_mod.write_state(
        root,
        lane.name,
        LaneState(bundle, tuple((w.record.name, w.sha256) for w in wheels), None, None),
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


def judge(root: Path, lock_path: Path, bundle: str, lane: Lane) -> PromotionVerdict:
    records = locked_records(lock_path, bundle)
    current = current_receipt(root, lane.name)
    profile = lane.policy.profile
    return judge_promotion(
        bundle,
        {(r.name, r.sha256) for r in records},
        bundle_receipts(root, bundle),
        lane.policy,
        current.receipt if current else None,
        read_lock(lock_path).entry(bundle).profiles.get(profile) if profile else None,
    )


def refusal(bundle: str, lane: Lane, verdict: PromotionVerdict) -> PromotionRefused:
    lines = [f"{f.rule}: {f.detail}" for f in verdict.failures]
    return PromotionRefused(
        f"lane {lane.name} refuses bundle {bundle}; rule(s) not met:\n  " + "\n  ".join(lines),
        fix=f"run the gate on the lane's device for exactly these wheels (`make gate "
        f"BUNDLE={bundle} PYTHON=<env installed from the lock>"
        + (f" PROFILE={lane.policy.profile}" if lane.policy.profile else "")
        + "`) and commit the receipt"
        + (f"; the lane requires device {lane.policy.device}" if lane.policy.device else ""),
    )


def promote(
    root: Path, lock_path: Path, bundle: str, lane: Lane, source: Lane, *, dry_run: bool = False,
    dist: Path | None = None, network: NetworkPolicy,
) -> tuple[PromotionVerdict, list[Outcome]]:  # fmt: skip
    """``dist``: the bundle's dist directory, where its envelopes are looked up after the
    source lane's own directory."""
    verdict = judge(root, lock_path, bundle, lane)
    if not verdict.passed:
        raise refusal(bundle, lane, verdict)
    records = locked_records(lock_path, bundle)
    search = [p for p in (source.path, dist) if p is not None]
    envelopes = required_signatures(lane, records, search)
    by_push = devpi.same_server(source, lane)
    if dry_run:
        action = "would push" if by_push else "would copy"
        return verdict, [Outcome(r.name, action, r.sha256) for r in records]
    if by_push:
        with log.section(
            f"promote: devpi push {bundle} from {source.devpi_index} to {lane.devpi_index}"
        ):
            outcomes = devpi.push(source, lane, records, network=network)
    else:
        with tempfile.TemporaryDirectory(prefix="xla-wheels-promote-") as tmp:
            with log.section(f"promote: fetch {bundle} from lane {source.name} ({source.where})"):
                wheels = fetch_from_lane(source, records, Path(tmp), network=network)
            with log.section(f"promote: {bundle} into lane {lane.name} ({lane.where})"):
                outcomes = put_into_lane(lane, wheels, envelopes, network=network)
    chosen = verdict.chosen
    lanes_mod.write_state(
        root,
        lane.name,
        LaneState(
            bundle,
            tuple((r.name, r.sha256) for r in records),
            chosen.path.relative_to(root).as_posix() if chosen else None,
            chosen.digest if chosen else None,
        ),
    )
    return verdict, outcomes
