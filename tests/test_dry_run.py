"""A dry run prints what would be done and changes nothing; a subcommand without one
refuses the flag (and the environment's XLA_WHEELS_DRY_RUN) instead of acting.

"Nothing changed" is judged on everything a run could touch: every file under the project
(dist/, out/, wheels.lock) by content, the index's packages (a real pypiserver on
127.0.0.1) and the per-machine cache (a fresh XLA_WHEELS_CACHE that must stay absent).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    IndexServer,
    make_publish_project,
)
from xla_host.arguments import RefusedSwitchAction
from xla_wheels.cli import COMMANDS, build_parser
from xla_wheels.settings_rows import by_flag

#: The subcommands that honour --dry-run (its row of the settings table says which, for
#: the documentation); every other one must reject the flag.
HONOURS_DRY_RUN = set(by_flag("--dry-run").commands)


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its sha256 (and every directory)."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if path.is_dir():
            found[relative + "/"] = "dir"
        else:
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Path:
    return make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_either_honours_dry_run_or_rejects_it(name: str) -> None:
    parser = build_parser(name)
    subparsers = next(a for a in parser._actions if a.dest == "command")
    sub = subparsers.choices[name]  # type: ignore[attr-defined]
    # Elsewhere --dry-run is hidden and takes only an off value (DRY_RUN=0 through make).
    action = sub._option_string_actions.get("--dry-run")
    honours = action is not None and not isinstance(action, RefusedSwitchAction)
    assert honours == (name in HONOURS_DRY_RUN), name


@pytest.mark.slow
def test_requirements_rejects_the_flag_and_the_environment(project: Path) -> None:
    before = _snapshot(project)
    flag = run_cli("requirements", "--bundle", BUNDLE, "--dry-run", root=project)
    assert flag.exit_code == 2 and "requirements has no dry run" in flag.stderr
    env = run_cli(
        "verify-install", "--bundle", BUNDLE, root=project, env={"XLA_WHEELS_DRY_RUN": "1"}
    )
    assert env.exit_code == 2, env.output
    assert "verify-install has no dry run" in env.stderr
    assert "fix: unset XLA_WHEELS_DRY_RUN" in env.stderr
    assert "Traceback" not in flag.output + env.output
    assert _snapshot(project) == before


def test_publish_dry_run_reads_the_index_and_uploads_nothing(
    project: Path,
    index_server: IndexServer,
    tmp_path: Path,
) -> None:
    before = _snapshot(project)
    cache = tmp_path / "machine-cache"
    result = run_cli(
        "publish", "--bundle", BUNDLE, "--index-url", index_server.url, "--dry-run",
        env={**index_server.credentials, "XLA_WHEELS_CACHE": str(cache)}, root=project,
        inherit_env=True,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.count("would-upload") == 2
    assert "DRY_RUN: nothing uploaded or written" in result.stdout
    assert list(index_server.packages.iterdir()) == []
    assert _snapshot(project) == before  # no publish.log, no static index
    assert not cache.exists()


def test_make_publish_dry_run_writes_no_static_index(project: Path, tmp_path: Path) -> None:
    before = _snapshot(project)
    cache = tmp_path / "machine-cache"
    result = run_cli(
        "publish", "--bundle", BUNDLE, root=project,
        env={"XLA_WHEELS_DRY_RUN": "1", "XLA_WHEELS_CACHE": str(cache)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.count("would-index") == 2
    assert _snapshot(project) == before
    assert not cache.exists()


def test_lock_dry_run_leaves_the_lock_byte_identical(project: Path, tmp_path: Path) -> None:
    # A manifest edit makes the real `lock` rewrite the entry; the dry run must not.
    manifest = project / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + "\n# edited\n")
    before = _snapshot(project)
    cache = tmp_path / "machine-cache"
    env = {"XLA_WHEELS_CACHE": str(cache)}
    dry = run_cli("lock", "--bundle", BUNDLE, "--dry-run", root=project, env=env)
    assert dry.exit_code == 0, dry.output
    assert f"DRY_RUN: would write bundle {BUNDLE} in wheels.lock; unchanged" in dry.stdout
    assert _snapshot(project) == before
    assert not cache.exists()
    real = run_cli("lock", "--bundle", BUNDLE, root=project, env=env)
    assert real.exit_code == 0, real.output
    assert _snapshot(project) != before  # the real run does write: the check can fail


@pytest.mark.parametrize(
    ("command", "last"), [("sources", "sources"), ("patch", "patches"), ("wheels", "collect")]
)
def test_stage_dry_run_prints_the_plan_up_to_that_stage(
    command: str, last: str, tmp_path: Path
) -> None:
    cache = tmp_path / "machine-cache"
    out = tmp_path / "out"
    result = run_cli(
        command, "--bundle", "v6e-2.9", "--dry-run", "--out-dir", str(out), root=REPO_ROOT,
        env={"XLA_WHEELS_CACHE": str(cache)},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    stages = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    assert stages[-1] == last, stages
    if command != "wheels":
        assert "preflight" not in stages and "build" not in stages
    assert not cache.exists() and not out.exists()


@pytest.mark.parametrize(
    "target",
    [
        ("publish", "BUNDLE=x", "INDEX_URL=http://127.0.0.1:1/simple/"),
        ("publish", "BUNDLE=x"),
        ("lock", "BUNDLE=x"),
        ("requirements", "BUNDLE=x"),
        ("requirements",),
        ("verify-install", "BUNDLE=x"),
        ("sources", "BUNDLE=x"),
        ("promote", "BUNDLE=x"),
    ],
)
def test_make_passes_dry_run_to_every_target_that_writes(target: tuple[str, ...]) -> None:
    # Honoured where the subcommand has a dry run, rejected (exit 2) where it has none:
    # never silently dropped so that the target runs for real.
    process = subprocess.run(
        ["make", "-n", "--no-print-directory", *target, "DRY_RUN=1"], cwd=REPO_ROOT,
        text=True, capture_output=True, check=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert "--dry-run" in process.stdout.strip().splitlines()[-1]


def _wheels(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "wheels", "BUNDLE=v6e-2.9", "BUILD_MODE=host", *flags],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=120, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
             "XLA_WHEELS_OUT": str(tmp_path / "out"), "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip


def test_make_wheels_dry_run_says_the_real_run_would_be_blocked(tmp_path: Path) -> None:
    # The dry run printed the plan and exit 0, while the real run stopped at preflight.
    missing = str(tmp_path / "no-such-python")
    dry = _wheels(tmp_path, f"HOST_PYTHON={missing}", "DRY_RUN=1")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    verdict = dry.stdout.split("preflight now: ", 1)[1]
    assert verdict.startswith("the real run would stop: "), verdict
    assert f"host mode: `{missing}` is not on PATH" in verdict
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
    real = _wheels(tmp_path, f"HOST_PYTHON={missing}")
    assert f"host mode: `{missing}` is not on PATH" in real.stderr
    assert real.stderr.rstrip().endswith("Error 1")  # make's last line: the CLI's exit 1


def test_make_wheels_dry_run_says_when_preflight_finds_no_blocker(tmp_path: Path) -> None:
    # A host interpreter of the bundle's Python, whatever this machine's python3 is.
    python = tmp_path / "python3.13"
    python.write_text("#!/bin/sh\necho 3.13\n")
    python.chmod(0o755)
    dry = subprocess.run(
        [sys.executable, "-m", "xla_wheels", "wheels", "--bundle", "v6e-2.9", "--dry-run",
         "--mode", "host", "--host-python", str(python), "--host-tools", "git", "--jobs", "1",
         "--min-disk-gib", "0", "--mem-per-job-gib", "0", "--mem-base-gib", "0"],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=120, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
             "XLA_WHEELS_OUT": str(tmp_path / "out"), "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.rstrip().splitlines()[-1] == (
        "preflight now: no blocker found (pins, engine or host tools, disk, memory); "
        "the remotes are checked by the real run"
    )


def test_the_memory_blockers_fix_proposes_jobs_this_machine_has_cores_for(tmp_path: Path) -> None:
    # It proposed as many jobs as the memory holds (JOBS=19 on a 2-core machine).
    dry = subprocess.run(
        [sys.executable, "-m", "xla_wheels", "wheels", "--bundle", "v6e-2.9", "--dry-run",
         "--mode", "host", "--jobs", "4096", "--mem-per-job-gib", "0.01", "--mem-base-gib", "0"],
        cwd=REPO_ROOT, text=True, capture_output=True, timeout=120, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
             "XLA_WHEELS_OUT": str(tmp_path / "out"), "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    (memory,) = [line for line in dry.stdout.splitlines() if line.startswith("  - memory: ")]
    (proposed,) = re.findall(r"JOBS=([0-9]+)`", memory)
    assert 1 <= int(proposed) <= (os.cpu_count() or 1), memory
