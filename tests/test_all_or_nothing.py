"""Every write of several files is all or nothing, and a failed command leaves
``wheels.lock`` byte for byte as it was.

One helper (``filemode.write_all``: each file complete in a temporary file beside its
target, then all renamed, the ones already renamed put back if a later one fails) serves
the gate's two reports, ``make requirements`` (requirements.txt with the runtime wheels it
records in wheels.lock), ``make attest`` (one envelope per wheel) and ``launch-env``
(env.sh, env.json and the helper). Full and read-only disks are real: a small tmpfs
(``tests.test_disk_faults``' fixture; mounting needs root, else these skip, saying so).
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
)
from tests.test_disk_faults import (
    PAGE,
    MountTmpfs,
    assert_one_disk_error,
)
from tests.test_error_contract import project_copy
from tests.test_supply_attest import make_key
from tests.test_supply_attest import wheels as signed_wheels  # noqa: F401 - fixture
from xla_host import filemode
from xla_host.gate import child_workload
from xla_host.gate.report import REPORT_JSON, REPORT_JUNIT, write_reports
from xla_wheels.attestation import ENVELOPE_SUFFIX


def listing(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (hidden temporary ones too) and its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "ballast"
    }


# --- the helper ---------------------------------------------------------------------------


def test_write_all_on_a_full_disk_changes_no_file(tmpfs: MountTmpfs) -> None:
    fs = tmpfs("fs", 1 << 20)
    (fs.path / "a.txt").write_text("old a\n")
    (fs.path / "b.txt").write_text("old b\n")
    fs.fill(leave=PAGE)  # room for the new a, not for the new b
    with pytest.raises(OSError) as caught:
        filemode.write_all([(fs.path / "a.txt", "new a\n"), (fs.path / "b.txt", "b" * 3 * PAGE)])
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(fs.path / "b.txt")  # the file, not a temporary one
    assert listing(fs.path) == {"a.txt": b"old a\n", "b.txt": b"old b\n"}


def test_a_rename_that_fails_half_way_puts_back_the_files_already_renamed(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("old a\n")
    staged = filemode.stage_all(
        [(tmp_path / "a.txt", "new a\n"), (tmp_path / "b.txt", "new b\n"),
         (tmp_path / "c.txt", "new c\n")]
    )  # fmt: skip
    # The last rename fails: its new file is gone. (A directory in the way no longer gets
    # this far: it is refused before anything is written, tests/test_special_files.py.)
    staged[2].temporary.unlink()
    with pytest.raises(FileNotFoundError):
        filemode.commit_all(staged)
    assert listing(tmp_path) == {"a.txt": b"old a\n"}  # b.txt, new, is gone again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_write_all_replaces_every_file_readable_as_if_created(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old a\n")
    filemode.write_all([(tmp_path / "a.txt", "new a\n"), (tmp_path / "b.txt", b"new b\n")])
    assert listing(tmp_path) == {"a.txt": b"new a\n", "b.txt": b"new b\n"}
    umask = filemode.current_umask()
    assert {p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {0o666 & ~umask}


# --- the gate's reports --------------------------------------------------------------------


def test_the_gate_reports_on_a_full_disk_are_as_they_were_and_the_error_names_one(
    tmpfs: MountTmpfs,
) -> None:
    out = tmpfs("out", 1 << 20)
    write_reports(out.path, None, [], error="an earlier run")
    before = listing(out.path)
    out.fill(leave=0)
    with pytest.raises(OSError) as caught:
        write_reports(out.path, None, [], error="this run")
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename in (str(out.path / REPORT_JSON), str(out.path / REPORT_JUNIT))
    assert listing(out.path) == before  # not a 0-byte report.json, no temporary file
    assert json.loads(before[REPORT_JSON])["error"] == "an earlier run"


def test_the_gate_child_leaves_no_part_file_on_a_full_disk(tmpfs: MountTmpfs) -> None:
    runs = tmpfs("runs", 1 << 20)
    runs.fill(leave=0)
    with pytest.raises(OSError):
        child_workload._write(str(runs.path / "probe.json"), {"status": "ok"})
    assert listing(runs.path) == {}


# --- make requirements: wheels.lock with the file it records -----------------------------


@pytest.mark.slow
def test_requirements_into_a_read_only_dist_leave_wheels_lock_as_it_was(
    tmp_path: Path,
    tmpfs: MountTmpfs,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    read_only = tmpfs("dist", 16 << 20)
    dist = _dist_on(project, read_only.path)
    read_only.remount_read_only()
    lock = (project / "wheels.lock").read_bytes()
    # The lock records no runtime resolution yet: this run resolves one (pip, our two
    # wheels only: no index is asked) and would record it.
    assert b"runtime-wheels" not in lock
    result = run_cli(
        "requirements", "--bundle", BUNDLE, root=project, inherit_env=True, timeout=300
    )
    assert_one_disk_error(result, dist / "requirements.txt")
    assert (project / "wheels.lock").read_bytes() == lock
    assert sorted(p.name for p in project.iterdir()) == ["build", "dist", "patches", "wheels.lock"]


def _dist_on(project: Path, fs: Path) -> Path:
    """``dist/<bundle>`` moved onto the filesystem at ``fs`` (a link to it in its place)."""
    dist = project / "dist" / BUNDLE
    for wheel in dist.iterdir():
        shutil.move(wheel, fs / wheel.name)  # another filesystem: copied, then removed
    dist.rmdir()
    dist.symlink_to(fs)
    return dist


# --- make attest: one envelope per wheel, all or none -------------------------------------


@pytest.mark.slow
def test_attest_on_a_nearly_full_disk_leaves_no_envelope(
    tmp_path: Path,
    tmpfs: MountTmpfs,
    signed_wheels: list[Path],  # noqa: F811
) -> None:
    project = make_publish_project(tmp_path, signed_wheels)
    private, _ = make_key(tmp_path / "keys", "team")
    env = {"XLA_WHEELS_SIGNING_KEY": str(private)}
    dist = project / "dist" / BUNDLE
    # Once on a roomy disk, for the envelopes' sizes.
    signed = run_cli("attest", "--bundle", BUNDLE, root=project, env=env, inherit_env=True)
    assert signed.exit_code == 0, signed.output
    envelopes = sorted(dist.glob(f"*{ENVELOPE_SUFFIX}"))
    assert len(envelopes) == 2
    pages = max(-(-e.stat().st_size // PAGE) for e in envelopes)
    for envelope in envelopes:
        envelope.unlink()
    fs = tmpfs("dist", 16 << 20)
    _dist_on(project, fs.path)
    # Room for either envelope, never for both: whichever is written first, the second
    # finds the disk full.
    fs.fill(leave=pages * PAGE)
    lock = (project / "wheels.lock").read_bytes()
    result = run_cli("attest", "--bundle", BUNDLE, root=project, env=env, inherit_env=True)
    assert_one_disk_error(result, dist)
    assert sorted(p.name for p in fs.path.iterdir()) == sorted(
        [w.name for w in signed_wheels] + ["ballast"]
    )
    assert (project / "wheels.lock").read_bytes() == lock


# --- launch-env: env.sh, env.json and the helper, all or none (not listed in the issue) ---


def test_launch_env_on_a_nearly_full_disk_writes_none_of_its_files(
    tmp_path: Path,
    tmpfs: MountTmpfs,
) -> None:
    root = project_copy(tmp_path)
    manifest = root / "build" / "bundles" / "v6e-2.9.toml"
    manifest.write_text(manifest.read_text() + '\n[profiles.plain.device]\nPJRT_DEVICE = "TPU"\n')
    out = tmpfs("launch", 1 << 20)
    out.fill(leave=PAGE)  # env.sh fits, env.json does not
    result = run_cli(
        "launch-env", "--bundle", "v6e-2.9", "--profile", "plain", "--role", "reader",
        "--out", str(out.path), root=root, env={"HOME": str(root)},
    )  # fmt: skip
    assert_one_disk_error(result, out.path)
    assert listing(out.path) == {}
