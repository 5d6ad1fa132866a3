"""``make doctor``'s lane findings: which bundle a host runs, and whether a lane serves it.

A wheel's identity is its inputs, not a bundle (the provenance names no bundle): the
torch_xla version's local label is a digest of those inputs, so the bundle a host runs is
known from the installed versions of our wheels, and held against the lanes' current
bundles (``lanes.lock``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host.host_doctor import install_line
from xla_host.host_probe import HostFacts
from xla_host.redact import one_line
from xla_host.wheel_filename import normalize, parse_wheel_name
from xla_wheels.publish.requirements import REQUIREMENTS_NAME
from xla_wheels.release import lanes
from xla_wheels.wheels_lock import Lock

if TYPE_CHECKING:  # doctor reads ELF files (pyelftools): loaded only by doctor itself
    from xla_wheels.publish.doctor import DoctorReport


def host_bundle(
    root: Path, lock: Lock, facts: HostFacts, named: str | None = None
) -> tuple[str | None, str]:
    """The bundle a host runs: one whose locked wheel names all match the installed
    versions (module doc). The bundle doctor was asked about (``named``) is tried first,
    then the lanes' current bundles; bundles that share inputs share wheels, so either
    answer is true.
    """
    installed_versions = {normalize(k): v for k, v in facts.versions.items()}

    def runs(wheel_names: Sequence[str]) -> bool:
        locked = [parse_wheel_name(n) for n in wheel_names]
        return bool(locked) and all(
            installed_versions.get(w.normalized) == w.version for w in locked
        )

    how = "installed versions (content not compared: see make verify-install)"
    if named:
        entry = lock.bundles.get(named)
        if entry is not None and runs([w.name for w in entry.wheels or ()]):
            return named, how
    try:
        state = lanes.read_state(root)
    except lanes.LaneError:
        return None, ""
    for name in sorted({s.bundle for s in state.values()}):
        if runs([n for n, _ in next(s.wheels for s in state.values() if s.bundle == name)]):
            return name, how
    return None, ""


def add_lane_findings(
    report: DoctorReport, root: Path, lock: Lock, lane: str | None, bundle_name: str | None = None
) -> None:
    """``make doctor``: which bundle and lane this host runs (adds findings to the report),
    from the host facts doctor's own probe read and the wheels.lock doctor parsed."""
    if not (root / lanes.LANES_CONFIG).exists() or report.host is None:
        return  # a checkout without lanes: nothing to say about them
    bundle, how = host_bundle(root, lock, report.host, bundle_name)
    status, detail, fix = lane_status(root, bundle, lane)
    report.add(status, "lane", detail + (f" (known from the {how})" if how else ""), fix)


def lane_status(root: Path, host_bundle: str | None, lane_name: str | None) -> tuple[str, str, str]:
    """Doctor's lane finding: (status, detail, fix) for the bundle this host runs."""
    try:
        config = lanes.load_config(root)
        record = lanes.read_record(root)
    except lanes.LaneError as error:
        return ("WARN", f"lanes unknown: {error.message}", error.fix or "")
    if host_bundle is None:
        why = "cannot tell which bundle this host runs (no provenance file)"
        return ("WARN", why, "install a bundle built by this pipeline")
    state = record.states
    runs = f"runs bundle {host_bundle}"
    if lane_name:
        lane = config.lane(lane_name)
        current = state.get(lane.name)
        if current and current.bundle == host_bundle:
            return ("ok", f"{runs}, the current bundle of lane {lane.name}", "")
        current_bundle = current.bundle if current else "(none)"
        # The runbook's line (a) with this lane's addresses as this machine reaches them:
        # a static lane serves its install list; an index's is the checkout's copy.
        requirements = lane.backend.install_list_url(root) or str(
            lane.backend.install_dir(root) / REQUIREMENTS_NAME
        )
        fix = f"install from lane {lane.name}: {install_line(lane.simple_url, requirements)}"
        served = [e for e in record.lane_history(lane.name) if e.bundle == host_bundle]
        if served and current:
            # Pinned to what the lane served before (a promotion or rollback moved it): say
            # both bundles and when the lane moved, not only that they differ.
            moved = record.lane_history(lane.name)[-1]
            return (
                "FAIL",
                f"this host has bundle {host_bundle}, which lane {lane.name} served before; "
                f"the lane serves {current.bundle} now ({moved.action} by {moved.who} at "
                f"{moved.when}" + (f": {one_line(moved.reason)}" if moved.reason else "") + ")",
                fix,
            )
        return ("FAIL", f"{runs}; lane {lane.name}'s current bundle is {current_bundle}", fix)
    if holding := sorted(n for n, s in state.items() if s.bundle == host_bundle):
        return ("ok", f"{runs}, the current bundle of lane(s) {', '.join(holding)}", "")
    fix = "install the bundle of the lane this host belongs to (make lanes)"
    return ("WARN", f"{runs}, which is not the current bundle of any lane", fix)
