"""Nothing the user made is lost, and a failed run leaves wheels.lock as it was.

Driven as a user drives it: the CLI on the synthetic upstream, fetched through a mirror
directory (``--mirror``), with real git everywhere. ``wheels`` runs in host mode on the
synthetic sources (tests/synthetic_upstream.py), so the whole pipeline runs here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.gitrepos import GIT_ENV, git
from tests.synthetic_upstream import Synthetic, cli_args, make_patch
from xla_wheels.sources import remote_path

HOST = ("--mode", "host", "--host-python", sys.executable)


def make_mirror(syn: Synthetic) -> Path:
    """A mirror directory of bare repositories, as `git clone --mirror` makes it."""
    mirror = syn.root.parent / "mirror"
    for name in ("torch", "xla", "openxla"):
        url = str(syn.upstream / name)
        target = mirror / remote_path(url)
        target.parent.mkdir(parents=True, exist_ok=True)
        git(syn.root.parent, "clone", "-q", "--mirror", url, str(target))
    return mirror


@pytest.fixture
def syn(syn: Synthetic) -> Synthetic:
    """The shared synthetic project (tests/conftest.py) with a mirror of its upstreams."""
    make_mirror(syn)
    return syn


def run(syn: Synthetic, stage: str) -> CliResult:
    mirror = ("--mirror", str(syn.root.parent / "mirror"))
    if stage == "wheels":
        args = cli_args(syn, *HOST, *mirror)
    else:
        args = [
            stage, "--bundle", "syn", "--root", str(syn.root), "--cache-dir", str(syn.cache),
            *mirror,
        ]  # fmt: skip
    return run_cli(*args, env={"HOME": str(syn.root.parent)}, timeout=600)


def xla_tree(syn: Synthetic) -> Path:
    return syn.root / "out" / "syn" / "src" / "torch_xla"


# --- item 1: local edits are never deleted -----------------------------------------


def edit_tracked(tree: Path) -> str:
    (tree / "WORKSPACE").write_text("# my local experiment\n")
    return "WORKSPACE"


def add_untracked(tree: Path) -> str:
    (tree / "notes").mkdir()
    (tree / "notes" / "todo.txt").write_text("remember this\n")
    return "notes/todo.txt"


def commit_on_top(tree: Path) -> str:
    (tree / "setup.py").write_text((tree / "setup.py").read_text() + "# a fix of mine\n")
    git(tree, "commit", "-q", "-am", "my own fix", env=GIT_ENV)
    return "my own fix"


@pytest.mark.parametrize("make_work", [edit_tracked, add_untracked, commit_on_top])
@pytest.mark.slow
def test_work_in_a_patched_worktree_stops_every_stage_and_is_kept(
    syn: Synthetic, make_work
) -> None:
    assert run(syn, "patch").exit_code == 0
    tree = xla_tree(syn)
    named = make_work(tree)
    head = git(tree, "rev-parse", "HEAD")
    status = git(tree, "status", "--porcelain", "--untracked-files=all")
    for stage in ("patch", "sources", "wheels"):
        result = run(syn, stage)
        assert result.exit_code == 4, (stage, result.stderr)
        assert "Traceback" not in result.stderr
        assert f"error: {tree} holds work the pipeline did not make" in result.stderr
        assert named in result.stderr, stage
        fix = next(line for line in result.stderr.splitlines() if line.startswith("  fix: "))
        assert f"mv {tree} {tree}.saved" in fix
        if make_work is commit_on_top:
            assert "make patch-export BUNDLE=syn COMPONENT=torch_xla" in fix
        else:
            assert f"git -C {tree} stash --include-untracked" in fix
        # Nothing touched: same commit, same changes, the work is there.
        assert git(tree, "rev-parse", "HEAD") == head
        assert git(tree, "status", "--porcelain", "--untracked-files=all") == status


@pytest.mark.slow
def test_a_worktree_that_is_the_series_is_reused_with_its_ignored_build_outputs(
    syn: Synthetic,
) -> None:
    assert run(syn, "patch").exit_code == 0
    tree = xla_tree(syn)
    head = git(tree, "rev-parse", "HEAD")
    # torch's .gitignore has build/: what a build leaves in the tree.
    output = syn.root / "out" / "syn" / "src" / "torch" / "build" / "lib" / "object.o"
    output.parent.mkdir(parents=True)
    output.write_bytes(b"\x7fELF")
    marker = tree / ".git"
    inode = marker.stat().st_ino
    for stage in ("patch", "sources", "patch"):
        result = run(syn, stage)
        assert result.exit_code == 0, (stage, result.stderr)
        assert "torch_xla: reusing" in result.stderr
    assert git(tree, "rev-parse", "HEAD") == head  # the series head, not re-applied
    assert output.read_bytes() == b"\x7fELF"
    assert marker.stat().st_ino == inode  # the same worktree, not recreated
    assert "the worktree already is this series" in result.stderr


def test_the_computed_series_head_is_the_commit_the_patch_stage_makes(syn: Synthetic) -> None:
    from xla_wheels.bundle import load_bundle
    from xla_wheels.worktree_guard import expected_head

    assert run(syn, "patch").exit_code == 0
    bundle = load_bundle(syn.root, "syn")
    for name in ("torch_xla", "openxla", "torch"):
        tree = syn.root / "out" / "syn" / "src" / name
        pin = syn.commits[name]
        assert expected_head(tree, bundle.component(name), pin) == git(tree, "rev-parse", "HEAD")


# --- item 6: wheels.lock changes only when the run succeeded ------------------------


def add_patch_that_does_not_apply(syn: Synthetic) -> None:
    make_patch(
        syn.upstream / "xla",
        syn.commits["torch_xla"],
        "torch_xla",
        "made against another text",
        {"WORKSPACE": "a text the pin never had\n"},
        syn.root / "patches" / "torch_xla" / "0003-stale.patch",
    )
    # Made against the pin; 0002 already changed WORKSPACE, so on top of it this fails.
    syn.write_bundle(
        xla_patches=(
            "torch_xla/0001-load-cache.patch",
            "torch_xla/0002-comment.patch",
            "torch_xla/0003-stale.patch",
        )
    )


def lock_check(syn: Synthetic) -> CliResult:
    return run_cli("lock-check", root=syn.root, timeout=120)


@pytest.mark.parametrize("stage", ["patch", "wheels"])
@pytest.mark.slow
def test_a_series_that_does_not_apply_leaves_the_lock_byte_identical(
    syn: Synthetic, stage: str
) -> None:
    assert run(syn, "lock").exit_code == 0
    add_patch_that_does_not_apply(syn)
    lock = (syn.root / "wheels.lock").read_bytes()
    drift = lock_check(syn)
    assert drift.exit_code == 1 and "0003-stale.patch is in the series but not in the lock" in (
        drift.stderr
    )
    result = run(syn, stage)
    assert result.exit_code == 1, result.stderr
    assert "0003-stale.patch does not apply" in result.stderr
    assert (syn.root / "wheels.lock").read_bytes() == lock
    after = lock_check(syn)
    assert after.exit_code == 1
    assert "syn: patches/torch_xla/0003-stale.patch is in the series but not in the lock" in (
        after.stderr
    )


@pytest.mark.slow
def test_a_failed_build_leaves_the_lock_byte_identical(syn: Synthetic) -> None:
    assert run(syn, "lock").exit_code == 0
    make_patch(
        syn.upstream / "xla",
        syn.commits["torch_xla"],
        "torch_xla",
        "breaks the build",
        {"setup.py": "raise SystemExit('synthetic build failure')\n"},
        syn.root / "patches" / "torch_xla" / "0003-break.patch",
    )
    syn.write_bundle(
        xla_patches=(
            "torch_xla/0001-load-cache.patch",
            "torch_xla/0002-comment.patch",
            "torch_xla/0003-break.patch",
        )
    )
    lock = (syn.root / "wheels.lock").read_bytes()
    result = run(syn, "wheels")
    assert result.exit_code == 1, result.stderr  # a step failed
    assert "build failed" in result.stderr, result.stderr
    assert (syn.root / "wheels.lock").read_bytes() == lock
    assert "0003-break.patch is in the series but not in the lock" in lock_check(syn).stderr


def test_an_interrupted_run_writes_no_lock(tmp_path: Path) -> None:
    """Ctrl-C is a BaseException: the held-back write is dropped with it."""
    from xla_wheels.wheels_lock import Lock, read_lock, write_lock, written_on_success

    path = tmp_path / "wheels.lock"
    write_lock(path, Lock())
    before = path.read_bytes()
    entry_lock = read_lock(path)
    with pytest.raises(KeyboardInterrupt), written_on_success():
        write_lock(path, entry_lock.with_entry("x", None))  # type: ignore[arg-type]
        assert read_lock(path).bundles == {"x": None}  # later stages see the new lock
        raise KeyboardInterrupt
    assert path.read_bytes() == before


@pytest.mark.slow
def test_the_builds_own_edits_are_recognised_and_an_edit_on_top_is_not(syn: Synthetic) -> None:
    """The torch_xla build applies its openxla_patches/ to the OpenXLA worktree in place
    and copies itself to <torch>/xla: those are the pipeline's; one more edit is not."""
    assert run(syn, "wheels").exit_code == 0
    openxla = syn.root / "out" / "syn" / "src" / "openxla"
    core = openxla / "xla" / "core.h"
    built = core.read_text()
    assert "TORCH_XLA_OPENXLA_PATCH" in built  # the build's edit, in place
    core.write_text(built + "// my experiment\n")
    result = run(syn, "patch")
    assert result.exit_code == 4, result.stderr
    assert f"error: {openxla} holds work the pipeline did not make" in result.stderr
    assert " M xla/core.h" in result.stderr
    assert core.read_text() == built + "// my experiment\n"
    core.write_text(built)  # back to exactly what the build made
    result = run(syn, "patch")
    assert result.exit_code == 0, result.stderr
    assert "TORCH_XLA_OPENXLA_PATCH" not in core.read_text()  # recreated for the next build
    assert "torch: reusing" in result.stderr  # <torch>/xla and setup.py outputs are not work


@pytest.mark.slow
def test_a_recreation_that_would_delete_ignored_files_stops_and_lists_them(
    syn: Synthetic,
) -> None:
    assert run(syn, "patch").exit_code == 0
    tree = xla_tree(syn)
    # An ignored file (here by the repository's info/exclude) in a worktree that must be
    # recreated because the series changed: recreating would delete it.
    exclude = Path(git(tree, "rev-parse", "--path-format=absolute", "--git-common-dir"))
    (exclude / "info").mkdir(exist_ok=True)
    (exclude / "info" / "exclude").write_text("*.o\n")
    (tree / "kernel.o").write_bytes(b"\x7fELF")
    syn.write_bundle(xla_patches=("torch_xla/0001-load-cache.patch",))
    result = run(syn, "patch")
    assert result.exit_code == 4, result.stderr
    assert "would delete files git ignores" in result.stderr
    assert "    kernel.o" in result.stderr
    assert f"git -C {tree} clean -ndX" in result.stderr
    assert (tree / "kernel.o").read_bytes() == b"\x7fELF"
    (tree / "kernel.o").unlink()
    result = run(syn, "patch")
    assert result.exit_code == 0, result.stderr
    assert len(git(tree, "rev-list", f"{syn.commits['torch_xla']}..HEAD").split()) == 1
