"""A test that needs a tool this machine lacks skips, and in CI (``CI=true``) fails instead.

A machine without podman, buildah, ccache, Bazel, nginx, ... would otherwise go green while
the container, cache and ABI tests never ran. Every test that skips for a missing tool
goes through :func:`skip_missing` (or the mark :func:`skipif_missing`), whose reason
starts with :data:`MISSING`; ``tests/conftest.py`` turns such a skip into a failure when
:func:`tests.real_source.is_ci` holds.

A tool that cannot exist on these machines (a docker daemon: the sandbox runs no
daemons) skips through :func:`skip_impossible`, whose reason says so, and passes in CI.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

#: How every missing-tool skip reason starts: what conftest's hook recognises.
MISSING = "missing tool: "

#: What a skip for a tool that cannot exist here says after naming it.
CANNOT_EXIST = "cannot exist on these machines"


def skip_missing(reason: str) -> NoReturn:
    """Skip for a tool this machine lacks (a failure in CI)."""
    pytest.skip(MISSING + reason)


def skipif_missing(reason: str | None) -> pytest.MarkDecorator:
    """A mark that skips when ``reason`` (what is missing) is given (a failure in CI)."""
    return pytest.mark.skipif(reason is not None, reason=MISSING + (reason or ""))


def skip_impossible(what: str, seen: str) -> NoReturn:
    """Skip for ``what``, which cannot exist on these machines (fine in CI too); ``seen``:
    how this run found it missing."""
    pytest.skip(f"{what} {CANNOT_EXIST}: {seen}")


def is_missing_tool(skip_reason: str) -> bool:
    """Whether a report's skip reason (``Skipped: ...`` from pytest) is a missing tool's."""
    return skip_reason.removeprefix("Skipped: ").startswith(MISSING)
