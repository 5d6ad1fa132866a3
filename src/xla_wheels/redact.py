"""Masking secrets: one marker, ``<redacted>``, wherever a credential could be shown.

Credentials reach text in three ways, and one :class:`Redactor` masks all three: a known
secret value (a remote cache's token, twine's password) in a command's output, URL-quoted
or not; the userinfo of a URL (``https://user:token@host`` -> ``https://<redacted>@host``);
and a basic-auth header echoed by a verbose client. Plans, logs, errors and reports all
show the same marker, so a reader learns one sign for "a secret was here".

Standard library only: the builder image runs it (``builder.run_recipe``).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

# user:password@ (or token@) in a URL: a remote, mirror or index given with credentials.
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
# A basic-auth header carries user:password in base64.
_BASIC_AUTH = re.compile(r"(?i)(authorization:\s*basic\s+)\S+")


def mask_url_credentials(text: str) -> str:
    """``https://user:token@host/x`` -> ``https://<redacted>@host/x``: credentials never
    reach a terminal, a plan, a log or an error message."""
    return _URL_USERINFO.sub(REDACTED + "@", text)


class Redactor:
    """Replaces every form of each secret, URL userinfo and basic-auth headers with
    :data:`REDACTED`."""

    def __init__(self, secrets: Mapping[str, str] | Iterable[str] = ()) -> None:
        values = secrets.values() if isinstance(secrets, Mapping) else secrets
        forms: set[str] = set()
        for value in values:
            if value:
                # As given, and as it appears inside a URL (percent- or plus-quoted).
                forms |= {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}
        # Longest first: a secret that contains another is masked whole.
        self.forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        text = mask_url_credentials(text)
        for form in self.forms:
            text = text.replace(form, REDACTED)
        return _BASIC_AUTH.sub(r"\1" + REDACTED, text)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every form of ``secrets`` and any URL credentials masked."""
    return Redactor(secrets)(text)
