"""Editing the patch series as git commits: patch-export and patch-rebase, run as a user
runs them (the CLI), on a throwaway upstream with real git."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gitrepos import GIT_ENV, RUNTIME_CC, Upstream, git, make_project, make_repo
from tests.test_patch_stage import good_patches

PATCHES = ("0001-load.patch", "0002-stats.patch")
AMEND_ENV = {**GIT_ENV, "GIT_COMMITTER_DATE": "2030-01-01T00:00:00Z"}


@pytest.fixture
def patched(tmp_path: Path, upstreams: dict[str, Upstream], run_cli) -> Path:
    """A project whose torch_xla series (two patches) is a branch in the worktree."""
    project = make_project(
        tmp_path, upstreams, patches={"torch_xla": good_patches(upstreams["torch_xla"])}
    )
    manifest = project / "build/bundles/test-1.toml"
    # A comment next to the pin: patch-rebase must keep it when it rewrites the pin.
    manifest.write_text(
        manifest.read_text().replace(
            "[components.torch_xla]\n", "[components.torch_xla]\n# the pin, reviewed\n"
        )
    )
    result = run_cli("patch", "--bundle", "test-1", root=project)
    assert result.exit_code == 0, result.stderr
    return project


def worktree(project: Path) -> Path:
    return project / "out/test-1/src/torch_xla"


def patch_bytes(project: Path) -> dict[str, bytes]:
    return {name: (project / "patches/torch_xla" / name).read_bytes() for name in PATCHES}


def export(run_cli, project: Path, *extra: str):
    return run_cli("patch-export", "--bundle", "test-1", *extra, root=project)


def amend(tree: Path, path: str, old: str, new: str) -> None:
    target = tree / path
    target.write_text(target.read_text().replace(old, new))
    import subprocess

    subprocess.run(
        ["git", "commit", "-q", "-a", "--amend", "--no-edit"], cwd=tree, env=AMEND_ENV, check=True
    )


def test_export_without_a_change_rewrites_nothing(patched: Path, run_cli) -> None:
    before = patch_bytes(patched)
    result = export(run_cli, patched)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [f"unchanged: patches/torch_xla/{n}" for n in PATCHES]
    assert patch_bytes(patched) == before


@pytest.mark.slow
def test_amending_a_commit_changes_exactly_that_patch(patched: Path, run_cli) -> None:
    before = patch_bytes(patched)
    amend(worktree(patched), "src/runtime.cc", "StatsOrError(device)", "StatsOrNone(device)")
    result = export(run_cli, patched)
    assert result.exit_code == 0, result.stderr
    after = patch_bytes(patched)
    assert after["0001-load.patch"] == before["0001-load.patch"]
    assert after["0002-stats.patch"] != before["0002-stats.patch"]
    assert "+  return StatsOrNone(device);" in after["0002-stats.patch"].decode()
    # The exported series is what the patch stage applies: a fresh run gives the same tree.
    tree = git(worktree(patched), "rev-parse", "HEAD^{tree}")
    assert run_cli("patch", "--bundle", "test-1", root=patched).exit_code == 0
    assert git(worktree(patched), "rev-parse", "HEAD^{tree}") == tree
    # A second export of the unchanged branch is byte-identical.
    assert export(run_cli, patched).exit_code == 0
    assert patch_bytes(patched) == after


def test_a_dry_run_export_says_what_it_would_write_and_writes_nothing(
    patched: Path, run_cli
) -> None:
    before = patch_bytes(patched)
    amend(worktree(patched), "src/runtime.cc", "StatsOrError(device)", "StatsOrNone(device)")
    result = export(run_cli, patched, "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "would write: patches/torch_xla/0002-stats.patch" in result.stdout
    assert patch_bytes(patched) == before


def test_a_patch_file_edited_by_hand_is_not_overwritten_without_force(
    patched: Path, run_cli
) -> None:
    path = patched / "patches/torch_xla/0001-load.patch"
    edited = path.read_text().replace("Longer reasoning.", "Longer reasoning, edited by hand.")
    path.write_text(edited)
    amend(worktree(patched), "src/runtime.cc", "StatsOrError(device)", "StatsOrNone(device)")
    other = (patched / "patches/torch_xla/0002-stats.patch").read_bytes()
    result = export(run_cli, patched)
    assert result.exit_code == 1
    assert "patches/torch_xla/0001-load.patch" in result.stderr and "FORCE=1" in result.stderr
    assert path.read_text() == edited  # nothing written, not even the amended 0002
    assert (patched / "patches/torch_xla/0002-stats.patch").read_bytes() == other
    forced = export(run_cli, patched, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert "edited by hand" not in path.read_text()


def test_uncommitted_changes_are_refused(patched: Path, run_cli) -> None:
    (worktree(patched) / "src/runtime.cc").write_text("changed\n")
    result = export(run_cli, patched)
    assert result.exit_code == 1 and "not committed" in result.stderr
    assert "src/runtime.cc" in result.stderr


def rebase(run_cli, project: Path, *extra: str, env: dict[str, str] | None = None):
    return run_cli("patch-rebase", "--bundle", "test-1", *extra, root=project, env=env)


@pytest.mark.slow
def test_rebase_onto_a_commit_that_moves_the_code_refreshes_the_line_numbers(
    patched: Path, upstreams: dict[str, Upstream], run_cli
) -> None:
    upstream = upstreams["torch_xla"]
    old_pin = upstream.commits[-1]
    moved = upstream.commit_file(
        "src/runtime.cc", "// one\n// two\n// three\n" + RUNTIME_CC, "three lines on top"
    )
    before = patch_bytes(patched)
    assert "@@ -1,7 +1,7 @@" in before["0001-load.patch"].decode()
    result = rebase(run_cli, patched, "--onto", moved)
    assert result.exit_code == 0, result.stderr
    result = export(run_cli, patched)
    assert result.exit_code == 0, result.stderr
    after = {name: text.decode() for name, text in patch_bytes(patched).items()}
    assert "@@ -4,7 +4,7 @@" in after["0001-load.patch"]
    for text in after.values():
        assert f"Base: {moved}\n" in text and old_pin not in text
    manifest = (patched / "build/bundles/test-1.toml").read_text()
    assert f'# the pin, reviewed\nremote = "{upstream.url}"\ncommit = "{moved}"\n' in manifest
    # The refreshed bundle builds its series from scratch.
    fresh = run_cli("patch", "--bundle", "test-1", root=patched)
    assert fresh.exit_code == 0, fresh.stderr
    assert git(worktree(patched), "rev-parse", "HEAD~2") == moved


def test_rebase_run_from_a_git_hook_works_on_its_worktree_not_the_hooks_repository(
    patched: Path, upstreams: dict[str, Upstream], tmp_path: Path, run_cli
) -> None:
    # A git hook runs with GIT_DIR, GIT_WORK_TREE and GIT_INDEX_FILE of its own repository
    # exported; every git command of the pipeline must still work on its own cwd.
    hook_repo = tmp_path / "hook-repo"
    hook_head = make_repo(hook_repo, {"README": "the repository whose hook runs us\n"})
    hook_env = {
        "GIT_DIR": str(hook_repo / ".git"),
        "GIT_WORK_TREE": str(hook_repo),
        "GIT_INDEX_FILE": str(hook_repo / ".git" / "index"),
    }
    moved = upstreams["torch_xla"].commit_file(
        "src/runtime.cc", "// one\n" + RUNTIME_CC, "a line on top"
    )
    result = rebase(run_cli, patched, "--onto", moved, env=hook_env)
    assert result.exit_code == 0, result.stderr
    assert git(worktree(patched), "rev-parse", "HEAD~2") == moved
    assert git(hook_repo, "rev-parse", "HEAD") == hook_head
    assert git(hook_repo, "status", "--porcelain") == ""


@pytest.mark.slow
def test_a_conflict_stops_naming_the_patch_and_files_then_continue_and_export(
    patched: Path, upstreams: dict[str, Upstream], run_cli
) -> None:
    upstream = upstreams["torch_xla"]
    changed = upstream.commit_file(
        "src/runtime.cc",
        RUNTIME_CC.replace("// two-step path", "// two-step path (upstream note)"),
        "upstream edits the line 0001 changes",
    )
    before = patch_bytes(patched)
    manifest_before = (patched / "build/bundles/test-1.toml").read_bytes()
    stopped = rebase(run_cli, patched, "--onto", changed)
    assert stopped.exit_code == 3, stopped.stderr
    assert "stopped at patches/torch_xla/0001-load.patch (1 of 2)" in stopped.stderr
    assert "in src/runtime.cc" in stopped.stderr and "CONTINUE=1" in stopped.stderr
    # Export refuses mid-rebase; nothing the user has was touched.
    assert export(run_cli, patched).exit_code == 1
    assert patch_bytes(patched) == before
    assert (patched / "build/bundles/test-1.toml").read_bytes() == manifest_before
    # The user resolves: keeps the patch's line, drops the upstream note.
    tree = worktree(patched)
    resolved = RUNTIME_CC.replace("// two-step path", "// load path (resolved)")
    (tree / "src/runtime.cc").write_text(resolved)
    git(tree, "add", "src/runtime.cc")
    continued = rebase(run_cli, patched, "--continue")
    assert continued.exit_code == 0, continued.stderr
    exported = export(run_cli, patched)
    assert exported.exit_code == 0, exported.stderr
    after = {name: text.decode() for name, text in patch_bytes(patched).items()}
    assert (
        "-  // two-step path (upstream note)\n+  // load path (resolved)\n"
        in after["0001-load.patch"]
    )
    assert all(f"Base: {changed}\n" in text for text in after.values())
    assert f'commit = "{changed}"' in (patched / "build/bundles/test-1.toml").read_text()
    assert run_cli("patch", "--bundle", "test-1", root=patched).exit_code == 0


def test_rebase_needs_a_commit_sha(patched: Path, run_cli) -> None:
    result = rebase(run_cli, patched, "--onto", "main")
    assert result.exit_code == 2 and "is not a commit SHA" in result.stderr


@pytest.mark.slow
def test_make_patch_refuses_to_recreate_a_worktree_with_commits_not_exported(
    patched: Path, run_cli
) -> None:
    amend(worktree(patched), "src/runtime.cc", "StatsOrError(device)", "StatsOrNone(device)")
    head = git(worktree(patched), "rev-parse", "HEAD")
    result = run_cli("patch", "--bundle", "test-1", root=patched)
    assert result.exit_code == 4
    assert "commits that are not in the patch series" in result.stderr
    assert "make patch-export" in result.stderr
    assert git(worktree(patched), "rev-parse", "HEAD") == head  # the amended work is kept
    assert export(run_cli, patched).exit_code == 0
    assert run_cli("patch", "--bundle", "test-1", root=patched).exit_code == 0


def test_the_pin_is_rewritten_in_place_and_an_inherited_pin_is_named() -> None:
    from xla_host.errors import PatchError
    from xla_wheels.patch_workflow import rewrite_pin

    text = (
        '# top\n[components.torch]\ncommit = "aaaaaaa"  # torch\n\n'
        '[components.torch_xla]  # ours\n# why this pin\ncommit = "bbbbbbb"  # keep me\n'
        'version = "2.9.0"\n'
    )
    new = rewrite_pin(text, "torch_xla", "c" * 40, "x.toml")
    assert new == text.replace('"bbbbbbb"', '"' + "c" * 40 + '"')
    with pytest.raises(PatchError) as caught:
        rewrite_pin(
            '[bundle]\nextends = "v"\n[components.openxla]\npatches = []\n',
            "openxla",
            "c" * 40,
            "child.toml",
        )
    assert 'child.toml: no `commit = "..."` line in [components.openxla]' in caught.value.message
