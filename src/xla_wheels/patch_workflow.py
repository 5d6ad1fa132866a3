"""Editing a patch series as git commits: export the branch back to patch files, and carry
the series onto another commit of the component.

After ``make patch``, ``out/<bundle>/src/<component>`` is a branch with one commit per
patch (see :mod:`xla_wheels.patches`). Editing a patch is then ordinary git there
(``git commit --amend``, ``git rebase -i <pin>``), and:

- :func:`export_series` (``make patch-export``) writes each commit back as its patch file:
  the commit message is the header, ``git diff <commit>^ <commit>`` the diff. A file that
  was edited by hand since the patch stage applied it is not overwritten unless forced.
- :func:`start_rebase` / :func:`continue_rebase` (``make patch-rebase``) run ``git rebase
  --onto <new commit> <pin>`` with a fixed committer; on a conflict they stop (exit 3)
  naming the patch and the files. ``--continue`` first refuses (exit 6) conflict markers
  and whitespace errors in the files of the patch it stopped at. Once the series is on
  the new commit, its compiled checks run against the worktree (:mod:`.series_build`):
  what no longer compiles is named with the patch that wrote the line (exit 7); a
  ``--continue`` after that runs them again. The cache key audit
  (:mod:`.series_checks.key_audit`) then reports every environment read or Python setter
  of the new base that the key misses and the table does not list (exit 1). Export then
  writes the refreshed patches
  (``Base:`` set to the new commit) and rewrites the bundle's pin, comments kept.

Export refuses (exit 6) a series whose commits or composed patch text hold conflict
markers or whitespace errors (:mod:`.series_hygiene`), naming the patch, file and line.

Every file is written by rename, and only after every patch of the series has been
composed and validated: a failed export changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from xla_host import filemode, log
from xla_host.errors import ExitCode, PatchError, PipelineError, UsageError
from xla_host.runner import after_options
from xla_wheels.bundle import Bundle, Component, PatchRef, available_bundles, load_bundle
from xla_wheels.gitutil import compose, git, git_out, run_git, status_porcelain
from xla_wheels.layout import BundleLayout
from xla_wheels.options import PipelineOptions
from xla_wheels.patches import (
    COMMIT_CONFIG,
    AppliedSeries,
    PatchHeader,
    describe_series,
    header_from_message,
    parse_patch,
    read_state,
    write_state,
)
from xla_wheels.plan import PlannedCommand
from xla_wheels.series_build import (
    BuildCheckReport,
    BuildCheckStep,
    build_check_step,
    no_step_line,
    run_build_check,
)
from xla_wheels.series_checks.key_audit import AuditReport, audit_series, audit_step_line
from xla_wheels.series_hygiene import LineDefect, git_check, refuse, scan_patch_text
from xla_wheels.sources import SourceCache

REBASE_SUFFIX = ".rebase.json"
"""``<worktree>.rebase.json``: the rebase under way (old base, new base, the patches)."""

DEFAULT_ABBREV = 12
"""Abbreviation of the blob names on ``index`` lines of a new patch file. An existing file
keeps its own length: git's automatic length depends on how many objects the repository
holds (a full clone and our single-commit fetch differ), so it is pinned, never "auto"."""

# `git diff` exactly as the patch files were made, whatever the user's configuration says.
_DIFF_CONFIG = (
    "-c", "diff.noprefix=false",
    "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.relative=false",
    "-c", "diff.suppressBlankEmpty=false",
    "-c", "diff.interHunkContext=0",
    "-c", "diff.context=3",
    "-c", "diff.algorithm=myers",
    "-c", "diff.indentHeuristic=true",
    "-c", "diff.renames=true",
    "-c", "core.quotePath=true",
)  # fmt: skip
_DIFF_OPTIONS = (
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)
_INDEX_LINE = re.compile(r"^index ([0-9a-f]+)\.\.", re.MULTILINE)
_BASE_LINE = re.compile(r"^Base: [0-9a-f]{40}$", re.MULTILINE)
_HEX = re.compile(r"[0-9a-f]{7,40}")
#: Where git's options end before revisions (its "--" would start paths there).
_REVS = "--end-of-options"


class RebaseStopped(PatchError):
    """``patch-rebase`` stopped at a patch that needs the user (a conflict, an emptied
    patch). Not a failure of the tool: the worktree is mid-rebase on purpose."""

    exit_code = ExitCode.REBASE_STOPPED


@dataclass(frozen=True)
class ExportedPatch:
    relpath: str
    changed: bool


@dataclass(frozen=True)
class ExportReport:
    patches: tuple[ExportedPatch, ...]
    new_pin: str | None
    """The component's new pin when a finished rebase was exported, else ``None``."""
    shared_with: tuple[str, ...]
    """Other bundles that list one of these patch files at another pin."""


def _rebase_path(worktree: Path) -> Path:
    return worktree.with_name(worktree.name + REBASE_SUFFIX)


def _require_series(
    options: PipelineOptions, bundle: Bundle, component: str
) -> tuple[Path, AppliedSeries]:
    """The component's worktree and the series the patch stage recorded there."""
    worktree = BundleLayout.of(options, bundle.name).worktree(component)
    if not worktree.is_dir():
        raise UsageError(
            f"{worktree} does not exist",
            fix=f"run `make patch BUNDLE={bundle.name}` first: it makes the series a branch there",
        )
    state = read_state(worktree)
    if state is None or not state.head:
        raise UsageError(
            f"{worktree} has no patch series recorded by the patch stage",
            fix=f"run `make patch BUNDLE={bundle.name}` first",
        )
    if state.component != component:
        raise UsageError(f"{worktree} holds {state.component}, not {component}")
    return worktree, state


def _rebase_in_progress(worktree: Path) -> bool:
    in_git_dir = ["rev-parse", "--path-format=absolute", "--git-path"]
    names = ("rebase-merge", "rebase-apply")
    return any(Path(git_out([*in_git_dir, name], cwd=worktree)).exists() for name in names)


def _descends(worktree: Path, commit: str) -> bool:
    """Whether HEAD in ``worktree`` descends from ``commit`` (or is it)."""
    is_ancestor = ["merge-base", "--is-ancestor", commit, "HEAD"]
    return git(is_ancestor, cwd=worktree, check=False).returncode == 0


def _require_clean(worktree: Path, what: str) -> None:
    dirty = status_porcelain(worktree)
    if dirty:
        raise PatchError(
            f"{worktree} has changes that are not committed:\n{dirty}",
            fix=f"commit them (`git -C {worktree} commit --amend` to change the last patch, "
            f"or `git rebase -i` for an earlier one), then {what} again; nothing was changed",
        )


# --- export -------------------------------------------------------------------------


def _diff(worktree: Path, commit: str, abbrev: int) -> str:
    return git(
        ["diff", *_DIFF_OPTIONS, "--find-renames", f"--abbrev={abbrev}", f"{commit}^", commit],
        cwd=worktree,
        config=_DIFF_CONFIG,
    ).stdout


def patch_text(message: str, diff: str, base: str | None) -> str:
    """A patch file from a commit: its message as the header, a blank line, its diff."""
    header = header_from_message(message)
    if base is not None:
        header = _BASE_LINE.sub(f"Base: {base}", header)
    return f"{header}\n\n{diff}"


def _abbrev_of(path: Path) -> int:
    if path.is_file():
        match = _INDEX_LINE.search(path.read_text(encoding="utf-8", errors="replace"))
        if match:
            return len(match.group(1))
    return DEFAULT_ABBREV


def _check_identity(header: PatchHeader, relpath: str, worktree: Path, commit: str) -> None:
    """The header's Author/Date are the commit's: refuse an author change made only in git
    (``commit --amend --author``), which export would otherwise drop without a word."""
    identity = header.commit_env()  # the variables git reads, not our environment
    name, email = identity["GIT_AUTHOR_NAME"], identity["GIT_AUTHOR_EMAIL"]
    date = identity["GIT_AUTHOR_DATE"].split()[0]
    actual = git_out(["log", "-1", "--format=%an%x00%ae%x00%at", commit], cwd=worktree)
    if actual.split("\0") != [name, email, date]:
        raise PatchError(
            f"the commit of patches/{relpath} has author {actual.split(chr(0))[:2]} at "
            f"{actual.split(chr(0))[2]}, its header says {name} <{email}> at {date}",
            fix="the header is what is kept: put the author in an 'Author: Name <email>' "
            "(and 'Date:') line of the commit message instead (`git commit --amend`)",
        )


def export_series(
    options: PipelineOptions, bundle: Bundle, component_name: str, *, force: bool = False
) -> ExportReport:
    """Write the worktree's branch back as the bundle's patch files (see module doc)."""
    root, dry_run = options.root, options.dry_run
    component = bundle.component(component_name)
    worktree, state = _require_series(options, bundle, component_name)
    if _rebase_in_progress(worktree):
        raise PatchError(
            f"a rebase is under way in {worktree}",
            fix=f"finish it first: resolve, `git -C {worktree} add <files>`, then `make "
            f"patch-rebase BUNDLE={bundle.name} COMPONENT={component_name} CONTINUE=1` "
            f"(or `git -C {worktree} rebase --abort` to go back)",
        )
    _require_clean(worktree, "export")
    base, new_pin = _export_base(worktree, state.base_commit, dry_run)
    commits = _series_commits(worktree, base, bundle, component_name)
    planned, hand_edited = _planned_patches(
        worktree, commits, component.patches, state, component_name, base, new_pin
    )
    if hand_edited and not force:
        raise PatchError(
            "these patch files changed on disk since the patch stage applied them, and "
            "exporting would overwrite that edit: " + ", ".join(hand_edited),
            fix="keep the hand edit: `make patch BUNDLE=... ` to rebuild the branch from the "
            "files (after saving your commits); or overwrite it: add FORCE=1 (--force); "
            "nothing was changed",
        )
    pin_text = None
    if new_pin:
        manifest = bundle.path.read_text(encoding="utf-8")
        pin_text = rewrite_pin(manifest, component.name, new_pin, str(bundle.path))
    report = ExportReport(
        tuple(ExportedPatch(ref.relpath, changed) for ref, _, changed in planned),
        new_pin,
        _shared_with(root, bundle, component, new_pin or state.base_commit),
    )
    if dry_run:
        return report
    # The patch files and the manifest's new pin, all or none: a full disk half way must
    # not leave a series that is half the new one (the manifest last, as it names them).
    writes: list[tuple[Path, bytes | str]] = [
        (ref.path, text.encode("utf-8")) for ref, text, changed in planned if changed
    ]
    if pin_text is not None:
        writes.append((bundle.path, pin_text.encode("utf-8")))
    filemode.write_all(writes)
    if pin_text is not None:
        _rebase_path(worktree).unlink(missing_ok=True)
    head = git_out(["rev-parse", "HEAD"], cwd=worktree)
    reloaded = load_bundle(root, bundle.name).component(component_name)
    write_state(
        worktree,
        replace(state, base_commit=base, patches=describe_series(reloaded), head=head),
    )
    return report


def _export_base(worktree: Path, base: str, dry_run: bool) -> tuple[str, str | None]:
    """The commit the exported series applies to, and the bundle's new pin when a finished
    ``patch-rebase`` carried the series onto another commit (else None); the branch must
    be a straight line on it."""
    new_pin = None
    rebase = _read_rebase(worktree)
    if rebase is not None:
        if _descends(worktree, rebase.onto):
            base, new_pin = rebase.onto, rebase.onto
        elif not dry_run:
            _rebase_path(worktree).unlink()  # the rebase was aborted: nothing to carry
    if not _descends(worktree, base):
        raise PatchError(
            f"{worktree}: HEAD does not descend from the series' base {base[:12]}",
            fix=f"rebase your commits onto it (`git -C {worktree} rebase {base[:12]}`)",
        )
    if git_out(["rev-list", "--merges"], operands=[f"{base}..HEAD"], end=_REVS, cwd=worktree):
        raise PatchError(
            f"{worktree}: the branch has merge commits; a patch series is a straight line",
            fix=f"linearize it (`git -C {worktree} rebase {base[:12]}`)",
        )
    return base, new_pin


def _series_commits(worktree: Path, base: str, bundle: Bundle, component_name: str) -> list[str]:
    """The branch's commits on ``base``, oldest first: one per patch the bundle lists."""
    commits = git_out(
        ["rev-list", "--reverse"], operands=[f"{base}..HEAD"], end=_REVS, cwd=worktree
    ).split()
    refs = bundle.component(component_name).patches
    if len(commits) != len(refs):
        subjects = [git_out(["log", "-1", "--format=%s", c], cwd=worktree) for c in commits]
        raise PatchError(
            f"{worktree} has {len(commits)} commit(s) on {base[:12]} but bundle {bundle.name} "
            f"lists {len(refs)} {component_name} patch(es); commits: "
            + ("; ".join(subjects) or "(none)"),
            fix="export maps commit N to the N-th listed patch: add (or remove) the patch "
            f"file names in the bundle's [components.{component_name}] patches list to "
            "match, then export again; nothing was changed",
        )
    return commits


def _planned_patches(
    worktree: Path,
    commits: list[str],
    refs: tuple[PatchRef, ...],
    state: AppliedSeries,
    component_name: str,
    base: str,
    new_pin: str | None,
) -> tuple[list[tuple[PatchRef, str, bool]], list[str]]:
    """Each listed patch's text as its commit says it, and whether that changes the file;
    and the patch files edited by hand since the patch stage applied them. A commit with
    a conflict marker or a whitespace error stops the export (nothing written)."""
    applied = {patch.relpath: patch.sha256 for patch in state.patches}
    planned: list[tuple[PatchRef, str, bool]] = []
    hand_edited: list[str] = []
    defects: list[LineDefect] = []
    for commit, ref in zip(commits, refs, strict=True):
        message = git(["cat-file", "commit", commit], cwd=worktree).stdout.partition("\n\n")[2]
        text = patch_text(message, _diff(worktree, commit, _abbrev_of(ref.path)), new_pin)
        _check_identity(_validate(text, ref.relpath, component_name), ref.relpath, worktree, commit)
        defects += _commit_defects(worktree, commit, f"patches/{ref.relpath}", text)
        current = ref.path.read_bytes() if ref.path.is_file() else b""
        changed = current != text.encode("utf-8")
        if changed and hashlib.sha256(current).hexdigest() != applied.get(ref.relpath):
            hand_edited.append(f"patches/{ref.relpath}")
        planned.append((ref, text, changed))
    refuse(
        defects,
        f"the commits on {base[:12]} in {worktree}",
        f"fix those lines in the patch's commit: `git -C {worktree} rebase -i {base[:12]}`, "
        "change `pick` to `edit` on the patch's line, fix the file, `git -C "
        f"{worktree} commit -a --amend --no-edit`, `git -C {worktree} rebase --continue`; "
        f"then export again; nothing was changed",
    )
    return planned, hand_edited


def _commit_defects(worktree: Path, commit: str, patch: str, text: str) -> list[LineDefect]:
    """Conflict markers and whitespace errors in what ``commit`` adds (git's judgement)
    and in its composed patch text (the header too), each place once."""
    found = git_check(worktree, patch, [f"{commit}^", commit]) + scan_patch_text(text, patch)
    unique: dict[tuple[str, int, str], LineDefect] = {}
    for defect in found:
        unique.setdefault((defect.path, defect.line, defect.problem), defect)
    return list(unique.values())


def _validate(text: str, relpath: str, component: str) -> PatchHeader:
    with tempfile.TemporaryDirectory(prefix="xla-wheels-export-") as scratch:
        candidate = Path(scratch) / Path(relpath).name
        candidate.write_text(text, encoding="utf-8")
        try:
            return parse_patch(candidate, component=component)
        except PatchError as error:
            raise PatchError(
                f"the commit for patches/{relpath} does not make a valid patch: "
                + error.message.replace(str(candidate), "its message"),
                fix=(error.fix or "")
                + " (change the commit message with `git commit --amend` or `git rebase -i`); "
                "nothing was changed",
            ) from error


def _shared_with(root: Path, bundle: Bundle, component: Component, pin: str) -> tuple[str, ...]:
    mine = {ref.relpath for ref in component.patches}
    others = []
    for name in available_bundles(root):
        if name == bundle.name:
            continue
        try:
            other = load_bundle(root, name).component(component.name)
        except PipelineError:
            continue
        if mine & {ref.relpath for ref in other.patches} and not pin.startswith(
            other.commit or "-"
        ):
            others.append(f"{name} (pins {other.commit})")
    return tuple(others)


# --- the bundle's pin ----------------------------------------------------------------


def rewrite_pin(text: str, component: str, new_commit: str, where: str) -> str:
    """``text`` with ``commit = "..."`` of ``[components.<component>]`` set to
    ``new_commit``; every other byte (comments, order, spacing) kept."""
    lines = text.splitlines(keepends=True)
    header = re.compile(rf"^\s*\[\s*components\.{re.escape(component)}\s*\]\s*(#.*)?$")
    commit_line = re.compile(r'^(\s*commit\s*=\s*")([0-9a-f]+)(".*)$', re.DOTALL)
    inside = False
    for index, line in enumerate(lines):
        if header.match(line):
            inside = True
            continue
        if inside and line.lstrip().startswith("["):
            break
        if inside:
            match = commit_line.match(line)
            if match:
                lines[index] = f"{match.group(1)}{new_commit}{match.group(3)}"
                return "".join(lines)
    raise PatchError(
        f'{where}: no `commit = "..."` line in [components.{component}] to rewrite '
        "(inherited from the bundle it extends?)",
        fix=f'add commit = "{new_commit}" to [components.{component}] in {where} by hand',
    )


# --- rebase --------------------------------------------------------------------------

_REBASE_CONFIG = (
    *COMMIT_CONFIG,
    "-c", "rebase.autoStash=false",
    "-c", "rebase.autoSquash=false",
    "-c", "rebase.updateRefs=false",
)  # fmt: skip


def _rebase_command(worktree: Path, *args: str) -> PlannedCommand:
    # A fixed committer keeps the rebased commits a function of their inputs, like the
    # patch stage's; GIT_EDITOR=true keeps each message as it is on --continue.
    env = {k: v for k, v in PatchHeader({}).commit_env().items() if "COMMITTER" in k}
    env["GIT_EDITOR"] = "true"
    return compose(["rebase", *args], cwd=worktree, config=_REBASE_CONFIG, env=env)


@dataclass(frozen=True)
class RebaseRecord:
    """``<worktree>.rebase.json``: a patch-rebase under way or finished but not exported."""

    base: str
    onto: str
    commits: tuple[str, ...]
    """The series' commits before the rebase, in order (to name the patch it stops at)."""
    patches: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _read_rebase(worktree: Path) -> RebaseRecord | None:
    try:
        data = json.loads(_rebase_path(worktree).read_text(encoding="utf-8"))
        return RebaseRecord(
            str(data["base"]), str(data["onto"]), tuple(data["commits"]), tuple(data["patches"])
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class RebaseResult:
    onto: str
    """The full SHA the series is now on."""
    build: BuildCheckReport | None
    """The compiled checks on the rebased worktree; ``None`` when the series has none."""
    audit: AuditReport | None = None
    """The cache key audit of the rebased worktree; ``None`` when the series has no table
    (or in a dry run)."""


def check_step(
    options: PipelineOptions, bundle: Bundle, component: str, onto: str
) -> BuildCheckStep | None:
    """The compiled checks a finished rebase runs (``None``: the series has none)."""
    layout = BundleLayout.of(options, bundle.name)
    return build_check_step(
        options.root,
        options.cache_dir,
        component,
        layout.worktree(component),
        onto,
        layout.work / "checks" / component,
        network=options.network,
    )


def _check_build(
    step: BuildCheckStep | None,
    component: str,
    worktree: Path,
    record: RebaseRecord,
) -> BuildCheckReport | None:
    if step is None:
        log.info(no_step_line(component))
        return None
    commits = git_out(
        ["rev-list", "--reverse"], operands=[f"{record.onto}..HEAD"], end=_REVS, cwd=worktree
    ).split()
    patches = dict(zip(commits, record.patches, strict=False))
    return run_build_check(step, patches)


def start_rebase(
    options: PipelineOptions, bundle: Bundle, component_name: str, onto: str
) -> RebaseResult:
    """Carry the series onto ``onto``, then run its compiled checks there (module doc)."""
    if not _HEX.fullmatch(onto):
        raise UsageError(
            f"ONTO '{onto}' is not a commit SHA",
            fix="pass 7 to 40 lowercase hex digits (for a tag: `git rev-parse <tag>^{commit}`)",
        )
    component = bundle.component(component_name)
    worktree, state = _require_series(options, bundle, component_name)
    if _rebase_in_progress(worktree):
        raise PatchError(
            f"a rebase is already under way in {worktree}",
            fix=f"continue it: `make patch-rebase BUNDLE={bundle.name} COMPONENT="
            f"{component_name} CONTINUE=1`, or `git -C {worktree} rebase --abort`",
        )
    _require_clean(worktree, "patch-rebase")
    # The worktree shares the cache repository's objects: fetch the target there.
    cache = SourceCache(options.source_cache, options.mirror, network=options.network)
    full = cache.resolve(replace(component, commit=onto))
    command = _rebase_command(
        worktree,
        "--empty=ask",
        f"--onto={full}",
        *after_options(state.base_commit, separator=_REVS),
    )
    step = check_step(options, bundle, component_name, full)
    if options.dry_run:
        log.result(command.render())
        log.result(step.render() if step else no_step_line(component_name))
        log.result(audit_step_line(options.root, component_name, worktree))
        return RebaseResult(full, None)
    commits = git_out(
        ["rev-list", "--reverse"],
        operands=[f"{state.base_commit}..HEAD"],
        end=_REVS,
        cwd=worktree,
    ).split()
    record = RebaseRecord(
        state.base_commit, full, tuple(commits), tuple(ref.relpath for ref in component.patches)
    )
    filemode.write_by_rename(_rebase_path(worktree), record.to_json().encode())
    _finish(worktree, bundle, component_name, run_git(command, check=False, echo=True), record)
    return RebaseResult(
        full,
        _check_build(step, component_name, worktree, record),
        audit_series(options.root, component_name, worktree),
    )


def continue_rebase(options: PipelineOptions, bundle: Bundle, component_name: str) -> RebaseResult:
    """Go on after the user resolved a stop; after a finished rebase that is not exported
    yet, run the compiled checks again (after a fix to a patch that did not build)."""
    worktree, _ = _require_series(options, bundle, component_name)
    record = _read_rebase(worktree)
    rebasing = record is not None and _rebase_in_progress(worktree)
    if record is None or not (rebasing or _descends(worktree, record.onto)):
        raise PatchError(
            f"no patch-rebase is under way in {worktree}",
            fix="start one with ONTO=<commit>",
        )
    step = check_step(options, bundle, component_name, record.onto)
    if not rebasing:
        _require_clean(worktree, "patch-rebase CONTINUE=1")
        return RebaseResult(
            record.onto,
            _check_build(step, component_name, worktree, record),
            audit_series(options.root, component_name, worktree),
        )
    _refuse_defects_at_stop(worktree, bundle, component_name, record)
    result = run_git(_rebase_command(worktree, "--continue"), check=False, echo=True)
    _finish(worktree, bundle, component_name, result, record)
    return RebaseResult(
        record.onto,
        _check_build(step, component_name, worktree, record),
        audit_series(options.root, component_name, worktree),
    )


def _stopped_at(worktree: Path, record: RebaseRecord) -> tuple[str, str]:
    """(the original commit the rebase stopped at, how to name it: its patch file)."""
    stopped = git(["rev-parse", "--verify", "--quiet", "REBASE_HEAD"], cwd=worktree, check=False)
    commits, patches = list(record.commits), list(record.patches)
    sha = stopped.stdout.strip()
    where = (
        f"patches/{patches[commits.index(sha)]} ({commits.index(sha) + 1} of {len(commits)})"
        if sha in commits and len(patches) == len(commits)
        else f"commit {sha[:12] or '?'}"
    )
    return sha, where


def _refuse_defects_at_stop(
    worktree: Path, bundle: Bundle, component: str, record: RebaseRecord
) -> None:
    """Before ``git rebase --continue`` commits the resolution: no conflict markers and no
    whitespace errors in what the stopped patch's files add (the index is what is
    committed; git itself accepts a file that still holds markers once it is added)."""
    sha, where = _stopped_at(worktree, record)
    continue_hint = f"`make patch-rebase BUNDLE={bundle.name} COMPONENT={component} CONTINUE=1`"
    unmerged = git_out(["diff", "--name-only", "--diff-filter=U"], cwd=worktree).split()
    if unmerged:
        raise RebaseStopped(
            f"patch-rebase is still stopped at {where}: {', '.join(unmerged)} not resolved",
            fix=f"resolve the <<<<<<< markers in those files under {worktree}, `git -C "
            f"{worktree} add {' '.join(unmerged)}`, then {continue_hint}",
        )
    touched = set(
        git_out(
            ["diff-tree", "-r", "--no-commit-id", "--name-only", "--root", sha], cwd=worktree
        ).split("\n")
        if sha
        else []
    )
    touched |= set(git_out(["diff", "--cached", "--name-only", "HEAD"], cwd=worktree).split("\n"))
    paths = sorted(path for path in touched if path)
    if not paths:
        return
    patch = where.split(" (", 1)[0]
    defects = git_check(worktree, patch, ["HEAD"], cached=True, paths=paths)
    files = " ".join(sorted({defect.path for defect in defects}))
    refuse(
        defects,
        f"patch-rebase is stopped at {where}, and the resolution added to the index",
        f"edit those lines in {worktree} (remove the conflict markers, keep the code you "
        f"want; no trailing white space), `git -C {worktree} add {files}`, then "
        f"{continue_hint}; nothing was committed",
    )


def _finish(
    worktree: Path,
    bundle: Bundle,
    component: str,
    result: subprocess.CompletedProcess[str],
    record: RebaseRecord,
) -> None:
    if result.returncode == 0 and not _rebase_in_progress(worktree):
        return
    if not _rebase_in_progress(worktree):
        _rebase_path(worktree).unlink(missing_ok=True)
        raise PatchError(
            f"git rebase failed in {worktree}: {result.stderr.strip() or result.stdout.strip()}",
            fix="see git's message; the branch is as before",
        )
    _, where = _stopped_at(worktree, record)
    conflicted = git_out(["diff", "--name-only", "--diff-filter=U"], cwd=worktree).split()
    continue_hint = f"`make patch-rebase BUNDLE={bundle.name} COMPONENT={component} CONTINUE=1`"
    if conflicted:
        raise RebaseStopped(
            f"patch-rebase stopped at {where}: it conflicts with {record.onto[:12]} "
            f"in {', '.join(conflicted)}",
            fix=f"resolve the <<<<<<< markers in those files under {worktree}, `git -C "
            f"{worktree} add {' '.join(conflicted)}`, then {continue_hint}; to give up: "
            f"`git -C {worktree} rebase --abort`",
        )
    raise RebaseStopped(
        f"patch-rebase stopped at {where}: {result.stderr.strip() or result.stdout.strip()}",
        fix=f"if the patch is already upstream, `git -C {worktree} rebase --skip` and remove it "
        f"from the bundle's list; else fix and {continue_hint}; to give up: `git -C "
        f"{worktree} rebase --abort`",
    )
