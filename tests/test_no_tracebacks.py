"""Bad settings end in the error:/fix: form with exit 2, never a traceback."""

from __future__ import annotations

import pytest

from tests.clirunner import REPO_ROOT, run_cli
from xla_wheels.builder.config import jobs_that_fit


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (("doctor", "--bundle", "v6e-2.9", "--role", "bogus"), {}, "invalid choice: 'bogus'"),
        (
            ("doctor", "--bundle", "v6e-2.9"),
            {"XLA_WHEELS_ROLE": "bogus"},
            # The one rule's refusal (xla_host.cache_role), worded as the cascade's.
            "fix: set XLA_WHEELS_ROLE=writer, or unset it",
        ),
        (
            ("wheels", "--bundle", "v6e-2.9", "--jobs", "abc"),
            {},
            "error: --jobs: 'abc' is not a whole number from 1 to 4096",
        ),
        (
            ("wheels", "--bundle", "v6e-2.9", "--dry-run"),
            {"XLA_WHEELS_JOBS": "abc"},
            f"fix: set XLA_WHEELS_JOBS={jobs_that_fit()}, or unset it",
        ),
    ],
)
def test_a_bad_setting_is_a_usage_error(
    argv: tuple[str, ...], env: dict[str, str], expected: str
) -> None:
    result = run_cli(*argv, root=REPO_ROOT, env=env)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert "Traceback" not in result.output
