"""Stage 3, patches: apply each component's series, in order, with ``git apply``.

A patch file is a ``git diff`` preceded by a header (see README, "Patch files")::

    Subject: what the patch does
    Component: torch_xla
    Base: <full SHA it was made against>
    Fixes: the defect
    Why: why it matters, why this way
    Upstream: issue/PR links and status, or "not upstreamed"
    Files: a/b.cpp, c/d.h

    Free text...

    diff --git a/... b/...

A series is all or nothing: on a conflict every patch already applied is reversed, so
the worktree is exactly as it was before the series started.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from xla_wheels import log
from xla_wheels.bundle import Component, PatchRef
from xla_wheels.errors import PatchError
from xla_wheels.gitutil import git, git_out, status_porcelain
from xla_wheels.sources import STATE_SUFFIX

REQUIRED_KEYS = ("Subject", "Component", "Base", "Fixes", "Why", "Upstream", "Files")
OPTIONAL_KEYS = ("Verified", "Not-verified")
_HEADER_LINE = re.compile(r"([A-Z][A-Za-z-]*):\s?(.*)")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")
_NO_FILE = re.compile(r"error: (.+): (No such file or directory|does not exist in index)")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*$", re.MULTILINE)
# Lines git apply would take for the start of a diff if they stood in the header.
_DIFF_START = ("diff ", "--- ", "+++ ", "@@ ")


@dataclass(frozen=True)
class PatchHeader:
    fields: dict[str, str]
    description: str
    touched_files: tuple[str, ...]

    @property
    def base(self) -> str:
        return self.fields["Base"]

    @property
    def declared_files(self) -> tuple[str, ...]:
        return tuple(name.strip() for name in self.fields["Files"].split(",") if name.strip())


def parse_patch(path: Path, *, component: str | None = None) -> PatchHeader:
    """Read and validate a patch file's header; every problem names the file and the fix."""
    text = path.read_text(encoding="utf-8")
    diff_at = text.find("\ndiff --git ")
    if not text.startswith("diff --git ") and diff_at < 0:
        raise PatchError(f"{path}: no 'diff --git' section", fix="append the output of `git diff`")
    header_text = "" if text.startswith("diff --git ") else text[: diff_at + 1]
    fields: dict[str, str] = {}
    lines = header_text.splitlines()
    index = 0
    last_key: str | None = None
    while index < len(lines) and lines[index].strip():
        line = lines[index]
        if line.startswith("  ") and last_key:
            fields[last_key] += "\n" + line.strip()
        else:
            match = _HEADER_LINE.fullmatch(line)
            if not match:
                raise PatchError(
                    f"{path}: header line {index + 1} is not 'Key: value': {line!r}",
                    fix="continuation lines start with two spaces; a blank line ends the header",
                )
            last_key = match.group(1)
            if last_key not in REQUIRED_KEYS + OPTIONAL_KEYS:
                raise PatchError(
                    f"{path}: unknown header key '{last_key}'",
                    fix=f"use: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}",
                )
            fields[last_key] = match.group(2).strip()
        index += 1
    missing = [key for key in REQUIRED_KEYS if not fields.get(key)]
    if missing:
        raise PatchError(
            f"{path}: header is missing {', '.join(missing)}",
            fix="every patch starts with Subject, Component, Base, Fixes, Why, Upstream and "
            "Files lines (see README, 'Patch files')",
        )
    for line_number, line in enumerate(lines, start=1):
        if line.startswith(_DIFF_START):
            raise PatchError(
                f"{path}: header line {line_number} starts like a diff: {line!r}",
                fix="reword it; git apply would take it for part of the diff",
            )
    if not re.fullmatch(r"[0-9a-f]{40}", fields["Base"]):
        raise PatchError(
            f"{path}: Base '{fields['Base']}' is not a full 40-hex commit SHA",
            fix="write the full SHA the diff was made against",
        )
    if component is not None and fields["Component"] != component:
        raise PatchError(
            f"{path}: header says Component: {fields['Component']}, but the bundle lists it "
            f"under {component}",
            fix="move the file to the right component's series",
        )
    diff_text = text[text.find("diff --git ") :] if header_text == "" else text[diff_at + 1 :]
    touched = tuple(dict.fromkeys(match.group(2) for match in _DIFF_FILE.finditer(diff_text)))
    header = PatchHeader(fields, "\n".join(lines[index:]).strip(), touched)
    if set(header.declared_files) != set(touched):
        raise PatchError(
            f"{path}: Files lists {', '.join(header.declared_files)} but the diff touches "
            f"{', '.join(touched)}",
            fix="make the Files line name exactly the files in the diff",
        )
    return header


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


@dataclass(frozen=True)
class PatchResult:
    relpath: str
    applied: bool
    detail: str


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


def apply_series(worktree: Path, component: Component, base_commit: str) -> AppliedSeries:
    """Apply ``component``'s series to ``worktree``; all or nothing."""
    for ref in component.patches:
        parse_patch(ref.path, component=component.name)
    before = status_porcelain(worktree)
    if before:
        raise PatchError(
            f"{worktree} is not clean before the {component.name} series:\n{before}",
            fix="re-run the sources stage to get a fresh worktree",
        )
    applied: list[PatchRef] = []
    for ref in component.patches:
        log.command(["git", "apply", "--whitespace=nowarn", str(ref.path)], cwd=str(worktree))
        result = git(["apply", "--whitespace=nowarn", str(ref.path)], cwd=worktree, check=False)
        if result.returncode != 0:
            message = _conflict_message(ref, result.stderr)
            _reverse(worktree, applied)
            after = status_porcelain(worktree)
            state = (
                "the worktree is as before the series"
                if not after
                else (f"WARNING: the worktree could not be fully restored:\n{after}")
            )
            raise PatchError(
                f"{message}\n  ({len(applied)} earlier patch(es) of the series reversed; {state})",
                fix=f"rebase patches/{ref.relpath} onto {base_commit} (see README, 'Updating "
                "a patch')",
            )
        applied.append(ref)
    return AppliedSeries(component.name, base_commit, describe_series(component))


def _reverse(worktree: Path, applied: Sequence[PatchRef]) -> None:
    for ref in reversed(applied):
        git(["apply", "-R", "--whitespace=nowarn", str(ref.path)], cwd=worktree, check=False)


def check_series(source_repo: Path, commit: str, component: Component) -> list[PatchResult]:
    """Apply the series to a scratch clone of ``source_repo`` at ``commit``; report each."""
    results: list[PatchResult] = []
    scratch = Path(tempfile.mkdtemp(prefix=f"xla-wheels-check-{component.name}-"))
    try:
        # --shared borrows the objects through alternates, so a check against a large
        # checkout is quick and never writes into the source repository.
        git(
            ["clone", "--quiet", "--shared", "--no-checkout", str(source_repo), str(scratch)],
            echo=True,
        )
        probe = git(
            ["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=scratch, check=False
        )
        if probe.returncode != 0:
            raise PatchError(
                f"{source_repo} does not contain {component.name} commit {commit}",
                fix="fetch it there first (`git fetch origin` in that checkout)",
            )
        git(["checkout", "--quiet", "--detach", probe.stdout.strip()], cwd=scratch)
        for ref in component.patches:
            try:
                parse_patch(ref.path, component=component.name)
            except PatchError as error:
                results.append(PatchResult(ref.relpath, False, error.message))
                break
            result = git(["apply", "--whitespace=nowarn", str(ref.path)], cwd=scratch, check=False)
            if result.returncode != 0:
                results.append(
                    PatchResult(ref.relpath, False, _conflict_message(ref, result.stderr))
                )
                break
            stat = git_out(["diff", "--shortstat"], cwd=scratch)
            results.append(PatchResult(ref.relpath, True, f"applies (series so far: {stat})"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def write_state(worktree: Path, series: AppliedSeries) -> Path:
    """Record the applied series next to the worktree (read by sources and the build)."""
    state = worktree.with_name(worktree.name + STATE_SUFFIX)
    state.write_text(series.to_json() + "\n", encoding="utf-8")
    return state
