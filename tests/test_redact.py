"""Every way a credential reaches text is masked with one marker, ``<redacted>``."""

from __future__ import annotations

import pytest

from xla_host.redact import REDACTED, Redactor, mask_url_credentials, scrub

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
