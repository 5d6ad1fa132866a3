"""Two publishes into one lane at once keep both: every history entry and every index entry.

``publish-lane --bundle pub-1 & publish-lane --bundle pub-2`` into one static lane used to
both exit 0 while ``lanes.lock`` kept one entry (the second read the record before the
first wrote it), and two checkouts sharing a lane lost index entries (each rebuilt the
index from the wheels it saw). A run now holds the lane (its directory) and ``lanes.lock``
for its whole read-modify-write, and the history chain refuses to record over an entry it
did not read.

Real CLI code (``xla_wheels.cli.main``) in forked processes started together, real wheels
(the publish tests' stand-ins), real files.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    XLA_VERSION,
    FakeWheels,
    build_wheel,
    make_publish_project,
    manifest_text,
)
from tests.test_error_contract import assert_bad_input
from tests.test_special_files import guarded_fifo
from xla_host.filemode import file_sha256
from xla_wheels.bundle import load_bundle
from xla_wheels.cli import main
from xla_wheels.release import lanes
from xla_wheels.release.lanes import LaneError, LaneState
from xla_wheels.wheels_lock import WheelRecord, record_wheels, update_bundle_entry

SECOND = "pub-2"
TRIES = 20
LANES_TOML = 'publish-lane = "validation"\n\n[lanes.validation]\npath = "{path}"\n'


def _add_bundle(project: Path, bundle: str, wheels: list[Path]) -> None:
    (project / "build" / "bundles" / f"{bundle}.toml").write_text(
        manifest_text(bundle, xla_version="2.9.1")
    )
    loaded = load_bundle(project, bundle)
    update_bundle_entry(
        project / "wheels.lock", loaded, {c.name: c.commit for c in loaded.components.values()},
        project,
    )  # fmt: skip
    dist = project / "dist" / bundle
    dist.mkdir(parents=True)
    for wheel in wheels:
        shutil.copyfile(wheel, dist / wheel.name)
    records = [WheelRecord(w.name, w.stat().st_size, file_sha256(w)) for w in wheels]
    record_wheels(project / "wheels.lock", bundle, records)


@pytest.fixture(scope="module")
def checkouts(
    fake_wheels: FakeWheels,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, Path, Path]:
    """Two checkouts, each with both bundles locked, and the one lane they share."""
    work = tmp_path_factory.mktemp("lanes")
    newer = XLA_VERSION.replace("2.9.0", "2.9.1")
    second = build_wheel(
        work / "second", "torch_xla", newer, "torch_xla",
        {"__init__.py": f'__version__ = "{newer}"\n'},
    )  # fmt: skip
    shared = work / "shared-lane"
    roots = []
    for name in ("a", "b"):
        root = make_publish_project(work / name, [fake_wheels.torch, fake_wheels.torch_xla])
        _add_bundle(root, SECOND, [fake_wheels.torch, second])
        (root / "build" / "lanes.toml").write_text(LANES_TOML.format(path=shared))
        roots.append(root)
    return roots[0], roots[1], shared


def _together(*runs: Callable[[], int]) -> list[int]:
    """Each run in a forked process, all let go at once; their exit codes."""
    ready, go = os.pipe()
    children = []
    for run in runs:
        pid = os.fork()
        if pid == 0:  # the child: wait for the start, run, and leave without cleanup
            code = 70
            try:
                os.close(go)
                os.read(ready, 1)
                code = run()
            finally:
                os._exit(code)
        children.append(pid)
    os.close(ready)
    os.close(go)  # EOF: every child starts now
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]


def _publish(root: Path, bundle: str) -> Callable[[], int]:
    return lambda: main(["publish-lane", "--bundle", bundle, "--root", str(root)])


def _fresh(*roots: Path, lane: Path) -> None:
    shutil.rmtree(lane, ignore_errors=True)
    for root in roots:
        (root / lanes.LANES_LOCK).unlink(missing_ok=True)


@pytest.mark.slow
def test_two_publishes_into_one_lane_at_once_keep_both_history_entries(
    checkouts: tuple[Path, Path, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    root, _, lane = checkouts
    for attempt in range(TRIES):
        _fresh(root, lane=lane)
        assert _together(_publish(root, BUNDLE), _publish(root, SECOND)) == [
            0,
            0,
        ], capfd.readouterr().err
        record = lanes.read_record(root)  # the chain holds, too
        published = sorted(entry.bundle for entry in record.history)
        assert published == [BUNDLE, SECOND], f"try {attempt + 1}: {published}"


@pytest.mark.slow
def test_two_checkouts_publishing_into_one_lane_at_once_keep_every_index_entry(
    checkouts: tuple[Path, Path, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    first, second, lane = checkouts
    for attempt in range(TRIES):
        _fresh(first, second, lane=lane)
        assert _together(_publish(first, BUNDLE), _publish(second, SECOND)) == [
            0,
            0,
        ], capfd.readouterr().err
        page = (lane / "simple" / "torch-xla" / "index.html").read_text()
        served = sorted(name for name in os.listdir(lane) if name.startswith("torch_xla-"))
        assert len(served) == 2, served
        for name in served:
            assert name in page, f"try {attempt + 1}: the index lost {name}"


def test_a_record_that_moved_since_it_was_read_is_refused_not_written_over(
    checkouts: tuple[Path, Path, Path],
) -> None:
    # A writer that did not hold the lane (an older checkout of the pipeline) recorded an
    # entry after this run read the head: recording now would lose it.
    root, _, lane = checkouts
    _fresh(root, lane=lane)
    config = lanes.load_config(root)
    state = LaneState(BUNDLE, (), None, None)
    with lanes.lane_lock(root, config.lane("validation")) as head:
        lanes.write_state(root, "other", LaneState(SECOND, (), None, None))  # behind its back
        with pytest.raises(LaneError, match="lanes.lock changed while this publish") as refused:
            lanes.write_state(root, "validation", state, expected_head=head)
    assert "make lanes HISTORY=1" in (refused.value.fix or "")
    assert [entry.bundle for entry in lanes.read_record(root).history] == [SECOND]


def test_a_fifo_in_a_shared_lane_is_refused_by_publish_and_status_before_anything_changes(
    checkouts: tuple[Path, Path, Path],
) -> None:
    # Hashing the lane's wheels opened a FIFO there and waited forever (`status`,
    # `publish-lane`). Now it is refused from its stat, before a wheel is copied.
    root, _, lane = checkouts
    _fresh(root, lane=lane)
    lane.mkdir()
    planted = lane / "planted-1.0-py3-none-any.whl"
    with guarded_fifo(planted) as guard:
        for args in (("publish-lane", "--bundle", BUNDLE), ("status",)):
            result = run_cli(*args, root=root, timeout=120)
            assert_bad_input(result, str(planted), "is a FIFO")
        assert sorted(p.name for p in lane.iterdir()) == [planted.name]
        assert not (root / lanes.LANES_LOCK).exists()
    assert guard.readers == 0
