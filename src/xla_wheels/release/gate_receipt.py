"""The receipt a ``bench-restart`` run leaves, and the evidence of a ``gate`` run's (whose
receipt :mod:`xla_host.host_commands` composes, as on a host): its verdicts, with evidence.

The evidence is what the judged environment holds compared with the bundle's locked
wheels (``installed.match_environment``): a receipt says whether it was for those wheels,
and only such a receipt can promote the bundle. With a bundle the receipt is sealed into
``receipts/<bundle>/``; without one it is ``<out>/receipt.json``, unusable to promote.

Standard library only: the builder image's ship check runs the gate, and its receipt,
without the pipeline's dependencies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_host import installed, log, receipt_verdict, receipts
from xla_host.errors import LockError, UsageError
from xla_host.gate.target import Target
from xla_wheels.wheels_lock import WheelRecord, read_lock


@dataclass(frozen=True)
class ReceiptPlace:
    """Where a run's receipt and its evidence come from and go."""

    root: Path
    """The project checkout holding wheels.lock and receipts/."""
    bundle: str | None
    """The bundle whose locked wheels the environment should be (None: no bundle)."""
    wheel_dir: Path | None
    """Where the locked wheel files are (None: ``<root>/dist/<bundle>``)."""
    out_dir: Path
    """The run's output directory: the receipt of a run without a bundle goes there."""
    cache_dir: Path
    """The per-machine cache (the locked wheels' unpacked content)."""


def locked_records(lock_path: Path, bundle: str) -> list[WheelRecord]:
    """The wheels ``wheels.lock`` records for ``bundle``; an unlocked bundle is bad input
    to the gate (exit 2, where the pipeline's steps give :class:`LockError`, exit 1)."""
    lock = read_lock(lock_path)
    try:
        return list(lock.entry(bundle).wheels or ())
    except LockError:
        raise UsageError(
            f"wheels.lock has no bundle {bundle}",
            fix="pass BUNDLE= of a locked bundle (see `make bundles`)",
        ) from None


def evidence(
    place: ReceiptPlace, python: Path
) -> tuple[installed.InstalledFacts, installed.EnvironmentMatch | None]:
    """The environment of ``python`` against the locked wheels of ``place``'s bundle (none:
    a bare probe, a receipt for no bundle's wheels)."""
    records = locked_records(place.root / "wheels.lock", place.bundle) if place.bundle else []
    if not place.bundle or not records:
        return installed.probe_environment(python, []), None
    # The gate has no pipeline options: the default dist directory of the checkout.
    wheel_dir = place.wheel_dir or place.root / "dist" / place.bundle
    with log.section(f"receipt: compare the environment with the locked wheels of {place.bundle}"):
        facts, match = installed.match_environment(
            python, records, wheel_dir, place.cache_dir / "wheel-content"
        )
    for problem in match.problems:
        log.warning(problem)
    return facts, match


def _store(place: ReceiptPlace, receipt: receipts.Receipt) -> Path:
    if receipt.bundle is None:
        path = receipts.write_receipt(place.out_dir / "receipt.json", receipt, replace=True)
    else:
        path = receipts.write_receipt(receipts.receipt_path(place.root, receipt), receipt)
    log.result(f"receipt: {path} ({receipt_verdict.judge(receipt).gate_label})")
    return path


def leave_bench_receipt(place: ReceiptPlace, target: Target, summary: Mapping[str, Any]) -> Path:
    facts, match = evidence(place, target.python)
    receipt = receipts.receipt_from_bench(
        target, summary, bundle=place.bundle, facts=facts, match=match
    )
    return _store(place, receipt)
