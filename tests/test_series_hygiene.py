"""Conflict markers and whitespace errors are refused wherever the series changes hands:
``patch-rebase --continue``, ``patch-export`` and ``patches-check`` (exit 6, naming the
patch, file and line, nothing written), on a throwaway upstream with real git.

The flow these tests replay is the one that once shipped markers: a rebase stopped at a
conflict, the file was added with its markers still in, ``CONTINUE=1`` went on, export
wrote the markers into the patch and ``patches-check`` said it applies.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import test_patch_workflow
from tests.gitrepos import GIT_ENV, RUNTIME_CC, Upstream, git
from tests.test_patch_workflow import export, patch_bytes, rebase, worktree
from xla_wheels.series_hygiene import (
    BLANK_AT_EOF,
    MARKER,
    SPACE_BEFORE_TAB,
    TRAILING,
    scan_patch_text,
)

# The series as commits in a worktree, from the patch-export/patch-rebase tests.
patched = test_patch_workflow.patched

DEFECTS = 6


def stop_at_a_conflict(project: Path, upstream: Upstream, run_cli) -> str:
    """Upstream edits the line 0001 changes; patch-rebase onto it stops there (exit 3)."""
    changed = upstream.commit_file(
        "src/runtime.cc",
        RUNTIME_CC.replace("// two-step path", "// two-step path (upstream note)"),
        "upstream edits the line 0001 changes",
    )
    stopped = rebase(run_cli, project, "--onto", changed)
    assert stopped.exit_code == 3, stopped.stderr
    assert "<<<<<<<" in (worktree(project) / "src/runtime.cc").read_text()
    return changed


def marker_line(path: Path) -> int:
    return next(
        number
        for number, line in enumerate(path.read_text().split("\n"), start=1)
        if line.startswith("<<<<<<< ")
    )


def test_continue_refuses_a_file_added_with_its_conflict_markers(
    patched: Path, upstreams: dict[str, Upstream], run_cli
) -> None:
    stop_at_a_conflict(patched, upstreams["torch_xla"], run_cli)
    tree = worktree(patched)
    line = marker_line(tree / "src/runtime.cc")
    git(tree, "add", "src/runtime.cc")  # git itself takes the markers as a resolution
    head = git(tree, "rev-parse", "HEAD")

    refused = rebase(run_cli, patched, "--continue")

    assert refused.exit_code == DEFECTS, refused.stderr
    assert "Traceback" not in refused.stderr
    assert (
        f"patches/torch_xla/0001-load.patch: src/runtime.cc:{line}: leftover conflict marker"
        in refused.stderr
    )
    assert "fix: edit those lines" in refused.stderr and "CONTINUE=1" in refused.stderr
    # Nothing was committed: the rebase is still stopped at the same place.
    assert git(tree, "rev-parse", "HEAD") == head
    assert (tree / ".git").exists() and git(tree, "rev-parse", "--verify", "REBASE_HEAD")
    # The fix it names works: edit the lines, add, continue.
    (tree / "src/runtime.cc").write_text(
        RUNTIME_CC.replace("// two-step path", "// load path (resolved)")
    )
    git(tree, "add", "src/runtime.cc")
    continued = rebase(run_cli, patched, "--continue")
    assert continued.exit_code == 0, continued.stderr


def test_continue_refuses_trailing_whitespace_in_the_resolution(
    patched: Path, upstreams: dict[str, Upstream], run_cli
) -> None:
    stop_at_a_conflict(patched, upstreams["torch_xla"], run_cli)
    tree = worktree(patched)
    (tree / "src/runtime.cc").write_text(
        RUNTIME_CC.replace("// two-step path", "// load path (resolved)   ")
    )
    git(tree, "add", "src/runtime.cc")
    refused = rebase(run_cli, patched, "--continue")
    assert refused.exit_code == DEFECTS, refused.stderr
    assert "src/runtime.cc:4: trailing whitespace" in refused.stderr


def _continue_with_git_itself(tree: Path) -> None:
    """What the tool once did on CONTINUE=1: git's own continue, markers and all."""
    subprocess.run(
        ["git", "rebase", "--continue"],
        cwd=tree,
        env={**GIT_ENV, "GIT_EDITOR": "true"},
        check=True,
        capture_output=True,
    )


@pytest.mark.slow
def test_export_and_patches_check_refuse_markers_a_rebase_left_in_a_commit(
    patched: Path, upstreams: dict[str, Upstream], run_cli
) -> None:
    upstream = upstreams["torch_xla"]
    changed = stop_at_a_conflict(patched, upstream, run_cli)
    tree = worktree(patched)
    git(tree, "add", "src/runtime.cc")
    _continue_with_git_itself(tree)
    assert "<<<<<<< " in git(tree, "show", "HEAD~1:src/runtime.cc")
    line = marker_line(tree / "src/runtime.cc")
    before = patch_bytes(patched)
    manifest = (patched / "build/bundles/test-1.toml").read_bytes()

    refused = export(run_cli, patched)

    assert refused.exit_code == DEFECTS, refused.stderr
    assert (
        f"patches/torch_xla/0001-load.patch: src/runtime.cc:{line}: leftover conflict marker"
        in refused.stderr
    )
    assert patch_bytes(patched) == before  # nothing written: not a patch, not the pin
    assert (patched / "build/bundles/test-1.toml").read_bytes() == manifest

    # patches-check refuses such a patch file too, whoever wrote it (here: by hand, from
    # the commit, as the old export did).
    from xla_wheels.patch_workflow import patch_text

    commit = git(tree, "rev-parse", "HEAD~1")
    message = git(tree, "log", "-1", "--format=%B", commit)
    diff = subprocess.run(
        ["git", "diff", f"{commit}^", commit], cwd=tree, env=GIT_ENV, text=True,
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    marked = patched / "patches/torch_xla/0001-load.patch"
    marked.write_text(patch_text(message, diff, changed))
    manifest_path = patched / "build/bundles/test-1.toml"
    manifest_path.write_text(manifest_path.read_text().replace(upstream.commits[-2], changed))
    checked = run_cli(
        "patches-check", "--bundle", "test-1", "--source", str(upstream.path), root=patched
    )
    assert checked.exit_code == DEFECTS, checked.output
    assert f"src/runtime.cc:{line}: leftover conflict marker" in checked.output
    assert "patches/torch_xla/0001-load.patch" in checked.stderr
    assert "apply to" not in checked.stdout
    # Every rung says whether it ran; none that did not run reads as checked.
    assert "rung applies: not run (not reached)" in checked.stdout
    assert "rung compiled checks: not run (not reached)" in checked.stdout
    assert "rung series-compile: not run here" in checked.stdout
    marked.write_bytes(before["0001-load.patch"])
    manifest_path.write_bytes(manifest)

    # The fix export names works: edit the commit in an interactive rebase, export.
    fix = refused.stderr.split("fix: ", 1)[1]
    assert f"rebase -i {changed[:12]}" in fix
    edit_first = "sed -i '1s/^pick/edit/'"
    subprocess.run(
        ["git", "rebase", "-i", changed],
        cwd=tree,
        env={**GIT_ENV, "GIT_SEQUENCE_EDITOR": edit_first, "GIT_EDITOR": "true"},
        check=True,
        capture_output=True,
    )
    (tree / "src/runtime.cc").write_text(
        RUNTIME_CC.replace("// two-step path", "// load path (resolved)")
    )
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")
    _continue_with_git_itself(tree)
    exported = export(run_cli, patched)
    assert exported.exit_code == 0, exported.stderr
    assert "<<<<<<<" not in patch_bytes(patched)["0001-load.patch"].decode()
    checked = run_cli(
        "patches-check", "--bundle", "test-1", "--source", str(upstream.path), root=patched
    )
    assert checked.exit_code == 0, checked.output
    assert "rung applies: ran: 2 patch(es) apply" in checked.stdout
    assert "rung series-compile: not run here" in checked.stdout


@pytest.mark.slow
def test_patches_check_names_a_whitespace_error_in_a_patch_file(
    patched: Path, upstreams: dict[str, Upstream], run_cli
) -> None:
    path = patched / "patches/torch_xla/0002-stats.patch"
    text = path.read_text()
    assert "+  return StatsOrError(device);\n" in text
    path.write_text(
        text.replace("+  return StatsOrError(device);\n", "+  return StatsOrError(device); \n")
    )
    result = run_cli(
        "patches-check",
        "--bundle",
        "test-1",
        "--source",
        str(upstreams["torch_xla"].path),
        root=patched,
    )
    assert result.exit_code == DEFECTS, result.output
    number = text.split("\n").index("+  return StatsOrError(device);") + 1
    assert (
        f"patches/torch_xla/0002-stats.patch: src/runtime.cc:9: trailing whitespace "
        f"(line {number} of the patch file)" in result.output
    )
    assert "fix: " in result.stderr


# --- The patch-file scanner agrees with git -----------------------------------------------

SAMPLE_FILE = "int a;\nint b;\nint c;\nint d;\n"


def _sample_patch(tmp_path: Path, new_text: str) -> str:
    repo = tmp_path / "sample"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f.cc").write_text(SAMPLE_FILE)
    git(repo, "add", "f.cc")
    git(repo, "commit", "-qm", "base")
    (repo / "f.cc").write_bytes(new_text.encode())
    # Bytes, not text mode: Python's universal newlines would drop the CR under test.
    return subprocess.run(
        ["git", "diff"], cwd=repo, env=GIT_ENV, capture_output=True, check=True
    ).stdout.decode()


def _git_apply_verdicts(tmp_path: Path, diff: str) -> set[int]:
    """The patch lines ``git apply --whitespace=error-all`` reports."""
    repo = tmp_path / "sample"
    git(repo, "checkout", "-q", "--", ".")
    result = subprocess.run(
        ["git", "apply", "--check", "--whitespace=error-all", "-"],
        cwd=repo, env=GIT_ENV, input=diff.encode(), capture_output=True, check=False,
    )  # fmt: skip
    return {
        int(line.split(":")[1])
        for line in result.stderr.decode().splitlines()
        if line.startswith("<stdin>:") and line.split(":")[1].isdigit()
    }


@pytest.mark.parametrize(
    ("new_text", "problem"),
    [
        ("int a;\nint b;  \nint c;\nint d;\n", TRAILING),
        ("int a;\nint b;\t\nint c;\nint d;\n", TRAILING),
        ("int a;\nint b;\r\nint c;\nint d;\n", TRAILING),
        ("int a;\n \tint b;\nint c;\nint d;\n", SPACE_BEFORE_TAB),
        ("int a;\nint b;\nint c;\nint d;\n\n\n", BLANK_AT_EOF),
        ("int a;\nint b;\nint c;\nint d;\nint e;\n", None),
        ("int a;\n\tint b;\nint c;\nint d;\n", None),
    ],
)
def test_the_scanner_finds_what_git_apply_rejects(
    tmp_path: Path, new_text: str, problem: str | None
) -> None:
    diff = _sample_patch(tmp_path, new_text)
    found = scan_patch_text(diff, "sample.patch")
    assert {defect.patch_line for defect in found} == _git_apply_verdicts(tmp_path, diff)
    assert {defect.problem for defect in found} == ({problem} if problem else set())


@pytest.mark.parametrize(
    "line", ["<<<<<<< HEAD", "=======", "||||||| base", ">>>>>>> 1c24c38 (0004)", "<<<<<<<"]
)
def test_conflict_markers_on_added_lines_and_in_the_header_are_found(line: str) -> None:
    patch = (
        "Subject: x\n\nfree text\n"
        "diff --git a/f.cc b/f.cc\n--- a/f.cc\n+++ b/f.cc\n@@ -1,2 +1,3 @@\n"
        f" int a;\n+{line}\n int b;\n"
    )
    found = scan_patch_text(patch, "p.patch")
    assert [(d.path, d.line, d.problem) for d in found] == [("f.cc", 2, MARKER)]
    in_header = scan_patch_text(f"Subject: x\n{line}\n" + patch.split("\n", 1)[1], "p.patch")
    assert ("", 2, MARKER) in [(d.path, d.line, d.problem) for d in in_header]


def test_context_and_removed_lines_are_upstream_s_and_pass() -> None:
    patch = (
        "diff --git a/f.md b/f.md\n--- a/f.md\n+++ b/f.md\n@@ -1,3 +1,3 @@\n"
        " Title\n =======\n-trailing \n+fixed\n"
    )
    assert scan_patch_text(patch, "p.patch") == []
