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

In a lane the document lives at ``bundles/<bundle>.json`` beside the wheels, listed in
``bundles/index.html`` with a PEP 503 ``#sha256=`` fragment.

The trust chain (docs/on-a-tpu-host.md): the host's own code is the host wheel, installed
by hash from the lane's requirements file; the document is then accepted only with the
sha256 the operator gives (``--bundle-sha256``, as ``make publish`` printed it on the
builder) or, without one, the one the lane's index lists (which guards against a
truncated or swapped file on a mirror, not against a compromised index). The document's
wheel hashes are what the host compares its installed files with, and the receipt records
the document's digest, so promotion can tell which document the receipt was judged under.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import urllib.error
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_host.cache_contract import directory_name
from xla_host.errors import PipelineError, UsageError
from xla_host.filemode import file_sha256
from xla_host.launch_profile import LaunchProfile
from xla_host.net import (
    ANSWER_BYTES_ALLOWANCE,
    DEFAULT_NETWORK,
    NetworkPolicy,
    Transient,
    host_of,
    read_url,
    settings_fix,
    with_retries,
)
from xla_host.redact import shown
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

        return {
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
            fix="install the host package from the same lane as the document "
            "(pip install --require-hashes -r <lane>/requirements.txt)",
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


def _lane_base(lane: str) -> tuple[str | None, Path | None]:
    """A lane given as a URL (its static root, or its ``simple/`` index) or a directory."""
    if lane.startswith(("http://", "https://", "file://")):
        base = lane.rstrip("/")
        if base.endswith("/simple"):
            base = base[: -len("/simple")]
        if lane.startswith("file://"):
            return None, Path(urllib.parse.unquote(urllib.parse.urlparse(base).path))
        return base + "/", None
    path = Path(lane)
    if path.name == "simple":
        path = path.parent
    return None, path


def _simple_url(lane: str) -> str:
    """The PEP 503 index of a lane given as a URL: itself when it is one (``simple/``,
    devpi's ``+simple/``), else the static lane's ``simple/``."""
    base = lane.rstrip("/")
    if base.rsplit("/", 1)[-1] in ("simple", "+simple"):
        return base + "/"
    return base + "/simple/"


def _wheel_url(simple: str, wheel: LockedFile, network: NetworkPolicy) -> str:
    """Where the index serves ``wheel``: the link of that name on its project page (a
    static lane, pypiserver and devpi each keep their files somewhere else)."""
    page_url = urllib.parse.urljoin(simple, f"{wheel.project}/")
    page = _get(page_url, network).decode("utf-8", "replace")
    for href in re.findall(r'href="([^"]+)"', page):
        target = urllib.parse.urljoin(page_url, html.unescape(href)).split("#", 1)[0]
        name = urllib.parse.unquote(urllib.parse.urlparse(target).path.rsplit("/", 1)[-1])
        if name == wheel.name:
            return target
    raise DocumentError(
        f"{page_url} lists no {wheel.name}",
        fix="the lane does not serve a wheel its document lists: publish the bundle into the "
        "lane again (make publish-lane)",
    )


_TIMEOUT_FIX = "check the lane's address and the network, then run the command again"


def _lane_fault(url: str, what: str) -> PipelineError:
    return DocumentError(
        f"{shown(url)}: {what}",
        fix="check --lane and --bundle: the bundle must have been published into the lane "
        "(a lane on a package index serves no document: pass --bundle-document FILE "
        "--bundle-sha256 HEX, as publish printed them)",
    )


def _fetched(
    url: str, network: NetworkPolicy, *, size: int | None = None,
    sink: Callable[[], Callable[[bytes], object]] | None = None,
) -> bytes:  # fmt: skip
    """One GET through the one network client (:mod:`xla_host.net`): the idle timeout and
    the whole-transfer deadline of ``network``, transient faults tried again, the URL's
    credentials never shown. No answer in time is exit 8; a 4xx, or a fault that outlasts
    the retries, is a :class:`DocumentError` naming the URL. ``sink``: each attempt streams
    into what it returns (a fresh start: an attempt after a cut-off one begins at byte 0)
    instead of into memory; ``size``: the bytes expected, for the deadline."""

    def attempt(limit: float) -> bytes:
        write = sink() if sink is not None else None
        try:
            return read_url(url, limit_s=limit, idle_s=network.timeout_s, write=write)
        except urllib.error.HTTPError as error:
            raise _lane_fault(url, f"the lane answered {error.code} {error.reason}") from None
        except Transient:
            raise
        except OSError as error:  # TLS, an unknown host, not HTTP: retrying cannot help
            reason = getattr(error, "reason", error)
            raise _lane_fault(url, f"cannot read it ({reason})") from None

    def give_up(fault: Transient, attempts: int) -> PipelineError:
        return _lane_fault(url, f"{host_of(url)} {fault.what_happened} ({attempts} attempt(s))")

    return with_retries(
        f"GET {shown(url)}", host_of(url), attempt, give_up=give_up,
        timeout_fix=f"{_TIMEOUT_FIX} (or give it longer: {settings_fix()})",
        limit_s=network.transfer_limit(ANSWER_BYTES_ALLOWANCE if size is None else size),
        network=network,
    )  # fmt: skip


def _get(url: str, network: NetworkPolicy) -> bytes:
    """A page or document of the lane (standard library only: the host side adds no
    packages), refused when larger than any document."""
    raw = _fetched(url, network)
    if len(raw) > MAX_FILE_BYTES:
        raise DocumentError(f"{shown(url)}: larger than {MAX_FILE_BYTES} bytes", fix=_FIX)
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
    lane: str, bundle: str, *, sha256: str | None = None,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> tuple[BundleDocument, str]:  # fmt: skip
    """``bundle``'s document from ``lane``, verified: (document, its sha256).

    The sha256 must be ``sha256`` when given, and the one the lane's index lists when it
    lists one; with neither, the document is refused (nothing vouches for it).
    """
    url_base, directory = _lane_base(lane)
    if url_base is not None:
        page = _get(urllib.parse.urljoin(url_base, f"{DIRNAME}/{INDEX_PAGE}"), network)
        where = urllib.parse.urljoin(url_base, f"{DIRNAME}/{urllib.parse.quote(bundle)}.json")
        raw = _get(where, network)
        where = shown(where)
    else:
        assert directory is not None
        index = directory / DIRNAME / INDEX_PAGE
        page = _read(index) if index.exists() else b""
        path = lane_path(directory, bundle)
        where = str(path)
        raw = _read(path)
    listed = listed_sha256(page.decode("utf-8", "replace"), bundle)
    if listed is None and sha256 is None:
        raise DocumentError(
            f"the lane's index {DIRNAME}/{INDEX_PAGE} lists no sha256 for {bundle}.json",
            fix="pass --bundle-sha256 <the digest `make lanes` shows for the document>",
        )
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
    lane: str | None,
    wheels: tuple[LockedFile, ...],
    directory: Path,
    *,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> Path:
    """``directory`` holding each of ``wheels`` with the document's sha256: those already
    there are kept, the rest fetched from ``lane`` (next to its ``simple/`` index) and kept
    only when the hash holds (by rename: a failed fetch leaves nothing half-written).

    Without a lane, the files must be there; a missing or different one is left for the
    installed-files comparison to report (``installed.match_wheel``), not raised here.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        target = directory / wheel.name
        if target.is_file() and file_sha256(target) == wheel.sha256:
            continue
        if lane is None:
            continue
        url_base, lane_dir = _lane_base(lane)
        if url_base is not None:
            where = _wheel_url(_simple_url(lane), wheel, network)
        else:
            assert lane_dir is not None
            where = (lane_dir / wheel.name).as_uri()
        _download(where, target, wheel, network)
    return directory


def _download(url: str, target: Path, wheel: LockedFile, network: NetworkPolicy) -> None:
    """Stream ``url`` into ``target`` (a wheel may be hundreds of MB), kept only when its
    sha256 is the document's; whatever happens, no partial file is left. Each read waits
    at most the idle timeout, the whole file its size at the slowest allowed rate."""
    partial = target.with_name(f".{target.name}.part")
    hashers: list[Any] = []
    try:
        with partial.open("wb") as out:

            def fresh() -> Callable[[bytes], object]:
                out.seek(0)
                out.truncate()
                hasher = hashlib.sha256()
                hashers[:] = [hasher]

                def write(block: bytes) -> None:
                    hasher.update(block)
                    out.write(block)

                return write

            _fetched(url, network, size=wheel.size or 0, sink=fresh)
        digest = hashers[0].hexdigest()
        if digest != wheel.sha256:
            raise DocumentError(
                f"{shown(url)}: sha256 {digest}, the bundle document has {wheel.sha256}",
                fix="the lane does not serve the locked file: report it to the lane's owners",
            )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
