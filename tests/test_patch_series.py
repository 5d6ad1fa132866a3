"""The patch series as commits: one commit per patch, identical on every run and machine,
composed as data so the plan prints exactly what the stage runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.gitrepos import Upstream, git, make_project
from tests.test_patch_stage import good_patches
from xla_wheels import patches as patches_module
from xla_wheels.bundle import load_bundle
from xla_wheels.options import PipelineOptions
from xla_wheels.patches import split_patch
from xla_wheels.pipeline import plan, run_until
from xla_wheels.plan import PlannedCommand, render_plan


def options_for(project: Path, base: Path) -> PipelineOptions:
    return PipelineOptions(
        root=project, cache_dir=base / "cache", out_dir=base / "out", mirror=None, dry_run=False
    )


def patched_project(
    base: Path, upstreams: dict[str, Upstream], series: dict[str, str]
) -> tuple[PipelineOptions, Path]:
    """A project in ``base`` whose bundle carries ``series`` for torch_xla; run to patches."""
    project = make_project(base, upstreams, patches={"torch_xla": series})
    options = options_for(project, base)
    run_until(options, load_bundle(project, "test-1"), "patches")
    return options, options.out_dir / "test-1" / "src" / "torch_xla"


@pytest.fixture
def good(tmp_path: Path, upstreams: dict[str, Upstream]) -> dict[str, str]:
    return good_patches(upstreams["torch_xla"])


def test_each_patch_becomes_one_commit_with_its_header_as_the_message(
    tmp_path: Path, upstreams: dict[str, Upstream], good: dict[str, str]
) -> None:
    options, worktree = patched_project(tmp_path / "one", upstreams, good)
    pin = upstreams["torch_xla"].commits[-1]
    log = git(
        worktree,
        "log",
        "--format=%H %an <%ae> %ad|%cn <%ce> %cd",
        "--date=iso-strict",
        f"{pin}..HEAD",
    )
    lines = log.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.split(" ", 1)[1] == (
            "xla-wheels patch series <patches@xla-wheels.invalid> 2000-01-01T00:00:00+00:00|"
            "xla-wheels patch series <patches@xla-wheels.invalid> 2000-01-01T00:00:00+00:00"
        )
    patch = options.root / "patches/torch_xla/0001-load.patch"
    header = split_patch(patch.read_text())[0].rstrip("\n")
    first = lines[1].split()[0]
    # The Subject is the title (what `git log --oneline` shows); the header is the body.
    title, body = header.split("\n", 1)
    message = git(worktree, "cat-file", "commit", first).split("\n\n", 1)[1]
    assert message == f"{title.removeprefix('Subject: ')}\n\n{body}"
    assert git(worktree, "status", "--porcelain") == ""
    assert git(worktree, "symbolic-ref", "--short", "HEAD").startswith("xla-wheels/test-1-")
    state = worktree.with_name("torch_xla.applied.json").read_text()
    assert git(worktree, "rev-parse", "HEAD") in state


def test_the_patched_commit_is_identical_across_runs_in_two_directories(
    tmp_path: Path, upstreams: dict[str, Upstream], good: dict[str, str], monkeypatch
) -> None:
    _, first = patched_project(tmp_path / "one", upstreams, good)
    # The second run as on another machine, another day, by another user.
    for key, value in {
        "GIT_AUTHOR_NAME": "Someone Else",
        "GIT_AUTHOR_EMAIL": "else@example.invalid",
        "GIT_AUTHOR_DATE": "2031-05-05T05:05:05+02:00",
        "GIT_COMMITTER_NAME": "Someone Else",
        "GIT_COMMITTER_EMAIL": "else@example.invalid",
        "GIT_COMMITTER_DATE": "2031-05-05T05:05:05+02:00",
        "TZ": "Asia/Kolkata",
    }.items():
        monkeypatch.setenv(key, value)
    _, second = patched_project(tmp_path / "two", upstreams, good)
    head = git(first, "rev-parse", "HEAD")
    assert head == git(second, "rev-parse", "HEAD")
    assert head != upstreams["torch_xla"].commits[-1]


def test_an_author_and_date_line_in_the_header_set_the_commits_author(
    tmp_path: Path, upstreams: dict[str, Upstream], good: dict[str, str]
) -> None:
    good["0001-load.patch"] = good["0001-load.patch"].replace(
        "Files:", "Author: Jane Doe <jane@example.com>\nDate: 2025-12-18T10:08:20-08:00\nFiles:", 1
    )
    project = make_project(tmp_path, upstreams, patches={"torch_xla": good})
    options = options_for(project, tmp_path)
    run_until(options, load_bundle(project, "test-1"), "patches")
    worktree = options.out_dir / "test-1/src/torch_xla"
    author = git(worktree, "log", "-1", "--format=%an <%ae> %ad", "--date=raw", "HEAD~1")
    assert author == "Jane Doe <jane@example.com> 1766081300 -0800"


def test_the_plan_prints_exactly_the_commands_the_patch_stage_runs(
    tmp_path: Path, upstreams: dict[str, Upstream], good: dict[str, str], monkeypatch
) -> None:
    project = make_project(tmp_path, upstreams, patches={"torch_xla": good})
    options = options_for(project, tmp_path)
    planned = next(s for s in plan(options, load_bundle(project, "test-1")) if s.name == "patches")
    executed: list[PlannedCommand] = []
    real = patches_module.run_git

    def recording(command: PlannedCommand, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        executed.append(command)
        return real(command, **kwargs)  # the real git runs: nothing is mocked

    monkeypatch.setattr(patches_module, "run_git", recording)
    run_until(options, load_bundle(project, "test-1"), "patches")
    assert executed == list(planned.commands)
    # ... and exactly the lines `make patch DRY_RUN=1` prints for the stage, in order.
    printed = render_plan([planned]).splitlines()
    assert [f"    $ {command.render()}" for command in executed] == [
        line for line in printed if line.startswith("    $ ")
    ]
    assert len(executed) == 3 + 2 * 2  # one branch per component, apply + commit per patch
    assert [c.argv[1] for c in executed[1:3]] == ["checkout", "apply"]


def test_the_revision_the_build_sees_is_the_patched_commit(
    tmp_path: Path, upstreams: dict[str, Upstream], good: dict[str, str]
) -> None:
    """What torch_xla's setup.py reads: `git rev-parse HEAD` in the tree it builds, which the
    recipe makes with `cp -a <worktree> <torch>/xla` (the worktree's .git file comes along)."""
    seen = []
    for run in ("one", "two"):
        _, worktree = patched_project(tmp_path / run, upstreams, good)
        torch_tree = worktree.parent / "torch"
        build_tree = torch_tree / "xla"
        subprocess.run(["cp", "-a", str(worktree), str(build_tree)], check=True)
        seen.append(git(build_tree, "rev-parse", "HEAD"))
        shutil.rmtree(build_tree)
    assert seen[0] == seen[1]
    assert seen[0] != upstreams["torch_xla"].commits[-1]
