"""Promotion between two lanes that are indexes of one devpi server: devpi's own push.

devpi keeps every index (``team/validation``, ``team/preferred``) on one server, and
its push (``POST <server>/<user>/<source index>`` with a JSON body ``{"name", "version",
"targetindex"}``, what ``devpi push`` sends) links the release's stored files into the
target index: the same bytes, nothing downloaded or uploaded by us. Everything else a devpi
lane does as any index lane (:class:`DevpiLane` is an ``IndexLane``): devpi takes uploads
at the index URL (twine) and serves a PEP 503 page under ``+simple/`` with ``#sha256=``
links, which ``publish.upload`` reads; the bundle document goes in as a document wheel.

A push moves a whole release (every file of ``name==version``), so before pushing, every
locked file must be on the source index with its locked sha256 and the source's release
must hold no other file; after pushing, the target's simple page must list every locked
file with its locked sha256. Credentials are the publish ones (TWINE_USERNAME /
TWINE_PASSWORD or keyring): the account needs read access to the source index and upload
rights on the target.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.net import (
    TIMEOUT_SETTING,
    Answer,
    Failures,
    NetworkPolicy,
    attempts_text,
    host_of,
    http_request,
)
from xla_host.redact import scrub
from xla_host.tables import Field, Table
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.publish.errors import (
    CredentialsRejected,
    HashMismatch,
    IndexUnreachable,
    PublishError,
)
from xla_wheels.publish.index import (
    Credentials,
    IndexFile,
    credentials_for,
    project_files,
    remote_sha256,
)
from xla_wheels.publish.upload import Outcome
from xla_wheels.release.lane_backend import LaneBackend, LaneKind
from xla_wheels.release.lane_index import IndexLane
from xla_wheels.wheels_lock import WheelRecord

_UNREACHABLE_FIX = (
    "check that devpi-server is running and the lane's `server` in build/lanes.toml is right"
)
#: After a push that may have reached devpi: what to look at before promoting again.
_MAY_HAVE_PUSHED_FIX = (
    "the push may have gone through: `make lanes` shows what the target lane holds; "
    "promoting again pushes only a release the target does not hold yet (the same bytes "
    "there are skipped)"
)


@dataclass(frozen=True)
class DevpiLane(IndexLane):
    """An index (``user/index``) of a devpi server: its simple page under ``+simple/``,
    uploads to the index URL, promotion between indexes of one server by devpi's push."""

    server: str = ""
    """The server's URL, without the index, ending in ``/``."""
    devpi_index: str = ""
    """``user/index``."""
    kind = "devpi"

    def can_push_from(self, source: LaneBackend) -> bool:
        """devpi can push only between indexes of one server."""
        return isinstance(source, DevpiLane) and source.server == self.server

    def push_from(
        self, source: LaneBackend, records: Sequence[WheelRecord], *, network: NetworkPolicy
    ) -> list[Outcome]:
        assert isinstance(source, DevpiLane) and self.can_push_from(source)
        return push(source, self, records, network=network)


def _make(name: str, table: Table, fields: Mapping[str, Any], root: Path) -> DevpiLane:
    server = fields["server"]
    if not server.startswith(("http://", "https://")):
        raise table.fail("server", "must be the devpi server's http(s) URL", "")
    index = fields["index"].strip("/")
    if len(index.split("/")) != 2:
        raise table.fail("index", 'must be "<user>/<index>", e.g. "team/validation"', "")
    # devpi's own layout: the simple page under +simple/, uploads to the index URL.
    server = f"{server.rstrip('/')}/"
    return DevpiLane(name, f"{server}{index}/+simple/", f"{server}{index}/", server, index)


KIND = LaneKind(
    "devpi",
    (Field("server", str, required=True), Field("index", str, required=True)),
    _make,
    # A push moves the index's files and nothing beside them: no envelopes travel.
    signatures=False,
)


def _releases(records: Sequence[WheelRecord]) -> dict[tuple[str, str], list[WheelRecord]]:
    """The locked files grouped by the release (project, version) a push moves at once."""
    groups: dict[tuple[str, str], list[WheelRecord]] = {}
    for record in records:
        name = parse_wheel_name(record.name)
        groups.setdefault((name.normalized, name.version), []).append(record)
    return groups


def _check_source(
    source: DevpiLane,
    release: tuple[str, str],
    records: Sequence[WheelRecord],
    listed: dict[str, IndexFile],
    credentials: Credentials,
    network: NetworkPolicy,
) -> tuple[list[str], list[str]]:
    """The locked files the source's release lacks, and those it serves with other bytes."""
    missing = [r.name for r in records if r.name not in listed]
    problems = []
    for record in records:
        if record.name in listed:
            served = remote_sha256(
                listed[record.name], credentials, size=record.size, network=network
            )
            if served != record.sha256:
                problems.append(
                    f"{record.name}: lane {source.lane} serves sha256 {served}, wheels.lock has "
                    f"{record.sha256}"
                )
    locked = {r.name for r in records}
    project, version = release
    extra = sorted(
        name
        for name in listed
        if name not in locked
        and name.endswith(".whl")
        and parse_wheel_name(name).version == version
    )
    if extra:
        raise PublishError(
            f"lane {source.lane} ({source.devpi_index}) holds {project} {version} files that "
            f"wheels.lock does not record for this bundle: {', '.join(extra)}; devpi's push "
            "moves every file of a release, so they would be promoted too",
            fix="rebuild the bundle under its own version or local label (a non-volatile devpi "
            "index never removes a file), or promote from a lane whose release is exactly the "
            "locked files",
        )
    return missing, problems


def post_push(
    source: DevpiLane,
    target: DevpiLane,
    release: tuple[str, str],
    size: int,
    credentials: Credentials,
    network: NetworkPolicy,
) -> None:
    """devpi's push of ``release`` (project, version) from ``source`` into ``target``.

    Bounded as every network read (``NET_TIMEOUT`` for each wait; the whole push by the
    release's ``size`` in bytes, what devpi links or copies), and sent again only when
    the connection was refused: a push devpi saw may have happened."""
    project, version = release
    url = source.credentials_url.rstrip("/")
    body = json.dumps({"name": project, "version": version, "targetindex": target.devpi_index})
    request = credentials.request(
        url,
        data=body.encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    log.info(f"  devpi push {project}=={version}: {source.devpi_index} -> {target.devpi_index}")

    def refused(answer: Answer) -> PublishError:
        detail = scrub(answer.body.decode(errors="replace"), credentials.secrets).strip()
        # devpi answers {"message": ...}; anything else is shown as it came.
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(json.loads(detail).get("message", detail))
        if answer.status in (401, 403):
            return CredentialsRejected(
                f"devpi refused to push {project} {version} from {source.devpi_index} to "
                f"{target.devpi_index} (HTTP {answer.status}; credentials from: "
                f"{credentials.source}): {detail}",
                fix=f"set TWINE_USERNAME / TWINE_PASSWORD (or keyring) to an account in "
                f"{target.devpi_index}'s acl_upload (`devpi index {target.devpi_index} "
                "acl_upload=<user>`)",
            )
        return PublishError(
            f"devpi could not push {project} {version} from {source.devpi_index} to "
            f"{target.devpi_index}: HTTP {answer.status}: {detail}",
            fix="devpi's message names the cause (409: the target index already holds a "
            "file of this release; non-volatile indexes never overwrite one)",
        )

    step = f"devpi push {project}=={version}"
    failures = Failures(
        answered=refused,
        unreadable=lambda reason: IndexUnreachable(
            f"the devpi server at {scrub(url)} is not reachable: {reason}", fix=_UNREACHABLE_FIX
        ),
        gave_up=lambda fault, attempts: IndexUnreachable(
            f"{step}: the devpi server at {host_of(url)} {fault.what_happened} "
            f"({attempts_text(attempts)})",
            fix=_UNREACHABLE_FIX if fault.kind == "refused" else _MAY_HAVE_PUSHED_FIX,
        ),
        timeout_fix=f"check devpi-server's health and log; {_MAY_HAVE_PUSHED_FIX}; a slow "
        f"server: give it longer with {TIMEOUT_SETTING}",
    )
    # A POST: sent again only when the connection was refused (net.SENT_ONCE_METHODS), as
    # a push that reached devpi may have linked the files.
    answer = http_request(
        request, network, failures, step=step, size=size, secrets=credentials.secrets
    )
    log.to_stage_logs(scrub(answer.body.decode(errors="replace"), credentials.secrets))


def push(
    source: DevpiLane, target: DevpiLane, records: Sequence[WheelRecord], *, network: NetworkPolicy
) -> list[Outcome]:
    """The locked ``records`` from ``source``'s devpi index into ``target``'s, by push."""
    credentials = credentials_for(source.credentials_url)
    releases = _releases(records)
    missing: list[str] = []
    problems: list[str] = []
    for release, members in releases.items():
        listed = project_files(source.index_url, release[0], credentials, network=network)
        lacking, wrong = _check_source(source, release, members, listed, credentials, network)
        missing += lacking
        problems += wrong
    if problems:
        raise HashMismatch(
            "refusing to promote files that are not the locked ones (nothing was pushed):\n  "
            + "\n  ".join(problems),
            fix="investigate the source lane's index before promoting",
        )
    if missing:
        raise PublishError(
            f"lane {source.lane} ({source.where}) does not hold {', '.join(sorted(missing))}",
            fix="publish the bundle there first: `make publish BUNDLE=<bundle>`",
        )
    # Idempotence: a release already in the target with the locked bytes is not pushed
    # again (a non-volatile devpi index would answer 409); other bytes there are refused.
    to_push: list[tuple[str, str]] = []
    outcomes: dict[str, Outcome] = {}
    conflicts = []
    for release, members in releases.items():
        there = project_files(target.index_url, release[0], credentials, network=network)
        for record in members:
            if record.name not in there:
                continue
            served = remote_sha256(
                there[record.name], credentials, size=record.size, network=network
            )
            if served != record.sha256:
                conflicts.append(f"{record.name}: sha256 {served}, wheels.lock has {record.sha256}")
            outcomes[record.name] = Outcome(record.name, "skipped", record.sha256)
        if any(r.name not in there for r in members):
            to_push.append(release)
    if conflicts:
        raise HashMismatch(
            f"lane {target.lane} ({target.devpi_index}) already holds other files under "
            "the locked names (nothing was pushed):\n  " + "\n  ".join(conflicts),
            fix="never overwrite a published wheel: bump the build's version or label",
        )
    for project, version in to_push:
        size = sum(record.size for record in releases[(project, version)])
        post_push(source, target, (project, version), size, credentials, network)
        there = project_files(target.index_url, project, credentials, network=network)
        for record in releases[(project, version)]:
            entry = there.get(record.name)
            after = (
                remote_sha256(entry, credentials, size=record.size, network=network)
                if entry
                else None
            )
            if after != record.sha256:
                raise HashMismatch(
                    f"after devpi's push, lane {target.lane} serves {record.name} with sha256 "
                    f"{after or '(not listed)'}, not the locked {record.sha256}",
                    fix="the index altered or mixed up the file: investigate before use",
                )
            if record.name not in outcomes:
                outcomes[record.name] = Outcome(record.name, "pushed", record.sha256)
    return [outcomes[r.name] for r in records]
