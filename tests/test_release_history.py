"""Operating the lanes: their history, a rollback with its reason, and status at a glance.

Real components: two pypiserver indexes on 127.0.0.1 (validation and preferred) started
once for this module and stopped by its fixture, twine uploads, and two bundles of real
wheels (the publish tests' stand-ins, plus a second torch_xla build for the second
bundle). The only hand-written bytes are the edits a test makes to show they are refused
or found.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.publish_support import (
    BUNDLE,
    XLA_VERSION,
    FakeWheels,
    IndexServer,
    build_wheel,
    host_venv,
    make_publish_project,
    manifest_text,
    start_pypiserver,
)
from tests.servers import free_port, stop
from xla_host.filemode import file_sha256
from xla_host.stamp import read_stamp
from xla_wheels.bundle import load_bundle
from xla_wheels.release import lanes
from xla_wheels.wheels_lock import WheelRecord, read_lock, record_wheels, update_bundle_entry

SECOND = "pub-2"


def file_sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Fleet:
    root: Path
    validation: IndexServer
    preferred: IndexServer
    second_wheel: Path
    torch: Path
    work: Path

    def run(self, *args: str, **env: str) -> CliResult:
        return run_cli(
            *args, env={**self.validation.credentials, **env}, timeout=300, root=self.root,
            inherit_env=True,
        )  # fmt: skip


def _add_second_bundle(project: Path, torch: Path, torch_xla: Path) -> None:
    """``pub-2``: the same torch, a newer torch_xla build."""
    _add_second_bundle_of(
        project, SECOND, manifest_text(SECOND, xla_version="2.9.1"), [torch, torch_xla]
    )


def _add_second_bundle_of(project: Path, name: str, manifest: str, wheels: list[Path]) -> None:
    """Bundle ``name`` (its manifest text) locked with ``wheels`` beside the project's first."""
    (project / "build" / "bundles" / f"{name}.toml").write_text(manifest)
    loaded = load_bundle(project, name)
    update_bundle_entry(
        project / "wheels.lock", loaded, {c.name: c.commit for c in loaded.components.values()},
        project,
    )  # fmt: skip
    dist = project / "dist" / name
    dist.mkdir(parents=True)
    records = []
    for wheel in wheels:
        shutil.copyfile(wheel, dist / wheel.name)
        records.append(WheelRecord(wheel.name, wheel.stat().st_size, file_sha256(wheel)))
    record_wheels(project / "wheels.lock", name, records)


@pytest.fixture(scope="module")
def fleet(
    fake_wheels: FakeWheels,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """Two bundles locked, two lanes served by pypiserver, nothing published yet."""
    work = tmp_path_factory.mktemp("fleet")
    project = make_publish_project(work, [fake_wheels.torch, fake_wheels.torch_xla])
    newer = XLA_VERSION.replace("2.9.0", "2.9.1")
    second = build_wheel(
        work / "second", "torch_xla", newer, "torch_xla",
        {"__init__.py": f'__version__ = "{newer}"\n'},
    )  # fmt: skip
    _add_second_bundle(project, fake_wheels.torch, second)
    servers = [start_pypiserver(work / name, "update") for name in ("validation", "preferred")]
    validation, preferred = (server for _, server in servers)
    try:
        (project / "build" / "lanes.toml").write_text(
            f'publish-lane = "validation"\n\n[lanes.validation]\nindex-url = "{validation.url}"'
            f'\n\n[lanes.preferred]\nindex-url = "{preferred.url}"\n'
            'promote-from = "validation"\n'
        )
        yield Fleet(project, validation, preferred, second, fake_wheels.torch, work)
    finally:
        for process, _ in servers:
            stop(process)


@pytest.mark.slow
def test_promotion_then_rollback_with_its_reason_and_the_history_shown(fleet: Fleet) -> None:
    # Two promotions: pub-1, then pub-2, through the validation lane.
    for bundle in (BUNDLE, SECOND):
        for step in (("publish-lane",), ("promote", "--lane", "preferred")):
            done = fleet.run(*step, "--bundle", bundle)
            assert done.exit_code == 0, done.output
    assert lanes.read_state(fleet.root)["preferred"].bundle == SECOND

    # A rollback needs a reason, and a bundle the lane served before.
    unexplained = fleet.run("rollback", "--lane", "preferred", "--to", BUNDLE)
    assert unexplained.exit_code == 2 and "needs a reason" in unexplained.stderr
    assert 'REASON="' in unexplained.stderr
    never = fleet.run("rollback", "--to", "pub-0", "--reason", "x")
    assert never.exit_code == 1, never.output
    assert "lane preferred never served bundle pub-0" in never.stderr
    assert f"(it served: {BUNDLE})" in never.stderr and f"TO={BUNDLE}" in never.stderr

    # A dry run shows the plan, checks the lane's files and changes nothing.
    before = (fleet.root / "lanes.lock").read_bytes()
    reason = "pub-2 hangs at step 0 on v6e-8 (incident 4711)"
    dry = fleet.run("rollback", "--to", BUNDLE, "--reason", reason, XLA_WHEELS_DRY_RUN="1")
    assert dry.exit_code == 0, dry.output
    assert f"rollback lane preferred: {SECOND} -> {BUNDLE}" in dry.stdout
    assert "would keep" in dry.stdout and "DRY_RUN: lanes.lock unchanged" in dry.stdout
    assert (fleet.root / "lanes.lock").read_bytes() == before

    rolled = fleet.run("rollback", "--to", BUNDLE, "--reason", reason)
    assert rolled.exit_code == 0, rolled.output
    assert "verified" in rolled.stdout
    record = lanes.read_record(fleet.root)
    assert record.states["preferred"] == record.lane_history("preferred")[0].state
    last = record.history[-1]
    assert (last.lane, last.action, last.previous_bundle, last.bundle, last.reason) == (
        "preferred", "rollback", SECOND, BUNDLE, reason,
    )  # fmt: skip
    assert last.who == lanes.operator() and last.when.endswith("Z")
    assert [e.action for e in record.lane_history("preferred")] == [
        "promote", "promote", "rollback",
    ]  # fmt: skip

    # make lanes: the current state; HISTORY=1: the log, newest last, with the reason.
    shown = fleet.run("lanes")
    assert f"current bundle: {BUNDLE}" in shown.stdout and "rollback by" in shown.stdout
    history = fleet.run("lanes", "--history", "--lane", "preferred").stdout.splitlines()
    moves = [line.split("  ")[1] for line in history if line.startswith("20")]
    assert moves == [
        f"preferred: promote {BUNDLE}", f"preferred: promote {BUNDLE} -> {SECOND}",
        f"preferred: rollback {SECOND} -> {BUNDLE}",
    ]  # fmt: skip
    assert history[-1] == f"  reason: {reason}"

    # doctor on a host still pinned to pub-2: which bundle the lane serves now, which the
    # host has, and why the lane moved.
    host = host_venv(fleet.work, [fleet.torch, fleet.second_wheel])
    doctor = fleet.run("doctor", "--bundle", SECOND, "--python", str(host), "--lane", "preferred")
    assert doctor.exit_code == 1, doctor.output
    assert f"this host has bundle {SECOND}, which lane preferred served before" in doctor.stdout
    assert f"the lane serves {BUNDLE} now (rollback by" in doctor.stdout
    assert reason in doctor.stdout
    # The same check as the job's audit stamp: one JSON document on stdout (the findings on
    # stderr), the same written to a file, and `jobs` finds the job by a wheel it ran.
    stamps = fleet.work / "stamps"
    # (the file from XLA_WHEELS_STAMP, the variable the runtime image's entrypoint reads)
    stamped = fleet.run(
        "doctor", "--bundle", SECOND, "--python", str(host), "--lane", "preferred", "--json",
        XLA_WHEELS_STAMP=str(stamps / "job-1.json"),
    )  # fmt: skip
    assert stamped.exit_code == 1, stamped.output
    assert "which lane preferred served before" in stamped.stderr
    document = json.loads(stamped.stdout)
    written = read_stamp(stamps / "job-1.json")
    assert written.as_json() == document
    assert (written.bundle, written.lane, written.verdict) == (SECOND, "preferred", "failed")
    assert written.receipt_digest is None  # the lane serves another bundle now
    second = read_lock(fleet.root / "wheels.lock").entry(SECOND)
    assert {w.name: w.sha256 for w in written.wheels} == {
        w.name: w.sha256 for w in second.wheels or ()
    }
    assert all(w.matched for w in written.wheels)  # dist/pub-2 holds the files: compared
    assert any(p.startswith("lane: this host has bundle") for p in written.problems)
    found = fleet.run("jobs", "--wheel", fleet.second_wheel.name, "--stamps", str(stamps))
    assert found.exit_code == 0 and "job-1.json" in found.stdout, found.output

    # A hand edit anywhere in the record is refused, naming the line.
    text = (fleet.root / "lanes.lock").read_text()
    lines = text.splitlines()
    reason_line = next(
        n for n, line in enumerate(lines, 1) if line.startswith("reason = ") and "4711" in line
    )
    edited = text.replace(reason, "routine")
    (fleet.root / "lanes.lock").write_text(edited)
    refused = fleet.run("lanes")
    assert refused.exit_code == 2, refused.output
    header = max(n for n, line in enumerate(lines[:reason_line], 1) if line == "[[history]]")
    assert f"lanes.lock line {header}: history entry 5 (the last) was changed" in refused.stderr
    assert "git checkout -- lanes.lock" in refused.stderr
    headers = [n for n, line in enumerate(lines, 1) if line == "[[history]]"]
    earlier = text.replace(f'from = "{BUNDLE}"', 'from = "pub-0"', 1)  # entry 3's
    (fleet.root / "lanes.lock").write_text(earlier)
    refused = fleet.run("lanes", "--history")
    assert refused.exit_code == 2, refused.output
    assert f"line {headers[2]}: history entry 3 (line {headers[2]}) was changed" in refused.stderr
    assert f"entry 4 (line {headers[3]}) records another digest" in refused.stderr
    state = text.replace(
        f'[lanes.validation]\nbundle = "{SECOND}"', '[lanes.validation]\nbundle = "pub-9"'
    )
    assert state != text
    (fleet.root / "lanes.lock").write_text(state)
    refused = fleet.run("promote", "--bundle", SECOND)
    assert refused.exit_code == 2, refused.output
    at = lines.index("[lanes.validation]") + 1
    assert f"line {at}: lane validation's current state is not the one" in refused.stderr
    (fleet.root / "lanes.lock").write_text(text)
    assert fleet.run("lanes").exit_code == 0


def test_a_record_without_history_is_read_and_migrated(tmp_path: Path) -> None:
    (tmp_path / "lanes.lock").write_text(
        'lanes-lock-version = "1"\n\n[lanes.validation]\nbundle = "old"\n'
        'wheels = [{ name = "torch-2.9.0-py3-none-any.whl", sha256 = "ab" }]\n'
    )
    assert lanes.read_record(tmp_path).history == ()
    assert lanes.read_state(tmp_path)["validation"].bundle == "old"
    lanes.write_state(tmp_path, "validation", lanes.LaneState("new", (), None, None))
    record = lanes.read_record(tmp_path)
    assert [(e.action, e.previous_bundle, e.bundle) for e in record.history] == [
        ("recorded", None, "old"), ("publish", "old", "new"),
    ]  # fmt: skip
    assert record.states["validation"].bundle == "new"


@pytest.mark.slow
def test_status_reads_back_as_json_and_names_drift_and_a_down_index(fleet: Fleet) -> None:
    for bundle in (SECOND, BUNDLE):  # preferred served pub-2, serves pub-1 now
        for step in (("publish-lane",), ("promote", "--lane", "preferred")):
            assert fleet.run(*step, "--bundle", bundle).exit_code == 0
    lanes_toml = fleet.root / "build" / "lanes.toml"
    original = lanes_toml.read_text()
    # A policy that pub-2 does not meet today (it has no receipt), and a third lane whose
    # index is down (nothing listens on its port).
    lanes_toml.write_text(
        original + '\n[lanes.preferred.policy]\ndevice = "TPU"\nchecks = ["restart"]\n'
        f'\n[lanes.offline]\nindex-url = "http://127.0.0.1:{free_port()}/simple/"\n'
    )
    try:
        found = fleet.run("status", "--json", "--net-retries", "0")
    finally:
        lanes_toml.write_text(original)
    assert found.exit_code == 1, found.output  # the down index: named, the rest reported
    # The down index is asked once (--net-retries 0), named, and the rest still reported.
    assert "offline: unreachable" in found.stderr and "trying again" not in found.stderr
    report = json.loads(found.stdout)
    bundles = {b["name"]: b for b in report["bundles"]}
    assert bundles[BUNDLE]["built"] and "preferred" in bundles[BUNDLE]["served_by"]
    (why,) = bundles[SECOND]["refused"]["preferred"]
    assert why.startswith(f"receipt: no receipt for bundle {SECOND}")
    by_lane = {lane["name"]: lane for lane in report["lanes"]}
    assert by_lane["preferred"]["in-sync"] and by_lane["validation"]["in-sync"]
    assert by_lane["preferred"]["bundle"] == BUNDLE
    assert not by_lane["offline"]["reachable"] and "127.0.0.1" in by_lane["offline"]["problem"]

    # Drift: a file of the index changed, one added, one removed; each is named.
    packages = fleet.preferred.packages
    torch = next(packages.glob("torch-*.whl"))
    removed = packages / fleet.second_wheel.name
    saved = {p: p.read_bytes() for p in (torch, removed)}
    torch.write_bytes(saved[torch] + b"\0")
    removed.unlink()
    extra = packages / "torch-9.9.9-py3-none-any.whl"
    extra.write_bytes(saved[torch])
    try:
        drift = fleet.run("status")
    finally:
        extra.unlink()
        for path, data in saved.items():
            path.write_bytes(data)
    assert drift.exit_code == 1, drift.output
    assert "preferred (" in drift.stdout and "DRIFT" in drift.stdout
    assert f"extra (no entry of lanes.lock put it there): {extra.name}" in drift.stdout
    assert f"missing (lanes.lock says the lane received it): {removed.name}" in drift.stdout
    assert f"changed: {torch.name}: lanes.lock has sha256 {file_sha256_bytes(saved[torch])}" in (
        drift.stdout
    )
    assert "validation (" in drift.stdout and "lanes:\n" in drift.stdout
    assert fleet.run("status").exit_code == 0  # restored: in sync again
