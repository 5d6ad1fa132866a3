"""Exception classes of the pipeline.

Every stage raises a subclass of :class:`PipelineError` with a message that names the
problem and the fix. The CLI edge (``xla_wheels.cli.main``) turns it into ``error:`` and
``fix:`` lines on stderr and its ``exit_code``; nothing below the CLI prints tracebacks or
calls ``sys.exit``. Exit codes: 0 done or passed; 1 a step failed or a check judged
against the build (:class:`CheckFailed`); 2 bad input, or the thing cannot be judged;
8 a command ran past the time limit its step gives it (``runner.StepTimedOut``: worth
retrying once the network or the machine is healthy); 10 a write hit a full disk, a
quota, a read-only filesystem or a directory the user may not write (:class:`DiskError`,
made by ``xla_wheels.disk_faults``: nothing is wrong with the inputs or the build).
"""

from __future__ import annotations

from xla_wheels.redact import mask_url_credentials, printable


class PipelineError(Exception):
    """A failure the user can act on. ``exit_code`` is what the CLI returns."""

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        # A remote or index URL may carry credentials (user:token@, ?token=): never in a
        # message; a value from a manifest may carry terminal escapes: shown escaped.
        self.message = printable(mask_url_credentials(message))
        self.fix = None if fix is None else printable(mask_url_credentials(fix))
        super().__init__(
            self.message if self.fix is None else f"{self.message}\n  fix: {self.fix}"
        )


class CheckFailed(PipelineError):
    """A check ran and judged against the build or host (gate, verify-install, doctor,
    ship check): exit 1. The report printed before it says which check and why; exit 2
    (``UsageError``, ``GateEnvironmentError``) means the thing could not be judged."""


class UsageError(PipelineError):
    """The command line itself is wrong (unknown bundle, missing argument)."""

    exit_code = 2


class ManifestError(PipelineError):
    """A bundle manifest is malformed: names the file, the key and the fix."""

    exit_code = 2


class LockError(PipelineError):
    """``wheels.lock`` lacks what a step needs (no entry for the bundle), or no longer
    matches the manifests and patches (stale after a change: ``lock-check``): exit 1."""


class LockFileError(LockError):
    """``wheels.lock`` itself is bad input (truncated, not TOML, not UTF-8, a wrong key or
    type, another lock-version): exit 2, like a malformed manifest."""

    exit_code = 2


class GitError(PipelineError):
    """A git command failed; the message carries git's own stderr."""


class SourceError(PipelineError):
    """Fetching or checking out a pinned component failed."""


class PatchError(PipelineError):
    """A patch series is malformed or does not apply."""


class PatchFileError(PatchError):
    """A patch file itself is bad input (not a patch, a malformed header, the wrong
    component, not UTF-8, a directory): exit 2, like a malformed manifest."""

    exit_code = 2


class BundleBusy(PipelineError):
    """Another run holds the bundle's work directory (``out/<bundle>/.lock``)."""

    exit_code = 5


class ToolchainError(PipelineError):
    """The tools a compiled check needs (compiler, headers, libraries) cannot be set up:
    the check cannot be judged (exit 2)."""

    exit_code = 2


class DiskError(PipelineError):
    """A write failed for a reason of the disk, not of the run: no space left (ENOSPC), a
    quota (EDQUOT), a read-only filesystem (EROFS) or no permission (EACCES). The message
    names the path; exit 10. Made by ``xla_wheels.disk_faults.disk_error``."""

    exit_code = 10
