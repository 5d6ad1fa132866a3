"""The host wheel's version follows host/'s content: a changed host package publishes into a
lane that already holds the previous one, with no hand bump, and the same commit always
builds the same file.

Real parts: a git repository holding a copy of the working tree's host/ (committed, then
changed and committed again), the build ``make host-wheel`` runs
(``xla_wheels.release.host_wheel``: git archive, pip with the pinned setuptools), and a
pypiserver lane that ``publish-lane`` uploads to and that refuses other bytes under a name
it holds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import stop
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.release import host_wheel

REPO_ROOT = Path(__file__).resolve().parents[1]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo, check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip


def _repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(
        REPO_ROOT / "host",
        repo / "host",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    _git(repo, "init", "--quiet")
    _git(repo, "add", "host")
    _git(repo, "commit", "--quiet", "-m", "host package")
    return repo


@pytest.mark.slow
def test_a_changed_host_package_publishes_to_a_lane_that_holds_the_previous_one(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    repo = _repository(tmp_path)
    first = host_wheel.build(repo)
    tree = _git(repo, "rev-parse", "HEAD:host")[:12]
    assert parse_wheel_name(first.name).version == f"0.1.1+g{tree}"
    # A commit that leaves host/ alone changes nothing of the wheel.
    (repo / "README").write_text("not the host package\n")
    _git(repo, "add", "README")
    _git(repo, "commit", "--quiet", "-m", "elsewhere")
    digest = file_sha256(first)
    assert host_wheel.build(repo) == first and file_sha256(first) == digest

    process, index = start_pypiserver(tmp_path / "index", "update")
    try:
        project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
        (project / "build" / "lanes.toml").write_text(
            f'publish-lane = "validation"\n\n[lanes.validation]\nindex-url = "{index.url}"\n'
        )

        def publish(wheel: Path) -> str:
            shutil.rmtree(project / "dist" / "host", ignore_errors=True)
            (project / "dist" / "host").mkdir(parents=True)
            shutil.copyfile(wheel, project / "dist" / "host" / wheel.name)
            result = run_cli(
                "publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True,
                env=index.credentials,
            )  # fmt: skip
            assert result.exit_code == 0, result.output
            return result.stdout

        assert f"uploaded   {first.name}" in publish(first)
        # The host package changes: the next build has a new name, no hand bump.
        init = repo / "host" / "src" / "xla_host" / "__init__.py"
        init.write_text(init.read_text() + "\n# a change to the host package\n")
        _git(repo, "commit", "--quiet", "-am", "host: a change")
        second = host_wheel.build(repo)
        tree = _git(repo, "rev-parse", "HEAD:host")[:12]
        assert parse_wheel_name(second.name).version == f"0.1.2+g{tree}"
        # dist/host/ holds the one wheel publish puts in; the previous one is kept aside.
        assert sorted(p.name for p in second.parent.glob("*.whl")) == [second.name]
        assert (second.parent / "older" / first.name).is_file()
        assert f"uploaded   {second.name}" in publish(second)
        assert {p.name for p in index.packages.glob("xla_wheels_host-*.whl")} == {
            first.name,
            second.name,
        }
    finally:
        stop(process)
