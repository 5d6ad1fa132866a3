"""What a lane gives a training host: the bundle document and the host wheel.

The document (format: :mod:`xla_host.bundle_document`) is composed here from the parsed
manifest, the bundle's ``wheels.lock`` entry and the lane of ``build/lanes.toml``, and
put into the lane beside the wheels by ``make publish`` and ``make promote``. The host
wheel (``make host-wheel``: ``dist/host/xla_wheels_host-*.whl``, built reproducibly from
``host/``) goes into the lane the way the bundle's wheels go, and the lane's
requirements file lists it by hash (``make requirements``), so a host installs both from
the lane by hash and needs nothing of the checkout.

The lane's update writes the document with its install lists and its lanes.lock record
(``release.lane_state``); each kind of lane serves it its own way
(``LaneBackend.document_files``, ``LaneBackend.put_document``): a
static lane keeps it at ``<lane>/bundles/<bundle>.json``, listed in
``<lane>/bundles/index.html`` with its ``#sha256=`` (hosts read both through any static
web server, or the directory itself); a package index (pypiserver, devpi, ...) serves
packages only, so it gets the document in a document wheel
(``xla_host.bundle_document.document_wheel``) that hosts find on the index's simple page,
and the checkout keeps a copy in ``dist/lanes/<lane>/bundles/``. Publish prints the
document's sha256, what hosts pass as ``--bundle-sha256``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from xla_host import bundle_document as doc
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.bundle import load_bundle
from xla_wheels.publish.wheels import LocalWheel, locked_records
from xla_wheels.release.lanes import Lane, Policy, load_config
from xla_wheels.wheels_lock import Lock, WheelRecord

#: Where ``make host-wheel`` leaves the host distribution's wheel.
HOST_WHEEL_DIR = Path("dist") / "host"
HOST_PROJECT = "xla-wheels-host"


def policy_data(policy: Policy) -> dict[str, Any]:
    """The lane's policy as the document carries it: only the rules that are set. The keys
    that verify signed receipts are carried by their content's sha256, not their path: the
    document must read the same from every checkout (its digest is what receipts name)."""
    data = {k.replace("_", "-"): v for k, v in asdict(policy).items() if v not in (None, ())}
    if policy.receipt_keys:
        data["receipt-keys"] = [f"sha256:{file_sha256(key)}" for key in policy.receipt_keys]
    return data


def compose(root: Path, lock: Lock, bundle_name: str, lane: Lane) -> doc.BundleDocument:
    """The document of ``bundle_name`` as ``lane`` publishes it."""
    bundle = load_bundle(root, bundle_name)
    entry = lock.entry(bundle_name)
    return doc.BundleDocument(
        bundle=bundle.name,
        lane=lane.name,
        python=bundle.python,
        wheels=tuple(
            doc.LockedFile(r.name, r.sha256, r.size) for r in locked_records(lock, bundle_name)
        ),
        runtime_wheels=tuple(doc.LockedFile(r.name, r.sha256) for r in entry.runtime_wheels or ()),
        runtime={
            name: doc.RuntimePin(pin.version, pin.minimum, pin.preferred)
            for name, pin in bundle.runtime.items()
        },
        profiles=dict(bundle.profiles),
        policy=policy_data(lane.policy),
        host_wheel=next(
            (doc.LockedFile(r.name, r.sha256, r.size) for r in host_records(root)), None
        ),
        packs=lane.backend.named_pack_store(),
    )


def published_digests(root: Path, lock: Lock, bundle: str) -> frozenset[str]:
    """``sha256:<hex>`` of the document each lane of ``build/lanes.toml`` publishes for
    ``bundle``: what a host's receipt must have been made under to promote it."""
    config = load_config(root)
    return frozenset(
        f"sha256:{doc.sha256_of(doc.dumps(compose(root, lock, bundle, lane)))}"
        for lane in config.lanes.values()
    )


def published(root: Path, lane: Lane, bundle: str) -> tuple[Path, str] | None:
    """The document ``lane`` was given for ``bundle`` (where, its sha256); None: none.
    ``make lanes`` shows it: the digest hosts pass as ``--bundle-sha256``."""
    return lane.backend.published_document(root, bundle)


def host_wheels(root: Path) -> list[LocalWheel]:
    """The host wheel ``make host-wheel`` built (none: not built; publish says so)."""
    found = sorted((root / HOST_WHEEL_DIR).glob("xla_wheels_host-*.whl"))
    wheels = []
    for path in found:
        record = WheelRecord(path.name, path.stat().st_size, file_sha256(path))
        wheels.append(LocalWheel(path, record, parse_wheel_name(path.name)))
    return wheels


def host_records(root: Path) -> list[WheelRecord]:
    """The host wheel as a requirements row (``make requirements`` lists it by hash)."""
    return [w.record for w in host_wheels(root)]
