""" "Applies" is not "builds": the series' compiled checks on a tree it was carried to.

A series rebased onto another commit (``patch-rebase``), or applied to a commit other than
the one its ``Base:`` names (``patches-check``), can apply cleanly and still not compile:
a patch may use a member or function that the new commit does not have. After such a
rebase or apply, the series' compiled check programs (``patches/<component>/checks/``,
built and run by :mod:`xla_wheels.series_checks`) are run against the tree, and every
compile error is traced to the patch that wrote its line: ``git blame --porcelain`` on a
tree whose commits are the patches, one per patch.

The step is data (:class:`BuildCheckStep`): a dry run prints it, a real run executes it.
A series without a ``checks/`` directory has no such step, and says so.

Exit codes: :data:`DOES_NOT_BUILD_EXIT_CODE` (7) when something no longer compiles; 1
when it compiles but a check judges against it (:class:`~xla_host.errors.CheckFailed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xla_host.errors import CheckFailed, ExitCode, PatchError
from xla_host.net import NetworkPolicy
from xla_wheels.gitutil import git

if TYPE_CHECKING:
    # Types only: the runner itself (and the toolchain code) is imported when a check runs.
    from xla_wheels.series_checks.run import CheckOutcome, CompileError

DOES_NOT_BUILD_EXIT_CODE = ExitCode.DOES_NOT_BUILD
CHECKS_SUBDIR = "checks"
"""``patches/<component>/checks/``: the series' compiled check programs."""


class SeriesDoesNotBuild(PatchError):
    """The series applies, but something it touches no longer compiles there."""

    exit_code = DOES_NOT_BUILD_EXIT_CODE


@dataclass(frozen=True)
class BuildCheckStep:
    """Build and run ``component``'s check programs against ``tree``, which holds the
    series as commits on ``base`` (one per patch), work files in ``work``."""

    component: str
    root: Path
    """The project whose ``patches/<component>/checks/`` programs run."""
    checks_dir: Path
    tree: Path
    base: str
    work: Path
    cache_dir: Path
    network: NetworkPolicy
    """Bounds the toolchain's downloads when it is not set up yet."""

    def render(self) -> str:
        return (
            f"compiled checks: build and run the programs of {self.checks_dir} against "
            f"{self.tree} (toolchain in {self.cache_dir}, work in {self.work}); each compile "
            f"error is traced to its patch with `git -C {self.tree} blame --porcelain "
            f"{self.base[:12]}..HEAD`"
        )


def build_check_step(
    root: Path,
    cache_dir: Path,
    component: str,
    tree: Path,
    base: str,
    work: Path,
    *,
    network: NetworkPolicy,
) -> BuildCheckStep | None:
    """The step for ``component``'s series, or ``None`` when it has no check programs."""
    checks_dir = root / "patches" / component / CHECKS_SUBDIR
    if not checks_dir.is_dir():
        return None
    return BuildCheckStep(component, root, checks_dir, tree, base, work, cache_dir, network)


def no_step_line(component: str) -> str:
    return (
        f"compiled checks: none (the {component} series has no patches/{component}/"
        f"{CHECKS_SUBDIR}/ directory): applying was checked, building was not"
    )


@dataclass(frozen=True)
class Finding:
    """One compile error, traced to the patch commit that added its line (``patch`` is
    ``None`` when the line is the base's own)."""

    error: CompileError
    patch: str | None
    commit: str

    def render(self, base: str) -> str:
        where = f"{self.error.path}:{self.error.line}"
        if self.patch is None and not self.commit:
            # Not a line of the tree (a check program's own file, a linker error).
            return f"{where} (not in the tree): {self.error.message}"
        if self.patch is None:
            owner = f"{where} (a line of {base[:12]} itself, not a patch's)"
            return f"{owner}: {self.error.message}"
        if self.error.identifier:
            return (
                f"patches/{self.patch}: {where} uses {self.error.identifier}, which "
                f"{base[:12]} does not declare ({self.error.message})"
            )
        return f"patches/{self.patch}: {where}: {self.error.message}"


@dataclass(frozen=True)
class BuildCheckReport:
    step: BuildCheckStep
    outcomes: tuple[CheckOutcome, ...]
    findings: tuple[Finding, ...]

    @property
    def compiles(self) -> bool:
        return not any(outcome.compile_errors for outcome in self.outcomes)

    def failed_checks(self) -> list[tuple[str, str, str]]:
        """(program, check, why) of every check that ran and judged against the tree."""
        return [
            (outcome.program, name, verdict)
            for outcome in self.outcomes
            if not outcome.compile_errors
            for name, verdict in sorted(outcome.failed.items())
        ]

    @property
    def passed(self) -> bool:
        return (
            bool(self.outcomes)
            and self.compiles
            and not self.failed_checks()
            and all(outcome.verdicts for outcome in self.outcomes)
        )

    def lines(self) -> list[str]:
        """What the user reads: one line per program, then every finding."""
        lines = []
        for outcome in self.outcomes:
            if outcome.compile_errors:
                lines.append(
                    f"does not compile: {outcome.program} "
                    f"({len(outcome.compile_errors)} error(s))"
                )
            elif not outcome.verdicts:
                lines.append(f"FAIL {outcome.program}: built, but reported no checks")
            else:
                failed = outcome.failed
                lines.append(
                    f"{'FAIL' if failed else 'ok  '} {outcome.program}: "
                    f"{len(outcome.verdicts) - len(failed)} of {len(outcome.verdicts)} "
                    "check(s) pass"
                )
        lines.extend(f"  {finding.render(self.step.base)}" for finding in self.findings)
        lines.extend(f"  {program} {name}: {why}" for program, name, why in self.failed_checks())
        if self.passed:
            lines.append(
                f"compiled checks passed: the {self.step.component} series builds on "
                f"{self.step.base[:12]} ({len(self.outcomes)} program(s))"
            )
        return lines


def trace(tree: Path, errors: Sequence[CompileError], patches: Mapping[str, str]) -> list[Finding]:
    """Each error with the patch (``patches``: commit -> patch relpath) that wrote its
    line (``git blame``; no commit when git cannot say: a file or line HEAD does not
    have); errors at one place are reported once."""
    findings = []
    for error in dict.fromkeys(errors):  # CompileError compares by all its fields
        line = f"{error.line},{error.line}"
        blamed = git(
            ["blame", "--porcelain", "-L", line, "HEAD", "--", error.path], cwd=tree, check=False
        )
        commit = blamed.stdout.split(" ", 1)[0] if blamed.returncode == 0 else ""
        findings.append(Finding(error, patches.get(commit), commit))
    return findings


def run_build_check(step: BuildCheckStep, patches: Mapping[str, str]) -> BuildCheckReport:
    """Execute ``step``: set the toolchain up in the per-machine cache (compiler, torch,
    absl, googletest; downloads bounded by ``step.network``), build and run the project's
    programs on the tree, trace what does not compile."""
    # Imported when a check runs, not when this module is: the other subcommands (and dry
    # runs) never load the toolchain code.
    from xla_wheels.series_checks.run import run_series_checks
    from xla_wheels.series_checks.toolchain import ensure_toolchain

    toolchain = ensure_toolchain(step.cache_dir, step.network)
    step.work.mkdir(parents=True, exist_ok=True)
    outcomes = tuple(run_series_checks(step.tree, toolchain, step.work, project_root=step.root))
    errors = [error for outcome in outcomes for error in outcome.compile_errors]
    return BuildCheckReport(step, outcomes, tuple(trace(step.tree, errors, patches)))


def judge(report: BuildCheckReport, what: str, fix: str) -> None:
    """Raise when the report is not a pass: exit 7 when something does not compile, 1
    when a check ran and failed."""
    if not report.compiles:
        traced = sorted({f.patch for f in report.findings if f.patch})
        raise SeriesDoesNotBuild(
            f"{what} applies but does not build on {report.step.base[:12]}: "
            + (
                f"{len(report.findings)} compile error(s), from "
                + ", ".join(f"patches/{patch}" for patch in traced)
                if traced
                else f"{len(report.findings)} compile error(s) in lines of the base itself"
            )
            + " (listed above)",
            fix=fix,
        )
    if not report.passed:
        raise CheckFailed(
            f"{what} builds on {report.step.base[:12]}, but its compiled checks fail "
            "(listed above)",
            fix=fix,
        )
