"""Receipt stores: where a lane's receipts are kept, so a receipt comes home without git.

A lane names its store in ``build/lanes.toml`` (``receipts = …``) and the gate uploads the
receipt it writes there; ``make promote``, ``make compare`` and ``make status`` read a
bundle's receipts from every lane's store as well as from ``receipts/<bundle>/``. Layout:
``<store>/<bundle>/<receipt file>`` (the file name of :func:`receipts.receipt_file_name`).
A receipt is never replaced: an upload under a name that is taken goes to ``-2``, ``-3``…

Three kinds of store (:data:`STORE_KINDS`), chosen by the URL's scheme:

- a directory (a path; relative to the checkout in lanes.toml): written by rename, and
  linked into place so a second writer can never replace a receipt;
- ``http(s)://…``: a WebDAV collection (MKCOL for the bundle's collection, PUT with
  ``If-None-Match: *``, PROPFIND ``Depth: 1`` to list, GET), through the one network
  client (:mod:`xla_host.net`: the idle timeout and whole-request deadline of the run's
  network policy, transient faults retried, a PUT only when the server never saw it);
  basic-auth credentials from ``XLA_WHEELS_RECEIPTS_USERNAME`` and
  ``XLA_WHEELS_RECEIPTS_PASSWORD`` (never in the URL, never shown: ``redact``);
- ``gs://bucket/prefix``: objects ``<prefix>/<bundle>/<file>`` of a Cloud Storage bucket,
  through the one client (:mod:`xla_host.gcs`: google-cloud-storage, imported only here,
  under the same network policy; uploads create-only, ``if_generation_match=0``).

Adding a kind is one subclass of :class:`ReceiptStore` (its schemes, its form, how a
location of it is checked and opened, and the store's requests) and its place in
:data:`STORE_KINDS`; docs/lanes.md "Receipt stores" describes it.

Errors name the store and a fix: a malformed URL is bad input (exit 2), a store that does
not answer in time or cannot be reached exit 8, one that refuses (credentials,
permissions, a bucket that does not exist) or keeps failing (HTTP 5xx after the retries)
exit 1. Standard library only (a gs:// store imports its client library when used): the
gate runs this on a TPU host.
"""

from __future__ import annotations

import base64
import builtins
import os
import re
import secrets
import tempfile
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from xla_host import filemode, gcs, log, receipt_signing
from xla_host.errors import ExitCode, PipelineError, UsageError
from xla_host.filemode import current_umask
from xla_host.net import (
    ANSWER_BYTES_ALLOWANCE,
    DEFAULT_NETWORK,
    Failures,
    NetworkPolicy,
    Transient,
    http_request,
    new_request,
    settings_fix,
)
from xla_host.receipts import (
    Receipt,
    StoredReceipt,
    parse_receipt,
    read_receipt,
    receipt_file_name,
    render,
)
from xla_host.redact import shown

USERNAME_ENV = "XLA_WHEELS_RECEIPTS_USERNAME"
PASSWORD_ENV = "XLA_WHEELS_RECEIPTS_PASSWORD"
MAX_RECEIPT_BYTES = 16 * 1024**2
"""A receipt is a few kilobytes; a server that sends more is not a receipt store."""
_BUNDLE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_FILE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\.json")


class StoreError(PipelineError):
    """A receipt store refused a request (credentials, permissions, a server error): exit 1."""


class StoreTimedOut(StoreError):
    """A receipt store did not answer within its time limit, or could not be reached: exit 8."""

    exit_code = ExitCode.TIMED_OUT


def check_bundle(bundle: str | None) -> str:
    if bundle is None or not _BUNDLE.fullmatch(bundle):
        raise UsageError(
            f"a receipt store keeps receipts per bundle, and {bundle!r} is not a bundle name",
            fix="run the gate with the bundle whose locked wheels it judges (BUNDLE=)",
        )
    return bundle


def _split(name: str) -> tuple[str, str]:
    bundle, _, file = name.partition("/")
    if not _BUNDLE.fullmatch(bundle) or not _FILE.fullmatch(file):
        raise UsageError(
            f"{name!r} is not a receipt's name in a store (<bundle>/<file>.json)",
            fix="use a name the store's listing gives",
        )
    return bundle, file


def _numbered(file: str, n: int) -> str:
    stem = file[: -len(".json")]
    return file if n == 1 else f"{stem}-{n}.json"


class ReceiptStore:
    """``put`` a receipt, ``list`` a bundle's receipt names, ``get`` one by name.

    A kind of store is a subclass in :data:`STORE_KINDS`: the URL ``schemes`` it is chosen
    by (none: a directory, the kind of any location without one), its ``form`` as the
    fix of a bad location shows it, :meth:`checked` (a location as kept, bad input
    refused) and :meth:`opened` (the store at a checked location)."""

    schemes: ClassVar[tuple[str, ...]] = ()
    form: ClassVar[str]

    @classmethod
    def checked(cls, value: str, root: Path | None) -> str:
        """``value`` as kept (``root``: the checkout, for a relative path); raises
        UsageError naming what is wrong with it."""
        raise NotImplementedError

    @classmethod
    def opened(
        cls, location: str, environ: Mapping[str, str], network: NetworkPolicy
    ) -> ReceiptStore:
        """The store at ``location`` (as :meth:`checked` keeps it); ``environ``: where
        its credentials are; ``network``: its requests' limits."""
        raise NotImplementedError

    @property
    def location(self) -> str:
        """The store as written in lanes.toml or on the command line (no credentials)."""
        raise NotImplementedError

    @property
    def shown(self) -> str:
        return shown(self.location)

    def put(self, receipt: Receipt, *, sign_key: Path | None = None) -> str:
        """Upload ``receipt`` (signed with ``sign_key`` when given); returns its name."""
        data = render(receipt).encode()
        if sign_key is not None:
            data = receipt_signing.sign(data, sign_key)
        return self.put_bytes(check_bundle(receipt.bundle), receipt_file_name(receipt), data)

    def put_bytes(self, bundle: str, file: str, data: bytes) -> str:
        raise NotImplementedError

    def list(self, bundle: str) -> list[str]:
        raise NotImplementedError

    def get(self, name: str) -> bytes:
        raise NotImplementedError

    def url_of(self, name: str) -> str:
        return f"{self.location.rstrip('/')}/{name}"

    def check_writable(self, bundle: str) -> None:
        """Prove, before a gate run, what uploading a receipt of ``bundle`` will need:
        the store answers, accepts the credentials and allows writes. Raises what
        ``put_bytes`` would raise; leaves no receipt behind. The base proves nothing
        before the upload."""

    def receipts(self, bundle: str) -> builtins.list[StoredReceipt]:
        """Every receipt of ``bundle`` in this store, read and parsed (seal not judged)."""
        return [
            parse_receipt(self.get(name), Path(name), origin=shown(self.url_of(name)))
            for name in self.list(check_bundle(bundle))
        ]


@dataclass
class DirectoryStore(ReceiptStore):
    root: Path

    form = '"<directory>"'

    @classmethod
    def checked(cls, value: str, root: Path | None) -> str:
        path = Path(value).expanduser()
        return str(path if path.is_absolute() or root is None else (root / path).resolve())

    @classmethod
    def opened(
        cls, location: str, environ: Mapping[str, str], network: NetworkPolicy
    ) -> ReceiptStore:
        return cls(Path(location))

    @property
    def location(self) -> str:
        return str(self.root)

    def put_bytes(self, bundle: str, file: str, data: bytes) -> str:
        directory = self.root / bundle
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=directory, prefix=".receipt.", delete=False
            ) as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            temporary = Path(out.name)
            try:
                os.chmod(temporary, 0o666 & ~current_umask())
                for n in range(1, 1000):
                    candidate = _numbered(file, n)
                    try:
                        # A hard link never replaces: two gates writing at once get two files.
                        os.link(temporary, directory / candidate)
                    except FileExistsError:
                        continue
                    return f"{bundle}/{candidate}"
            finally:
                temporary.unlink(missing_ok=True)
        except OSError as error:
            raise StoreError(
                f"cannot write a receipt into the store {self.shown}: {error.strerror} "
                f"({error.filename})",
                fix="give a directory this user may write, with space left",
            ) from None
        raise StoreError(f"{directory} holds 999 receipts named {file}", fix="clean it up")

    def check_writable(self, bundle: str) -> None:
        # The deepest directory that exists must let this user create what put_bytes
        # creates below it: nothing is written to find out.
        directory = self.root / check_bundle(bundle)
        existing = directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            what = "is not a directory" if not existing.is_dir() else "is not writable"
            raise StoreError(
                f"cannot write a receipt into the store {self.shown}: {existing} {what}",
                fix="give a directory this user may write, with space left",
            )

    def list(self, bundle: str) -> list[str]:
        directory = self.root / check_bundle(bundle)
        return sorted(f"{bundle}/{p.name}" for p in directory.glob("*.json") if p.is_file())

    def get(self, name: str) -> bytes:
        bundle, file = _split(name)
        try:
            # A shared directory: a FIFO or device there is refused, never opened.
            return filemode.read_shared(self.root / bundle / file, what="receipt")
        except OSError as error:
            raise StoreError(
                f"cannot read {name} from the store {self.shown}: {error.strerror}",
                fix="check the store's directory",
            ) from None


@dataclass
class WebDavStore(ReceiptStore):
    base: str
    """The collection's URL, ending in ``/``."""
    username: str | None
    password: str | None
    network: NetworkPolicy = DEFAULT_NETWORK
    """Each request's idle timeout, deadline and retries (the run's ``--net-*`` settings)."""

    schemes = ("http", "https")
    form = '"https://host/path/" (WebDAV)'

    @classmethod
    def checked(cls, value: str, root: Path | None) -> str:
        parts = urllib.parse.urlsplit(value)
        if not parts.hostname:
            raise UsageError(f"{shown(value)} names no host", fix=_forms())
        if parts.username is not None or parts.password is not None:
            raise UsageError(
                f"the receipt store {shown(value)} carries credentials in its URL",
                fix=f"drop them from the URL; set {USERNAME_ENV} and {PASSWORD_ENV} instead",
            )
        if parts.query or parts.fragment:
            raise UsageError(
                f"{shown(value)}: a store's URL has no query or fragment", fix=_forms()
            )
        return value if value.endswith("/") else value + "/"

    @classmethod
    def opened(
        cls, location: str, environ: Mapping[str, str], network: NetworkPolicy
    ) -> ReceiptStore:
        username, password = environ.get(USERNAME_ENV), environ.get(PASSWORD_ENV)
        return cls(location, username or None, password or None, network)

    @property
    def location(self) -> str:
        return self.base

    def _request(
        self, method: str, url: str, *, data: bytes | None = None,
        headers: Mapping[str, str] | None = None, ok: Sequence[int] = (200,),
    ) -> tuple[int, bytes]:  # fmt: skip
        request = new_request(url, data=data, method=method, headers=headers)
        if self.username is not None or self.password is not None:
            token = base64.b64encode(f"{self.username or ''}:{self.password or ''}".encode())
            request.add_unredirected_header("Authorization", f"Basic {token.decode()}")
        where = shown(url)

        def gave_up(fault: Transient, attempts: int) -> PipelineError:
            unreachable = fault.kind in ("refused", "reset", "unreachable", "cut")
            kind = StoreTimedOut if unreachable else StoreError
            return kind(
                f"{method} {where}: the receipt store {fault.what_happened} "
                f"({attempts} attempt(s))",
                fix="check that the store's server is up and reachable from this host, then "
                "run it again" + ("" if unreachable else " (its log names the fault)"),
            )

        failures = Failures(
            answered=lambda answer: None,  # every status is judged below
            unreadable=lambda reason: StoreTimedOut(
                f"{method} {where}: cannot reach the receipt store ({reason})",
                fix="check the store's URL in build/lanes.toml (or --receipts) and that "
                "its server is up and reachable from this host",
            ),
            gave_up=gave_up,
            timeout_fix=f"check that the store's server is up and reachable from this host, "
            f"or give it longer ({settings_fix()})",
        )
        # A PUT is sent again only when the server never saw it (net.SENT_ONCE_METHODS).
        answer = http_request(
            request, self.network, failures, size=len(data or b"") + ANSWER_BYTES_ALLOWANCE,
            secrets=[self.password or ""],
        )  # fmt: skip
        status, body = answer.status, answer.body
        if len(body) > MAX_RECEIPT_BYTES:
            raise StoreError(f"{method} {where}: the answer is larger than any receipt")
        if status in (401, 403):
            given = "with the credentials given" if self.password else "without credentials"
            raise StoreError(
                f"{method} {where}: the receipt store refused the request {given} "
                f"(HTTP {status})",
                fix=f"set {USERNAME_ENV} and {PASSWORD_ENV} to an account of the store that "
                "may read and write receipts",
            )
        if status not in ok:
            raise StoreError(
                f"{method} {where}: the receipt store answered HTTP {status}",
                fix="check the store's URL (a WebDAV collection) and its server's log",
            )
        return status, body

    def _collection(self, bundle: str) -> str:
        return f"{self.base}{urllib.parse.quote(bundle)}/"

    def _make_collection(self, bundle: str) -> str:
        collection = self._collection(bundle)
        # 405: the collection exists; 409: a parent (the store itself) does not yet, and
        # each collection from the server's root down is made in turn.
        status, _ = self._request("MKCOL", collection, ok=(201, 405, 409))
        if status == 409:
            parts = urllib.parse.urlsplit(collection)
            segments = [s for s in parts.path.split("/") if s]
            for depth in range(1, len(segments) + 1):
                path = "/" + "/".join(segments[:depth]) + "/"
                url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
                self._request("MKCOL", url, ok=(201, 405))
        return collection

    def put_bytes(self, bundle: str, file: str, data: bytes) -> str:
        collection = self._make_collection(bundle)
        taken = set(self.list(bundle))
        for n in range(1, 1000):
            candidate = _numbered(file, n)
            if f"{bundle}/{candidate}" in taken:
                continue
            # If-None-Match: * makes the server refuse (412) rather than replace a receipt
            # another gate put there since the listing.
            status, _ = self._request(
                "PUT", collection + urllib.parse.quote(candidate), data=data,
                headers={"If-None-Match": "*", "Content-Type": "application/json"},
                ok=(200, 201, 204, 412),
            )  # fmt: skip
            if status != 412:
                return f"{bundle}/{candidate}"
        raise StoreError(f"{collection} holds 999 receipts named {file}", fix="clean it up")

    def check_writable(self, bundle: str) -> None:
        # The collection as put_bytes makes it, then a file of the check's own (not a
        # receipt: the listing only names *.json) written and deleted: a wrong password, a
        # read-only account or a server that is down shows here, before any child starts.
        collection = self._make_collection(check_bundle(bundle))
        probe = collection + f".write-check-{os.getpid()}-{secrets.token_hex(4)}"
        self._request("PUT", probe, data=b"", ok=(200, 201, 204))
        self._request("DELETE", probe, ok=(200, 204, 404))

    def list(self, bundle: str) -> list[str]:
        collection = self._collection(check_bundle(bundle))
        status, body = self._request("PROPFIND", collection, headers={"Depth": "1"}, ok=(207, 404))
        if status == 404:
            return []
        try:
            tree = ElementTree.fromstring(body)
        except ElementTree.ParseError as error:
            raise StoreError(
                f"PROPFIND {shown(collection)}: the answer is not WebDAV XML ({error})",
                fix="check that the store's URL is a WebDAV collection",
            ) from None
        names = set()
        for href in tree.iter("{DAV:}href"):
            path = urllib.parse.unquote(urllib.parse.urlsplit(href.text or "").path)
            file = path.rstrip("/").rsplit("/", 1)[-1]
            if not path.endswith("/") and _FILE.fullmatch(file):
                names.add(f"{bundle}/{file}")
        return sorted(names)

    def get(self, name: str) -> bytes:
        bundle, file = _split(name)
        return self._request("GET", self._collection(bundle) + urllib.parse.quote(file))[1]


@dataclass
class GcsStore(ReceiptStore):
    prefix: str
    """``gs://bucket/prefix``, without a trailing ``/``."""
    network: NetworkPolicy = DEFAULT_NETWORK
    """Each call's idle timeout, deadline and retries (the run's ``--net-*`` settings)."""

    schemes = ("gs",)
    form = '"gs://bucket/prefix"'

    @classmethod
    def checked(cls, value: str, root: Path | None) -> str:
        return gcs.parse(value, fix=_forms()).url

    @classmethod
    def opened(
        cls, location: str, environ: Mapping[str, str], network: NetworkPolicy
    ) -> ReceiptStore:
        return cls(location, network)

    @property
    def location(self) -> str:
        return self.prefix

    def _bucket(self) -> gcs.Bucket:
        return gcs.bucket_at(self.prefix, self.network, fix=_forms())

    def put_bytes(self, bundle: str, file: str, data: bytes) -> str:
        bucket = self._bucket()
        taken = set(self.list(bundle))
        for n in range(1, 1000):
            candidate = _numbered(file, n)
            if f"{bundle}/{candidate}" in taken:
                continue
            # Create-only (if_generation_match=0): a name another gate took since the
            # listing is refused by the bucket, and the next number is tried.
            try:
                bucket.create(f"{bundle}/{candidate}", data)
            except gcs.ObjectExists:
                continue
            return f"{bundle}/{candidate}"
        raise StoreError(f"{self.prefix}/{bundle} holds 999 receipts named {file}",
                         fix="clean it up")  # fmt: skip

    def check_writable(self, bundle: str) -> None:
        # A listing of the bundle's receipts (which put_bytes makes first): the bucket
        # exists, answers, and the account may read it. Whether it may create objects is
        # proved by the upload itself: a probe object would need a delete permission the
        # gate's account should not have (roles/storage.objectCreator cannot delete).
        self.list(check_bundle(bundle))

    def list(self, bundle: str) -> list[str]:
        names = self._bucket().list(f"{check_bundle(bundle)}/")
        return sorted(n for n in names if _split_ok(n) and n.startswith(f"{bundle}/"))

    def get(self, name: str) -> bytes:
        _split(name)
        try:
            return self._bucket().read(name, max_bytes=MAX_RECEIPT_BYTES)[0]
        except gcs.ObjectMissing:
            raise StoreError(
                f"{self.prefix}/{name} is not in the store", fix="use a name the listing gives"
            ) from None


def _split_ok(name: str) -> bool:
    bundle, _, file = name.partition("/")
    return bool(_BUNDLE.fullmatch(bundle) and _FILE.fullmatch(file))


#: The kinds of receipt store, chosen by the location's URL scheme (:class:`ReceiptStore`):
#: a new kind is its subclass and a place here.
STORE_KINDS: tuple[type[ReceiptStore], ...] = (DirectoryStore, WebDavStore, GcsStore)


def _forms() -> str:
    """The fix of a bad location: every registered kind's form."""
    forms = " | ".join(kind.form for kind in STORE_KINDS)
    return f'receipts = {forms} (docs/lanes.md "Receipt stores")'


def _kind_of(value: str) -> type[ReceiptStore]:
    scheme = urllib.parse.urlsplit(value).scheme
    kind = next((k for k in STORE_KINDS if scheme in k.schemes), None)
    if kind is not None:
        return kind
    if scheme and "://" in value:
        raise UsageError(
            f"{shown(value)}: a receipt store cannot be a {scheme}:// URL", fix=_forms()
        )
    return DirectoryStore  # a path (`C:` or `a:b` included: no `://`)


def parse_location(value: str, root: Path | None = None) -> str:
    """A store's location as kept: a URL checked for its form, or a directory made
    absolute (relative to ``root``, the checkout, when given). Raises UsageError."""
    if not value.strip():
        raise UsageError("a receipt store's location is empty", fix=_forms())
    return _kind_of(value).checked(value, root)


def store_for(
    location: str, *, root: Path | None = None, environ: Mapping[str, str] | None = None,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> ReceiptStore:  # fmt: skip
    """The store at ``location``, of the kind its URL scheme names (:data:`STORE_KINDS`);
    ``network``: the time limits and retries of a network store's requests."""
    where = parse_location(location, root)
    return _kind_of(where).opened(where, os.environ if environ is None else environ, network)


@dataclass(frozen=True)
class Upload:
    """Where a gate sends its receipt (``--receipts``, ``--sign-key``), checked before the
    gate runs so that a typo costs seconds, not a gate run."""

    location: str
    sign_key: Path | None = None
    network: NetworkPolicy = DEFAULT_NETWORK

    @classmethod
    def checked(
        cls,
        location: str,
        sign_key: Path | None,
        bundle: str | None,
        root: Path | None = None,
        *,
        probe: bool = True,
        network: NetworkPolicy = DEFAULT_NETWORK,
    ) -> Upload:
        check_bundle(bundle)
        if sign_key is not None and not sign_key.is_file():
            raise UsageError(
                f"the signing key {sign_key} is not a file",
                fix="give the ed25519 PEM private key the lane's receipt-keys verify",
            )
        upload = cls(parse_location(location, root), sign_key, network)
        if probe:
            upload.store().check_writable(check_bundle(bundle))
        return upload

    def store(self) -> ReceiptStore:
        return store_for(self.location, network=self.network)

    def send(self, receipt_file: Path) -> str:
        """Upload the receipt the gate wrote (signed when a key is given); its URL."""
        stored = read_receipt(receipt_file)
        data = stored.raw
        if self.sign_key is not None:
            data = receipt_signing.sign(data, self.sign_key)
        store = self.store()
        try:
            name = store.put_bytes(
                check_bundle(stored.receipt.bundle), receipt_file_name(stored.receipt), data
            )
        except PipelineError as error:
            error.message += f" (the receipt is kept at {receipt_file})"
            raise
        return shown(store.url_of(name))


def upload_for(
    location: str | None, sign_key: Path | None, bundle: str | None, *, uploads: bool = True,
    network: NetworkPolicy = DEFAULT_NETWORK,
) -> Upload | None:  # fmt: skip
    """The gate's ``--receipts``/``--sign-key``, checked before any child starts (a store
    that cannot be used, or a key that is not one, must not cost a gate run); None
    without them. ``uploads``: this run leaves the receipt (one host, or a slice's worker
    0), so the store itself is proved too; the other workers of a slice upload nothing
    and only have their arguments checked (all of them making the store's collection at
    once is no proof of anything, and a WebDAV server may answer such a race with 500)."""
    if not (location or sign_key):
        return None
    return Upload.checked(
        location or "", sign_key, bundle, Path.cwd(), probe=uploads, network=network
    )


def send_written(upload: Upload | None, written: Path) -> None:
    """Upload the receipt a gate run wrote, when the run was given a store."""
    if upload is not None:
        signed = " (signed)" if upload.sign_key else ""
        log.result(f"receipt: uploaded to {upload.send(written)}{signed}")
