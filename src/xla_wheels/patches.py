"""Stage 3, patches: each component's series becomes one git commit per patch.

A patch file is a ``git diff`` preceded by a header (see docs/patches.md, "Patch files")::

    Subject: what the patch does
    Component: torch_xla
    Base: <full SHA it was made against>
    Fixes: the defect
    Why: why it matters, why this way
    Upstream: issue/PR links and status, or "not upstreamed"
    Files: a/b.cpp, c/d.h

    Free text...

    diff --git a/... b/...

The worktree (detached at the pin after the sources stage) becomes the branch
``xla-wheels/<bundle>`` with one commit per patch: ``git apply --index`` then ``git
commit``. The commit message is the patch's header (its ``Subject:`` value as the
title, the other lines verbatim as the body); author and date come from
the optional ``Author:``/``Date:`` header lines, else a fixed identity and date; the
committer is fixed too. So the commits, and the final commit SHA, are a pure function of
the pin and the patch files: identical on every run and every machine. That SHA is what
torch_xla's setup.py reads (``git rev-parse HEAD``) and compiles in as ``XLA_GITREV``,
which is part of its compilation-cache key: a patched build no longer shares the pin's
revision with a stock build.

The commands are data (:class:`~xla_wheels.plan.PlannedCommand`): the dry-run plan prints
:func:`series_commands`, and :func:`apply_series` executes exactly those objects.

A series is all or nothing: on a conflict the worktree is reset to the pin, so it is
exactly as it was before the series started.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import takewhile
from pathlib import Path
from typing import Literal

from xla_host import filemode
from xla_host.errors import PatchError, PatchFileError
from xla_host.tables import read_regular
from xla_wheels.bundle import Component, PatchRef
from xla_wheels.gitutil import compose, git, git_out, run_git, status_porcelain
from xla_wheels.plan import PlannedCommand
from xla_wheels.series_hygiene import DIFF_FILE, LineDefect, scan_patch_text

REQUIRED_KEYS = ("Subject", "Component", "Base", "Fixes", "Why", "Upstream", "Files")
OPTIONAL_KEYS = ("Verified", "Not-verified", "Author", "Date")
DEFAULT_AUTHOR = "xla-wheels patch series <patches@xla-wheels.invalid>"
"""Author of a patch commit whose header has no ``Author:`` line; also every committer."""
DEFAULT_DATE = "2000-01-01T00:00:00+00:00"
"""Date of a patch commit whose header has no ``Date:`` line; also every commit date.
Fixed (not "now"), so the commit SHAs do not depend on when or where the stage ran."""
MESSAGES_SUFFIX = ".messages"
"""``<worktree>.messages/``: the commit message files (``git commit -F``) of a series."""
_AUTHOR = re.compile(r"([^<>]+?)\s*<([^<>\s]+)>")
_HEADER_LINE = re.compile(r"([A-Z][A-Za-z-]*):\s?(.*)")
_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")
_NO_FILE = re.compile(r"error: (.+): (No such file or directory|does not exist in index)")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)
# Lines git apply would take for the start of a diff if they stood in the header.
_DIFF_START = ("diff ", "--- ", "+++ ", "@@ ")


@dataclass(frozen=True)
class PatchHeader:
    fields: dict[str, str]
    text: str = ""
    """The header as written (its line breaks kept): the commit message's source."""

    @property
    def base(self) -> str:
        return self.fields["Base"]

    @property
    def declared_files(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.fields["Files"].split(",") if name.strip())

    def commit_env(self) -> dict[str, str]:
        """The fixed git identity and dates of this patch's commit (author and committer)."""
        author = _AUTHOR.fullmatch(self.fields.get("Author", DEFAULT_AUTHOR))
        committer = _AUTHOR.fullmatch(DEFAULT_AUTHOR)
        assert author and committer  # parse_patch refuses an Author that is not 'Name <email>'
        date = git_date(self.fields.get("Date", DEFAULT_DATE))
        return {
            "GIT_AUTHOR_NAME": author[1],
            "GIT_AUTHOR_EMAIL": author[2],
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_NAME": committer[1],
            "GIT_COMMITTER_EMAIL": committer[2],
            "GIT_COMMITTER_DATE": date,
        }


def git_date(iso: str) -> str:
    """ISO 8601 with an offset -> git's internal ``<epoch> <+hhmm>`` (no locale, no zone db)."""
    moment = datetime.fromisoformat(iso)
    offset = moment.utcoffset()
    if offset is None:
        raise ValueError(f"no UTC offset in {iso!r}")
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"{int(moment.timestamp())} {sign}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d}"


def split_patch(text: str) -> tuple[str, str]:
    """(header, diff) of a patch file's text; the header keeps its own line breaks."""
    if text.startswith("diff --git "):
        return "", text
    diff_at = text.find("\ndiff --git ")
    if diff_at < 0:
        return text, ""
    return text[: diff_at + 1], text[diff_at + 1 :]


def commit_message(header_text: str) -> str:
    """A patch header as its commit message, the inverse of :func:`header_from_message`.

    The ``Subject:`` value becomes the title, so ``git log --oneline`` and ``git rebase -i``
    show what each patch does; the rest of the header, verbatim, is the body.
    """
    header = header_text.rstrip("\n")
    if header.startswith("Subject: ") and "\n" in header:
        first, rest = header.split("\n", 1)
        return f"{first.removeprefix('Subject: ')}\n\n{rest}\n"
    return header + "\n"


def header_from_message(message: str) -> str:
    """A commit message back as a patch header (no trailing newline)."""
    message = message.rstrip("\n")
    if message.startswith("Subject: ") or "\n\n" not in message:
        return message
    title, body = message.split("\n\n", 1)
    return f"Subject: {title}\n{body}"


def parse_patch(path: Path, *, component: str | None = None) -> PatchHeader:
    """Read and validate a patch file's header; every problem names the file and the fix."""
    text = _read_patch_text(path)
    header_text, diff_text = split_patch(text)
    if not diff_text:
        raise PatchFileError(
            f"{path}: no 'diff --git' section", fix="append the output of `git diff`"
        )
    fields = _header_fields(path, header_text)
    _check_header_values(path, fields, component)
    touched = tuple(dict.fromkeys(match.group(2) for match in DIFF_FILE.finditer(diff_text)))
    header = PatchHeader(fields, header_text)
    if set(header.declared_files) != set(touched):
        raise PatchFileError(
            f"{path}: Files lists {', '.join(header.declared_files)} but the diff touches "
            f"{', '.join(touched)}",
            fix="make the Files line name exactly the files in the diff",
        )
    return header


def _read_patch_text(path: Path) -> str:
    """The patch file's text: a regular file of UTF-8."""
    if path.is_dir():
        raise PatchFileError(
            f"{path} is a directory, not a patch file",
            fix="give the patch files inside it, one each",
        )
    try:
        # A FIFO or device is refused from its stat, before it is opened.
        text = read_regular(path, PatchFileError, what="patch file").decode("utf-8")
    except UnicodeDecodeError as error:
        raise PatchFileError(
            f"{path}: not UTF-8 text (byte {error.start} cannot be read)",
            fix="save the patch as UTF-8 (as `git format-patch` writes it)",
        ) from None
    return text


def _header_fields(path: Path, header_text: str) -> dict[str, str]:
    """The header's ``Key: value`` fields (continuation lines joined), each known, the
    required ones present, and no line git apply would take for a diff."""
    fields: dict[str, str] = {}
    lines = header_text.splitlines()
    last_key: str | None = None
    for number, line in enumerate(takewhile(str.strip, lines), start=1):
        if line.startswith("  ") and last_key:
            fields[last_key] += "\n" + line.strip()
        else:
            match = _HEADER_LINE.fullmatch(line)
            if not match:
                raise PatchFileError(
                    f"{path}: header line {number} is not 'Key: value': {line!r}",
                    fix="continuation lines start with two spaces; a blank line ends the header",
                )
            last_key = match.group(1)
            if last_key not in REQUIRED_KEYS + OPTIONAL_KEYS:
                raise PatchFileError(
                    f"{path}: unknown header key '{last_key}'",
                    fix=f"use: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}",
                )
            fields[last_key] = match.group(2).strip()
    missing = [key for key in REQUIRED_KEYS if not fields.get(key)]
    if missing:
        raise PatchFileError(
            f"{path}: header is missing {', '.join(missing)}",
            fix="every patch starts with Subject, Component, Base, Fixes, Why, Upstream and "
            "Files lines (see docs/patches.md, 'Patch files')",
        )
    for line_number, line in enumerate(lines, start=1):
        if line.startswith(_DIFF_START):
            raise PatchFileError(
                f"{path}: header line {line_number} starts like a diff: {line!r}",
                fix="reword it; git apply would take it for part of the diff",
            )
    return fields


def _check_header_values(path: Path, fields: Mapping[str, str], component: str | None) -> None:
    """Base a full SHA, Author and Date well formed, Component the series' own."""
    if not re.fullmatch(r"[0-9a-f]{40}", fields["Base"]):
        raise PatchFileError(
            f"{path}: Base '{fields['Base']}' is not a full 40-hex commit SHA",
            fix="write the full SHA the diff was made against",
        )
    if "Author" in fields and not _AUTHOR.fullmatch(fields["Author"]):
        raise PatchFileError(
            f"{path}: Author '{fields['Author']}' is not 'Name <email>'",
            fix="write e.g. 'Author: Jane Doe <jane@example.com>', or drop the line",
        )
    if "Date" in fields:
        try:
            git_date(fields["Date"])
        except ValueError as error:
            raise PatchFileError(
                f"{path}: Date '{fields['Date']}' is not an ISO 8601 date with a UTC offset",
                fix="write e.g. 'Date: 2025-12-18T10:08:20-08:00', or drop the line",
            ) from error
    if component is not None and fields["Component"] != component:
        raise PatchFileError(
            f"{path}: header says Component: {fields['Component']}, but the bundle lists it "
            f"under {component}",
            fix="move the file to the right component's series",
        )


@dataclass(frozen=True)
class AppliedPatch:
    relpath: str
    sha256: str


@dataclass(frozen=True)
class AppliedSeries:
    """What the lock and the version stamp record about a component's patches."""

    component: str
    base_commit: str
    patches: tuple[AppliedPatch, ...] = field(default_factory=tuple)
    head: str = ""
    """The last commit of the series (the pin when there are no patches): the revision
    the build sees."""
    branch: str = ""

    @property
    def digest(self) -> str:
        return series_digest(self.patches)

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"digest": self.digest}, indent=2, sort_keys=True)


def series_digest(patches: Sequence[AppliedPatch]) -> str:
    """sha256 over the ordered (path, sha256) pairs: order matters, names and bytes too."""
    hasher = hashlib.sha256()
    for patch in patches:
        hasher.update(f"{patch.relpath}\0{patch.sha256}\n".encode())
    return hasher.hexdigest()


def describe_series(component: Component) -> tuple[AppliedPatch, ...]:
    return tuple(AppliedPatch(ref.relpath, ref.sha256()) for ref in component.patches)


FailedAt = Literal["", "lines", "header", "apply"]
"""What stopped a patch: its lines (conflict markers, whitespace errors), its header, or
``git apply``; empty when it applied."""


@dataclass(frozen=True)
class PatchResult:
    relpath: str
    applied: bool
    detail: str
    defects: tuple[LineDefect, ...] = ()
    """Conflict markers and whitespace errors in the patch file (then not applied)."""
    failed_at: FailedAt = ""


def _conflict_message(ref: PatchRef, stderr: str) -> str:
    text = ref.path.read_text(encoding="utf-8")
    missing = _NO_FILE.search(stderr)
    if missing:
        return (
            f"patch patches/{ref.relpath} does not apply: target file {missing.group(1)} "
            "does not exist at this commit"
        )
    failed = _FAILED_AT.search(stderr)
    if failed:
        target, line = failed.group(1), failed.group(2)
        hunk = _first_hunk_at(text, target, int(line))
        return (
            f"patch patches/{ref.relpath} does not apply: file {target}, first failing hunk "
            f"{hunk or f'at line {line}'}"
        )
    return f"patch patches/{ref.relpath} does not apply: {stderr.strip()}"


def _first_hunk_at(patch_text: str, target: str, old_line: int) -> str | None:
    section_start = patch_text.find(f"diff --git a/{target} b/")
    if section_start < 0:
        return None
    next_section = patch_text.find("\ndiff --git ", section_start + 1)
    section = patch_text[section_start : next_section if next_section > 0 else None]
    for match in _HUNK.finditer(section):
        if int(match.group(1)) == old_line:
            return match.group(0)
    return None


def branch_name(bundle: str, worktree: Path) -> str:
    """The branch a bundle's patched worktree is on.

    The cache repository (and so its branches) is shared by every checkout of the project
    on the machine, and git lets one branch be checked out in one worktree only: the
    digest of the worktree's path keeps two checkouts building one bundle apart.
    """
    digest = hashlib.sha256(str(worktree.resolve()).encode()).hexdigest()[:8]
    return f"xla-wheels/{bundle}-{digest}"


def messages_dir(worktree: Path) -> Path:
    return worktree.with_name(worktree.name + MESSAGES_SUFFIX)


@dataclass(frozen=True)
class SeriesStep:
    """One patch of a series as the two commands that turn it into a commit."""

    patch: PatchRef
    message_file: Path
    message: str
    apply: PlannedCommand
    commit: PlannedCommand


@dataclass(frozen=True)
class SeriesCommands:
    """Everything the patch stage runs for one component, in run order."""

    branch: PlannedCommand
    steps: tuple[SeriesStep, ...]

    @property
    def commands(self) -> tuple[PlannedCommand, ...]:
        return (self.branch, *(c for step in self.steps for c in (step.apply, step.commit)))


# Settings that would make a commit depend on the machine or the user: signing adds a
# signature to the object, hooks may edit the message, a non-UTF-8 commitEncoding adds
# an encoding header. All are pinned for our commits.
COMMIT_CONFIG = (
    "-c",
    "commit.gpgsign=false",
    "-c",
    "i18n.commitEncoding=UTF-8",
    "-c",
    "core.hooksPath=/dev/null",
)


def series_commands(worktree: Path, component: Component, branch: str) -> SeriesCommands:
    """The commands that make ``component``'s series a branch of commits in ``worktree``.

    Pure: reads the patch files (their headers become the messages), runs nothing. The
    plan prints these; :func:`apply_series` executes these very objects.
    """
    steps = []
    for ref in component.patches:
        header = parse_patch(ref.path, component=component.name)
        message_file = messages_dir(worktree) / f"{ref.path.name}.msg"
        # The file joined to its option: a path is never an element of its own there.
        commit = [
            "commit",
            "--quiet",
            "--no-verify",
            "--cleanup=verbatim",
            f"--file={message_file}",
        ]
        steps.append(
            SeriesStep(
                patch=ref,
                message_file=message_file,
                message=commit_message(header.text),
                apply=compose(
                    ["apply", "--index", "--whitespace=nowarn"],
                    operands=[str(ref.path)],
                    cwd=worktree,
                    note=f"sha256:{ref.sha256()}",
                ),
                commit=compose(
                    commit,
                    cwd=worktree,
                    config=COMMIT_CONFIG,
                    env=header.commit_env(),
                    note=f"message: the header of patches/{ref.relpath}",
                ),
            )
        )
    branch_command = compose(
        ["checkout", "--quiet", "-B", branch], cwd=worktree, note="at the pinned commit"
    )
    return SeriesCommands(branch_command, tuple(steps))


def apply_series(
    worktree: Path,
    component: Component,
    base_commit: str,
    *,
    branch: str = "xla-wheels/series",
    build_owned: tuple[str, ...] = (),
) -> AppliedSeries:
    """Make ``component``'s series a branch of commits on ``worktree``; all or nothing.

    Each planned command runs through :func:`~xla_wheels.gitutil.run_git`, looked up at
    call time so a test can record what ran while git still runs for real.
    """
    planned = series_commands(worktree, component, branch)
    # Untracked paths the build owns (``upstream_tree.BUILD_OWNED``) may be there.
    before = "\n".join(
        line
        for line in status_porcelain(worktree).splitlines()
        if not (build_owned and line.startswith("?? ") and line[3:].startswith(build_owned))
    )
    if before:
        raise PatchError(
            f"{worktree} is not clean before the {component.name} series:\n{before}",
            fix="re-run the sources stage to get a fresh worktree",
        )
    head = git_out(["rev-parse", "HEAD"], cwd=worktree)
    if head != base_commit:
        raise PatchError(
            f"{worktree} is at {head}, not at the pinned {base_commit}",
            fix="re-run the sources stage to get a fresh worktree",
        )
    messages_dir(worktree).mkdir(parents=True, exist_ok=True)
    for step in planned.steps:
        # Write-by-rename: an interrupted run never leaves half a message behind.
        filemode.write_by_rename(step.message_file, step.message)
    _run(planned.branch, f"cannot create branch {branch} in {worktree}")
    for number, step in enumerate(planned.steps):
        result = run_git(step.apply, check=False, echo=True)
        if result.returncode != 0:
            message = _conflict_message(step.patch, result.stderr)
            git(["reset", "--quiet", "--hard", base_commit], cwd=worktree, check=False)
            git(["checkout", "--quiet", "--detach", base_commit], cwd=worktree, check=False)
            after = status_porcelain(worktree)
            state = (
                "the worktree is as before the series"
                if not after
                else f"WARNING: the worktree could not be fully restored:\n{after}"
            )
            raise PatchError(
                f"{message}\n  ({number} earlier patch(es) of the series undone; {state})",
                fix=f"rebase patches/{step.patch.relpath} onto {base_commit} (see README, "
                "'Updating a patch')",
            )
        _run(step.commit, f"cannot commit patches/{step.patch.relpath}")
    head = git_out(["rev-parse", "HEAD"], cwd=worktree)
    return AppliedSeries(component.name, base_commit, describe_series(component), head, branch)


def _run(command: PlannedCommand, what: str) -> None:
    run_git(
        command,
        echo=True,
        error=lambda result: PatchError(
            f"{what}: {result.stderr.strip() or result.stdout.strip()}",
            fix="see git's message above",
        ),
    )


SeriesTreeCheck = Callable[[Path, Mapping[str, str]], None]
"""Called with the scratch tree holding the whole series (one commit per patch) and
{commit: patch relpath}, before the tree is removed (``patches-check``'s compiled checks)."""


def check_series(
    source_repo: Path,
    commit: str,
    component: Component,
    *,
    after_apply: SeriesTreeCheck | None = None,
) -> list[PatchResult]:
    """Apply the series to a scratch clone of ``source_repo`` at ``commit``, one commit
    per patch; report each.

    A patch file holding conflict markers or whitespace errors fails (``defects``), and
    nothing is applied: those lines apply as well as any other, so "applies" would hide
    them. When every patch applies, ``after_apply`` gets the scratch tree.
    """
    results = _defective_patches(component)
    if results:
        return results
    scratch = Path(tempfile.mkdtemp(prefix=f"xla-wheels-check-{component.name}-"))
    try:
        base = _scratch_clone(source_repo, commit, component, scratch)
        commits: dict[str, str] = {}
        for ref in component.patches:
            result = _commit_patch(ref, component, scratch, base, commits)
            results.append(result)
            if not result.applied:
                break
        if after_apply is not None and len(commits) == len(component.patches):
            after_apply(scratch, commits)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def _defective_patches(component: Component) -> list[PatchResult]:
    """A failed result for each patch file holding conflict markers or whitespace errors."""
    results: list[PatchResult] = []
    for ref in component.patches:
        text = ref.path.read_text(encoding="utf-8", errors="replace")
        defects = scan_patch_text(text, f"patches/{ref.relpath}")
        if defects:
            results.append(
                PatchResult(
                    ref.relpath,
                    False,
                    f"{len(defects)} line(s) with conflict markers or whitespace errors",
                    tuple(defects),
                    "lines",
                )
            )
    return results


def _scratch_clone(source_repo: Path, commit: str, component: Component, scratch: Path) -> str:
    """Clone ``source_repo`` into ``scratch``, checked out at ``commit``; its full SHA."""
    # --shared borrows the objects through alternates, so a check against a large
    # checkout is quick and never writes into the source repository.
    git(
        ["clone", "--quiet", "--shared", "--no-checkout"],
        operands=[str(source_repo), str(scratch)],
        echo=True,
    )
    probe = git(
        ["rev-parse", "--verify", "--quiet"],
        operands=[f"{commit}^{{commit}}"],
        end="--end-of-options",
        cwd=scratch,
        check=False,
    )
    if probe.returncode != 0:
        raise PatchError(
            f"{source_repo} does not contain {component.name} commit {commit}",
            fix="fetch it there first (`git fetch origin` in that checkout)",
        )
    base = probe.stdout.strip()
    git(["checkout", "--quiet", "--detach", base], cwd=scratch)
    return base


def _commit_patch(
    ref: PatchRef, component: Component, scratch: Path, base: str, commits: dict[str, str]
) -> PatchResult:
    """Apply ``ref`` in ``scratch`` and commit it (its commit added to ``commits``), or
    the result saying why it does not apply."""
    try:
        header = parse_patch(ref.path, component=component.name)
    except PatchError as error:
        return PatchResult(ref.relpath, False, error.message, failed_at="header")
    # error-all: a whitespace error the scan above missed still fails here (git's
    # own rule is the last word).
    result = git(
        ["apply", "--index", "--whitespace=error-all", str(ref.path)],
        cwd=scratch,
        check=False,
    )
    if result.returncode != 0:
        return PatchResult(
            ref.relpath, False, _conflict_message(ref, result.stderr), failed_at="apply"
        )
    stat = git_out(["diff", "--cached", "--shortstat", base], cwd=scratch)
    # One commit per patch: `git blame` then names the patch of any line.
    git(
        [*COMMIT_CONFIG, "commit", "--quiet", "--no-verify", "-m", ref.relpath],
        cwd=scratch,
        env=header.commit_env(),
    )
    commits[git_out(["rev-parse", "HEAD"], cwd=scratch)] = ref.relpath
    return PatchResult(ref.relpath, True, f"applies (series so far: {stat})")


# The state file the patch stage leaves next to a worktree (read by patch-export and the
# build). Whether a worktree may be reused or recreated is never decided from it, but
# from the worktree's content (xla_wheels.worktree_guard): a record can be stale.
STATE_SUFFIX = ".applied.json"


def state_path(worktree: Path) -> Path:
    return worktree.with_name(worktree.name + STATE_SUFFIX)


def write_state(worktree: Path, series: AppliedSeries) -> Path:
    """Record the applied series next to the worktree (read by sources, the build, export)."""
    state = state_path(worktree)
    filemode.write_by_rename(state, series.to_json() + "\n")
    return state


def read_state(worktree: Path) -> AppliedSeries | None:
    """The series the patch stage recorded for ``worktree``; ``None`` when there is none."""
    try:
        data = json.loads(state_path(worktree).read_text(encoding="utf-8"))
        return AppliedSeries(
            component=data["component"],
            base_commit=data["base_commit"],
            patches=tuple(AppliedPatch(p["relpath"], p["sha256"]) for p in data["patches"]),
            head=data.get("head", ""),
            branch=data.get("branch", ""),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
