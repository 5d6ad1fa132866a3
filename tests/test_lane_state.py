"""What a lane serves is one state: its install lists follow every move of the lane, a
list of another bundle is a FAILURE, and the runbook's two install lines work pasted.

Real parts only: static lanes written by the CLI (two bundles of the publish tests'
stand-in wheels, the second a newer torch_xla build), the host wheel built from ``host/``,
a lane served by ``python -m http.server`` on loopback, and pip installing into fresh
venvs exactly the lines the runbook (docs/on-a-tpu-host.md) and ``xla-host doctor`` print.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    XLA_VERSION,
    FakeWheels,
    build_wheel,
    make_publish_project,
)
from tests.servers import start_directory_server, stop
from tests.test_host_from_lane import (
    contract_environment,
)
from tests.test_release_history import SECOND, _add_second_bundle
from xla_wheels.release import lanes

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNBOOK = REPO_ROOT / "docs" / "on-a-tpu-host.md"
#: The lane address the runbook's lines are written for.
RUNBOOK_LANE = "https://lanes.corp/validation/"


def _project(tmp_path: Path, wheels: FakeWheels, host: Path | None = None) -> Path:
    """Two bundles locked (BUNDLE and SECOND, another torch_xla), one static lane."""
    project = make_publish_project(tmp_path, [wheels.torch, wheels.torch_xla])
    newer = XLA_VERSION.replace("2.9.0", "2.9.1")
    second = build_wheel(
        tmp_path / "second", "torch_xla", newer, "torch_xla",
        {"__init__.py": f'__version__ = "{newer}"\n'},
    )  # fmt: skip
    _add_second_bundle(project, wheels.torch, second)
    if host is not None:
        (project / "dist" / "host").mkdir(parents=True)
        shutil.copyfile(host, project / "dist" / "host" / host.name)
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
    )
    return project


def _torch_xla_sha(project: Path, bundle: str) -> str:
    (sha,) = (s for n, s in lanes.read_state(project)["validation"].wheels if "torch_xla" in n)
    assert lanes.read_state(project)["validation"].bundle == bundle
    return sha


@pytest.mark.slow
def test_the_install_list_follows_publish_publish_rollback_and_a_stale_one_fails_status(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = _project(tmp_path, fake_wheels)
    lane = project / "dist" / "lanes" / "validation"
    requirements = lane / "requirements.txt"
    seen: dict[str, str] = {}
    steps = [
        (BUNDLE, ("publish-lane", "--bundle", BUNDLE)),
        (SECOND, ("publish-lane", "--bundle", SECOND)),
        (BUNDLE, ("rollback", "--lane", "validation", "--to", BUNDLE, "--reason", "incident")),
    ]
    for bundle, step in steps:
        done = run_cli(*step, root=project, inherit_env=True)
        assert done.exit_code == 0, done.output
        sha = _torch_xla_sha(project, bundle)
        text = requirements.read_text()
        # The list the runbook installs names the bundle the lane serves now, and its wheels.
        assert f"# Hash-pinned requirements of bundle {bundle} " in text
        assert f"--hash=sha256:{sha}" in text
        others = {s for b, s in seen.items() if b != bundle}
        assert not any(f"--hash=sha256:{s}" in text for s in others), text
        seen[bundle] = sha
        status = run_cli("status", root=project, inherit_env=True)
        assert status.exit_code == 0, status.output
        assert f"validation ({lane}): serves {bundle}; in sync with lanes.lock" in status.stdout

    # By hand: the list of the bundle the lane served before, beside lanes.lock's BUNDLE.
    text = requirements.read_text()
    stale = text.replace(f"bundle {BUNDLE} ", f"bundle {SECOND} ").replace(
        seen[BUNDLE], seen[SECOND]
    )
    requirements.write_text(stale)
    status = run_cli("status", root=project, inherit_env=True)
    assert status.exit_code == 1, status.output
    assert f"serves {BUNDLE}; FAILURE" in status.stdout and "in sync" not in status.stdout
    assert (
        f"FAILURE: {requirements} installs bundle {SECOND}, not {BUNDLE} (pins 1 of its 2 "
        "wheels); fix: make requirements LANE=validation" in status.stdout
    ), status.stdout
    as_json = run_cli("status", "--json", root=project, inherit_env=True)
    (found,) = json.loads(as_json.stdout)["lanes"]
    assert as_json.exit_code == 1 and found["in-sync"] is False
    assert [line.split(" installs ")[0] for line in found["stale"]] == [str(requirements)]
    # The fix it names works: the lane's lists are the bundle's again.
    fixed = run_cli("lane-requirements", "--lane", "validation", root=project, inherit_env=True)
    assert fixed.exit_code == 0, fixed.output
    assert requirements.read_text() == text
    assert run_cli("status", root=project, inherit_env=True).exit_code == 0


def _runbook_lines() -> tuple[str, str]:
    """The runbook's two pip lines, continuation lines joined: (training env, host only)."""
    section = RUNBOOK.read_text().split("## Runbook", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    found = [" ".join(line.split()) for line in joined.splitlines() if line.startswith("pip ")]
    (training,) = [line for line in found if "--no-deps" not in line]
    (host_only,) = [line for line in found if "--no-deps" in line]
    return training, host_only


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def _paste(python: Path, line: str) -> subprocess.CompletedProcess[str]:
    """``line`` (``pip install …``) run by a real pip into the venv of ``python``."""
    words = shlex.split(line)
    assert words[:2] == ["pip", "install"], line
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
         *words[1:], "--no-cache-dir"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _installed(python: Path) -> set[str]:
    listed = subprocess.run(
        [str(python), "-I", "-c",
         "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in "
         "m.distributions()))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {name.lower().replace("_", "-") for name in listed.stdout.split()}


@pytest.mark.slow
def test_the_runbooks_two_lines_and_doctors_fix_line_install_when_pasted(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    host_wheel: Path,
) -> None:
    project = _project(tmp_path, fake_wheels, host_wheel)
    for step in (("publish-lane", "--bundle", SECOND), ("publish-lane", "--bundle", BUNDLE)):
        assert run_cli(*step, root=project, inherit_env=True).exit_code == 0
    lane = project / "dist" / "lanes" / "validation"
    server, root = start_directory_server(lane, tmp_path / "http.log")
    try:
        training, host_only = _runbook_lines()
        assert RUNBOOK_LANE in training and RUNBOOK_LANE in host_only
        # (a) the training environment: the lane's bundle and the host package, by hash.
        full = _venv(tmp_path / "full")
        pasted = _paste(full, training.replace(RUNBOOK_LANE, root))
        assert pasted.returncode == 0, pasted.stderr
        assert {"torch", "torch-xla", "xla-wheels-host"} <= _installed(full)
        # (b) the host package alone: a host's own torch environment stays as it is.
        own = _venv(tmp_path / "own")
        pasted = _paste(own, host_only.replace(RUNBOOK_LANE, root))
        assert pasted.returncode == 0, pasted.stderr
        assert "xla-wheels-host" in _installed(own) and "torch" not in _installed(own)

        home = tmp_path / "home"
        home.mkdir()
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), **contract_environment(home)}

        def doctor(python: Path) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(python), "-I", "-m", "xla_host", "doctor", "--lane", f"{root}simple/",
                 "--bundle", BUNDLE],
                cwd=home, env=env, capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip

        # That host lacks the bundle's torch: doctor's fix is line (a), and it works pasted.
        found = doctor(own)
        assert found.returncode == 1, found.stdout + found.stderr
        assert "ok   lane install list" in found.stdout, found.stdout
        fixes = re.findall(r"fix: install the bundle by hash: (pip install .*)", found.stdout)
        assert fixes and set(fixes) == {
            f"pip install --require-hashes --index-url {root}simple/ -r {root}requirements.txt"
        }, found.stdout
        fixed = _venv(tmp_path / "fixed")
        assert _paste(fixed, fixes[0]).returncode == 0
        assert {"torch", "torch-xla"} <= _installed(fixed)
        # A lane whose install list is another bundle's: doctor names it, with the fix.
        listed = (lane / "requirements.txt").read_text()
        (lane / "requirements.txt").write_text(
            listed.replace(f"bundle {BUNDLE} ", f"bundle {SECOND} ")
        )
        stale = doctor(full)
        assert stale.returncode == 1
        assert (
            f"FAIL lane install list {root}requirements.txt installs bundle {SECOND}, not "
            f"{BUNDLE}, the document's" in " ".join(stale.stdout.split())
        ), stale.stdout
        assert "fix: on the builder: make requirements LANE=validation" in stale.stdout
    finally:
        stop(server)
