"""The real pytorch/xla source for the tests: where it comes from, and trees made from it.

The source repository is ``TORCH_XLA_SRC`` (a pytorch/xla repository, bare or not, holding
c04e61c) or, when that is not set, the shared snapshot next to the project,
``../shared/upstream/pytorch-xla.git``: a shallow bare clone holding c04e61c (branch
``master``) and the tag ``v2.9.0``. That snapshot is read-only and has no ``refs/``
directory, so git refuses it as a repository; it is used through an *alternates*
repository (its objects, a copy of its packed-refs and shallow files) made in a scratch
directory, which is also what the other tests and the gate are given.

Trees are ``git worktree``s of that repository: the base at c04e61c, and the patched tree
with the series applied one commit per patch (``git apply --whitespace=error-all``, the
patch's header as the commit message), so ``git blame`` on a patched line names its patch.

Tests that need the source carry the ``real_source`` marker. Without a source they skip and
say why; in CI (``CI`` truthy) with the shared snapshot present, such a skip is a failure
(tests/conftest.py): CI must never pass by not looking at the real source.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.gitrepos import GIT_ENV, REPO_ROOT, git
from xla_wheels.patches import commit_message, split_patch

BASE = "c04e61c3424142c0eebcc9e59984b9d8fced18c0"
V2_9_0_TAG = "v2.9.0"
SHARED_SNAPSHOT = REPO_ROOT.parent / "shared" / "upstream" / "pytorch-xla.git"
PATCH_DIR = REPO_ROOT / "patches" / "torch_xla"
SOURCE_VARIABLE = "TORCH_XLA_SRC"
_TRUTHY = {"1", "true", "yes", "on"}


class SourceUnusable(Exception):
    """TORCH_XLA_SRC is set but cannot be used: a configuration error, never a skip."""


@dataclass(frozen=True)
class SourceChoice:
    path: Path | None
    why_none: str = ""


def is_ci(environ: Mapping[str, str]) -> bool:
    return environ.get("CI", "").strip().lower() in _TRUTHY


def required_in_ci(environ: Mapping[str, str]) -> bool:
    """In CI with the shared snapshot present, no real-source test may skip."""
    return is_ci(environ) and SHARED_SNAPSHOT.is_dir()


def choose_source(environ: Mapping[str, str]) -> SourceChoice:
    if value := environ.get(SOURCE_VARIABLE):
        return SourceChoice(Path(value).expanduser())
    if SHARED_SNAPSHOT.is_dir():
        return SourceChoice(SHARED_SNAPSHOT)
    return SourceChoice(
        None,
        f"no pytorch/xla source: {SOURCE_VARIABLE} is not set and the shared snapshot "
        "../shared/upstream/pytorch-xla.git (beside the project) does not exist "
        "(set TORCH_XLA_SRC to a pytorch/xla repository holding c04e61c)",
    )


def _git_dir(source: Path) -> Path:
    return source / ".git" if (source / ".git").is_dir() else source


def alternates_repository(source: Path, dest: Path) -> Path:
    """A bare repository at ``dest`` that borrows ``source``'s objects and refs.

    Works for the refs-less shared snapshot as for any repository: its objects through
    ``objects/info/alternates``, its packed-refs, loose refs and shallow file copied.
    """
    git_dir = _git_dir(source)
    objects = git_dir / "objects"
    if not objects.is_dir():
        raise SourceUnusable(f"{source} is not a git repository (no objects directory)")
    git(dest.parent, "init", "-q", "--bare", str(dest))
    (dest / "objects" / "info" / "alternates").write_text(f"{objects.resolve()}\n")
    for name in ("packed-refs", "shallow"):
        if (git_dir / name).is_file():
            shutil.copyfile(git_dir / name, dest / name)
    if (git_dir / "refs").is_dir():
        shutil.copytree(git_dir / "refs", dest / "refs", dirs_exist_ok=True)
    probe = subprocess.run(
        ["git", "--git-dir", str(dest), "cat-file", "-e", f"{BASE}^{{commit}}"],
        env=GIT_ENV,
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        raise SourceUnusable(f"{source} does not hold the series' base commit {BASE}")
    return dest


def worktree(repository: Path, dest: Path, commit: str) -> Path:
    git(repository, "worktree", "add", "-q", "--detach", str(dest), commit)
    return dest


def apply_series(tree: Path, patches: list[Path]) -> list[str]:
    """Apply ``patches`` one commit each (whitespace errors refused); the new commits."""
    commits = []
    for patch in patches:
        git(tree, "apply", "--whitespace=error-all", str(patch))
        git(tree, "add", "-A")
        # The patch stage's own message: the Subject as the title, the header as the body.
        message = commit_message(split_patch(patch.read_text(encoding="utf-8"))[0])
        git(tree, "commit", "-q", "--no-verify", "-F", "-", input_text=message)
        commits.append(git(tree, "rev-parse", "HEAD"))
    return commits


def series_patches() -> list[Path]:
    """The torch_xla series in the order the patch stage applies it (file name order)."""
    return sorted(PATCH_DIR.glob("*.patch"))
