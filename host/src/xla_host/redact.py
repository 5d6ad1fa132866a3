"""Masking secrets: one marker, ``<redacted>``, wherever a credential could be shown.

Credentials reach text in four ways, and one :class:`Redactor` masks all four: a known
secret value (a remote cache's token, twine's password) in a command's output, URL-quoted
or not; the userinfo of a URL (``https://user:token@host`` -> ``https://<redacted>@host``);
a credential in a URL's query string or fragment (``?token=abc``, ``&X-Amz-Signature=...``
-> ``?token=<redacted>``); and a basic-auth header echoed by a verbose client. Plans, logs,
errors and reports all show the same marker, so a reader learns one sign for "a secret was here".
An address the user gives (a lane, a pack's URL) is shown by :func:`masked_url`, which masks
every value of its query whatever its name, and recorded without its userinfo.

**Records** that leave the process (receipts' launch environment and profile, key records
and the pack manifests that carry their components, audit stamps) are masked by
:func:`mask_environment`, :func:`mask_flag_values` and :func:`mask_flag_string`, which also
judge flag strings (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``, a job's command) token by token.
The rule, one for variables and flags:

- a variable or flag whose **name** says it holds a credential (a part of the name, split
  at ``_ - .``, is token, secret, password, passwd, pwd, passphrase, key, apikey, auth,
  authorization, credential(s), bearer, jwt, cookie, signature; or the name contains
  token, secret, passw or credential anywhere) has its value masked, whatever it is;
- a flag's **value** is masked when it looks like a credential: a URL with userinfo or a
  credential query parameter, a PEM block (``-----BEGIN``), or a long token (24 characters
  or more of base64/URL-safe alphabet, letters and digits mixed, at least 3.5 bits of
  entropy per character; a path, a number or a word-like value never is).

Flags are ``--name=value`` (quoted values too) and ``--name value`` (the next word when it
does not start with ``-``). A masked value in a record is ``<redacted sha256:…>``: the
marker and the first 12 hex digits of a sha256 of the name and value, so two records that
differ only in a secret still differ where the project compares them (receipts' launch
environments, ``cache explain``'s components), and equal secrets stay equal. The digest
tells records apart; it does not make a guessable password safe (anyone can hash guesses),
which is why the value is never written, only this. What determines an executable (the
persistent-cache key, the children's environment) always gets the real values: masking is
for what is written down, never for what is run.

Standard library only: the builder image runs it (``builder.run_recipe``).
"""

from __future__ import annotations

import hashlib
import math
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


# A name that says it holds a credential: judged by its parts, plus a few words distinctive
# enough to count anywhere in it (HFTOKEN, DBPASSWORD).
_CREDENTIAL_PARTS = frozenset(
    {
        "token", "secret", "password", "passwd", "pwd", "passphrase", "key", "apikey",
        "auth", "authorization", "credential", "credentials", "bearer", "jwt", "cookie",
        "signature",
    }
)  # fmt: skip
_CREDENTIAL_ANYWHERE = ("token", "secret", "passw", "credential")
_NAME_PARTS = re.compile(r"[_.\-]+")
# A token-shaped value: base64 / URL-safe characters only (no path separator first, no space).
_TOKEN_SHAPED = re.compile(r"[A-Za-z0-9+/=_\-.~]{24,}")
_PEM = "-----BEGIN"
#: Bits per character above which a long mixed letters-and-digits value is taken for a key.
_TOKEN_ENTROPY_BITS = 3.5
_DIGEST_HEX = 12
# One flag of a flag string: --name=value (value maybe quoted) or --name value (the next
# word when it does not start with "-"); the lead dash starts a word.
_FLAG = re.compile(
    r"""(?<!\S)(?P<flag>-{1,2}(?P<name>[A-Za-z0-9][\w.\-]*))"""
    r"""(?:(?P<eq>=)(?P<value>"[^"]*"|'[^']*'|\S*)"""
    r"""|(?P<gap>[ \t]+)(?P<next>(?!-)(?:"[^"]*"|'[^']*'|\S+)))?"""
)


def is_credential_name(name: str) -> bool:
    """Whether a variable or flag named ``name`` holds a credential (the module's rule)."""
    lowered = name.lower().lstrip("-")
    if any(word in lowered for word in _CREDENTIAL_ANYWHERE):
        return True
    return any(part in _CREDENTIAL_PARTS for part in _NAME_PARTS.split(lowered))


def _entropy_bits(text: str) -> float:
    counts = {char: text.count(char) for char in set(text)}
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def looks_like_secret(value: str) -> bool:
    """Whether a flag's ``value`` looks like a credential whatever its name (the module's
    rule: a URL with credentials, a PEM block, a long high-entropy token)."""
    bare = value.strip("'\"")
    if _PEM in bare or mask_url_credentials(bare) != bare:
        return True
    if not _TOKEN_SHAPED.fullmatch(bare) or bare[0] in "/.~":
        return False
    mixed = any(c.isalpha() for c in bare) and any(c.isdigit() for c in bare)
    return mixed and _entropy_bits(bare) >= _TOKEN_ENTROPY_BITS


def masked(value: str, name: str = "") -> str:
    """``<redacted sha256:ab12cd34ef56>``: the marker and a short digest of ``name`` and
    ``value``, so records that differ in a secret still differ."""
    digest = hashlib.sha256(f"{name}\0{value}".encode()).hexdigest()[:_DIGEST_HEX]
    return f"<redacted sha256:{digest}>"


def mask_flag_string(text: str) -> str:
    """A flag string (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``, a command line) with the value
    of every flag that holds a credential masked (the module's rule), URL credentials
    masked elsewhere too; spacing and every other token as they were."""

    def one(match: re.Match[str]) -> str:
        name = match.group("name")
        if match.group("eq") is not None:
            value = match.group("value")
            if value and (is_credential_name(name) or looks_like_secret(value)):
                return f"{match.group('flag')}={masked(value.strip(chr(39) + chr(34)), name)}"
            return match.group()
        following = match.group("next")
        if following is not None and (is_credential_name(name) or looks_like_secret(following)):
            bare = following.strip("'\"")
            return f"{match.group('flag')}{match.group('gap')}{masked(bare, name)}"
        return match.group()

    return mask_url_credentials(_FLAG.sub(one, text))


def mask_flag_values(flags: Mapping[str, str]) -> dict[str, str]:
    """Parsed flags (name -> value, as the key records hold them) with each credential's
    value masked (the module's rule, by name or by value)."""
    return {
        name: masked(value, name)
        if value and (is_credential_name(name) or looks_like_secret(value))
        else value
        for name, value in flags.items()
    }


def mask_variable(name: str, value: str) -> str:
    """One variable's value as a record holds it: masked whole when its name is a
    credential's or the value is itself a URL with credentials or a PEM block, else masked
    flag by flag (:func:`mask_flag_string`)."""
    bare = value.strip()
    whole = _PEM in bare or (mask_url_credentials(bare) != bare and " " not in bare)
    if value and (is_credential_name(name) or whole):
        return masked(value, name)
    return mask_flag_string(value)


def mask_environment(env: Mapping[str, str]) -> dict[str, str]:
    """An environment as a record holds it: each value through :func:`mask_variable`."""
    return {name: mask_variable(name, value) for name, value in env.items()}
