"""A lane on a PEP 503 index that takes uploads (``index-url = "https://…/simple/"``).

Wheels go in with twine (``publish.upload.publish_remote``: the same hash checks,
idempotent) and come back from the links of the index's project pages, each download
bounded by the network settings. Credentials: ``TWINE_USERNAME``/``TWINE_PASSWORD`` or
keyring, for the upload URL (``upload-url``, else derived from the index URL).

An index serves packages only, so the bundle document goes in as a *document wheel*
(``xla_host.bundle_document.document_wheel``: project ``xla-wheels-document-<bundle>``,
version ``<serial>+sha256.<16 hex>``) uploaded as the wheels are; the serial is one more
than the highest the index lists for the bundle, and a document the index already holds
(the same label) is not uploaded again. The checkout keeps a copy in
``dist/lanes/<lane>/bundles/`` (``make lanes`` shows its digest), and the lane's install
lists in ``dist/lanes/<lane>/`` (``requirements.txt``, ``pylock.toml``): the index serves
neither, so they are not a host's to fetch from the lane.
"""

from __future__ import annotations

import re
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_host import bundle_document as doc
from xla_host.errors import UsageError
from xla_host.filemode import write_by_rename
from xla_host.net import (
    TIMEOUT_SETTING,
    Failures,
    attempts_text,
    host_of,
    http_request,
    rewound,
)
from xla_host.redact import scrub, shown
from xla_host.tables import Field, Table
from xla_host.values import BadValue, check_url
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.options import NetworkPolicy
from xla_wheels.publish.errors import PublishError
from xla_wheels.publish.index import (
    check_reachable,
    credentials_for,
    project_files,
    remote_sha256,
    upload_url_for,
)
from xla_wheels.publish.upload import Outcome, publish_remote
from xla_wheels.publish.wheels import LocalWheel
from xla_wheels.release.lane_backend import LaneBackend, LaneKind, PublishedDocument
from xla_wheels.release.pack_store import PackStore
from xla_wheels.wheels_lock import WheelRecord

#: The size a served wheel's download is allowed for in its whole-transfer deadline when
#: the index gives no sha256: status judges every file the index serves, including files
#: no lock records (an extra file is drift), so no locked size is known. 2 GiB: more than
#: a torch wheel.
SERVED_WHEEL_BYTES_ALLOWANCE = 2 * 1024**3


@dataclass(frozen=True)
class IndexLane(LaneBackend):
    lane: str
    index_url: str
    """The simple page, ending in ``/``."""
    upload_url: str | None = None
    pack_store: PackStore | None = field(default=None, kw_only=True)
    kind = "index"

    @property
    def where(self) -> str:
        return shown(self.index_url)

    @property
    def simple_url(self) -> str:
        return self.index_url

    @property
    def credentials_url(self) -> str:
        """The upload URL (twine's and keyring's key), else the index URL when no upload
        URL can be derived from it (reading needs none)."""
        if self.upload_url:
            return self.upload_url
        try:
            return upload_url_for(self.index_url)
        except UsageError:
            return self.index_url

    def put(
        self, wheels: Sequence[LocalWheel], envelopes: Sequence[Path], *, network: NetworkPolicy
    ) -> list[Outcome]:
        # An index takes packages only: the envelopes stay beside the build (dist/).
        result = publish_remote(list(wheels), self.index_url, self.upload_url, network=network)
        return result.outcomes

    def fetch(
        self, records: Sequence[WheelRecord], workdir: Path, *, network: NetworkPolicy
    ) -> list[str]:
        missing = []
        credentials = credentials_for(self.credentials_url)
        for record in records:
            project = parse_wheel_name(record.name).normalized
            listed = project_files(self.index_url, project, credentials, network=network)
            if record.name not in listed:
                missing.append(record.name)
                continue
            self._download(listed[record.name].url, workdir / record.name, record.size, network)
        return missing

    def _download(self, url: str, dest: Path, size: int, network: NetworkPolicy) -> None:
        credentials = credentials_for(self.credentials_url)
        seen = scrub(url, credentials.secrets)
        could_not = f"could not download {seen} from lane {self.lane}"
        read_fix = "check that the lane's index is up and the credentials may read it"
        failures = Failures(
            answered=lambda answer: PublishError(
                f"{could_not}: HTTP Error {answer.status}: {answer.reason}", fix=read_fix
            ),
            unreadable=lambda reason: PublishError(f"{could_not}: {reason}", fix=read_fix),
            gave_up=lambda fault, attempts: PublishError(
                f"downloading {seen} from lane {self.lane}: {host_of(url)} "
                f"{fault.what_happened} ({attempts_text(attempts)})",
                fix="check that the lane's index is up and answering, then run it again",
            ),
            timeout_fix=f"check the lane's index and the network, or give it longer with "
            f"{TIMEOUT_SETTING}",
        )
        with dest.open("wb") as handle:
            http_request(
                credentials.request(url), network, failures,
                step=f"downloading {dest.name} from lane {self.lane}", size=size,
                write=rewound(handle), long=True, secrets=credentials.secrets,
            )  # fmt: skip

    def served(self, projects: Sequence[str], *, network: NetworkPolicy) -> dict[str, str]:
        credentials = credentials_for(self.credentials_url)
        check_reachable(self.index_url, credentials, network=network)  # even with nothing recorded
        served: dict[str, str] = {}
        for project in projects:
            for name, listed in project_files(
                self.index_url, project, credentials, network=network
            ).items():
                served[name] = remote_sha256(
                    listed, credentials, size=SERVED_WHEEL_BYTES_ALLOWANCE, network=network
                )
        return served

    def put_document(
        self, root: Path, bundle: str, raw: bytes, *, network: NetworkPolicy
    ) -> PublishedDocument:
        # The checkout's copy is one of document_files, written with the lane's update.
        path, digest = self.documents_dir(root) / f"{bundle}.json", doc.sha256_of(raw)
        project = doc.document_project(bundle)
        credentials = credentials_for(self.credentials_url)
        listed = project_files(self.index_url, project, credentials, network=network)
        label = f"+sha256.{digest[: doc.LABEL_DIGITS]}-"
        held = sorted(name for name in listed if label in name)
        if held:
            # The index holds this document already (a publish run again, a rollback).
            return PublishedDocument(path, digest, (f"{'skipped':<10} {held[-1]}",))
        serials = [int(m.group(1)) for n in listed if (m := re.search(r"-([0-9]+)\+sha256\.", n))]
        name, data = doc.document_wheel(raw, max(serials, default=0) + 1)
        with tempfile.TemporaryDirectory(prefix="xla-wheels-document-") as tmp:
            wheel_path = Path(tmp) / name
            write_by_rename(wheel_path, data)
            wheel = LocalWheel(
                wheel_path,
                WheelRecord(name, len(data), doc.sha256_of(data)),
                parse_wheel_name(name),
            )
            outcomes = publish_remote([wheel], self.index_url, self.upload_url, network=network)
        return PublishedDocument(
            path,
            digest,
            tuple(f"{o.action:<10} {o.filename}  sha256:{o.sha256}" for o in outcomes.outcomes),
        )


_INDEX_EXAMPLE = "https://pypi.example.com/validation/simple/"


def check_index_url(table: Table, key: str, value: str) -> str:
    """An index URL pip and twine can use: http(s), a host, a port that is a number, no
    space or control character (each of them once a traceback, or shown as valid by
    ``lanes``). The value is shown masked: it may carry a token."""
    try:
        check_url(value, ("http", "https"), _INDEX_EXAMPLE)
        if any(char.isspace() for char in value):
            raise BadValue("contains a space", _INDEX_EXAMPLE)
        urllib.parse.urlsplit(value).port  # noqa: B018 - raises for a port that is no number
    except BadValue as bad:
        raise table.fail(key, f"{shown(value)} {bad.reason}", f"write e.g. {bad.example}") from None
    except ValueError as bad:
        raise table.fail(
            key, f"{shown(value)} is not a URL ({bad})", f"write e.g. {_INDEX_EXAMPLE}"
        ) from None
    return value


def _make(name: str, table: Table, fields: Mapping[str, Any], root: Path) -> IndexLane:
    index_url = check_index_url(table, "index-url", fields["index-url"])
    upload = fields["upload-url"]
    if upload is not None:
        check_index_url(table, "upload-url", upload)
    return IndexLane(name, index_url if index_url.endswith("/") else f"{index_url}/", upload)


KIND = LaneKind("index", (Field("index-url", str, required=True), Field("upload-url", str)), _make)
