"""The bundle document: what a host needs to know about a bundle, published in its lane.

This module owns the format. The builder composes it (``xla_wheels.release.host_document``
from the manifest, ``wheels.lock`` and ``build/lanes.toml``) and publishes it beside the
wheels; a host that has never seen the repository fetches it, checks its sha256 and judges
its environment against it (``xla-host doctor|gate --lane ... --bundle ...``).

One JSON object, canonical (sorted keys, no spaces, UTF-8, a final newline), keys::

    format          "1"
    bundle, lane    the bundle's name, the lane that published this document
    python          "3.11": the interpreter the wheels are built for
    wheels          [{name, size, sha256}]: the bundle's locked wheels (wheels.lock)
    runtime-wheels  [{project, version, name, sha256}]: the public wheels installed beside
                    them (libtpu, jax, ...) as ``make requirements`` resolved them
    runtime         {name: {version, minimum, preferred}}: the manifest's runtime pins
    profiles        {name: {group: {VARIABLE: value}}}: the launch profiles (their digest
                    is :attr:`xla_host.launch_profile.LaunchProfile.sha256`)
    policy          the lane's promotion policy, as data ({} for none)
    host-wheel      {name, size, sha256}: the host package's wheel the lane serves beside
                    the bundle (absent when none was built), pinned by hash as the
                    lane's requirements file pins it

In a static lane the document lives at ``bundles/<bundle>.json`` beside the wheels, listed
in ``bundles/index.html`` with a PEP 503 ``#sha256=`` fragment. A package index (pypiserver,
devpi, any PEP 503 index that takes uploads) serves packages only, so there the document
travels inside a *document wheel* (:func:`document_wheel`): project
``xla-wheels-document-<bundle>``, version ``<serial>+sha256.<first 16 hex digits of the
document's sha256>``, the document at ``<dist-info>/bundle-document.json``, built byte for
byte the same from the same document. The index lists it on the project's simple page with
its ``#sha256=``, as every wheel; the host picks the file whose label is the
``--bundle-sha256`` it was given, else the highest serial (the last one published), and
checks the wheel's hash, then the document's (docs/lanes.md "The bundle document on a
package index").

The trust chain (docs/on-a-tpu-host.md): the host's own code is the host wheel, installed
by hash from the lane's requirements file; the document is then accepted only with the
sha256 the operator gives (``--bundle-sha256``, as ``make publish`` printed it on the
builder) or, without one, the one the lane's index lists (which guards against a
truncated or swapped file on a mirror, not against a compromised index). The document's
wheel hashes are what the host compares its installed files with, and the receipt records
the document's digest, so promotion can tell which document the receipt was judged under.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import io
import json
import re
import urllib.error
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, overload

from xla_host.cache_contract import directory_name
from xla_host.errors import PipelineError, UsageError
from xla_host.filemode import file_sha256, open_shared
from xla_host.lane_address import LaneAddress, address_of
from xla_host.launch_profile import LaunchProfile
from xla_host.net import DEFAULT_NETWORK, NetworkPolicy, NotThere, get
from xla_host.tables import MAX_FILE_BYTES, Field, Table, loads_json, read_regular
from xla_host.values import NAME_PATTERN
from xla_host.wheel_filename import normalize, parse_wheel_name

FORMAT = "1"
DIRNAME = "bundles"
INDEX_PAGE = "index.html"
_SHA256 = re.compile(r"[0-9a-f]{64}")


class DocumentError(UsageError):
    """A bundle document that is malformed, of an unknown format, or not the one the hash
    says: the host cannot judge against it (exit 2)."""


@dataclass(frozen=True)
class LockedFile:
    """One wheel file of the document: the lock's row (``installed.WheelRecord``)."""

    name: str
    sha256: str
    size: int | None = None
    """Known for the bundle's own wheels; the index does not give it for runtime wheels."""

    @property
    def project(self) -> str:
        return parse_wheel_name(self.name).normalized

    @property
    def version(self) -> str:
        return parse_wheel_name(self.name).version


@dataclass(frozen=True)
class RuntimePin:
    version: str | None = None
    minimum: str | None = None
    preferred: str | None = None

    @property
    def install_version(self) -> str:
        """The one version a host installs (the exact pin, else the preferred one): the
        builder's ``xla_wheels.bundle.RuntimePin.install_version``, the same rule."""
        return self.version or self.preferred or self.minimum or ""


@dataclass(frozen=True)
class BundleDocument:
    bundle: str
    lane: str
    python: str
    wheels: tuple[LockedFile, ...]
    runtime_wheels: tuple[LockedFile, ...] = ()
    runtime: Mapping[str, RuntimePin] = field(default_factory=dict)
    profiles: Mapping[str, LaunchProfile] = field(default_factory=dict)
    policy: Mapping[str, Any] = field(default_factory=dict)
    host_wheel: LockedFile | None = None
    packs: str | None = None
    """Where the lane keeps its cache packs when that is not the lane itself (lanes.toml's
    ``packs = "gs://bucket/prefix"`` or a directory): hosts find the pack index there."""

    @property
    def pins(self) -> dict[str, str]:
        """normalized project -> the exact version a host must have installed.

        Exact pins only, compared as normalized strings: a training host's environment has
        no ``packaging`` (the stock torch environment does not ship it, and the host side
        adds nothing to it), and the locked and resolved files are exact versions anyway.
        """
        pins = {w.project: w.version for w in self.runtime_wheels}
        pins.update({w.project: w.version for w in self.wheels})
        for name, pin in self.runtime.items():
            if pin.version is not None:
                pins.setdefault(normalize(name), pin.version)
        return dict(sorted(pins.items()))

    def build_directory(self) -> str:
        """``{build}`` of a profile's cache path: the cache contract's directory name for
        the document's torch_xla wheel and the libtpu version hosts install."""
        version = next((w.version for w in self.wheels if w.project == "torch-xla"), None)
        if version is None:
            raise DocumentError(
                f"the bundle document of {self.bundle} lists no torch_xla wheel, and the "
                "profile's cache path names the build ({build})",
                fix="launch with a profile whose cache path does not use {build}",
            )
        libtpu = self.runtime.get("libtpu")
        return directory_name(self.bundle, version, libtpu.install_version if libtpu else None)

    def as_json(self) -> dict[str, Any]:
        def files(rows: tuple[LockedFile, ...], with_size: bool) -> list[dict[str, Any]]:
            out = []
            for row in sorted(rows, key=lambda r: r.name):
                entry: dict[str, Any] = {"name": row.name, "sha256": row.sha256}
                if with_size:
                    entry["size"] = row.size
                else:
                    entry.update(project=row.project, version=row.version)
                out.append(entry)
            return out

        return (
            {
                "format": FORMAT,
                "bundle": self.bundle,
                "lane": self.lane,
                "python": self.python,
                "wheels": files(self.wheels, True),
                "runtime-wheels": files(self.runtime_wheels, False),
                "runtime": {
                    name: {k: v for k, v in vars(pin).items() if v is not None}
                    for name, pin in sorted(self.runtime.items())
                },
                "profiles": {
                    name: {g: dict(sorted(v.items())) for g, v in sorted(p.groups.items())}
                    for name, p in sorted(self.profiles.items())
                },
                "policy": dict(self.policy),
            }
            | ({"host-wheel": files((self.host_wheel,), True)[0]} if self.host_wheel else {})
            | ({"packs": self.packs} if self.packs else {})
        )


def dumps(document: BundleDocument) -> bytes:
    """The canonical bytes: the same document always has the same sha256."""
    text = json.dumps(document.as_json(), sort_keys=True, separators=(",", ":"))
    return (text + "\n").encode("utf-8")


def sha256_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def _error(message: str, *, fix: str | None = None) -> DocumentError:
    return DocumentError(message, fix=fix)


_FIX = "publish the bundle into the lane again (make publish-lane), or pass the lane's document"


def loads(raw: bytes, source: str) -> BundleDocument:
    """Parse and check a document; every problem names ``source`` and the field (exit 2)."""
    try:
        data = loads_json(raw, source=source, error=_error, fix=_FIX)
    except ValueError as error:
        raise DocumentError(f"{source}: not a JSON bundle document ({error})", fix=_FIX) from None
    if not isinstance(data, dict):
        raise DocumentError(f"{source}: not a JSON object", fix=_FIX)
    table = Table(data, source=source, error=_error)
    version = table.get("format", str, required=True)
    if version != FORMAT:
        raise DocumentError(
            f"{source}: key 'format': {version!r} is not a format this host side reads "
            f"(it reads {FORMAT!r})",
            fix="install the host package from the same lane as the document, by hash: "
            "pip install --require-hashes --no-deps --index-url <lane>/simple/ "
            "-r <lane>/host-requirements.txt",
        )
    fields = table.read(
        Field("format", str, required=True),
        Field("bundle", str, required=True),
        Field("lane", str, required=True),
        Field("python", str, required=True),
        Field("wheels", list, required=True),
        Field("runtime-wheels", list, default=[]),
        Field("runtime", dict, default={}),
        Field("profiles", dict, default={}),
        Field("policy", dict, default={}),
        Field("host-wheel", dict),
        Field("packs", str),
    )
    for key in ("bundle", "lane"):
        if not NAME_PATTERN.fullmatch(fields[key]):
            raise table.fail(key, f"{fields[key]!r} is not a name", _FIX)
    wheels = tuple(_file(row, sized=True) for row in table.rows("wheels") or ())
    if not wheels:
        raise table.fail("wheels", "no wheels: a document of an unbuilt bundle", _FIX)
    runtime_wheels = tuple(_file(row, sized=False) for row in table.rows("runtime-wheels") or ())
    pin_fields = (Field("version", str), Field("minimum", str), Field("preferred", str))
    runtime = {
        name: RuntimePin(**pin.read(*pin_fields)) for name, pin in table.tables("runtime").items()
    }
    profiles = {
        name: LaunchProfile(name, _groups(groups))
        for name, groups in table.tables("profiles").items()
    }
    return BundleDocument(
        bundle=fields["bundle"],
        lane=fields["lane"],
        python=fields["python"],
        wheels=wheels,
        runtime_wheels=runtime_wheels,
        runtime=runtime,
        profiles=profiles,
        policy=fields["policy"],
        host_wheel=_file(table.table("host-wheel"), sized=True) if fields["host-wheel"] else None,
        packs=fields["packs"],
    )


def _groups(profile: Table) -> dict[str, dict[str, str]]:
    """A profile's groups as published (the builder validated them when it parsed the
    manifest; here each value must still be a string)."""
    groups = {str(group): profile.table(str(group)) for group in profile.data}
    return {
        group: {str(k): variables.get(str(k), str, required=True) for k in variables.data}
        for group, variables in groups.items()
    }


def _file(row: Table, *, sized: bool) -> LockedFile:
    if sized:
        fields = row.read(
            Field("name", str, required=True),
            Field("sha256", str, required=True),
            Field("size", int, required=True),
        )
    else:
        fields = row.read(
            Field("name", str, required=True),
            Field("sha256", str, required=True),
            Field("project", str, required=True),
            Field("version", str, required=True),
        )
    if not _SHA256.fullmatch(fields["sha256"]):
        raise row.fail("sha256", f"{fields['sha256']!r} is not a sha256 (64 hex digits)", _FIX)
    try:
        parse_wheel_name(fields["name"])
    except ValueError as error:
        raise row.fail("name", str(error), _FIX) from None
    return LockedFile(fields["name"], fields["sha256"], fields.get("size"))


# --- where a document is, and how a host gets it --------------------------------------


def lane_path(lane_dir: Path, bundle: str) -> Path:
    """Where a static lane directory keeps ``bundle``'s document."""
    return lane_dir / DIRNAME / f"{bundle}.json"


def index_page(documents: Mapping[str, str]) -> str:
    """``bundles/index.html``: a PEP 503-style page of links ``<bundle>.json#sha256=...``."""
    links = "\n".join(
        f'    <a href="{urllib.parse.quote(name)}.json#sha256={digest}">{name}.json</a><br/>'
        for name, digest in sorted(documents.items())
    )
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n    <title>Bundle documents</title>\n"
        f"  </head>\n  <body>\n{links}\n  </body>\n</html>\n"
    )


def listed_sha256(page: str, bundle: str) -> str | None:
    """The ``#sha256=`` of ``bundle``'s link on an index page (None: not listed)."""
    name = re.escape(urllib.parse.quote(bundle))
    found = re.search(rf'href="(?:[^"]*/)?{name}\.json#sha256=([0-9a-f]{{64}})"', page)
    return found.group(1) if found else None


#: A document wheel's project is this prefix and the bundle's name (PEP 503-normalized).
DOCUMENT_PROJECT_PREFIX = "xla-wheels-document-"
DOCUMENT_MEMBER = "bundle-document.json"
#: The version's local label carries this many hex digits of the document's sha256: enough
#: to pick the file for a ``--bundle-sha256`` (the whole digest is checked after).
LABEL_DIGITS = 16
#: Every member's time: the same document always makes the same wheel bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def document_project(bundle: str) -> str:
    """The PEP 503 project a package index keeps ``bundle``'s document wheels under."""
    return normalize(DOCUMENT_PROJECT_PREFIX + bundle).strip("-")


def _distribution(bundle: str) -> str:
    return document_project(bundle).replace("-", "_")


def _document_wheel_name(bundle: str, serial: int, digest: str) -> str:
    return f"{_distribution(bundle)}-{serial}+sha256.{digest[:LABEL_DIGITS]}-py3-none-any.whl"


def document_wheel(raw: bytes, serial: int) -> tuple[str, bytes]:
    """The document wheel of the canonical document ``raw``: (file name, bytes).

    Stored uncompressed with fixed times and modes, so the bytes depend on ``raw`` and
    ``serial`` only (a lane refuses other bytes under a name it holds). pip could install
    it (an empty package: dist-info only), but it is there to be read, not installed."""
    document = loads(raw, "the bundle document")
    name = _document_wheel_name(document.bundle, serial, sha256_of(raw))
    dist, version = name.split("-")[:2]
    info = f"{dist}-{version}.dist-info"
    members = {
        f"{info}/{DOCUMENT_MEMBER}": raw,
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {document_project(document.bundle)}\n"
            f"Version: {version}\nSummary: the bundle document of {document.bundle} (lane "
            f"{document.lane}), read by the xla-wheels host package\n"
        ).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: xla-wheels\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = "".join(
        f"{path},sha256={_record_digest(data)},{len(data)}\n" for path, data in members.items()
    )
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for path, data in members.items():
            member = zipfile.ZipInfo(path, date_time=_ZIP_TIME)
            member.external_attr = 0o644 << 16
            archive.writestr(member, data)
    return name, buffer.getvalue()


def _record_digest(data: bytes) -> str:
    import base64  # only the builder writes a RECORD

    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def document_of_wheel(data: bytes, name: str, source: str) -> bytes:
    """The document a document wheel ``name`` carries (its label must be that document's
    digest: a wheel whose name and content disagree is refused)."""
    found = _DOCUMENT_WHEEL.fullmatch(name)
    if found is None:
        raise DocumentError(f"{source}: {name} is not a document wheel's name", fix=_FIX)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            # Found by its place, not by the name: a file renamed to another document's
            # name is then refused for its content (the digest check below).
            place = f".dist-info/{DOCUMENT_MEMBER}"
            members = [i for i in archive.infolist() if i.filename.endswith(place)]
            if len(members) != 1:
                raise KeyError(f"{len(members)} members */{DOCUMENT_MEMBER}, one expected")
            (info,) = members
            if info.file_size > MAX_FILE_BYTES:
                raise DocumentError(f"{source}: {info.filename} is too large", fix=_FIX)
            raw = archive.read(info)
    except (zipfile.BadZipFile, KeyError) as error:
        raise DocumentError(f"{source}: not a document wheel ({error})", fix=_FIX) from None
    if not sha256_of(raw).startswith(found["label"]):
        raise DocumentError(
            f"{source}: the document inside has sha256 {sha256_of(raw)}, the file name says "
            f"{found['label']}…: not the document that was published",
            fix=_FIX,
        )
    return raw


_DOCUMENT_WHEEL = re.compile(
    rf"(?P<dist>[a-z0-9_]+)-(?P<version>(?P<serial>[0-9]+)\+sha256\."
    rf"(?P<label>[0-9a-f]{{{LABEL_DIGITS}}}))-py3-none-any\.whl"
)


def _links(lane: LaneAddress, page_url: str, page: bytes) -> list[tuple[str, str, str | None]]:
    """(file name, URL, ``#sha256=`` or None) of each link on a PEP 503 project page, the
    lane's credentials kept on links to its own server (:meth:`LaneAddress.linked`)."""
    links = []
    for href in re.findall(r'href="([^"]+)"', page.decode("utf-8", "replace")):
        target, fragment = lane.linked(page_url, html.unescape(href))
        name = urllib.parse.unquote(urllib.parse.urlsplit(target).path.rsplit("/", 1)[-1])
        listed = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", fragment)
        links.append((name, target, listed.group(1).lower() if listed else None))
    return links


def _from_index(
    lane: LaneAddress, bundle: str, sha256: str | None, network: NetworkPolicy, also: str
) -> tuple[bytes, str]:
    """``bundle``'s document from the document wheel a package index serves: (document,
    where). The index vouches for the wheel (its ``#sha256=``, checked here), the wheel's
    name for the document inside (:func:`document_of_wheel`)."""
    page_url = lane.project_page(document_project(bundle))
    page = _get(lane, page_url, network, missing_ok=True)
    shown_page = lane.shown(page_url)
    if page is None:
        raise DocumentError(
            f"the lane serves no document of bundle {bundle}: neither {also} nor "
            f"{shown_page} exists",
            fix="check --lane and --bundle: the bundle must have been published into the lane "
            "(make publish-lane); or pass --bundle-document FILE --bundle-sha256 HEX",
        )
    wanted = _distribution(bundle)
    found = []
    for name, url, listed in _links(lane, page_url, page):
        match = _DOCUMENT_WHEEL.fullmatch(name)
        if match and match["dist"] == wanted:
            found.append((int(match["serial"]), match["label"], name, url, listed))
    if sha256 is not None:
        found = [f for f in found if f[1] == sha256.lower()[:LABEL_DIGITS]]
    if not found:
        raise DocumentError(
            f"{shown_page} lists no document wheel of bundle {bundle}"
            + (f" with sha256 {sha256.lower()}" if sha256 else ""),
            fix="publish the bundle into the lane again (make publish-lane), or pass the "
            "digest `make lanes` shows for the lane's document",
        )
    _, _, name, url, listed = max(found)
    if listed is None and sha256 is None:
        raise DocumentError(
            f"{shown_page} lists {name} without a #sha256=, and no --bundle-sha256 was given",
            fix="pass --bundle-sha256 <the digest `make lanes` shows for the document>",
        )
    data = _get(lane, url, network)
    if listed is not None and sha256_of(data) != listed:
        raise DocumentError(
            f"{lane.shown(url)}: sha256 {sha256_of(data)}, the lane's index says {listed}: "
            "not the file that was published",
            fix="fetch the document from the lane that published it",
        )
    return document_of_wheel(data, name, lane.shown(url)), lane.shown(url)


#: A lane's install lists (the builder's ``publish.requirements`` writes them): the
#: bundle's wheels with the host package, and the host package alone.
INSTALL_LIST = "requirements.txt"
HOST_INSTALL_LIST = "host-requirements.txt"


def install_urls(lane: str | LaneAddress) -> tuple[str, str, str]:
    """A lane's ``simple/`` index and its two install lists as pip reaches them (``-r``
    takes a URL): (simple/, requirements.txt, host-requirements.txt), the lane's
    credentials kept (show them masked); a directory's as ``file:`` URLs."""
    address = address_of(lane)
    if address.directory is not None:
        root = address.directory.absolute().as_uri() + "/"
        return root + "simple/", root + INSTALL_LIST, root + HOST_INSTALL_LIST
    return address.index_url, address.url(INSTALL_LIST), address.url(HOST_INSTALL_LIST)


def install_list(lane: str | LaneAddress, network: NetworkPolicy) -> bytes | None:
    """The lane's ``requirements.txt``; None when it serves none (a package index serves
    packages only: its install list is the builder checkout's)."""
    address = address_of(lane)
    if address.local:
        path = address.path(INSTALL_LIST)
        return _read(path) if path.exists() else None
    if address.package_index:
        return None
    return _get(address, address.url(INSTALL_LIST), network, missing_ok=True)


def _wheel_url(lane: LaneAddress, wheel: LockedFile, network: NetworkPolicy) -> str:
    """Where the index serves ``wheel``: the link of that name on its project page (a
    static lane, pypiserver and devpi each keep their files somewhere else)."""
    page_url = lane.project_page(wheel.project)
    for name, target, _ in _links(lane, page_url, _get(lane, page_url, network)):
        if name == wheel.name:
            return target
    raise DocumentError(
        f"{lane.shown(page_url)} lists no {wheel.name}",
        fix="the lane does not serve a wheel its document lists: publish the bundle into the "
        "lane again (make publish-lane)",
    )


_TIMEOUT_FIX = "check the lane's address and the network, then run the command again"


def _lane_fault(lane: LaneAddress, url: str, what: str) -> PipelineError:
    return DocumentError(
        f"{lane.shown(url)}: {what}",
        fix="check --lane and --bundle: the bundle must have been published into the lane "
        "(or pass --bundle-document FILE --bundle-sha256 HEX, as publish printed them)",
    )


def _fetched(
    lane: LaneAddress, url: str, network: NetworkPolicy, *, size: int | None = None,
    sink: Callable[[], Callable[[bytes], object]] | None = None, missing_ok: bool = False,
) -> bytes:  # fmt: skip
    """One GET through the one network client (:func:`xla_host.net.get`): no answer in
    time is exit 8; a 4xx, or a fault that outlasts the retries, is a
    :class:`DocumentError` naming the URL, masked."""
    return get(
        url, network, refused=lambda what: _lane_fault(lane, url, what),
        timeout_fix=_TIMEOUT_FIX, size=size, write=sink, missing_ok=missing_ok,
        secrets=lane.secrets,
    )  # fmt: skip


@overload
def _get(lane: LaneAddress, url: str, network: NetworkPolicy) -> bytes: ...
@overload
def _get(
    lane: LaneAddress, url: str, network: NetworkPolicy, *, missing_ok: bool
) -> bytes | None: ...


def _get(
    lane: LaneAddress, url: str, network: NetworkPolicy, *, missing_ok: bool = False
) -> bytes | None:
    """A page or document of the lane (standard library only: the host side adds no
    packages), refused when larger than any document; with ``missing_ok``, None for a
    404."""
    try:
        raw = _fetched(lane, url, network, missing_ok=missing_ok)
    except NotThere:
        return None
    if len(raw) > MAX_FILE_BYTES:
        raise DocumentError(f"{lane.shown(url)}: larger than {MAX_FILE_BYTES} bytes", fix=_FIX)
    return raw


def _read(path: Path) -> bytes:
    def error(message: str, *, fix: str | None = None) -> DocumentError:
        return DocumentError(message, fix=fix)

    if not path.exists():
        raise DocumentError(
            f"{path} does not exist",
            fix="check --lane and --bundle: the bundle must have been published into the lane",
        )
    return read_regular(path, error)


def fetch(
    lane: str | LaneAddress, bundle: str, *, sha256: str | None = None,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> tuple[BundleDocument, str]:  # fmt: skip
    """``bundle``'s document from ``lane``, verified: (document, its sha256).

    The sha256 must be ``sha256`` when given, and the one the lane's index lists when it
    lists one; with neither, the document is refused (nothing vouches for it). A lane on a
    package index (no ``bundles/index.html``) gives it in a document wheel, whose
    ``#sha256=`` on the index is what vouches for it (module doc).
    """
    address = address_of(lane)
    page_place = f"{DIRNAME}/{INDEX_PAGE}"
    document_place = f"{DIRNAME}/{bundle}.json"
    if not address.local:
        index_url = address.url(page_place)
        # A static lane's page first (none on devpi's +simple/); a package index keeps the
        # document in a document wheel on its simple page instead.
        page = None if address.package_index else _get(address, index_url, network, missing_ok=True)
        if page is None:
            raw, where = _from_index(address, bundle, sha256, network, address.shown(index_url))
            return _checked_document(raw, where, bundle, sha256=sha256, listed=None)
        url = address.url(document_place)
        raw = _get(address, url, network)
        where = address.shown(url)
    else:
        index = address.path(page_place)
        page = _read(index) if index.exists() else b""
        path = address.path(document_place)
        where = str(path)
        raw = _read(path)
    listed = listed_sha256(page.decode("utf-8", "replace"), bundle)
    if listed is None and sha256 is None:
        raise DocumentError(
            f"the lane's index {page_place} lists no sha256 for {bundle}.json",
            fix="pass --bundle-sha256 <the digest `make lanes` shows for the document>",
        )
    return _checked_document(raw, where, bundle, sha256=sha256, listed=listed)


def _checked_document(
    raw: bytes, where: str, bundle: str, *, sha256: str | None, listed: str | None
) -> tuple[BundleDocument, str]:
    document = verified(raw, where, sha256=sha256, listed=listed)
    if document.bundle != bundle:
        raise DocumentError(
            f"{where}: key 'bundle': {document.bundle!r}, asked for {bundle!r}", fix=_FIX
        )
    return document, sha256_of(raw)


def verified(
    raw: bytes, source: str, *, sha256: str | None = None, listed: str | None = None
) -> BundleDocument:
    """The document of ``raw`` if its sha256 is each expected one (a tampered or swapped
    document is refused before a field of it is read)."""
    actual = sha256_of(raw)
    for expected, said_by in ((sha256, "--bundle-sha256"), (listed, "the lane's index")):
        if expected is not None and expected.lower() != actual:
            raise DocumentError(
                f"{source}: sha256 {actual}, {said_by} says {expected.lower()}: "
                "not the document that was published",
                fix="fetch the document from the lane that published it, or pass the "
                "digest of the document you mean",
            )
    return loads(raw, source)


def read_file(path: Path, *, sha256: str | None) -> tuple[BundleDocument, str]:
    """A document given as a file (``--bundle-document``): (document, its sha256). Its
    sha256 must be given too: a file is vouched for by nothing else."""
    if sha256 is None:
        raise DocumentError(
            f"{path}: a bundle document given as a file needs its sha256",
            fix="pass --bundle-sha256 <the digest `make lanes` shows for the document>",
        )
    raw = _read(path)
    return verified(raw, str(path), sha256=sha256), sha256_of(raw)


def wheel_files(
    lane: str | LaneAddress | None,
    wheels: tuple[LockedFile, ...],
    directory: Path,
    *,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> Path:
    """``directory`` holding each of ``wheels`` with the document's sha256: those already
    there are kept, the rest fetched from ``lane`` (next to its ``simple/`` index; a
    local lane's root) and kept only when the hash holds (by rename: a failed fetch
    leaves nothing half-written).

    Without a lane, the files must be there; a missing or different one is left for the
    installed-files comparison to report (``installed.match_wheel``), not raised here.
    """
    address = None if lane is None else address_of(lane)
    directory.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        target = directory / wheel.name
        if target.is_file() and file_sha256(target) == wheel.sha256:
            continue
        if address is None:
            continue
        if address.local:
            _copy_local(address.path(wheel.name), target, wheel)
        else:
            _download(address, _wheel_url(address, wheel, network), target, wheel, network)
    return directory


@contextlib.contextmanager
def _partial(target: Path) -> Iterator[IO[bytes]]:
    """A file beside ``target`` that becomes it only by :meth:`Path.replace` in the block;
    whatever happens, no partial file is left."""
    partial = target.with_name(f".{target.name}.part")
    try:
        with partial.open("wb") as out:
            yield out
    finally:
        partial.unlink(missing_ok=True)


def _kept(partial: Path, target: Path, digest: str, wheel: LockedFile, where: str) -> None:
    if digest != wheel.sha256:
        raise DocumentError(
            f"{where}: sha256 {digest}, the bundle document has {wheel.sha256}",
            fix="the lane does not serve the locked file: report it to the lane's owners",
        )
    partial.replace(target)


def _copy_local(source: Path, target: Path, wheel: LockedFile) -> None:
    """A local lane's wheel copied into ``target`` (its type checked where it is opened:
    a FIFO is refused, never waited on), kept only when its sha256 is the document's."""
    try:
        with open_shared(source, what="wheel") as data, _partial(target) as out:
            hasher = hashlib.sha256()
            while block := data.read(1 << 20):
                hasher.update(block)
                out.write(block)
            out.close()
            _kept(Path(out.name), target, hasher.hexdigest(), wheel, str(source))
    except FileNotFoundError:
        raise DocumentError(
            f"{source} does not exist",
            fix="the lane does not serve a wheel its document lists: publish the bundle into "
            "the lane again (make publish-lane)",
        ) from None


def _download(
    lane: LaneAddress, url: str, target: Path, wheel: LockedFile, network: NetworkPolicy
) -> None:
    """Stream ``url`` into ``target`` (a wheel may be hundreds of MB), kept only when its
    sha256 is the document's; whatever happens, no partial file is left. Each read waits
    at most the idle timeout, the whole file its size at the slowest allowed rate."""
    hashers: list[Any] = []
    with _partial(target) as out:

        def fresh() -> Callable[[bytes], object]:
            out.seek(0)
            out.truncate()
            hasher = hashlib.sha256()
            hashers[:] = [hasher]

            def write(block: bytes) -> None:
                hasher.update(block)
                out.write(block)

            return write

        _fetched(lane, url, network, size=wheel.size or 0, sink=fresh)
        out.close()
        _kept(Path(out.name), target, hashers[0].hexdigest(), wheel, lane.shown(url))
