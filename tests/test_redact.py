"""Every way a credential reaches text is masked with one marker, ``<redacted>``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.test_error_contract import project_copy
from xla_host.redact import REDACTED, Redactor, mask_url_credentials, one_line, scrub
from xla_wheels.release import lanes
from xla_wheels.release.lanes import LaneState

SECRET = "p@ss w/rd"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        # A known secret value, as given and as it appears quoted inside a URL.
        (f"token {SECRET} rejected", f"token {REDACTED} rejected"),
        ("GET /?key=p%40ss%20w%2Frd", f"GET /?key={REDACTED}"),
        ("GET /?key=p%40ss+w%2Frd", f"GET /?key={REDACTED}"),
        # URL userinfo, whoever's it is.
        ("fetch https://user:tok@host/x.git", f"fetch https://{REDACTED}@host/x.git"),
        # A basic-auth header a verbose client echoes.
        ("Authorization: Basic dXNlcjpwdw==", f"Authorization: Basic {REDACTED}"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_a_secret_in_any_form_becomes_the_one_marker(text: str, masked: str) -> None:
    assert scrub(text, [SECRET]) == masked


def test_a_secret_containing_another_is_masked_whole() -> None:
    redact = Redactor({"short": "abc", "long": "abcdef"})
    assert redact("x abcdef y abc") == f"x {REDACTED} y {REDACTED}"


def test_url_credentials_are_masked_without_knowing_them() -> None:
    assert mask_url_credentials("redis://u:p@h:6379|ro") == f"redis://{REDACTED}@h:6379|ro"


def test_a_rollback_reason_with_escapes_and_line_breaks_is_shown_as_one_line_of_text(
    tmp_path: Path,
) -> None:
    # Stored as given (lanes.lock keeps it escaped in TOML), printed by `lanes --history`:
    # it once recoloured the terminal and printed a forged history line.
    root = project_copy(tmp_path)
    forged = "2026-01-01T00:00:00Z  preferred: promote evil  by root"
    reason = f"incident 4711\x1b[31m red\n{forged}\ttab"
    lanes.write_state(root, "preferred", LaneState("v6e-2.9", (), None, None))
    lanes.write_state(root, "preferred", LaneState("v6e-2.9-b", (), None, None))
    lanes.write_state(
        root, "preferred", LaneState("v6e-2.9", (), None, None), action="rollback", reason=reason
    )
    result = run_cli("lanes", "--history", root=root)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\t" not in result.output
    assert "  reason: incident 4711\\x1b[31m red\\n" + forged + "\\ttab" in result.stdout
    assert not [line for line in result.stdout.splitlines() if line.startswith(forged)]
    assert one_line("a\x9bb\r") == "a\\x9bb\\r"  # C1 controls and carriage returns too
