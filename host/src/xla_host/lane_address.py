"""A lane's address: parsed once from every form a user gives it, and every place of the
lane built from it.

A lane is given (``--lane``, ``--pack-lane``, ``XLA_WHEELS_PACK_LANE``) as one of
:data:`FORMS`: its directory, a ``file://`` URL of it, or an http(s) URL of its root or of
its PEP 503 index (``simple/``; devpi's ``+simple/``, a package index with no static
pages). :func:`parse` reads each form once into a :class:`LaneAddress`, which names the
lane's root, its index, and any file relative to the root (the bundle documents, the pack
index, a pack). Every reader of a lane (``bundle_document``, ``lane_packs``, the pack
fetch) builds its places here, so the forms mean the same everywhere.

Credentials travel with the address and only to the lane's own server: the userinfo
(``https://user:token@host/...``, sent as basic auth by :mod:`xla_host.net`) and the query
(``?token=...``) are kept on every request URL built from the address, including links a
page of the lane names on the same server (:meth:`LaneAddress.linked`; ``urljoin`` alone
drops the query). What is shown (:meth:`LaneAddress.shown`) has both masked
(:func:`xla_host.redact.masked_url`); what is recorded (:func:`recorded`) has no userinfo
and every query value masked.

Standard library only: this runs on a TPU host.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from xla_host.errors import UsageError
from xla_host.redact import masked_url, printable, url_secrets

#: The address forms, for help texts and fixes.
FORMS = (
    "the lane's directory, a file:// URL of it, or an http(s) URL of its root or of its "
    "simple/ index (devpi: its +simple/)"
)
_INDEX_NAMES = ("simple", "+simple")


class LaneAddressError(UsageError):
    """A lane address none of :data:`FORMS` (exit 2)."""


@dataclass(frozen=True)
class LaneAddress:
    """One lane's address, as :func:`parse` read it."""

    given: str
    """As the user typed it (never shown as such: :meth:`shown`)."""
    directory: Path | None
    """The lane's root directory (a directory or ``file://`` address), else None."""
    origin: str = ""
    """``scheme://[userinfo@]host[:port]`` of an http(s) address."""
    root_path: str = "/"
    """The URL path of the lane's root, ending in ``/``."""
    index_path: str = "/simple/"
    """The URL path of its PEP 503 index, ending in ``/``."""
    query: str = ""
    """The query kept on every request to the lane (a ``?token=``), without the ``?``."""
    package_index: bool = False
    """devpi's ``+simple/``: a package index only, no static pages beside it."""

    @property
    def local(self) -> bool:
        return self.directory is not None

    def _url(self, path: str) -> str:
        return self.origin + path + (f"?{self.query}" if self.query else "")

    @property
    def root_url(self) -> str:
        return self._url(self.root_path)

    @property
    def index_url(self) -> str:
        """The PEP 503 index (``simple/``), credentials kept: what pip's ``--index-url``
        takes."""
        return self._url(self.index_path)

    def project_page(self, project: str) -> str:
        """The index's page of ``project`` (PEP 503: ``simple/<project>/``)."""
        return self._url(f"{self.index_path}{urllib.parse.quote(project)}/")

    def url(self, relative: str) -> str:
        """The request URL of the file at ``relative`` (``/``-separated) below the root:
        the root's path joined with it, the query attached again."""
        return self._url(self.root_path + urllib.parse.quote(relative.lstrip("/")))

    def path(self, relative: str) -> Path:
        """The file at ``relative`` below a local lane's root."""
        assert self.directory is not None, "a lane served over HTTP has no local path"
        return self.directory.joinpath(*relative.split("/"))

    def where(self, relative: str) -> str:
        """The file at ``relative``: its request URL, or a local lane's path."""
        return str(self.path(relative)) if self.local else self.url(relative)

    def linked(self, page_url: str, href: str) -> tuple[str, str]:
        """(request URL, fragment) of a link ``href`` on the lane's page ``page_url``.

        Joined with the page's URL without its query (``urljoin`` would drop it anyway);
        a target on the lane's own server gets the lane's credentials back (its userinfo,
        and its query unless the link has one of its own), a target elsewhere gets none.
        """
        page = urllib.parse.urlsplit(page_url)
        bare = urllib.parse.urlunsplit(page._replace(query="", fragment=""))
        target = urllib.parse.urlsplit(urllib.parse.urljoin(bare, href))
        fragment = target.fragment
        target = target._replace(fragment="")
        ours = urllib.parse.urlsplit(self.origin)
        if (target.scheme, target.hostname, target.port) == (
            ours.scheme, ours.hostname, ours.port,
        ):  # fmt: skip
            target = target._replace(netloc=ours.netloc, query=target.query or self.query)
        return urllib.parse.urlunsplit(target), fragment

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values a message must never show: the userinfo's and the query's."""
        return url_secrets(self.given)

    def shown(self, where: str | Path | None = None) -> str:
        """``where`` (default: the lane's root) as messages show it: a URL with its
        userinfo and every query value masked, a path as it is."""
        if where is None:
            where = self.directory if self.directory is not None else self.root_url
        if isinstance(where, Path):
            return printable(str(where))
        return masked_url(where)


def recorded(where: str) -> str:
    """A lane's or pack's URL as a record keeps it (the pack install record, a stamp):
    no userinfo, every query value masked; a path as it is."""
    return masked_url(where, record=True)


def _refused(given: str, problem: str) -> LaneAddressError:
    return LaneAddressError(
        f"the lane address {masked_url(given)!r} {problem}",
        fix=f"give the lane as {FORMS}; for example https://lanes.corp/validation/",
    )


def parse(given: str) -> LaneAddress:
    """``given`` read as one of :data:`FORMS`; refused naming the problem otherwise."""
    if not given.strip():
        raise _refused(given, "is empty")
    parts = urllib.parse.urlsplit(given)
    scheme = parts.scheme.lower() if "://" in given else ""
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise _refused(given, "names no host")
        path = parts.path.rstrip("/") + "/"
        last = path.rstrip("/").rsplit("/", 1)[-1]
        if last in _INDEX_NAMES:
            root, index = path[: -len(last) - 1], path
        else:
            root, index = path, path + "simple/"
        return LaneAddress(
            given, None, origin=f"{scheme}://{parts.netloc}", root_path=root,
            index_path=index, query=parts.query, package_index=last == "+simple",
        )  # fmt: skip
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise _refused(given, f"names another machine ({parts.netloc})")
        directory = Path(urllib.parse.unquote(parts.path))
    elif scheme:
        raise _refused(given, f"has the scheme {scheme}://, which no lane is served by")
    else:
        directory = Path(given)
    if directory.name in _INDEX_NAMES:
        directory = directory.parent
    return LaneAddress(given, directory)


def address_of(lane: str | LaneAddress) -> LaneAddress:
    """``lane`` as an address: parsed when given as text (a library caller's string)."""
    return lane if isinstance(lane, LaneAddress) else parse(lane)
