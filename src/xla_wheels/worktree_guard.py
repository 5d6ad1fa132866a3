"""Is a component's worktree exactly what the pipeline makes? Decided by content.

``out/<bundle>/src/<component>`` is made by the sources stage (a worktree at the pin)
and the patch stage (one commit per patch on top). Users then work in it (docs/patches.md,
"Updating a patch": edit, ``git commit --amend``, ``make patch-export``). Before a run
reuses or recreates that directory, this module looks at what is in it, never at a
state file that can be stale:

- **expected head**: the commit the listed series produces from the pin, computed with
  git plumbing in a scratch index (``git apply --cached``, ``write-tree``,
  ``commit-tree`` with the patch stage's fixed identities and dates), so nothing in the
  worktree moves. Without patches it is the pin itself.
- **uncommitted work**: ``git status --porcelain --untracked-files=all`` (modified,
  added, deleted, untracked files), and a rebase/merge/cherry-pick under way.
- **commits the pipeline did not make**: every commit reachable from HEAD but from no
  pinned commit (``refs/pinned/*``, which the sources stage keeps) must have the patch
  stage's committer (``patches.DEFAULT_AUTHOR``); ``git commit`` or ``--amend`` in the
  worktree gives the user's own committer, so those commits are the user's work.
- **ignored files** (``--ignored=matching``): build outputs by the upstream's
  ``.gitignore`` (``build/``, ``bazel-*``, ``*.so``). They never block reuse: a worktree
  at the expected head is reused as it is, so they stay where they are (an incremental
  build needs them). They block *recreation*, which would delete them: the error lists
  them and the run stops, because an ignored file can still be something the user made
  (a note, an ``.env``) and only the user can tell.

Verdicts: at the expected head (or the pin, before the patch stage) with no uncommitted
work -> reused; every commit the pipeline's and nothing uncommitted or ignored ->
recreated; anything else -> :class:`WorktreeHasUserWork` naming the files and commits,
and nothing is touched.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from xla_host.errors import ExitCode, GitError, SourceError
from xla_wheels.bundle import Component
from xla_wheels.gitutil import GitRunner, compose, run_git
from xla_wheels.patches import DEFAULT_AUTHOR, commit_message, parse_patch
from xla_wheels.upstream_tree import (
    BUILD_OWNED,
    OPENXLA_PATCHES,
    TORCH_XLA_IN_TORCH,
    workspace_openxla_patches,
)

_IN_PROGRESS = (
    ("rebase-merge", "a rebase"),
    ("rebase-apply", "a rebase or git am"),
    ("MERGE_HEAD", "a merge"),
    ("CHERRY_PICK_HEAD", "a cherry-pick"),
    ("REVERT_HEAD", "a revert"),
)
_SHOWN = 20
"""At most this many files or commits are named in the error (then "and N more")."""


class WorktreeHasUserWork(SourceError):
    """The worktree holds work the pipeline did not make; nothing was touched (exit 4)."""

    exit_code = ExitCode.USER_WORK


@dataclass(frozen=True)
class WorktreeCheck:
    """What a worktree holds, compared with what the pipeline would make there."""

    worktree: Path
    head: str
    pin: str
    expected: str | None
    """The series head computed from the pin; None when the series does not apply."""
    changes: tuple[str, ...]
    """``git status --porcelain`` lines of uncommitted work (tracked and untracked)."""
    ignored: tuple[str, ...]
    foreign_commits: tuple[str, ...]
    """``<sha> <subject>`` of each commit not made by the pipeline, oldest first."""
    in_progress: str | None
    same_repository: bool
    """The worktree belongs to the cache repository of the component's current remote."""
    built: bool = False
    """Its files carry the edits the torch_xla build makes in place (torch_xla's
    ``openxla_patches/`` on the OpenXLA checkout): the pipeline's, but the next build
    needs the tree without them, so it is recreated, never reused."""

    @property
    def has_user_work(self) -> bool:
        return bool(self.changes or self.foreign_commits or self.in_progress)

    @property
    def reusable(self) -> bool:
        """At the pin or the expected series head, nothing of the user's: keep it as is."""
        return (
            not self.has_user_work
            and not self.built
            and self.same_repository
            and self.head in {self.pin, self.expected}
        )


def expected_head(
    worktree: Path, component: Component, pin: str, runner: GitRunner = run_git
) -> str | None:
    """The commit the patch stage makes from ``pin`` with ``component``'s series.

    Same tree (``git apply`` of each file, in order), same message (the header), same
    author, committer and dates as :func:`xla_wheels.patches.apply_series`, built with
    plumbing in a temporary index: the worktree, its index and its refs are untouched
    (the objects land in the shared object store, where ``git gc`` collects them).
    """
    parent = pin
    with tempfile.TemporaryDirectory(prefix="xla-wheels-expected-") as scratch:
        for number, ref in enumerate(component.patches):
            header = parse_patch(ref.path, component=component.name)
            apply = ["apply", "--cached", "--whitespace=nowarn", str(ref.path)]
            tree = _scratch_tree(worktree, parent, [apply], runner)
            if tree is None:
                return None  # the patch stage reports the conflict itself
            message_file = Path(scratch) / f"{number:04d}.msg"
            message_file.write_text(commit_message(header.text), encoding="utf-8")
            parent = runner(
                compose(
                    ["commit-tree", tree, "-p", parent, "-F", str(message_file)],
                    cwd=worktree,
                    config=("-c", "i18n.commitEncoding=UTF-8"),
                    env=header.commit_env(),
                )
            ).stdout.strip()
    return parent


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line for line in text.splitlines() if line.strip())


def inspect(
    worktree: Path,
    repo: Path,
    component: Component,
    pin: str,
    runner: GitRunner = run_git,
) -> WorktreeCheck:
    """Read what ``worktree`` holds; changes nothing in it."""
    head_probe = runner(compose(["rev-parse", "HEAD"], cwd=worktree), check=False)
    if head_probe.returncode != 0:
        raise WorktreeHasUserWork(
            f"{worktree} exists but is not a git worktree the pipeline made "
            f"({head_probe.stderr.strip() or 'git rev-parse HEAD failed'}); nothing was changed",
            fix=f"move it away (`mv {worktree} {worktree}.saved`) and run again",
        )
    head = head_probe.stdout.strip()

    def out(*args: str, check: bool = True) -> str:
        return runner(compose(args, cwd=worktree), check=check).stdout

    common = out("rev-parse", "--path-format=absolute", "--git-common-dir", check=False).strip()
    same_repository = bool(common) and Path(common).resolve() == repo.resolve()
    status = out("status", "--porcelain", "--untracked-files=all", "--ignored=matching")
    changes, ignored = _changes_and_ignored(status, BUILD_OWNED.get(component.name, ()))
    in_progress = next(
        (what for name, what in _IN_PROGRESS
         if (worktree / out("rev-parse", "--git-path", name).strip()).exists()),
        None,
    )  # fmt: skip
    # Commits beyond every commit the sources stage pinned, with their committer.
    log_format = "--format=%H%x00%cn <%ce>%x00%s"
    not_pinned = ("--not", "--glob=refs/pinned/*")
    foreign = _foreign_commits(
        out("log", "--reverse", log_format, "HEAD", *not_pinned, check=False)
    )
    try:
        expected = expected_head(worktree, component, pin, runner) if same_repository else None
    except GitError:
        expected = None
    built = False
    if (
        changes
        and expected is not None
        and head == expected
        and not any(line.startswith("?? ") for line in changes)
    ):
        built = _is_build_edit(worktree, component, expected, runner)
        if built:
            changes = ()
    # Commits the user made (an amend) whose trees and messages are exactly what the
    # patch files make again (after `make patch-export`): saved, so nothing is lost.
    if (
        foreign
        and expected is not None
        and head != expected
        and _series_content(worktree, pin, head, runner)
        == _series_content(worktree, pin, expected, runner)
    ):
        foreign = []
    return WorktreeCheck(
        worktree=worktree,
        head=head,
        pin=pin,
        expected=expected,
        changes=changes,
        ignored=ignored,
        foreign_commits=tuple(foreign),
        in_progress=in_progress,
        same_repository=same_repository,
        built=built,
    )


def _changes_and_ignored(
    status: str, owned: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """From ``git status --porcelain --ignored``: the changed entries, and the ignored
    paths, leaving out the untracked and ignored files the build owns (``owned``)."""
    entries = [
        line
        for line in _lines(status)
        if not (line.startswith(("?? ", "!! ")) and line[3:].startswith(owned))
    ]
    changes = tuple(line for line in entries if not line.startswith("!! "))
    ignored = tuple(line[3:] for line in entries if line.startswith("!! "))
    return changes, ignored


def _foreign_commits(listing: str) -> list[str]:
    """The commits of ``listing`` (``%H%x00%cn <%ce>%x00%s`` lines) someone other than
    the pipeline committed, as ``sha subject (committed by ...)``."""
    foreign = []
    for line in _lines(listing):
        sha, committer, subject = [*line.split("\0"), "", ""][:3]
        if committer != DEFAULT_AUTHOR:
            foreign.append(f"{sha[:12]} {subject} (committed by {committer})")
    return foreign


def _scratch_tree(
    worktree: Path, start: str, steps: list[list[str]], runner: GitRunner
) -> str | None:
    """The tree of ``start`` after running each git ``steps`` command on a scratch index
    (None if one fails): only objects are written, never the worktree or its index."""
    with tempfile.TemporaryDirectory(prefix="xla-wheels-tree-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        runner(compose(["read-tree", start], cwd=worktree, env=env))
        for step in steps:
            if runner(compose(step, cwd=worktree, env=env), check=False).returncode != 0:
                return None
        return runner(compose(["write-tree"], cwd=worktree, env=env)).stdout.strip()


def _is_build_edit(worktree: Path, component: Component, head: str, runner: GitRunner) -> bool:
    """Are the worktree's files exactly ``head`` plus the edits the build makes in place?

    The torch_xla build applies torch_xla's ``openxla_patches/`` (the ones its WORKSPACE
    lists) to the OpenXLA worktree, from the copy of torch_xla it builds at
    ``<torch>/xla`` (see ``builder/run_recipe.py``, ``apply-openxla-patches``). The same
    files applied to ``head`` in a scratch index must give the worktree's tree.
    """
    if component.name != "openxla":
        return False
    built_from = worktree.parent / "torch" / TORCH_XLA_IN_TORCH
    names = workspace_openxla_patches(built_from)
    if not names:
        return False
    applied = [
        ["apply", "--cached", "-p1", "--ignore-whitespace", str(built_from / OPENXLA_PATCHES / n)]
        for n in names
    ]
    expected = _scratch_tree(worktree, head, applied, runner)
    # `git add -u`: the tracked files as they are on disk (untracked ones stay the user's).
    actual = _scratch_tree(worktree, "HEAD", [["add", "-u"]], runner)
    return expected is not None and expected == actual


def _series_content(
    worktree: Path, pin: str, head: str, runner: GitRunner
) -> list[tuple[str, str]] | None:
    """(tree, message) of each commit from ``pin`` (excluded) to ``head``, oldest first;
    None when ``head`` does not descend from ``pin`` by a straight line of commits."""
    listing = runner(
        compose(
            ["rev-list", "--reverse", "--parents"],
            operands=[f"{pin}..{head}"],
            end="--end-of-options",
            cwd=worktree,
        ),
        check=False,
    )
    if listing.returncode != 0:
        return None
    content = []
    parent = pin
    for line in _lines(listing.stdout):
        sha, *parents = line.split()
        if parents != [parent]:
            return None
        raw = runner(compose(["cat-file", "commit", sha], cwd=worktree)).stdout
        headers, _, message = raw.partition("\n\n")
        tree = headers.splitlines()[0].removeprefix("tree ")
        content.append((tree, message))
        parent = sha
    return content if parent == head else None


def _listed(lines: tuple[str, ...]) -> str:
    shown = "".join(f"\n    {line}" for line in lines[:_SHOWN])
    if len(lines) > _SHOWN:
        shown += f"\n    ... and {len(lines) - _SHOWN} more"
    return shown


def refuse_user_work(check: WorktreeCheck, bundle: str, component: str) -> None:
    """Raise :class:`WorktreeHasUserWork` when ``check`` shows work of the user's."""
    if not check.has_user_work:
        return
    worktree = check.worktree
    parts = [f"{worktree} holds work the pipeline did not make; nothing was changed:"]
    fixes = []
    if check.in_progress:
        parts.append(f"  {check.in_progress} is under way in it")
        fixes.append(f"finish or abort it (`git -C {worktree} status` says how)")
    if check.foreign_commits:
        parts.append("  commits that are not in the patch series:" + _listed(check.foreign_commits))
        fixes.append(
            f"save them as patch files with `make patch-export BUNDLE={bundle} "
            f"COMPONENT={component}`"
        )
    if check.changes:
        parts.append("  uncommitted changes (git status --porcelain):" + _listed(check.changes))
        fixes.append(
            f"commit them and export (`make patch-export BUNDLE={bundle} "
            f"COMPONENT={component}`), or put them aside with `git -C {worktree} stash "
            "--include-untracked`"
        )
    fixes.append(f"or move the directory away (`mv {worktree} {worktree}.saved`)")
    raise WorktreeHasUserWork("\n".join(parts), fix="; ".join(fixes) + ", then run again")


def refuse_ignored_files(check: WorktreeCheck) -> None:
    """Recreating the worktree would delete its ignored files: stop and list them."""
    if not check.ignored:
        return
    worktree = check.worktree
    raise WorktreeHasUserWork(
        f"{worktree} must be recreated (it is at {check.head[:12]}, the bundle wants "
        f"{(check.expected or check.pin)[:12]}), which would delete files git ignores; "
        "nothing was changed:" + _listed(check.ignored),
        fix=f"review them (`git -C {worktree} clean -ndX`), keep what you need elsewhere, "
        f"then remove them (`git -C {worktree} clean -fdX`) or move the directory away "
        f"(`mv {worktree} {worktree}.saved`), then run again",
    )
