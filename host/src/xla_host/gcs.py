"""The one Cloud Storage client: objects under ``gs://bucket/prefix``, for the receipt
store (:mod:`xla_host.receipt_store`) and the pack store (:mod:`xla_host.lane_packs`,
``xla_wheels.release.pack_store``).

Through Google's own library, google-cloud-storage (the JSON API with generation
preconditions, resumable uploads, streamed downloads, the standard credential chain),
imported only when a ``gs://`` address is used: the host package is standard library
only, and a host without the library gets one ``error:`` naming the pip line
(:data:`PIP_INSTALL`). Credentials come from the library's chain (Application Default
Credentials: ``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default
login``, a VM's service account); ``STORAGE_EMULATOR_HOST`` points it at an emulator.
No token, key file content or header is ever put in a message: errors are worded here
from the status and the server's message.

Every call runs under the run's :class:`~xla_host.net.NetworkPolicy`: the library's own
retries are off, each attempt waits at most the idle timeout for each answer (its
``timeout=(connect, read)``) and at most the whole-transfer deadline for the whole call
(for a transfer, the deadline of its size; a download's size may be learnt from its first
bytes: a pack's signed manifest), and a transient fault (HTTP 429 or 5xx, a refused,
reset or cut connection, no answer) is tried again with the policy's backoff
(:func:`xla_host.net.with_retries`). No answer in time on every attempt is
:class:`~xla_host.net.NetworkTimedOut` (exit 8); a denied request (401, 403), a bucket
that does not exist and a fault that outlasts the retries are :class:`ObjectStoreError`
(exit 1).

**Never replaced.** :meth:`Bucket.create` uploads with ``if_generation_match=0``: of two
writers of one name, one creates the object and the other gets :class:`ObjectExists`
(unless its bytes are the very same: then the object is its own, as after a retried
upload whose first answer was lost). The one object that changes, a pack store's index,
is replaced only over the generation it was read at (:meth:`Bucket.replace`), so a
publisher that raced another one is refused, not merged.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from xla_host.errors import PipelineError, UsageError
from xla_host.net import (
    ANSWER_BYTES_ALLOWANCE,
    NetworkPolicy,
    Transient,
    attempts_text,
    settings_fix,
    with_retries,
)
from xla_host.redact import shown

T = TypeVar("T")

SCHEME = "gs"
#: The library version the tests prove (requirements-dev.txt pins the same).
LIBRARY_PIN = "google-cloud-storage==3.17.1"
PIP_INSTALL = f"python -m pip install '{LIBRARY_PIN}'"
#: Where an emulator is named (the library's own variable).
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
_ROLES = (
    "give the account the bucket's roles: roles/storage.objectViewer to read, "
    'roles/storage.objectCreator to add (docs/lanes.md "Receipt and pack stores on '
    'Cloud Storage")'
)


class ObjectStoreError(PipelineError):
    """A bucket refused a request (credentials, permissions, no such bucket) or kept
    failing after the retries: exit 1."""


class ObjectExists(ObjectStoreError):
    """A create-only upload found the name taken by other bytes: nothing was replaced."""


class ObjectChanged(ObjectStoreError):
    """An object replaced over the generation it was read at had changed since."""


class ObjectMissing(Exception):
    """A read of an object that is not there: an answer in itself (the bucket exists)."""


class NoClientLibrary(UsageError):
    """A ``gs://`` address on a machine without google-cloud-storage: exit 2."""


@dataclass(frozen=True)
class Address:
    """``gs://bucket/prefix``: the bucket and the prefix of every name (no ``/`` at
    either end; empty: the bucket's top)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}".rstrip("/")

    def key(self, name: str) -> str:
        """The object name of ``name`` (relative to the prefix)."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def url_of(self, name: str) -> str:
        return f"gs://{self.bucket}/{self.key(name)}"


def is_gs(value: str) -> bool:
    return value.startswith(f"{SCHEME}://")


def parse(value: str, *, fix: str) -> Address:
    """The address of ``gs://bucket[/prefix]``; raises UsageError (``fix``) for another
    form: no bucket, a query, a fragment, credentials, an empty segment."""
    parts = urllib.parse.urlsplit(value)
    if parts.scheme != SCHEME or not parts.netloc:
        raise UsageError(f"{shown(value)} names no bucket (gs://bucket/prefix)", fix=fix)
    if "@" in parts.netloc or ":" in parts.netloc:
        raise UsageError(
            f"{shown(value)}: a gs:// address carries no credentials or port "
            "(credentials come from Application Default Credentials)",
            fix=fix,
        )
    if parts.query or parts.fragment:
        raise UsageError(f"{shown(value)}: a gs:// address has no query or fragment", fix=fix)
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if any(s in ("", ".", "..") for s in segments):
        raise UsageError(f"{shown(value)}: an empty, . or .. segment in its prefix", fix=fix)
    return Address(parts.netloc, "/".join(segments))


def _library() -> Any:
    """google.cloud.storage, or the error naming the pip line."""
    try:
        from google.cloud import storage  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        raise NoClientLibrary(
            "a gs:// address is reached through Google's client library "
            "google-cloud-storage, which this Python does not have",
            fix=f"install it into this environment: {PIP_INSTALL}",
        ) from None
    return storage


@dataclass(frozen=True)
class Stat:
    size: int
    generation: int
    md5: str | None
    """base64 MD5 the server computed (None for a composite object)."""


class _Cancelled(Exception):
    """An attempt that ran past its deadline: its reads and writes stop here."""


class Bucket:
    """The objects under one :class:`Address`, each call under ``network``."""

    def __init__(self, address: Address, network: NetworkPolicy) -> None:
        self.address = address
        self.network = network
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def shown(self) -> str:
        return self.address.url

    # -- the calls ---------------------------------------------------------------------

    def list(self, under: str) -> list[str]:
        """Every name below ``under`` (``<bundle>/``), relative to the prefix, sorted."""
        start = self.address.key(under)

        def call(client: Any, attempt: _Attempt) -> list[str]:
            blobs = client.list_blobs(
                self.address.bucket, prefix=start, timeout=self._timeout, retry=None
            )
            names = [blob.name for blob in blobs]
            attempt.check()
            return names

        cut = len(self.address.prefix) + 1 if self.address.prefix else 0
        return sorted(name[cut:] for name in self._run("list", under, call))

    def read(self, name: str, *, max_bytes: int) -> tuple[bytes, int]:
        """The object ``name``'s bytes and generation; :class:`ObjectMissing` when there is
        none; refused when it is larger than ``max_bytes`` (never held past that)."""

        def call(client: Any, attempt: _Attempt) -> tuple[bytes, int]:
            blob = self._blob(client, name)
            blob.reload(timeout=self._timeout, retry=None)
            if blob.size is not None and int(blob.size) > max_bytes:
                raise ObjectStoreError(
                    f"{self.address.url_of(name)} is {blob.size} bytes, more than the "
                    f"{max_bytes} such an object can be",
                    fix="check what wrote it: the store holds something else under that name",
                )
            sink = _Sink(attempt, max_bytes)
            blob.download_to_file(
                sink, if_generation_match=blob.generation, timeout=self._timeout, retry=None
            )
            return bytes(sink.data), int(blob.generation)

        return self._run("read", name, call, missing=True, size=max_bytes)

    def stat(self, name: str) -> Stat | None:
        """The object's size and generation, or None when it is not there."""

        def call(client: Any, attempt: _Attempt) -> Stat | None:
            blob = client.bucket(self.address.bucket).get_blob(
                self.address.key(name), timeout=self._timeout, retry=None
            )
            if blob is None:
                return None
            return Stat(int(blob.size or 0), int(blob.generation), blob.md5_hash)

        return self._run("stat", name, call, missing=True)

    def download(
        self, name: str, fresh: Callable[[], Callable[[bytes], object]],
        sized: Callable[[], int | None], *, size: int,
    ) -> None:  # fmt: skip
        """Stream the object into what ``fresh()`` returns (each attempt starts again:
        :func:`xla_host.net.rewound`); its deadline is that of ``size`` bytes until
        ``sized()`` tells the whole transfer's size (a pack's signed manifest)."""

        def call(client: Any, attempt: _Attempt) -> None:
            write = fresh()
            blob = self._blob(client, name)
            blob.download_to_file(
                _Sink(attempt, None, write, sized), timeout=self._timeout, retry=None
            )

        self._run("download", name, call, missing=True, size=size, sized=sized)

    def create(self, name: str, data: bytes | IO[bytes], *, size: int | None = None) -> bool:
        """Upload ``data`` (bytes, or a file read from its start) as ``name`` only when
        the name is free (``if_generation_match=0``). True: created; False: the object is
        there with these very bytes (an earlier attempt's, or another writer of the same
        content: a pack is named by its hash). Other bytes there: :class:`ObjectExists`."""
        length = len(data) if isinstance(data, bytes) else int(size or 0)

        def call(client: Any, attempt: _Attempt) -> bool:
            blob = self._blob(client, name)
            source = _Source(attempt, data)
            try:
                blob.upload_from_file(
                    source, size=length, rewind=False, if_generation_match=0,
                    timeout=self._timeout, retry=None, checksum="md5",
                )  # fmt: skip
            except _precondition_failed():
                there = blob.bucket.get_blob(blob.name, timeout=self._timeout, retry=None)
                if there is not None and there.md5_hash == source.md5_b64():
                    return False
                raise ObjectExists(
                    f"{self.address.url_of(name)} is taken by other bytes: a create-only "
                    "upload never replaces an object, and nothing was written",
                    fix="another writer took the name first; publish under another name, or "
                    "remove the object by hand if it is known to be wrong",
                ) from None
            return True

        return self._run("upload", name, call, size=length)

    def replace(self, name: str, data: bytes, *, generation: int | None) -> None:
        """Write ``name`` over the generation it was read at (None: only when it is not
        there yet); :class:`ObjectChanged` when another writer changed it since, unless
        it holds these very bytes now."""

        def call(client: Any, attempt: _Attempt) -> None:
            blob = self._blob(client, name)
            source = _Source(attempt, data)
            try:
                blob.upload_from_file(
                    source, size=len(data), rewind=False, if_generation_match=generation or 0,
                    timeout=self._timeout, retry=None, checksum="md5",
                )  # fmt: skip
            except _precondition_failed():
                there = blob.bucket.get_blob(blob.name, timeout=self._timeout, retry=None)
                if there is not None and there.md5_hash == source.md5_b64():
                    return
                raise ObjectChanged(
                    f"{self.address.url_of(name)} changed since it was read (another "
                    "publisher wrote it): nothing was written",
                    fix="run the command again: it reads the new version first",
                ) from None

        self._run("upload", name, call, size=len(data))

    def delete(self, name: str) -> None:
        """Remove ``name`` (gone already: nothing to do)."""

        def call(client: Any, attempt: _Attempt) -> None:
            self._blob(client, name).delete(timeout=self._timeout, retry=None)

        with contextlib.suppress(ObjectMissing):
            self._run("delete", name, call, missing=True)

    # -- one call under the policy -----------------------------------------------------

    @property
    def _timeout(self) -> tuple[float, float]:
        return (self.network.timeout_s, self.network.timeout_s)

    def _blob(self, client: Any, name: str) -> Any:
        return client.bucket(self.address.bucket).blob(self.address.key(name))

    def _connected(self) -> Any:
        with self._lock:
            if self._client is None:
                storage = _library()
                self._client = storage.Client()
            return self._client

    def _run(
        self, what: str, name: str, call: Callable[[Any, _Attempt], T], *,
        missing: bool = False, size: int | None = None,
        sized: Callable[[], int | None] | None = None,
    ) -> T:  # fmt: skip
        where = self.address.url_of(name)
        step = f"{what} {where}"
        network = self.network

        def attempt(limit: float) -> T:
            def limit_now() -> float:
                known = sized() if sized is not None else None
                return limit if known is None else network.transfer_limit(known)

            return _bounded(lambda a: self._attempt(call, a, where, missing), limit_now)

        def gave_up(fault: Transient, attempts: int) -> PipelineError:
            return ObjectStoreError(
                f"{step}: Cloud Storage {fault.what_happened} ({attempts_text(attempts)})",
                fix="check that the bucket is reachable from this host, then run it again",
            )

        return with_retries(
            step, self.address.bucket, attempt, give_up=gave_up,
            timeout_fix="check that Cloud Storage (or STORAGE_EMULATOR_HOST's server) is "
            f"reachable from this host, or give it longer ({settings_fix()})",
            limit_s=network.transfer_limit(ANSWER_BYTES_ALLOWANCE if size is None else size),
            network=network,
        )  # fmt: skip

    def _attempt(
        self, call: Callable[[Any, _Attempt], T], attempt: _Attempt, where: str, missing: bool
    ) -> T:
        try:
            return call(self._connected(), attempt)
        except (_Cancelled, PipelineError, Transient, ObjectMissing):
            raise
        except Exception as error:
            raise self._fault(error, where, missing) from None

    def _fault(self, error: Exception, where: str, missing: bool) -> Exception:
        """The library's exception as this module's (the module doc): transient, refused
        or missing; never its text beyond the status and the server's message."""
        code = getattr(error, "code", None)
        kind = type(error).__name__
        module = type(error).__module__
        message = _server_message(error) or kind
        if isinstance(code, int):
            if code in (401, 403):
                return ObjectStoreError(
                    f"{where}: Cloud Storage denied the request (HTTP {code}: {message})",
                    fix=f"check the credentials (Application Default Credentials, "
                    f"GOOGLE_APPLICATION_CREDENTIALS) and {_ROLES}",
                )
            if code == 404:
                if missing and not self._bucket_missing():
                    return ObjectMissing(where)
                return ObjectStoreError(
                    f"{where}: the bucket {self.address.bucket} does not exist",
                    fix="create it (gcloud storage buckets create gs://"
                    f"{self.address.bucket}) or fix the address in build/lanes.toml",
                )
            if code == 429 or code >= 500:
                return Transient(f"HTTP {code}", message)
            return ObjectStoreError(
                f"{where}: Cloud Storage answered HTTP {code} ({message})",
                fix="check the address and the account's roles on the bucket",
            )
        if module.startswith("google.auth"):
            return ObjectStoreError(
                f"{where}: no usable credentials for Cloud Storage ({kind})",
                fix="log in with `gcloud auth application-default login`, or set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or run "
                "on a VM whose service account has the bucket's roles",
            )
        if kind == "DataCorruption":
            return ObjectStoreError(
                f"{where}: the bytes received are not the object's (its checksum differs)",
                fix="run it again; if it persists, the object or the network is at fault",
            )
        text = shown(str(error))
        if "Timeout" in kind or "timed out" in text.lower():
            return Transient("timed out", kind, after_s=self.network.timeout_s)
        if "refused" in text.lower():
            return Transient("refused", kind)
        if kind in ("ChunkedEncodingError", "IncompleteRead", "ProtocolError"):
            return Transient("cut", kind)
        if kind in ("ConnectionError", "ConnectionResetError", "RemoteDisconnected"):
            return Transient("reset", kind)
        return ObjectStoreError(
            f"{where}: cannot reach Cloud Storage ({kind})",
            fix="check the address and the network (or STORAGE_EMULATOR_HOST)",
        )

    def _bucket_missing(self) -> bool:
        """Whether the bucket itself is absent (a 404 on a list), read with the
        objects.list permission a reader has (buckets.get is not a reader's)."""
        try:
            client = self._connected()
            iterator = client.list_blobs(
                self.address.bucket, max_results=1, timeout=self._timeout, retry=None
            )
            list(iterator)
        except Exception as error:
            return getattr(error, "code", None) == 404
        return False


def _server_message(error: Exception) -> str:
    """What the server said (the JSON API's ``error.message``), without the request line
    the library puts before it: the status's reason, never a header."""
    import json
    import re

    errors = getattr(error, "errors", None) or []
    if errors and isinstance(errors[0], dict) and errors[0].get("message"):
        return shown(str(errors[0]["message"]))
    text = str(getattr(error, "message", "") or "")
    text = re.sub(r"^[A-Z]+ \S+: ", "", text.splitlines()[0] if text else "")
    text = text.split(": ('Request failed", 1)[0]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        text = str(json.loads(text)["error"]["message"])
    return shown(text[:300])


def _precondition_failed() -> type[BaseException]:
    from google.api_core import exceptions

    return exceptions.PreconditionFailed


class _Attempt:
    """One attempt's cancellation: set when its deadline passes; its reads and writes
    (:class:`_Sink`, :class:`_Source`) then stop it."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def check(self) -> None:
        if self.cancelled.is_set():
            raise _Cancelled


def _bounded(run: Callable[[_Attempt], T], limit_now: Callable[[], float]) -> T:
    """``run(attempt)`` in a thread, for at most ``limit_now()`` seconds (asked again while
    it runs: a transfer's size can become known): past it, the attempt is cancelled (its
    next read or write stops it; a wait inside the library ends at the idle timeout) and
    the caller sees a timeout."""
    attempt = _Attempt()
    outcome: list[tuple[bool, Any]] = []

    def body() -> None:
        try:
            outcome.append((True, run(attempt)))
        except BaseException as error:
            outcome.append((False, error))

    started = time.monotonic()
    thread = threading.Thread(target=body, name="xla-host gcs call", daemon=True)
    thread.start()
    while thread.is_alive():
        limit = limit_now()
        thread.join(max(0.0, min(0.2, started + limit - time.monotonic())))
        if thread.is_alive() and time.monotonic() - started >= limit:
            attempt.cancelled.set()
            raise Transient("timed out", f"not finished after {limit:g}s", after_s=limit,
                            unfinished=True)  # fmt: skip
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return, unused-ignore]
    if isinstance(value, _Cancelled):
        raise Transient("timed out", "cancelled at its deadline", unfinished=True)
    raise value


class _Sink:
    """The file-like the library downloads into: bounded, cancellable, passed on."""

    def __init__(
        self, attempt: _Attempt, max_bytes: int | None,
        write: Callable[[bytes], object] | None = None,
        sized: Callable[[], int | None] | None = None,
    ) -> None:  # fmt: skip
        self._attempt, self._max, self._write, self._sized = attempt, max_bytes, write, sized
        self.data = bytearray()
        self.received = 0

    def write(self, chunk: bytes) -> int:
        self._attempt.check()
        self.received += len(chunk)
        if self._max is not None and self.received > self._max:
            raise ObjectStoreError(
                f"an object is larger than the {self._max} bytes it can be",
                fix="check what wrote it: the store holds something else under that name",
            )
        if self._write is not None:
            self._write(chunk)
        else:
            self.data += chunk
        return len(chunk)

    def flush(self) -> None:
        return None


class _Source:
    """The file-like the library uploads from: cancellable, its MD5 computed as read."""

    def __init__(self, attempt: _Attempt, data: bytes | IO[bytes]) -> None:
        self._attempt = attempt
        self._md5 = hashlib.md5(usedforsecurity=False)
        if isinstance(data, bytes):
            import io

            self._handle: IO[bytes] = io.BytesIO(data)
            self._md5.update(data)
        else:
            # Hashed whole before the upload: a refused upload stops before its end, and
            # what is there is compared with all of these bytes.
            data.seek(0)
            while chunk := data.read(1 << 20):
                self._md5.update(chunk)
            data.seek(0)
            self._handle = data

    def read(self, size: int = -1) -> bytes:
        self._attempt.check()
        return self._handle.read(size)

    def tell(self) -> int:
        return self._handle.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def md5_b64(self) -> str:
        import base64

        return base64.b64encode(self._md5.digest()).decode()


def bucket_at(value: str, network: NetworkPolicy, *, fix: str) -> Bucket:
    """The bucket of the ``gs://`` address ``value`` (parsed, not yet reached)."""
    return Bucket(parse(value, fix=fix), network)
