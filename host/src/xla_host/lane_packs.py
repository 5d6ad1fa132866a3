"""A lane's cache packs: where they are and how a host finds the one for it.

A lane keeps its packs beside its bundles: ``<lane>/packs/sha256/<hex>.xlapack.tar``,
each named by the sha256 of its bytes, and ``<lane>/packs/index.json``, which lists
them (``index-version`` 1; one row per pack: ``sha256``, ``size``, ``path`` relative to
the lane, ``bundle``, ``workload``, ``workload-sha256``, ``topology``, ``device``,
``torch-xla``, ``libtpu``, ``receipt-digest``, ``created``, ``published``) and which
bundles the lane keeps packs for and why (``retained``: each bundle with ``serves`` or
``rollback``). The builder writes both (``xla_wheels.release.lane_packs``); a host reads
them (:func:`find_pack`), over HTTP or from a directory, and fetches the pack by hash:
``cache fetch`` refuses a file whose sha256 is not the index's. A lane may keep its packs
in another store, of the same layout (``gs://bucket/prefix`` or a directory: lanes.toml's
``packs``), which its bundle document names: a host reads the index there.

Standard library only: this runs on a TPU host.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import bundle_document, gcs
from xla_host.cache_pack import PackRefused
from xla_host.errors import PipelineError, UsageError
from xla_host.filemode import read_shared
from xla_host.lane_address import LaneAddress, address_of
from xla_host.net import NetworkPolicy, NotThere, get
from xla_host.tables import loads_json

INDEX = "packs/index.json"
INDEX_VERSION = 1
MAX_INDEX_BYTES = 8 * 1024**2
_HEX64 = re.compile(r"[0-9a-f]{64}")
_PUBLISH = "publish one: make cache-pack BUNDLE=… LANE=… WORKLOAD=…"


@dataclass(frozen=True)
class PackRow:
    sha256: str
    size: int
    path: str
    bundle: str | None
    workload: str
    workload_sha256: str | None
    topology: str
    device: str
    torch_xla: str
    libtpu: str | None
    receipt_digest: str | None
    created: str
    published: str

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "size": self.size,
            "path": self.path,
            "bundle": self.bundle,
            "workload": self.workload,
            "workload-sha256": self.workload_sha256,
            "topology": self.topology,
            "device": self.device,
            "torch-xla": self.torch_xla,
            "libtpu": self.libtpu,
            "receipt-digest": self.receipt_digest,
            "created": self.created,
            "published": self.published,
        }

    @property
    def label(self) -> str:
        return f"{self.bundle or 'no bundle'} / {self.workload} / {self.topology}"


def pack_path(sha256: str) -> str:
    """Where a pack of these bytes lives in a lane: named by its hash."""
    return f"packs/sha256/{sha256}.xlapack.tar"


def parse_index(text: str, source: str) -> tuple[list[PackRow], dict[str, str]]:
    """The rows and the retained bundles (bundle -> why) of a lane's index."""
    fix = "publish the pack again (`make cache-pack`), which rewrites the index"
    try:
        data = loads_json(text, source=source, error=UsageError, fix=fix)
        if data.get("index-version") != INDEX_VERSION:
            raise ValueError(f"index-version {data.get('index-version')!r}")
        rows = [
            PackRow(
                sha256=str(row["sha256"]),
                size=int(row["size"]),
                path=str(row["path"]),
                bundle=row["bundle"],
                workload=str(row["workload"]),
                workload_sha256=row.get("workload-sha256"),
                topology=str(row["topology"]),
                device=str(row["device"]),
                torch_xla=str(row["torch-xla"]),
                libtpu=row.get("libtpu"),
                receipt_digest=row.get("receipt-digest"),
                created=str(row.get("created", "")),
                published=str(row.get("published", "")),
            )
            for row in data["packs"]
        ]
        retained = {str(k): str(v) for k, v in dict(data.get("retained", {})).items()}
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as error:
        raise UsageError(f"{source} is not a lane's pack index ({error})", fix=fix) from None
    for row in rows:
        # A row's path is where the host fetches from: only the lane's own hash-named place.
        if not _HEX64.fullmatch(row.sha256) or row.path != pack_path(row.sha256):
            raise UsageError(f"{source} names a pack outside packs/sha256/: {row.path}", fix=fix)
    return rows, retained


def index_json(rows: Sequence[PackRow], retained: Mapping[str, str]) -> str:
    data = {
        "index-version": INDEX_VERSION,
        "retained": dict(sorted(retained.items())),
        "packs": [row.to_json() for row in sorted(rows, key=lambda r: (r.label, r.created))],
    }
    return json.dumps(data, indent=2) + "\n"


def read_index(lane: str | LaneAddress, network: NetworkPolicy) -> list[PackRow]:
    """The lane's pack index: ``lane`` is its address (:mod:`xla_host.lane_address`)."""
    address = address_of(lane)
    where = address.where(INDEX)
    shown_where = address.shown(address.path(INDEX) if address.local else where)
    fix = "check --lane (the lane's URL or directory, where packs/index.json is served)"
    absent = PackRefused(
        f"the lane {address.shown()} serves no cache pack (no {shown_where})", fix=_PUBLISH
    )
    try:
        if address.local:
            # A FIFO or device at the index's place is refused from its stat, never opened.
            raw = read_shared(address.path(INDEX), what="lane's pack index", limit=MAX_INDEX_BYTES)
        else:
            # Unsigned and of any length: at most one byte past the limit is ever held.
            raw = get(
                where, network, missing_ok=True, timeout_fix=fix, secrets=address.secrets,
                max_bytes=MAX_INDEX_BYTES,
                refused=lambda what: PackRefused(f"{shown_where}: {what}", fix=fix),
            )  # fmt: skip
    except (NotThere, FileNotFoundError):
        raise absent from None
    if len(raw) > MAX_INDEX_BYTES:
        raise UsageError(f"{shown_where} is larger than {MAX_INDEX_BYTES} bytes", fix=fix)
    return parse_index(raw.decode(errors="replace"), shown_where)[0]


def read_store_index(store: str, network: NetworkPolicy) -> list[PackRow]:
    """The pack index of a store a lane's document names: ``gs://bucket/prefix`` (through
    :mod:`xla_host.gcs`) or a directory."""
    where = f"{store.rstrip('/')}/{INDEX}"
    absent = PackRefused(f"the pack store {store} holds no pack index ({where})", fix=_PUBLISH)
    if gcs.is_gs(store):
        bucket = gcs.bucket_at(store, network, fix="publish the bundle into the lane again")
        try:
            raw = bucket.read(INDEX, max_bytes=MAX_INDEX_BYTES)[0]
        except gcs.ObjectMissing:
            raise absent from None
    else:
        try:
            raw = read_shared(Path(store) / INDEX, what="pack store's index", limit=MAX_INDEX_BYTES)
        except FileNotFoundError:
            raise absent from None
    if len(raw) > MAX_INDEX_BYTES:
        raise UsageError(f"{where} is larger than {MAX_INDEX_BYTES} bytes", fix=_PUBLISH)
    return parse_index(raw.decode(errors="replace"), where)[0]


def _named_store(address: LaneAddress, bundle: str | None, network: NetworkPolicy) -> str | None:
    """The pack store the lane's document of ``bundle`` names (lanes.toml's ``packs``), or
    None: the document names none, or there is no document to ask."""
    if bundle is None:
        return None
    try:
        document, _ = bundle_document.fetch(address, bundle, network=network)
    except PipelineError:
        return None
    return document.packs


def find_pack(
    lane: str | LaneAddress, bundle: str | None, workload: str, topology: str,
    network: NetworkPolicy,
) -> tuple[str, PackRow]:  # fmt: skip
    """The URL (or path) of the newest pack of the lane for this bundle, workload and
    topology, and its index row; refused naming what the lane has instead. The lane's own
    ``packs/index.json`` first; without one, the pack store the lane's bundle document
    names (a lane on a package index, or one whose packs are in a bucket). The URL keeps
    the lane's credentials (its userinfo and query): show it masked."""
    address = address_of(lane)
    store: str | None = None
    try:
        rows = read_index(address, network)
    except PackRefused:
        store = _named_store(address, bundle, network)
        if store is None:
            raise
        rows = read_store_index(store, network)
    fitting = [
        r for r in rows if (r.bundle, r.workload, r.topology) == (bundle, workload, topology)
    ]
    if not fitting:
        offered = "; ".join(sorted({r.label for r in rows})) or "none"
        raise PackRefused(
            f"the lane {address.shown()} has no cache pack for bundle {bundle or 'none'}, "
            f"workload {workload}, topology {topology} (it has: {offered})",
            fix="run the gate with --pack for this workload on this topology and publish the "
            "pack (make cache-pack), or pass the --bundle/--workload/--topology this host runs",
        )
    row = max(fitting, key=lambda r: (r.created, r.published))
    if store is not None:
        return f"{store.rstrip('/')}/{row.path}", row
    return address.where(row.path), row
