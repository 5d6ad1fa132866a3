"""Talking to a PEP 503 "simple" index: names, credentials, reading project pages.

Only the standard library is used (urllib, html.parser) so the same code reads pypiserver,
devpi, Artifactory, Artifact Registry and the static index this stage writes. A link's
``#sha256=`` fragment is what pip itself checks, so it is also what decides whether a file
is already on the index.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import urllib.error
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_host import filemode
from xla_host.errors import PipelineError, UsageError
from xla_host.net import (
    ANSWER_BYTES_ALLOWANCE,
    RETRIES_SETTING,
    TIMEOUT_SETTING,
    Answer,
    Failures,
    NetworkPolicy,
    NetworkTimedOut,
    Transient,
    attempts_text,
    file_url_path,
    host_of,
    http_request,
    new_request,
)
from xla_host.redact import scrub
from xla_host.tables import MAX_FILE_BYTES
from xla_host.wheel_filename import normalize

if TYPE_CHECKING:
    import urllib.request
from xla_wheels.publish.errors import CredentialsRejected, IndexUnreachable, PublishError

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_UNREACHABLE_FIX = (
    "check that the index server is running and INDEX_URL is right (scheme, host, port, path)"
)


# ---------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    """Index credentials, read from the environment (or keyring), never from argv."""

    username: str | None
    password: str | None
    source: str
    """Where they came from, for the report: ``environment``, ``keyring`` or ``none``."""

    @property
    def secrets(self) -> list[str]:
        return [self.password] if self.password else []

    def request(self, url: str, **options: Any) -> urllib.request.Request:
        """A ``urllib`` request for ``url`` (``options`` as ``Request`` takes them), with
        these credentials as Basic auth when there are both a username and a password."""
        request = new_request(url, **options)
        if self.username is not None and self.password is not None:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        return request


def credentials_for(upload_url: str, environ: Mapping[str, str] | None = None) -> Credentials:
    """TWINE_USERNAME / TWINE_PASSWORD, else the password keyring holds for the URL.

    These are the variables twine itself reads, so one setting serves the upload (twine)
    and our reads of the simple page (urllib).
    """
    # Credentials follow twine's own convention (TWINE_*), deliberately not an option.
    env = os.environ if environ is None else environ
    username = env.get("TWINE_USERNAME") or None
    password = env.get("TWINE_PASSWORD") or None
    if password is not None:
        return Credentials(username, password, "environment")
    if username is not None:
        try:
            import keyring  # twine's own dependency: present wherever twine is

            password = keyring.get_password(upload_url, username)
        except Exception:
            # No keyring backend on a headless host is normal; twine will say the same.
            password = None
        if password is not None:
            return Credentials(username, password, "keyring")
    return Credentials(username, None, "none")


def reject_userinfo(url: str, what: str) -> None:
    """Credentials inside a URL end up in shell history, make's echo and logs: refuse."""
    if urllib.parse.urlsplit(url).password is not None or _USERINFO.match(url):
        raise UsageError(
            f"{what} carries credentials in the URL ({scrub(url)})",
            fix="drop them from the URL; set TWINE_USERNAME and TWINE_PASSWORD in the "
            "environment (or store the password in keyring) instead",
        )


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    """From the link's ``#sha256=`` fragment; None when the index gives none."""


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_project_page(html: str, page_url: str) -> dict[str, IndexFile]:
    """File name -> file of one project page; relative links resolved against the page."""
    parser = _Anchors()
    parser.feed(html)
    files: dict[str, IndexFile] = {}
    for href, text in parser.links:
        absolute = urllib.parse.urljoin(page_url, href)
        parts = urllib.parse.urlsplit(absolute)
        filename = urllib.parse.unquote(parts.path.rsplit("/", 1)[-1]) or text
        fragment = urllib.parse.parse_qs(parts.fragment)
        digest = fragment.get("sha256", [None])[0]
        files[filename] = IndexFile(filename, absolute, digest.lower() if digest else None)
    return files


def _open(
    url: str,
    credentials: Credentials,
    *,
    network: NetworkPolicy,
    accept: str = "text/html",
    size: int = ANSWER_BYTES_ALLOWANCE,
) -> bytes | None:
    """The body at ``url``; None for 404. Every failure becomes an error naming the fix.
    ``size``: the bytes the read is allowed for in its deadline (a page: an allowance)."""
    if urllib.parse.urlsplit(url).scheme == "file":
        path = Path(file_url_path(url))
        if path.is_dir():
            path = path / "index.html"
        try:
            # A static lane is a shared directory: a FIFO there is refused, never opened.
            return filemode.read_shared(path, what="lane file", limit=max(size, MAX_FILE_BYTES))
        except FileNotFoundError:
            return None
    shown = scrub(url, credentials.secrets)

    def answered(answer: Answer) -> PipelineError | None:
        if answer.status == 404:
            return None  # no such page: an answer (the caller's None)
        if answer.status in (401, 403):
            return CredentialsRejected(
                f"the index at {host_of(url)} refused our credentials for {shown} "
                f"(HTTP {answer.status}; credentials from: {credentials.source})",
                fix="set TWINE_USERNAME and TWINE_PASSWORD (or keyring) to an account "
                "that may read and upload to this index",
            )
        return IndexUnreachable(
            f"the index answered HTTP {answer.status} {answer.reason} for {shown}",
            fix="check INDEX_URL (it must be the index's simple/ page) and the index's logs",
        )

    failures = Failures(
        answered=answered,
        unreadable=lambda reason: IndexUnreachable(
            f"the index at {shown} is not reachable: {reason}", fix=_UNREACHABLE_FIX
        ),
        gave_up=lambda fault, attempts: IndexUnreachable(
            f"reading {shown}: the index at {host_of(url)} is not reachable: it "
            f"{fault.what_happened} ({attempts_text(attempts)})",
            fix=(
                # An answer cut off, as an HTTP 5xx: the server (or a proxy before it) fails.
                f"the index fails on its side: check its logs and health (and any proxy "
                f"before it), then run again (retries: {RETRIES_SETTING})"
                if fault.kind.startswith("HTTP ") or fault.kind == "cut"
                else _UNREACHABLE_FIX
            ),
        ),
        timeout_fix=f"check that the index at {host_of(url)} is up and answering, or give it "
        f"longer with {TIMEOUT_SETTING}",
    )
    answer = http_request(
        credentials.request(url, headers={"Accept": accept}), network, failures,
        step=f"reading {shown}", size=size, secrets=credentials.secrets,
    )  # fmt: skip
    return None if answer.status == 404 else answer.body


def project_files(
    simple_url: str, project: str, credentials: Credentials, *, network: NetworkPolicy
) -> dict[str, IndexFile]:
    """The files the index lists for ``project``; empty when it has no such project."""
    page_url = f"{simple_url.rstrip('/')}/{normalize(project)}/"
    body = _open(page_url, credentials, network=network)
    if body is None:
        return {}
    return parse_project_page(body.decode("utf-8", errors="replace"), page_url)


def check_reachable(simple_url: str, credentials: Credentials, *, network: NetworkPolicy) -> None:
    """Fail early, before any upload, when the index root does not answer."""
    _open(simple_url.rstrip("/") + "/", credentials, network=network)


def remote_sha256(
    file: IndexFile, credentials: Credentials, *, size: int, network: NetworkPolicy
) -> str:
    """The file's sha256, from the link or, when the index gives none, by downloading it
    (``size``: the bytes expected, the locked file's, for the download's deadline)."""
    if file.sha256:
        return file.sha256
    body = _open(file.url, credentials, network=network, accept="*/*", size=size)
    if body is None:
        raise PublishError(
            f"the index lists {file.filename} but serves 404 for it",
            fix="remove the broken entry on the index, then publish again",
        )
    return hashlib.sha256(body).hexdigest()


def upload_url_for(simple_url: str) -> str:
    """Where twine uploads, derived from the simple URL the hosts install from.

    pypiserver serves ``/simple/`` and takes uploads at ``/``; devpi ``/u/i/+simple/`` and
    ``/u/i/``; Artifactory ``.../api/pypi/<repo>/simple`` and ``.../api/pypi/<repo>``. Other
    layouts pass ``--upload-url`` (``UPLOAD_URL=``) explicitly.
    """
    stripped = simple_url.rstrip("/")
    for suffix in ("/+simple", "/simple"):
        if stripped.endswith(suffix):
            return stripped[: -len(suffix)] + "/"
    raise UsageError(
        f"cannot derive the upload URL from INDEX_URL {scrub(simple_url)} "
        "(it does not end in /simple/ or /+simple/)",
        fix="pass the index's upload endpoint as UPLOAD_URL=... (twine's --repository-url)",
    )


# ---------------------------------------------------------------------------- pip's faults

#: What pip (requests, urllib3) prints when it failed on the network, not on a hash or a
#: resolution: the fault's kind, as :class:`Transient` names it.
_PIP_FAULTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "timed out",
        re.compile(
            r"ReadTimeoutError|ConnectTimeoutError|Read timed out|didn't respond within"
            r"|: timed out - skipping",
            re.I,
        ),
    ),
    ("refused", re.compile(r"Connection refused|Errno 111", re.I)),
    (
        "cut",
        re.compile(r"IncompleteRead|Connection broken|ProtocolError|RemoteDisconnected", re.I),
    ),
    ("reset", re.compile(r"Connection reset|Connection aborted", re.I)),
    ("HTTP 5xx", re.compile(r"HTTP error 5[0-9][0-9]\b[^\n]*", re.I)),
)
_PIP_HOST = re.compile(r"host='([^']+)', port=([0-9]+)")
#: A page pip could not read (its debug log, ``--log``: the console says only "from
#: versions: none").
_PIP_PAGE = re.compile(r"Could not fetch URL (\S+): ")


def pip_network_fault(
    output: str, index_url: str | None, *, step: str, network: NetworkPolicy
) -> PipelineError | None:
    """The error for a pip run that failed on the network (its own ``--timeout`` and
    ``--retries`` spent), from pip's ``output`` (and its ``--log``): naming the host and
    what happened, exit 8 for no answer in time, else exit 1; None when pip failed for
    another reason."""
    found = [(kind, match) for kind, pattern in _PIP_FAULTS if (match := pattern.search(output))]
    if not found:
        return None
    kind, match = found[0]
    if where := _PIP_HOST.search(output):
        host = f"{where.group(1)}:{where.group(2)}"
    elif page := _PIP_PAGE.search(output):
        host = host_of(page.group(1))
    else:
        host = host_of(index_url) if index_url else "the package index"
    if kind == "timed out":
        return NetworkTimedOut(
            step,
            host,
            network.timeout_s,
            network.attempts,
            f"check that the index at {host} is up and answering, then run it again; a slow "
            f"link: give it longer with {TIMEOUT_SETTING}",
        )
    fault = Transient(match.group(0).strip() if kind == "HTTP 5xx" else kind)
    return IndexUnreachable(
        f"{step}: {host} {fault.what_happened} ({attempts_text(network.attempts)}, pip's own)",
        fix="check that the index server is running and its URL is right; a fault that "
        "passes: run it again",
    )
