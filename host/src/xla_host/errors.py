"""Exception classes of the pipeline, and the one table of its exit codes.

Every stage raises a subclass of :class:`PipelineError` with a message that names the
problem and the fix. The CLI edge (``xla_wheels.cli.main``) turns it into ``error:`` and
``fix:`` lines on stderr and its ``exit_code``; nothing below the CLI prints tracebacks or
calls ``sys.exit``. Every code a run can end with is one row of :class:`ExitCode` with its
meaning in :data:`MEANINGS`; each exception class takes its code from there, and the
README's table and ``xla-wheels --help`` are written from it (``xla_wheels.exit_codes``).
"""

from __future__ import annotations

from enum import IntEnum

from xla_host.redact import mask_url_credentials, printable


class ExitCode(IntEnum):
    """Every exit code of the CLI (and the demo, the make checks, the build recipes)."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    REBASE_STOPPED = 3
    USER_WORK = 4
    BUSY = 5
    SERIES_DEFECTS = 6
    DOES_NOT_BUILD = 7
    TIMED_OUT = 8
    DISK = 10
    SIGHUP = 129
    SIGINT = 130
    SIGPIPE = 141
    SIGTERM = 143


MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "done, or every check passed",
    ExitCode.FAILED: "a step failed, or a check judged against the build or host (gate, "
    "verify-install, doctor, ship check); a well-formed wheels.lock that is stale; a lane "
    "refused; an index that refused or kept failing after the retries",
    ExitCode.BAD_INPUT: "bad input (a flag, setting, manifest, patch, wheels.lock, "
    "lanes.toml, lanes.lock or builders.toml that is not understood), or the thing "
    "cannot be judged (no torch_xla, no such device, no toolchain)",
    ExitCode.REBASE_STOPPED: "patch-rebase stopped at a patch that needs you (the worktree "
    "is mid-rebase on purpose)",
    ExitCode.USER_WORK: "a component's worktree holds work the pipeline did not make; "
    "nothing was touched",
    ExitCode.BUSY: "another run holds the bundle (out/<bundle>/.lock); the message names it",
    ExitCode.SERIES_DEFECTS: "the patch series holds conflict markers or whitespace errors "
    "(nothing written)",
    ExitCode.DOES_NOT_BUILD: "the series applies but no longer compiles on the commit it "
    "was carried to",
    ExitCode.TIMED_OUT: "a command or a network step ran past its time limit (worth "
    "retrying once the network or the machine is healthy)",
    ExitCode.DISK: "a write hit a full disk, a quota, a read-only filesystem or a "
    "directory you may not write (dist/ and wheels.lock are left as they were)",
    ExitCode.SIGHUP: "ended by SIGHUP (the terminal closed), as Ctrl-C ends a run",
    ExitCode.SIGINT: "interrupted (Ctrl-C): children ended, lock released, nothing "
    "half-done kept",
    ExitCode.SIGPIPE: "the output's reader went away (piped into `head`): the output "
    "stops there, silently, as the shell's own tools stop, and nothing else changes",
    ExitCode.SIGTERM: "ended by SIGTERM (kill <pid>, make's own), as Ctrl-C ends a run",
}
"""One line per code: what a user reads in ``--help`` and the README."""


class PipelineError(Exception):
    """A failure the user can act on. ``exit_code`` is what the CLI returns."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        # A remote or index URL may carry credentials (user:token@, ?token=): never in a
        # message; a value from a manifest may carry terminal escapes: shown escaped.
        self.message = printable(mask_url_credentials(message))
        self.fix = None if fix is None else printable(mask_url_credentials(fix))
        super().__init__(self.message if self.fix is None else f"{self.message}\n  fix: {self.fix}")


class CheckFailed(PipelineError):
    """A check ran and judged against the build or host (gate, verify-install, doctor,
    ship check): exit 1. The report printed before it says which check and why; exit 2
    (``UsageError``, ``GateEnvironmentError``) means the thing could not be judged."""


class UsageError(PipelineError):
    """The command line itself is wrong (unknown bundle, missing argument)."""

    exit_code = ExitCode.BAD_INPUT


class ManifestError(PipelineError):
    """A bundle manifest is malformed: names the file, the key and the fix."""

    exit_code = ExitCode.BAD_INPUT


class LockError(PipelineError):
    """``wheels.lock`` lacks what a step needs (no entry for the bundle), or no longer
    matches the manifests and patches (stale after a change: ``lock-check``): exit 1."""


class LockFileError(LockError):
    """``wheels.lock`` itself is bad input (truncated, not TOML, not UTF-8, a wrong key or
    type, another lock-version): exit 2, like a malformed manifest."""

    exit_code = ExitCode.BAD_INPUT


class GitError(PipelineError):
    """A git command failed; the message carries git's own stderr."""


class SourceError(PipelineError):
    """Fetching or checking out a pinned component failed."""


class PatchError(PipelineError):
    """A patch series is malformed or does not apply."""


class PatchFileError(PatchError):
    """A patch file itself is bad input (not a patch, a malformed header, the wrong
    component, not UTF-8, a directory): exit 2, like a malformed manifest."""

    exit_code = ExitCode.BAD_INPUT


class BundleBusy(PipelineError):
    """Another run holds the bundle's work directory (``out/<bundle>/.lock``)."""

    exit_code = ExitCode.BUSY


class ToolchainError(PipelineError):
    """The tools a compiled check needs (compiler, headers, libraries) cannot be set up:
    the check cannot be judged (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class DiskError(PipelineError):
    """A write failed for a reason of the disk, not of the run: no space left (ENOSPC), a
    quota (EDQUOT), a read-only filesystem (EROFS) or no permission (EACCES). The message
    names the path; exit 10. Made by ``xla_wheels.disk_faults.disk_error``."""

    exit_code = ExitCode.DISK
