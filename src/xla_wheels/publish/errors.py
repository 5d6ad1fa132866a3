"""Errors of the publish stage; every message names the problem and the fix."""

from __future__ import annotations

from xla_host.errors import CheckFailed, PipelineError


class PublishError(PipelineError):
    """Publishing or installing a bundle's wheels failed."""


class IndexUnreachable(PublishError):
    """The package index did not answer (down, wrong URL, DNS, TLS)."""


class CredentialsRejected(PublishError):
    """The index answered 401/403: the credentials are wrong or lack upload rights."""


class HashMismatch(PublishError):
    """A file's sha256 differs from the one wheels.lock (or the index) records."""


class VerifyFailed(PublishError, CheckFailed):
    """``verify-install`` ran but a check failed; the report names which."""


class DoctorFailed(CheckFailed):
    """``doctor`` found at least one problem on this host; the report lists the fixes."""
