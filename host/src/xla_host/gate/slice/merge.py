"""What worker 0 records of a slice: every worker's verdicts merged into the receipt's
``slice`` record (accelerator type, hosts, chips per host, topology, each worker's role
and checks), and the slice's own verdict (another worker's failed check, devices per
host that differ)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xla_host.gate.slice.barrier import Arrival
from xla_host.gate.slice.spec import WRITER, SliceSpec


def merge_slice(spec: SliceSpec, device: str, arrivals: Mapping[int, Arrival]) -> dict[str, Any]:
    """The receipt's record of the slice from every worker's results payload: accelerator
    type, number of hosts, chips per host (addressable devices), each worker's verdicts."""
    rows: list[dict[str, Any]] = []
    for worker in sorted(arrivals):
        arrival = arrivals[worker]
        rows.append(
            {
                "worker": worker,
                "host": arrival.host,
                "role": "writer" if worker == WRITER else "reader",
                "addressable-devices": list(arrival.payload.get("addressable_devices", [])),
                "checks": list(arrival.payload.get("checks", [])),
            }
        )
    counts = sorted({len(r["addressable-devices"]) for r in rows})
    chips = counts[0] if len(counts) == 1 else None
    return {
        "accelerator-type": spec.accelerator_type,
        "hosts": spec.workers,
        "chips-per-host": chips,
        "topology": topology(device, spec.accelerator_type, spec.workers, chips),
        "workers": rows,
    }


def topology(device: str, accelerator_type: str | None, hosts: int, chips: int | None) -> str:
    """What promotion compares receipts by: the accelerator type where the TPU VM names it
    (``v6e-32``), else the device with hosts x devices per host (``cpu-2x1``)."""
    if accelerator_type:
        return accelerator_type
    return f"{device.lower()}-{hosts}x{chips if chips is not None else '?'}"


def slice_verdicts(record: Mapping[str, Any]) -> list[str]:
    """Why the slice as a whole fails: each other worker's failed check, and devices per
    host that differ between workers."""
    reasons = []
    for row in record.get("workers", []):
        for check in row.get("checks", []):
            if row["worker"] != WRITER and check.get("passed") is False:
                why = "; ".join(check.get("reasons", [])[:2])
                reasons.append(f"worker {row['worker']} ({row['host']}): {check['name']}: {why}")
    if record.get("chips-per-host") is None and record.get("workers"):
        counts = {r["worker"]: len(r["addressable-devices"]) for r in record["workers"]}
        reasons.append(f"the workers address different numbers of devices: {counts}")
    return reasons
