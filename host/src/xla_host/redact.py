"""Masking secrets: one marker, ``<redacted>``, wherever a credential could be shown.

Credentials reach text in four ways, and one :class:`Redactor` masks all four: a known
secret value (a remote cache's token, twine's password) in a command's output, URL-quoted
or not; the userinfo of a URL (``https://user:token@host`` -> ``https://<redacted>@host``);
a credential in a URL's query string or fragment (``?token=abc``, ``&X-Amz-Signature=...``
-> ``?token=<redacted>``); and a basic-auth header echoed by a verbose client. Plans, logs,
errors and reports all show the same marker, so a reader learns one sign for "a secret was here".
An address the user gives (a lane, a pack's URL) is shown by :func:`masked_url`, which masks
every value of its query whatever its name, and recorded without its userinfo.

Standard library only: the builder image runs it (``builder.run_recipe``).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"

# user:password@ (or token@) in a URL: a remote, mirror or index given with credentials.
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
# A query-string (or fragment) parameter whose name says it carries a credential: token,
# access_token, api_key/apikey, key, password/passwd/pwd, secret, sig/signature,
# X-Amz-Signature/Credential/Security-Token, X-Goog-Signature/Credential, auth... Judged by
# the name's parts, so a spelling not listed (private_token, client_secret, upload-key) is
# masked too; masking a harmless parameter costs a reader less than showing a secret.
_SECRET_WORDS = (
    r"token|secret|passw(?:or)?d|pwd|pass|sig|signature|key|apikey|auth|authorization|"
    r"credentials?|session|sessionid|jwt|bearer"
)
_SECRET_PARAM = re.compile(
    rf"(?i)(?<=[?&;#])((?:[a-z0-9]+[_.-])*(?:{_SECRET_WORDS})(?:[_.-][a-z0-9]+)*=)[^&#\s'\"<>]+"
)
# A basic-auth header carries user:password in base64.
_BASIC_AUTH = re.compile(r"(?i)(authorization:\s*basic\s+)\S+")


# Control characters other than newline and tab (C0, DEL, C1): an escape sequence in a
# manifest value (a description, a remote) would otherwise recolour, retitle or clear the
# user's terminal when an error or a plan shows the value.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as an escape
    (``\\x1b``): what the pipeline itself shows (errors, fixes, its log lines, plans), so a
    value from a manifest or the user cannot act on the terminal. A command's own output
    (a compiler's colours) is passed on as it is."""
    return _CONTROLS.sub(lambda match: ascii(match.group())[1:-1], text)


_LINE_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """``text`` shown as one line of a listing: every control character written as an
    escape, the newline and the tab too (a rollback's reason with a newline once printed
    a forged history line), URL credentials masked."""
    return _LINE_CONTROLS.sub(lambda match: ascii(match.group())[1:-1], mask_url_credentials(text))


def mask_url_credentials(text: str) -> str:
    """``https://user:token@host/x?token=t`` -> ``https://<redacted>@host/x?token=<redacted>``:
    credentials never reach a terminal, a plan, a log or an error message."""
    return _SECRET_PARAM.sub(r"\1" + REDACTED, _URL_USERINFO.sub(REDACTED + "@", text))


def masked_url(url: str, *, record: bool = False) -> str:
    """A URL the user gave as an address (a lane, a pack), as shown: its userinfo masked
    and every value of its query masked, whatever the parameter's name (an address's
    query is there to carry a token: ``?t=...`` as much as ``?token=...``); ``record``:
    as a record keeps it, the userinfo left out. Text that is not a URL is shown as it is."""
    if "://" not in url:
        return shown(url)
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc and not record:
        netloc = f"{REDACTED}@{netloc}"

    def masked(query: str) -> str:
        pairs = (p.partition("=") for p in query.split("&") if p)
        return "&".join(f"{name}={REDACTED}" if sep else REDACTED for name, sep, _ in pairs)

    masked_parts = parts._replace(
        netloc=netloc, query=masked(parts.query), fragment=masked(parts.fragment)
    )
    return shown(urllib.parse.urlunsplit(masked_parts))


#: A credential is never shorter; a shorter value (``?v=1``) masked wherever it appears
#: would garble every number of a message (its URL is masked by :func:`masked_url`).
_SHORTEST_SECRET = 6


def url_secrets(url: str) -> tuple[str, ...]:
    """The values of ``url`` a message must never show, for a :class:`Redactor`: its
    userinfo's user and password, and each value of its query."""
    if "://" not in url:
        return ()
    parts = urllib.parse.urlsplit(url)
    values = [parts.username or "", parts.password or ""]
    for query in (parts.query, parts.fragment):
        values += [value for _, value in urllib.parse.parse_qsl(query, keep_blank_values=True)]
        values += [p.partition("=")[2] for p in query.split("&")]
    found = {v for value in values for v in (value, urllib.parse.unquote(value))}
    return tuple(sorted(v for v in found if len(v) >= _SHORTEST_SECRET))


def shown(text: str) -> str:
    """``text`` as the pipeline shows it: URL credentials masked, control characters escaped."""
    return printable(mask_url_credentials(text))


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
