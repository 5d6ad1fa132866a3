"""doctor: a training host checked against a bundle, without importing torch_xla."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.bundles import LIBTPU_RUNTIME
from tests.clirunner import CliResult, run_cli
from tests.publish_support import (
    BUNDLE,
    TORCH_VERSION,
    XLA_VERSION,
    build_wheel,
    host_venv,
    make_publish_project,
)
from xla_host.cache_role import decide
from xla_host.filemode import mount_of
from xla_host.host_doctor import check_cache, check_environment
from xla_host.host_probe import HostFacts
from xla_wheels.bundle import load_bundle
from xla_wheels.publish.doctor import DoctorReport, check_abi, check_versions
from xla_wheels.wheels_lock import read_lock

GOOD_ENV = {"PJRT_DEVICE": "TPU", "XLA_NO_SPECIAL_SCALARS": "1"}


def _doctor(project: Path, python: Path, env: dict[str, str]) -> CliResult:
    """``doctor --bundle BUNDLE --python python`` in ``project``, the shell's env plus ``env``."""
    args = ("doctor", "--bundle", BUNDLE, "--python", str(python))
    return run_cli(*args, env=env, root=project, inherit_env=True)


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    """torch + a torch_xla whose import leaves a marker file and fails."""
    work = tmp_path_factory.mktemp("poisoned")
    marker = work / "torch_xla-was-imported"
    init = f"open({str(marker)!r}, 'w').write('imported')\nraise RuntimeError('imported')\n"
    torch = build_wheel(work, "torch", TORCH_VERSION, "torch", {"__init__.py": ""})
    torch_xla = build_wheel(work, "torch_xla", XLA_VERSION, "torch_xla", {"__init__.py": init})
    return [torch, torch_xla], marker


@pytest.mark.slow
def test_healthy_host_passes_without_importing_torch_xla(
    tmp_path: Path, poisoned: tuple[list[Path], Path]
) -> None:
    wheels, marker = poisoned
    project = make_publish_project(tmp_path, wheels)
    python = host_venv(tmp_path, wheels)
    # The contract's directory: named after the bundle and the full torch_xla version.
    cache = tmp_path / f"xla_cache_{BUNDLE}_txla{XLA_VERSION}"
    cache.mkdir()
    env = {**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache)}
    result = _doctor(project, python, env)
    assert result.exit_code == 0, result.output
    assert "ok   torch-xla" in result.stdout and XLA_VERSION in result.stdout
    assert re.search(
        rf"ok +cache path build +{re.escape(str(cache))} names this build", result.stdout
    )
    assert re.search(rf"ok +cache path recommended +{re.escape(str(cache))}\n", result.stdout)
    assert "0 problem(s)" in result.stdout
    # This torch_xla is pure Python: the ABI check says it does not apply, never "ok".
    assert "WARN abi" in result.stdout and "not applicable: no _XLAC extension" in result.stdout
    assert not marker.exists(), "doctor imported torch_xla"


@pytest.mark.slow
def test_abi_check_of_a_real_installed_pair(stock_xla_python_29: Path) -> None:
    report = DoctorReport("b", str(stock_xla_python_29))
    check_abi(report, str(stock_xla_python_29))
    [finding] = report.findings
    assert (finding.status, finding.check) == ("ok", "abi")
    assert "symbols _XLAC imports from torch: all exported" in finding.detail


@pytest.mark.slow
def test_a_cache_path_that_does_not_name_the_build_fails_with_the_recommended_path(
    tmp_path: Path, poisoned: tuple[list[Path], Path]
) -> None:
    wheels, _ = poisoned
    project = make_publish_project(tmp_path, wheels)
    python = host_venv(tmp_path, wheels)
    cache = tmp_path / "xla-cache"
    cache.mkdir()
    env = {**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache), "XLA_WHEELS_ROLE": "reader"}
    result = _doctor(project, python, env)
    assert result.exit_code == 1, result.output
    recommended = tmp_path / f"xla_cache_{BUNDLE}_txla{XLA_VERSION}"
    assert "FAIL cache path build" in result.stdout
    assert f"fix: export XLA_PERSISTENT_CACHE_PATH={recommended}" in result.stdout
    assert "FAIL cache role" in result.stdout
    assert "fix: export XLA_PERSISTENT_CACHE_READ_ONLY=1" in result.stdout


@pytest.mark.slow
def test_misconfigured_host_lists_each_problem_and_fix(
    tmp_path: Path, poisoned: tuple[list[Path], Path]
) -> None:
    wheels, marker = poisoned
    project = make_publish_project(tmp_path, wheels)
    python = host_venv(tmp_path, wheels[:1])  # torch only: torch_xla is missing
    unset = {"PJRT_DEVICE": "", "XLA_NO_SPECIAL_SCALARS": "0", "XLA_PERSISTENT_CACHE_PATH": ""}
    result = _doctor(project, python, unset)
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "FAIL PJRT_DEVICE" in out and "fix: export PJRT_DEVICE=TPU" in out
    assert "FAIL XLA_NO_SPECIAL_SCALARS" in out and "export XLA_NO_SPECIAL_SCALARS=1" in out
    assert "FAIL XLA_PERSISTENT_CACHE_PATH" in out
    assert "FAIL torch-xla" in out and "not installed" in out
    assert "ok   torch" in out
    assert "doctor found 4 problem(s)" in result.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_wrong_version_is_reported(tmp_path: Path, poisoned: tuple[list[Path], Path]) -> None:
    wheels, _ = poisoned
    other = build_wheel(tmp_path, "torch_xla", "2.9.0", "torch_xla", {"__init__.py": ""})
    project = make_publish_project(tmp_path, wheels)
    python = host_venv(tmp_path, [wheels[0], other])
    cache = tmp_path / "c"
    cache.mkdir()
    env = {**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache)}
    result = _doctor(project, python, env)
    assert result.exit_code == 1, result.output
    assert "FAIL torch-xla" in result.stdout
    assert f"2.9.0 installed, bundle has {XLA_VERSION}" in result.stdout


def _mountinfo(point: Path, fstype: str) -> str:
    return (
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        f"40 22 0:50 / {point} rw,relatime shared:9 - {fstype} filer:/export rw\n"
    )


def _findings(env: dict[str, str], mountinfo: str, role: str | None = None) -> dict[str, str]:
    report = DoctorReport("b", "python")
    # The role as every doctor decides it: by the one rule (xla_host.cache_role).
    check_environment(report, env, decide(role, env), mountinfo=mountinfo)
    return {f.check: f"{f.status} {f.detail} | {f.fix}" for f in report.findings}


def test_mount_of_picks_the_longest_mount_point(tmp_path: Path) -> None:
    info = _mountinfo(tmp_path, "nfs4")
    assert mount_of(tmp_path / "cache", info) == (str(tmp_path), "nfs4")
    assert mount_of(Path("/var/elsewhere"), info) == ("/", "ext4")


@pytest.mark.parametrize(
    ("extra", "role", "expected"),
    [
        ({}, "reader", "FAIL"),  # a reader that may write the shared cache
        ({"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}, "reader", "ok"),
        ({}, "writer", "ok"),
        ({"XLA_PERSISTENT_CACHE_READ_ONLY": "1"}, "writer", "FAIL"),  # nobody writes
        ({"TPU_WORKER_ID": "3"}, None, "FAIL"),  # worker 3 is a reader by convention
        ({"TPU_WORKER_ID": "0"}, None, "ok"),
        ({}, None, "WARN"),  # unknown role: warn that only one host may write
    ],
)
def test_shared_cache_mount_roles(
    tmp_path: Path, extra: dict[str, str], role: str | None, expected: str
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache), **extra}
    findings = _findings(env, _mountinfo(tmp_path, "nfs4"), role)
    assert findings["cache sharing"].startswith(expected), findings
    if expected == "FAIL" and not extra.get("XLA_PERSISTENT_CACHE_READ_ONLY"):
        assert "XLA_PERSISTENT_CACHE_READ_ONLY=1" in findings["cache sharing"]


def test_local_cache_and_missing_directory(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache)}
    findings = _findings(env, _mountinfo(tmp_path / "other", "nfs4"))
    assert findings["XLA_PERSISTENT_CACHE_PATH"].startswith("ok")
    assert findings["cache sharing"].startswith("ok local ext4")

    env["XLA_PERSISTENT_CACHE_PATH"] = str(tmp_path / "absent")
    findings = _findings(env, "")
    assert findings["XLA_PERSISTENT_CACHE_PATH"].startswith("FAIL")
    assert f"mkdir -p {tmp_path / 'absent'}" in findings["XLA_PERSISTENT_CACHE_PATH"]


@pytest.mark.parametrize(("fstype", "failed"), [("nfs4", "cache sharing"), ("ext4", "cache role")])
def test_a_reader_that_may_write_is_one_finding(tmp_path: Path, fstype: str, failed: str) -> None:
    # On a shared mount "cache sharing" names the mount and the role's source; the cache
    # contract's "cache role" says the same thing, so only a local mount gets it.
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**GOOD_ENV, "XLA_PERSISTENT_CACHE_PATH": str(cache)}
    report = DoctorReport("b", "python")
    reader = decide("reader", env)
    check_environment(report, env, reader, mountinfo=_mountinfo(tmp_path, fstype))
    check_cache(report, "b", {}, env, reader)
    assert [f.check for f in report.failed] == [failed]
    assert "XLA_PERSISTENT_CACHE_READ_ONLY=1" in report.failed[0].fix


def test_a_dev_release_of_the_minimum_is_older_than_the_minimum(tmp_path: Path) -> None:
    # pip's ">=0.0.24" refuses 0.0.24.dev20250601 (a pre-release of 0.0.24); so does doctor.
    project = make_publish_project(tmp_path, [], runtime=LIBTPU_RUNTIME)
    bundle = load_bundle(project, BUNDLE)
    lock = read_lock(project / "wheels.lock")
    found = {}
    for libtpu in ("0.0.24.dev20250601", "0.0.24", "0.0.24.post1", "0.0.36"):
        facts = HostFacts("python", "3.11", {"libtpu": libtpu}, {}, None, None, None, ())
        report = DoctorReport(BUNDLE, "python")
        check_versions(report, bundle, facts, lock)
        [finding] = [f for f in report.findings if f.check == "libtpu"]
        found[libtpu] = finding.status
    assert found == {
        "0.0.24.dev20250601": "FAIL",
        "0.0.24": "WARN",  # meets the minimum, not the preferred version
        "0.0.24.post1": "WARN",
        "0.0.36": "ok",
    }
