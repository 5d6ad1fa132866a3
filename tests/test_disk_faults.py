"""Disk faults (a read-only filesystem, a full disk) are one `error:` and leave nothing half done.

On REAL filesystems: a small tmpfs mounted by the test (in its own tmp_path, unmounted at
teardown), remounted read-only or filled with a ballast file that leaves a chosen number
of bytes, under a real host-mode build of the synthetic upstream through the real CLI
(and make). Each run must exit 10 (``DiskError``) with one ``error:`` naming the path, no
traceback, no temporary file left, and ``dist/`` and ``wheels.lock`` byte for byte as
they were. Mounting needs root: elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult, run_cli
from tests.disk_support import PAGE, MountTmpfs
from tests.synthetic_upstream import Synthetic, cli_args
from xla_host.errors import DiskError
from xla_wheels.disk_faults import disk_error

HOST = ("--mode", "host", "--host-python", sys.executable)


def run_wheels(syn: Synthetic, *extra: str) -> CliResult:
    return run_cli(*cli_args(syn, *HOST, *extra), env={"HOME": str(syn.root.parent)}, timeout=600)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of ``dist/`` and ``wheels.lock``, and every hidden file in the root
    (a temporary lock file would show here), by path."""
    files = {p: p.read_bytes() for p in (root / "dist").rglob("*") if p.is_file()}
    files.update({p: p.read_bytes() for p in root.glob(".*") if p.is_file()})
    if (root / "wheels.lock").exists():
        files[root / "wheels.lock"] = (root / "wheels.lock").read_bytes()
    return {str(path.relative_to(root)): data for path, data in files.items()}


def assert_one_disk_error(result: CliResult, path: Path) -> str:
    """Exit 10, one `error:` line naming ``path`` and a `fix:`, no traceback."""
    assert result.exit_code == DiskError.exit_code, result.output
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert str(path) in errors[0], errors[0]
    assert "  fix: " in result.stderr
    return errors[0]


def timings(stderr: str) -> dict[str, str]:
    table = stderr.split("stage timings:", 1)[1].split("error:", 1)[0]
    rows = [line.split() for line in table.splitlines() if line.startswith("  ")]
    return {" ".join(row[:-2]): row[-1] for row in rows if len(row) >= 3}


def test_a_read_only_work_directory_is_an_error_naming_it(
    syn: Synthetic, tmpfs: MountTmpfs
) -> None:
    out = tmpfs("out", 1 << 20)
    out.remount_read_only()
    before = snapshot(syn.root)

    result = run_wheels(syn, "--out-dir", str(out.path))

    line = assert_one_disk_error(result, out.path / "syn")
    assert "Read-only file system" in line and "mounted read-only" in line
    assert f"mount -o remount,rw {out.path}" in result.stderr
    assert snapshot(syn.root) == before


def test_a_read_only_work_directory_through_make(tmpfs: MountTmpfs) -> None:
    """The case as reported: `make wheels` with the work directory on a read-only mount."""
    out = tmpfs("out", 1 << 20)
    out.remount_read_only()
    before = snapshot(REPO_ROOT)
    env = {key: value for key, value in os.environ.items() if not key.startswith("XLA_WHEELS_")}
    done = subprocess.run(
        ["make", "--no-print-directory", "wheels", "BUNDLE=v6e-2.11"],
        cwd=REPO_ROOT,
        env={**env, "XLA_WHEELS_OUT": str(out.path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # make reports the command's exit code in its own line: "make: *** [...] Error 10".
    assert "Error 10" in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(out.path / "v6e-2.11") in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert snapshot(REPO_ROOT) == before


@pytest.mark.parametrize("earlier_wheels", [True, False], ids=["replacing", "first"])
@pytest.mark.slow
def test_a_full_disk_at_wheels_lock_leaves_dist_and_the_lock_as_they_were(
    syn: Synthetic, tmpfs: MountTmpfs, tmp_path: Path, earlier_wheels: bool
) -> None:
    """dist/ is staged, then the lock cannot be written: both stay as they were, whether
    dist/syn held earlier wheels (which must come back) or none (the case reported: the
    wheels were in dist/, the lock was not written, its temporary file was left)."""
    fs = tmpfs("fs", 32 << 20)
    shutil.copytree(syn.root, fs.path / "project", symlinks=True)
    on_fs = Synthetic(fs.path / "project", syn.cache, syn.upstream, dict(syn.commits))
    work = ("--out-dir", str(tmp_path / "work"))
    first = run_wheels(on_fs, *work)
    assert first.exit_code == 0, first.stderr
    # New inputs (one torch_xla patch fewer): built once elsewhere into the shared stage
    # cache, so that the run on the tmpfs only stages, checks and records known wheels.
    fewer = ("torch_xla/0001-load-cache.patch",)
    syn.write_bundle(xla_patches=fewer)
    elsewhere = run_wheels(syn)
    assert elsewhere.exit_code == 0, elsewhere.stderr
    new_wheels = sorted((syn.root / "dist" / "syn").glob("*.whl"))
    on_fs.write_bundle(xla_patches=fewer)
    if not earlier_wheels:
        shutil.rmtree(on_fs.root / "dist")
    before = snapshot(on_fs.root)
    assert before["wheels.lock"] != (syn.root / "wheels.lock").read_bytes()
    # Room for exactly the staged copies of the new wheels: the lock's write is the one
    # that finds the disk full.
    fs.fill(sum(-(-wheel.stat().st_size // PAGE) * PAGE for wheel in new_wheels))

    result = run_wheels(on_fs, *work)

    line = assert_one_disk_error(result, on_fs.root / "wheels.lock")
    assert "No space left on device" in line and f"filesystem at {fs.path} is full" in line
    assert f"free space on {fs.path}" in result.stderr
    assert timings(result.stderr)["collect: wheels.lock"] == "failed"
    assert timings(result.stderr)["collect: ship check"] == "ran"
    # Nothing half done: the old wheels, the old lock, no staging, no temporary lock.
    assert snapshot(on_fs.root) == before
    if earlier_wheels:
        assert sorted(p.name for p in (on_fs.root / "dist").iterdir()) == ["syn"]
    else:
        assert not (on_fs.root / "dist").exists()


@pytest.mark.slow
def test_a_full_disk_in_the_ship_check_is_a_disk_error_not_a_verdict(
    syn: Synthetic, tmpfs: MountTmpfs
) -> None:
    first = run_wheels(syn)
    assert first.exit_code == 0, first.stderr
    # Both stages are cached now; without dist/syn the next run stages and checks again.
    shutil.rmtree(syn.root / "dist")
    before = snapshot(syn.root)
    out = tmpfs("out", 64 << 20)
    # Room for the run lock, the logs and the clean environment with the stand-in's small
    # wheels, not for what the check writes (real torch wheels fill it while installing).
    out.fill(1 << 20)
    writes_2_mib = "dd if=/dev/zero of={out}/scratch bs=1M count=2"

    result = run_wheels(
        syn, "--out-dir", str(out.path), "--min-disk-gib", "0", "--ship-check", writes_2_mib
    )

    line = assert_one_disk_error(result, out.path / "syn")
    assert "in the ship check" in line and "No space left on device" in line
    assert "ship check failed" not in result.output
    assert timings(result.stderr)["collect: ship check"] == "failed"
    assert snapshot(syn.root) == before
    assert not (syn.root / "dist").exists()


@pytest.mark.parametrize(
    ("code", "says", "fix"),
    [
        (errno.ENOSPC, "is full", "free space on"),
        (errno.EDQUOT, "quota", "within your quota"),
        (errno.EROFS, "mounted read-only", "remount"),
        (errno.EACCES, "may not write", "write access to"),
    ],
)
def test_each_disk_errno_is_a_disk_error_with_its_fix(
    tmp_path: Path, code: int, says: str, fix: str
) -> None:
    error = disk_error(OSError(code, os.strerror(code)), tmp_path / "wheels.lock")
    assert error is not None and error.exit_code == 10
    assert str(tmp_path / "wheels.lock") in error.message and says in error.message
    assert error.fix is not None and fix in error.fix


def test_other_errors_are_not_disk_errors(tmp_path: Path) -> None:
    assert disk_error(OSError(errno.ENOENT, "No such file"), tmp_path) is None
