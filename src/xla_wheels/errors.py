"""Exception classes of the pipeline.

Every stage raises a subclass of :class:`PipelineError` with a message that names the
problem and the fix. The CLI edge (``cli.main``) turns it into one line on stderr and an
exit code; nothing below the CLI prints tracebacks or calls ``sys.exit``.
"""

from __future__ import annotations

from xla_wheels.log import mask_url_credentials


class PipelineError(Exception):
    """A failure the user can act on. ``exit_code`` is what the CLI returns."""

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        # A remote or index URL may carry credentials (user:token@): never in a message.
        self.message = mask_url_credentials(message)
        self.fix = None if fix is None else mask_url_credentials(fix)
        super().__init__(
            self.message if self.fix is None else f"{self.message}\n  fix: {self.fix}"
        )


class UsageError(PipelineError):
    """The command line itself is wrong (unknown bundle, missing argument)."""

    exit_code = 2


class ManifestError(PipelineError):
    """A bundle manifest is malformed: names the file, the key and the fix."""

    exit_code = 2


class LockError(PipelineError):
    """``wheels.lock`` is malformed or does not match the manifests and patches."""


class GitError(PipelineError):
    """A git command failed; the message carries git's own stderr."""


class SourceError(PipelineError):
    """Fetching or checking out a pinned component failed."""


class PatchError(PipelineError):
    """A patch series is malformed or does not apply."""
