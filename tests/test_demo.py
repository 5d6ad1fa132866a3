"""`make demo`: the whole path on a demonstration upstream, as the README tells a newcomer.

Run through make itself (the command the README gives), with HTTP(S) proxies pointing at a
closed port, so any attempt to reach the network would fail the run, and with HOME and
TMPDIR in a directory that must stay empty: the demo writes only under DEMO_DIR.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.demo import MARKER, _summary
from xla_wheels.run_lock import LOCK_NAME, bundle_run_lock

DEAD_PROXY = "http://127.0.0.1:9"
DEMO_TIMEOUT_S = 600


def _make_demo(demo_dir: Path, outside: Path) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    env.update(
        {
            "HOME": str(outside / "home"),
            "TMPDIR": str(outside / "tmp"),
            **{
                name: DEAD_PROXY
                for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
            },
        }
    )
    return subprocess.run(
        ["make", "--no-print-directory", "demo", f"DEMO_DIR={demo_dir}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S,
        check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_make_demo_runs_every_stage_offline_and_writes_only_under_demo_dir(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    (outside / "home").mkdir(parents=True)
    (outside / "tmp").mkdir()
    demo_dir = tmp_path / "demo"
    result = _make_demo(demo_dir, outside)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for stage in ("make wheels", "make publish", "make verify-install", "make doctor"):
        assert stage in out
    assert "NOT PyTorch" in out and "every stage passed" in out
    assert f"{demo_dir}/logs/" in out  # where to look
    checks = [line for line in out.splitlines() if line.strip().startswith(("ok ", "WARN "))]
    assert len(checks) == len(set(checks)) and len(checks) > 10, out  # each check once

    project = demo_dir / "project"
    lock = tomllib.loads((project / "wheels.lock").read_text())
    wheels = {w["name"] for w in lock["bundles"]["demo"]["wheels"]}
    assert {parse_wheel_name(w).project for w in wheels} == {"torch", "torch_xla"}
    lanes = tomllib.loads((project / "lanes.lock").read_text())
    assert lanes["lanes"]["validation"]["bundle"] == "demo"
    report = json.loads((project / "out" / "demo" / "verify-install" / "report.json").read_text())
    assert report["passed"] is True, report
    # The demonstration package says what it is, in the installed code itself.
    venv = project / "out" / "demo" / "verify-install" / "venv"
    (init,) = venv.glob("lib/python*/site-packages/torch_xla/__init__.py")
    assert "NOT PyTorch/XLA" in init.read_text()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo", "outside"]
    assert list((outside / "home").iterdir()) == [] and list((outside / "tmp").iterdir()) == []

    # A second run replaces its own directory; a directory that is not a demo's is refused.
    stranger = tmp_path / "not-a-demo"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine\n")
    refused = _make_demo(stranger, outside)
    assert refused.returncode == 2, refused.stderr  # bad input, as make reports any failure
    assert "error: " in refused.stderr and "is not a previous demo's directory" in refused.stderr
    assert "fix: name an empty or new directory" in refused.stderr
    assert (stranger / "keep.txt").read_text() == "mine\n"


def _previous_demo(directory: Path) -> dict[str, str]:
    """A directory as a demo leaves it (its marker and a log); returns what it holds."""
    (directory / "logs").mkdir(parents=True)
    (directory / MARKER).write_text("written by `make demo`\n")
    (directory / "logs" / "1-wheels.log").write_text("the first demo's log\n")
    return _contents(directory)


def _contents(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): p.read_text() for p in directory.rglob("*") if p.is_file()
    }


SWITCH_VALUES = "(on: 1/true/yes/on/y; off: 0/false/no/off/n or empty; any case)"


@pytest.mark.parametrize(
    ("argv", "env", "error", "fix"),
    [
        # Asked for a dry run: refused, never ignored.
        (["DRY_RUN=1"], {}, "DRY_RUN: demo has no dry run", "make demo DEMO_DIR={dir}"),
        (["DRY_RUN=yes"], {}, "DRY_RUN: demo has no dry run", "make demo DEMO_DIR={dir}"),
        ([], {"XLA_WHEELS_DRY_RUN": "1"}, "demo has no dry run, and XLA_WHEELS_DRY_RUN is set",
         "unset XLA_WHEELS_DRY_RUN to run it for real"),
        # Not a switch value at all: the value is what is named.
        (["DRY_RUN=maybe"], {}, f"DRY_RUN: 'maybe' is not a switch value {SWITCH_VALUES}",
         "make demo DEMO_DIR={dir}"),
        ([], {"XLA_WHEELS_DRY_RUN": "maybe"},
         f"XLA_WHEELS_DRY_RUN='maybe' is not a switch value {SWITCH_VALUES} (the variable "
         "of --dry-run)", "set XLA_WHEELS_DRY_RUN=1 or XLA_WHEELS_DRY_RUN=0, or unset it"),
    ],
)  # fmt: skip
def test_make_demo_refuses_a_dry_run_and_leaves_the_directory_as_it_was(
    argv: list[str], env: dict[str, str], error: str, fix: str, tmp_path: Path
) -> None:
    # It once deleted and rebuilt the demo directory: the demo has no dry run.
    demo_dir = tmp_path / "demo"
    before = _previous_demo(demo_dir)
    result = subprocess.run(
        ["make", "--no-print-directory", "demo", f"DEMO_DIR={demo_dir}", *argv],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert lines[:2] == [f"error: {error}", f"  fix: {fix.format(dir=demo_dir)}"], lines
    assert "Traceback" not in result.stderr
    assert _contents(demo_dir) == before and result.stdout == ""


def test_a_second_demo_in_one_directory_is_refused_while_the_first_runs(
    tmp_path: Path,
) -> None:
    # The second once deleted the first one's directory under it (a traceback in the
    # first), or left the first pointing at logs it now wrote.
    demo_dir = tmp_path / "demo"
    before = _previous_demo(demo_dir)
    with bundle_run_lock(tmp_path, "demo", "make demo (the first)"):
        result = subprocess.run(
            [sys.executable, "-m", "xla_wheels.demo", "--dir", str(demo_dir)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        )  # fmt: skip
        assert result.returncode == 5, result.stdout + result.stderr
        assert result.stderr.splitlines()[0] == (
            f"error: another demo is running in {demo_dir} (pid and command: "
            f"{os.getpid()} make demo (the first))"
        )
        assert "DEMO_DIR=<dir>" in result.stderr
        holder = f"{os.getpid()} make demo (the first)\n"
        assert _contents(demo_dir) == {**before, LOCK_NAME: holder}
    assert _contents(demo_dir) == before  # the first run's lock is gone with it


def test_a_stage_that_prints_its_checks_twice_is_summarised_once(tmp_path: Path) -> None:
    # verify-install prints each check as it runs and again in its closing table: the
    # demo showed the block twice.
    log = tmp_path / "3-verify-install.log"
    log.write_text(
        "==> verify-install: pip install\n"
        "  ok      install: 2 pinned file(s) by sha256\n"
        "  ok      version torch: installed 2.9.0, locked 2.9.0\n"
        "verify-install demo: PASSED\n"
        "  ok      install            2 pinned file(s) by sha256\n"
        "  ok      version torch      installed 2.9.0, locked 2.9.0\n"
        "  WARN    abi                not applicable\n"
        "  fix: reinstall torch_xla from a Linux wheel\n"
        "  WARN    abi torch          not applicable\n"
        "  fix: reinstall torch_xla from a Linux wheel\n"
    )
    assert _summary(log) == [
        "verify-install demo: PASSED",
        "ok      install            2 pinned file(s) by sha256",
        "ok      version torch      installed 2.9.0, locked 2.9.0",
        # Equal fixes of two checks both stay, each under its own.
        "WARN    abi                not applicable",
        "fix: reinstall torch_xla from a Linux wheel",
        "WARN    abi torch          not applicable",
        "fix: reinstall torch_xla from a Linux wheel",
    ]
