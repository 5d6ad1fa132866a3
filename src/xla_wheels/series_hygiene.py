"""Conflict markers and whitespace errors in a patch series, refused wherever the series
changes hands: ``patch-rebase --continue``, ``patch-export`` and ``patches-check``.

A patch that ``git apply`` applies is not yet a good patch: a file resolved in a rebase
may still hold ``<<<<<<<`` lines, and those apply as well as any other line. The rules
are git's own, so that this module and git never disagree:

- a conflict marker is a line of seven ``<``, ``=``, ``>`` or ``|`` followed by white
  space or the end of the line (``git diff --check``: "leftover conflict marker");
- whitespace errors are git's default ``core.whitespace`` (``blank-at-eol``,
  ``space-before-tab``, ``blank-at-eof``): what ``git apply --whitespace=error-all`` and
  ``git diff --check`` reject.

Trees and commits are judged by git itself (:func:`git_check`, ``git diff --check`` with
that configuration pinned); patch files by :func:`scan_patch_text`, which applies the same
rules to a diff's added lines and header (a test holds it to git's verdicts).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from xla_host.errors import ExitCode, GitError, PatchError
from xla_wheels.gitutil import git

DEFECTS_EXIT_CODE = ExitCode.SERIES_DEFECTS

MARKER = "leftover conflict marker"
TRAILING = "trailing whitespace"
SPACE_BEFORE_TAB = "space before tab in indent"
BLANK_AT_EOF = "new blank line at EOF"

# git's defaults, pinned: a user's core.whitespace must not loosen (or tighten) the check.
_CHECK_CONFIG = (
    "-c", "core.whitespace=blank-at-eol,space-before-tab,blank-at-eof",
    "-c", "core.quotePath=false",
    "-c", "diff.noprefix=false",
)  # fmt: skip
_MARKER = re.compile(r"([<=>|])\1{6}(\s|$)")
_CHECK_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<problem>.+?)\.?$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,\d+)? @@")
DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
"""A diff's file header line; group 2 is the file's path after the patch."""
_SHOWN = 12
"""How many defects a refusal lists before it says how many more there are."""


@dataclass(frozen=True)
class LineDefect:
    """One refused line: in ``patch`` (``patches/<component>/<file>``), file ``path`` of
    the tree at ``line`` (after the patch; for a header line, ``path`` is empty and
    ``line`` is the patch file's line)."""

    patch: str
    path: str
    line: int
    problem: str
    text: str
    patch_line: int | None = None
    """The line of the patch file itself, when the defect was read from one."""

    def render(self) -> str:
        where = f"{self.path}:{self.line}" if self.path else f"header line {self.line}"
        in_file = (
            f" (line {self.patch_line} of the patch file)" if self.patch_line and self.path else ""
        )
        shown = f": {self.text.rstrip()!r}" if self.text.strip() else ""
        return f"{self.patch}: {where}: {self.problem}{in_file}{shown}"


class SeriesHasDefects(PatchError):
    """Conflict markers or whitespace errors in the series: refused, nothing written."""

    exit_code = DEFECTS_EXIT_CODE


def is_conflict_marker(line: str) -> bool:
    return _MARKER.match(line) is not None


def line_problems(line: str) -> list[str]:
    """git's problems with one added line (without its newline)."""
    problems = []
    if is_conflict_marker(line):
        problems.append(MARKER)
    if line != line.rstrip():
        problems.append(TRAILING)
    indent = line[: len(line) - len(line.lstrip(" \t"))]
    if " " in indent and "\t" in indent and indent.index(" ") < indent.rindex("\t"):
        problems.append(SPACE_BEFORE_TAB)
    return problems


def scan_patch_text(text: str, patch: str) -> list[LineDefect]:
    """The defects of a patch file's text: conflict markers anywhere in its header, and
    markers and whitespace errors on the lines its diff adds (context and removed lines
    are upstream's, not the patch's)."""
    defects: list[LineDefect] = []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    in_diff = False
    path = ""
    new_line = 0
    hunk: list[tuple[int, int, str, str]] = []  # (patch line, file line, tag, text)
    hunk_old_start = 0

    def close_hunk() -> None:
        # blank-at-eof: blank lines the hunk adds at its very end, when nothing of the
        # old file follows them (no trailing context) and the hunk is anchored (leading
        # context, or a new file): the file ends there.
        if not hunk or hunk[-1][2] != "+":
            return
        anchored = hunk_old_start == 0 or any(tag == " " for _, _, tag, _ in hunk)
        if not anchored:
            return
        blank_run = []
        for entry in reversed(hunk):
            if entry[2] != "+" or entry[3].strip():
                break
            blank_run.append(entry)
        if blank_run:  # git names the first of the blank lines, once
            patch_line, file_line, _, body = blank_run[-1]
            defects.append(LineDefect(patch, path, file_line, BLANK_AT_EOF, body, patch_line))

    for number, line in enumerate(lines, start=1):
        file_match = DIFF_FILE.match(line)
        if file_match:
            close_hunk()
            hunk = []
            in_diff, path = True, file_match.group(2)
            continue
        if not in_diff:
            if is_conflict_marker(line):
                defects.append(LineDefect(patch, "", number, MARKER, line))
            continue
        hunk_match = _HUNK.match(line)
        if hunk_match:
            close_hunk()
            hunk = []
            hunk_old_start = int(hunk_match.group(1))
            new_line = int(hunk_match.group(3))
            continue
        if not hunk and not line.startswith(("+", "-", " ")):
            continue  # file header lines (index, ---, +++, mode) before the first hunk
        if line.startswith(("--- ", "+++ ")) and not hunk:
            continue
        tag, body = line[:1], line[1:]
        if tag == "+":
            defects.extend(
                LineDefect(patch, path, new_line, problem, body, number)
                for problem in line_problems(body)
            )
        if tag in ("+", " ", "-"):
            hunk.append((number, new_line, tag, body))
        if tag in ("+", " "):
            new_line += 1
    close_hunk()
    return defects


def git_check(
    worktree: Path,
    patch: str,
    revs: Sequence[str],
    *,
    cached: bool = False,
    paths: Sequence[str] = (),
) -> list[LineDefect]:
    """``git diff --check`` over ``revs`` (and the index with ``cached``) in ``worktree``:
    what the lines added there break, attributed to ``patch``."""
    argv = ["diff", "--check", "--no-color", "--no-ext-diff"]
    if cached:
        argv.append("--cached")
    result = git([*argv, *revs, "--", *paths], cwd=worktree, config=_CHECK_CONFIG, check=False)
    # git prints `path:line: problem.`, then the offending line (`+...`) for whitespace
    # errors only; a marker line comes alone.
    defects: list[LineDefect] = []
    problems: list[LineDefect] = []
    for line in result.stdout.splitlines():
        if line.startswith("+") and problems:
            defects += [replace(defect, text=line[1:]) for defect in problems]
            problems = []
            continue
        defects += problems
        problems = []
        match = _CHECK_LINE.match(line)
        if match:
            problems = [
                LineDefect(patch, match.group("path"), int(match.group("line")), problem, "")
                for problem in match.group("problem").split(", ")
            ]
    defects += problems
    if result.returncode != 0 and not defects:
        raise GitError(
            f"git diff --check failed in {worktree}: {result.stderr.strip()}",
            fix="see git's message",
        )
    return defects


def refuse(defects: Sequence[LineDefect], what: str, fix: str) -> None:
    """Raise :class:`SeriesHasDefects` listing ``defects`` (if any)."""
    if not defects:
        return
    shown = [f"  {defect.render()}" for defect in defects[:_SHOWN]]
    if len(defects) > _SHOWN:
        shown.append(f"  ... and {len(defects) - _SHOWN} more")
    raise SeriesHasDefects(
        f"{what}: {len(defects)} line(s) with conflict markers or whitespace errors:\n"
        + "\n".join(shown),
        fix=fix,
    )
