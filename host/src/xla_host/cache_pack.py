"""Cache packs: the entries a gate's cold run wrote, signed, so a new host starts warm.

A pack is one uncompressed tar file (``<bundle>__<workload>__<topology>__<id>.xlapack.tar``):

- its first member, ``manifest.dsse.json``, is a DSSE envelope signed like a receipt
  (:mod:`xla_host.receipt_signing`, openssl ed25519) whose payload type is
  :data:`PAYLOAD_TYPE` (so a signed receipt can never pass for a pack, nor the reverse).
  Its payload, the manifest, names the bundle, the workload (name, source sha256, params),
  the topology, the device, the torch / torch_xla / libtpu versions, the cache format, the
  digest of the receipt of the gate run that proved the warm restart, and each entry's
  file name, size and sha256;
- then ``entries/<file name>`` for each entry, in the manifest's order.

The manifest comes first so a reader checks the signature and the host before it reads a
byte of an entry: a pack is read as a stream (a local file or a URL), never unpacked
with ``tarfile``'s extractors, and only regular members with the manifest's names and
sizes are taken. A pack at a URL is first fetched whole through the one network client
(:mod:`xla_host.net`: idle timeout, whole-transfer deadline, retries, credentials never
shown) into an anonymous temporary file beside the cache directory, then read the same
way; its deadline and the bytes it may take are its signed manifest's (before the
manifest has arrived: the idle timeout's, :class:`_Spool`), and a full disk there is the
disk-fault error naming the directory. Installing (:func:`install`) is all or nothing:
each entry is streamed into a temporary file in the cache directory while its sha256 is
computed; only when every entry matches its manifest row, and no existing entry of the
same name differs, are they linked into place (a link never replaces a file), after the
install is recorded (``.xla-packs/<id>.json``) and under the install lock a prune takes
too. On any failure the temporary files, the links and the record made so far are
removed: the directory is as it was. A killed install's temporary files are removed by
the next install (:func:`remove_dead_staging`: only a run whose lock nobody holds).

A pack is written by rename and linked into place, never replaced (:func:`write_pack`).
Standard library only: this runs on a TPU host.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from xla_host import cache_keys, gcs, log, receipt_signing, runner
from xla_host.edge import DISK_ERRNOS
from xla_host.errors import DiskError, PipelineError, UsageError
from xla_host.filemode import (
    NotARegularFile,
    as_if_created,
    file_sha256,
    open_shared,
    read_shared,
    write_by_rename,
)
from xla_host.gate.slice.merge import topology as slice_topology_of
from xla_host.net import (
    DEFAULT_NETWORK,
    Failures,
    NetworkPolicy,
    host_of,
    http_request,
    settings_fix,
)
from xla_host.receipts import read_receipt
from xla_host.redact import masked_url, url_secrets
from xla_host.slice import WRITER_LEASE
from xla_host.tables import loads_json

if TYPE_CHECKING:
    from xla_host.gate.run import GateOutcome
    from xla_host.gate.workload import WorkloadSpec

PAYLOAD_TYPE = "application/vnd.xla-wheels.cache-pack+json"
PACK_VERSION = 1
#: What the entries are: torch_xla's PersistentCache, one file per key named by the key's
#: hash, holding a serialized executable. A loader of another format must not take them.
CACHE_FORMAT = "torch_xla-persistent-cache/1"
MANIFEST_MEMBER = "manifest.dsse.json"
ENTRY_PREFIX = "entries/"
SUFFIX = ".xlapack.tar"
MAX_MANIFEST_BYTES = 16 * 1024**2
#: What a tar member may take besides its data: its header, a PAX header for a long name
#: (header and record), the padding of its data to a block.
_MEMBER_OVERHEAD = 4 * tarfile.BLOCKSIZE
#: Where a pack's first member header must have been read by (a PAX header may come
#: first): more bytes without one and it is no tar file.
_HEAD_BYTES = 8 * tarfile.BLOCKSIZE
VERIFY_TIMEOUT_S = 60.0
#: A cache entry's file name as torch_xla writes it (a hash); never a path, never hidden.
_ENTRY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}")
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")
_KEY_FIX = (
    "pass the lane's public key: `openssl pkey -in <private.pem> -pubout -out key.pub.pem`, "
    "then --key key.pub.pem"
)


class PackRefused(PipelineError):
    """A pack failed verification (signature, an entry's sha256) or is not for this host,
    or an existing entry differs: nothing was installed (exit 1)."""


class PackFormatError(UsageError):
    """The file is not a cache pack this version reads (exit 2)."""


@dataclass(frozen=True)
class Entry:
    name: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class Manifest:
    bundle: str | None
    workload: Mapping[str, Any]
    topology: str
    device: str
    torch_version: str
    torch_xla_version: str
    libtpu_version: str | None
    receipt_digest: str | None
    entries: tuple[Entry, ...]
    created: str = ""
    cache_format: str = CACHE_FORMAT
    keys: Mapping[str, Any] | None = None
    """The key components of the entries (``xla_host.cache_explain``): the run's
    components and topology, and each entry's module fingerprint; None: not recorded."""

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.keys is None else {"keys": dict(self.keys)}
        return {
            **extra,
            "pack-version": PACK_VERSION,
            "bundle": self.bundle,
            "workload": dict(self.workload),
            "topology": self.topology,
            "device": self.device,
            "torch": self.torch_version,
            "torch-xla": self.torch_xla_version,
            "libtpu": self.libtpu_version,
            "cache-format": self.cache_format,
            "receipt-digest": self.receipt_digest,
            "created": self.created,
            "entries": [e.to_json() for e in self.entries],
        }

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)


_PACK_FIX = "pass a pack the gate wrote (`xla-host gate ... --pack DIR --pack-key PEM`)"


def _format_error(source: str, problem: str) -> PackFormatError:
    return PackFormatError(f"{source} is not a cache pack: {problem}", fix=_PACK_FIX)


def _text(data: Mapping[str, Any], key: str, source: str) -> str:
    """``data[key]``, a non-empty string: ``str()`` of a null would show as "None" in one
    message and be compared as a version in the next."""
    value = data[key]
    if not isinstance(value, str) or not value:
        shown = json.dumps(value)[:40]
        raise _format_error(source, f"its manifest's {key} is {shown}, not a non-empty string")
    return value


def parse_manifest(payload: bytes, source: str) -> Manifest:
    """The manifest of a verified payload; a malformed one is a :class:`PackFormatError`."""
    try:
        data = loads_json(payload, source=source, error=PackFormatError, fix=_PACK_FIX)
    except (UnicodeDecodeError, ValueError):
        raise _format_error(source, "its manifest is not JSON") from None
    if not isinstance(data, dict) or data.get("pack-version") != PACK_VERSION:
        version = data.get("pack-version") if isinstance(data, dict) else None
        raise _format_error(source, f"pack-version {version!r}, this reader knows {PACK_VERSION}")
    try:
        entries = tuple(
            Entry(str(row["name"]), int(row["size"]), str(row["sha256"])) for row in data["entries"]
        )
        manifest = Manifest(
            bundle=data["bundle"],
            workload=dict(data["workload"]),
            topology=_text(data, "topology", source),
            device=_text(data, "device", source),
            torch_version=_text(data, "torch", source),
            torch_xla_version=_text(data, "torch-xla", source),
            libtpu_version=data["libtpu"],
            receipt_digest=data["receipt-digest"],
            entries=entries,
            created=str(data.get("created", "")),
            cache_format=str(data["cache-format"]),
            keys=dict(data["keys"]) if isinstance(data.get("keys"), dict) else None,
        )
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise _format_error(source, f"its manifest lacks or mistypes {error}") from None
    names = [e.name for e in entries]
    bad = [n for n in names if not _ENTRY_NAME.fullmatch(n) or n == WRITER_LEASE]
    if bad:
        raise _format_error(source, f"its manifest names bad entries {bad[:3]}")
    repeated = sorted(n for n, times in collections.Counter(names).items() if times > 1)
    if repeated:
        raise _format_error(source, f"its manifest lists entries twice: {repeated[:3]}")
    negative = [e.name for e in entries if e.size < 0]
    if negative:
        raise _format_error(source, f"its manifest gives entries a negative size: {negative[:3]}")
    return manifest


# --- signing and verifying ----------------------------------------------------------------


@dataclass(frozen=True)
class PublicKey:
    path: Path
    raw: bytes

    @property
    def keyid(self) -> str:
        return receipt_signing.ed25519_keyid(self.raw)


def read_public_key(path: Path) -> PublicKey:
    """An ed25519 public key in PEM (``openssl pkey -pubout``), checked where it is read."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise UsageError(f"the key {path} cannot be read: {error.strerror}", fix=_KEY_FIX) from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > 64 * 1024:
        raise UsageError(f"the key {path} is not a regular PEM file", fix=_KEY_FIX)
    text = read_shared(path, what="public key", limit=64 * 1024).decode(errors="replace")
    if "PRIVATE KEY" in text:
        # A private key here would mean the host holds what signs packs: refuse, name none of it.
        raise UsageError(
            f"the key {path} is a private key; a host verifies with the public half only",
            fix=_KEY_FIX,
        )
    body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        der = b""
    prefix = receipt_signing._ED25519_SPKI_PREFIX
    if not der.startswith(prefix) or len(der) != len(prefix) + 32:
        raise UsageError(f"the key {path} is not an ed25519 public key in PEM", fix=_KEY_FIX)
    return PublicKey(path, der[len(prefix) :])


def verify_envelope(raw: bytes, keys: Sequence[PublicKey], source: str) -> bytes:
    """The payload of a pack's envelope once a signature by one of ``keys`` verifies
    (openssl ``pkeyutl -verify``); else :class:`PackRefused`."""
    try:
        # Before the signature is checked: anyone may have written it (depth and size bound).
        data = loads_json(raw, source=source, error=PackFormatError, fix=_PACK_FIX)
    except (UnicodeDecodeError, ValueError):
        raise _format_error(source, "its manifest envelope is not JSON") from None
    if not receipt_signing.is_envelope(data):
        raise _format_error(source, "its manifest is not a DSSE envelope")
    if data.get("payloadType") != PAYLOAD_TYPE:
        raise _format_error(source, f"an envelope of {data.get('payloadType')!r}, not a pack's")
    try:
        payload = base64.b64decode(str(data.get("payload", "")), validate=True)
        signatures = [
            (str(s["keyid"]), base64.b64decode(str(s["sig"]), validate=True))
            for s in data["signatures"]
        ]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise PackRefused(
            f"{source}: the manifest's envelope is damaged (payload or signature not base64)",
            fix="fetch the pack again from the lane; never install a damaged one",
        ) from None
    by_id = {key.keyid: key for key in keys}
    matching = [(by_id[keyid], sig) for keyid, sig in signatures if keyid in by_id]
    if not matching:
        ids = ", ".join(keyid[:16] for keyid, _ in signatures) or "none"
        raise PackRefused(
            f"{source} is signed by key id(s) {ids}, none of them a key given with --key",
            fix="pass the lane's public key with --key; a pack signed by another key is "
            "not installed",
        )
    if shutil.which("openssl") is None:
        raise UsageError(
            "verifying a pack needs openssl (3.0 or newer), which is not on PATH",
            fix="install openssl (Debian: apt-get install openssl)",
        )
    message = receipt_signing.pae(PAYLOAD_TYPE, payload)
    with tempfile.TemporaryDirectory(prefix="xla-pack-verify-") as tmp:
        (Path(tmp) / "pae").write_bytes(message)
        for key, sig in matching:
            (Path(tmp) / "sig").write_bytes(sig)
            result = runner.run(
                ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(key.path), "-rawin",
                 "-in", str(Path(tmp) / "pae"), "-sigfile", str(Path(tmp) / "sig")],
                echo="log", timeout=VERIFY_TIMEOUT_S, check=False, step="openssl",
            )  # fmt: skip
            if result.returncode == 0:
                return payload
    raise PackRefused(
        f"{source}: the manifest's signature does not verify with {matching[0][0].path}: the "
        "manifest was changed after it was signed, or signed by another key under this key id",
        fix="fetch the pack again from the lane; never install a pack whose signature fails",
    )


# --- writing ------------------------------------------------------------------------------


def entries_of(cache: Path) -> list[tuple[Entry, Path]]:
    """Every cache entry of ``cache`` (regular files with an entry's name, the writer
    lease and temporary files left out), sorted by name."""
    found = []
    for path in sorted(cache.iterdir()):
        if path.name == WRITER_LEASE or not _ENTRY_NAME.fullmatch(path.name):
            continue
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            continue
        found.append((Entry(path.name, info.st_size, file_sha256(path)), path))
    return found


def pack_name(manifest: Manifest, envelope: bytes) -> str:
    parts = [
        manifest.bundle or "no-bundle",
        str(manifest.workload.get("name", "workload")),
        manifest.topology,
        hashlib.sha256(envelope).hexdigest()[:16],
    ]
    return "__".join(_SAFE.sub("_", p) for p in parts) + SUFFIX


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    # Fixed owner, mode and time: the pack's bytes depend on its content only.
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info


def write_pack(
    directory: Path, cache: Path, sign_key: Path, manifest: Manifest
) -> tuple[Path, Manifest]:
    """Pack ``cache``'s entries into ``directory`` with ``manifest`` (its entries filled in
    here) signed with ``sign_key``; written beside its place, then linked: never replaces."""
    entries = entries_of(cache)
    if not entries:
        raise PackRefused(
            f"the cold run left no cache entry in {cache}: nothing to pack",
            fix="run the gate's restart check on a build whose persistent cache writes",
        )
    created = manifest.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    full = Manifest(**{**manifest.__dict__, "entries": tuple(e for e, _ in entries),
                       "created": created})  # fmt: skip
    payload = (json.dumps(full.to_json(), indent=2, sort_keys=True) + "\n").encode()
    envelope = receipt_signing.sign(payload, sign_key, payload_type=PAYLOAD_TYPE)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / pack_name(full, envelope)
    handle, temporary_name = tempfile.mkstemp(dir=directory, prefix=".xlapack.")
    temporary = Path(temporary_name)
    try:
        with os.fdopen(handle, "wb") as out:
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
                tar.addfile(_tar_info(MANIFEST_MEMBER, len(envelope)), _bytes_reader(envelope))
                for entry, path in entries:
                    with open_shared(path, what="cache entry") as data:
                        tar.addfile(_tar_info(ENTRY_PREFIX + entry.name, entry.size), data)
            out.flush()
            os.fsync(out.fileno())
        as_if_created(temporary)
        try:
            # A link never replaces an existing pack.
            os.link(temporary, final)
        except FileExistsError:
            # The same name is the same signed manifest (its digest is in the name): the
            # same pack, unless its entries differ, which is refused, never replaced.
            if _sha256_of(final) != _sha256_of(temporary):
                raise PackRefused(
                    f"{final} exists with other content: a pack is never replaced",
                    fix="write the pack into another --pack directory",
                ) from None
    finally:
        temporary.unlink(missing_ok=True)
    return final, full


def _bytes_reader(data: bytes) -> IO[bytes]:
    import io

    return io.BytesIO(data)


# --- reading and installing ---------------------------------------------------------------


@dataclass(frozen=True)
class HostFacts:
    """What a pack must match on this host."""

    bundle: str | None
    device: str
    topology: str
    torch_xla_version: str | None
    libtpu_version: str | None


def differences(manifest: Manifest, host: HostFacts) -> list[str]:
    """What differs between the pack and this host, in words; empty: it fits."""
    rows = [
        ("bundle", manifest.bundle, host.bundle),
        ("device", manifest.device, host.device),
        ("topology", manifest.topology, host.topology),
        ("torch_xla version", manifest.torch_xla_version, host.torch_xla_version),
        ("libtpu version (platform)", manifest.libtpu_version, host.libtpu_version),
    ]
    return [
        f"{what}: the pack's is {theirs or 'none'}, this host's is {ours or 'none'}"
        for what, theirs, ours in rows
        if theirs != ours
    ]


@dataclass
class Installed:
    manifest: Manifest
    installed: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    """Entries already in the cache directory with the same content (left as they were)."""
    bytes_read: int = 0
    seconds: float = 0.0


def pack_bytes(manifest: Manifest, manifest_end: int) -> int:
    """The most bytes a pack of ``manifest`` can be, its manifest member ending at byte
    ``manifest_end``: each entry with its headers and padding, the end blocks and the
    last record's padding."""
    members = sum(_MEMBER_OVERHEAD + e.size for e in manifest.entries)
    return manifest_end + members + 2 * tarfile.RECORDSIZE


class _Spool:
    """A pack fetched from a URL, written into an anonymous file as it arrives, and what
    its first bytes say of its size: until its first member's header arrives, one block
    (the deadline is then the idle timeout's); then that member, the manifest; once the
    manifest verifies (``manifest_of``), :func:`pack_bytes` of its signed sizes, which is
    both the deadline's size and the most bytes the spool takes (a server sending more is
    refused, never allowed to fill the disk). A write that fails for the disk's reason is
    a :class:`~xla_host.errors.DiskError` naming the spool's directory (exit 10)."""

    def __init__(
        self,
        handle: IO[bytes],
        directory: Path,
        source: str,
        manifest_of: Callable[[bytes], Manifest],
    ) -> None:
        self._handle, self._directory, self._source = handle, directory, source
        self._manifest_of = manifest_of
        self.fresh()

    def fresh(self) -> Callable[[bytes], object]:
        """A new attempt: from byte 0, nothing known (:func:`xla_host.net.rewound`)."""
        self._handle.seek(0)
        self._handle.truncate()
        self._head = bytearray()
        self._received = 0
        self._manifest_end: int | None = None
        self._manifest_start = 0
        self._verified = False
        self._parse_at = tarfile.BLOCKSIZE
        self.expected = tarfile.BLOCKSIZE
        self._cap = _HEAD_BYTES + MAX_MANIFEST_BYTES
        return self.write

    def write(self, chunk: bytes) -> None:
        if self._received + len(chunk) > self._cap:
            raise PackRefused(
                f"{self._source} is larger than its signed manifest allows ({self._cap} "
                "bytes): nothing was installed",
                fix="fetch the pack again from the lane; never install a pack of other bytes",
            )
        try:
            self._handle.write(chunk)
        except OSError as error:
            raise spool_fault(error, self._directory) from None
        self._received += len(chunk)
        if not self._verified:
            self._head += chunk
            self._learn()

    def _learn(self) -> None:
        """What the bytes so far tell of the pack's size (the class's doc)."""
        if self._manifest_end is None:
            if len(self._head) < self._parse_at:
                return  # parsed once per block: a drip of bytes is not parsed at each byte
            first = _first_member(bytes(self._head))
            if first is None:
                if len(self._head) >= _HEAD_BYTES:
                    raise _format_error(self._source, "not a tar file")
                self._parse_at = len(self._head) + tarfile.BLOCKSIZE
                return
            if first.name != MANIFEST_MEMBER or not first.isreg():
                raise _format_error(self._source, f"its first member is not {MANIFEST_MEMBER}")
            if first.size > MAX_MANIFEST_BYTES:
                too_large = f"a manifest larger than {MAX_MANIFEST_BYTES} bytes"
                raise _format_error(self._source, too_large)
            self._manifest_end = first.offset_data + first.size
            self._manifest_start = first.offset_data
            self.expected = self._manifest_end + tarfile.BLOCKSIZE
        if len(self._head) >= self._manifest_end:
            raw = bytes(self._head[self._manifest_start : self._manifest_end])
            self._head, self._verified = bytearray(), True  # the rest goes to the file only
            self.expected = self._cap = pack_bytes(self._manifest_of(raw), self._manifest_end)

    def size(self) -> int:
        return self.expected


def _first_member(head: bytes) -> tarfile.TarInfo | None:
    """The first member's header of a tar whose first bytes are ``head``; None while they
    do not hold a whole one (or are no tar)."""
    import io

    try:
        with tarfile.open(fileobj=io.BytesIO(head), mode="r|") as tar:
            return tar.next()
    except tarfile.TarError:
        return None


def spool_fault(error: OSError, directory: Path) -> PipelineError | OSError:
    """A failed write of a pack's download: the disk's (a full disk, a quota, read-only,
    no permission, an immutable directory) is :class:`DiskError` naming ``directory``;
    anything else is ``error`` itself."""
    if error.errno not in DISK_ERRNOS:
        return error
    return DiskError(
        f"cannot write the pack's download in {directory}: {os.strerror(error.errno)}",
        fix=f"free space on the filesystem of {directory} (a pack is fetched beside its cache "
        "directory) or make it writable, or install into a cache directory elsewhere (--into)",
    )


@contextlib.contextmanager
def open_pack(
    source: str,
    network: NetworkPolicy,
    manifest_of: Callable[[bytes], Manifest],
    spool: Path | None = None,
) -> Iterator[IO[bytes]]:
    """The pack's bytes as a stream: a URL (http, https, file), fetched whole into an
    anonymous temporary file in ``spool`` (the nearest existing directory of the cache;
    default: the system's), its userinfo and query kept on the request and masked
    wherever it is shown, its deadline and its size bounded by its signed manifest
    (:class:`_Spool`; ``manifest_of``: the manifest of the envelope's bytes once its
    signature verifies); or a regular file, its type checked where it is opened (a FIFO
    or device is refused, never read)."""
    if re.match(r"[a-z]+://", source):
        where = masked_url(source)
        directory = spool or Path(tempfile.gettempdir())
        try:
            spooled_file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115
        except OSError as error:
            raise spool_fault(error, directory) from None
        with spooled_file as spooled:
            download = _Spool(spooled, directory, where, manifest_of)
            failures = Failures(
                answered=lambda answer: PackRefused(
                    f"{where}: the server answered {answer.status} {answer.reason}",
                    fix="check the pack's URL (the lane's packs/ listing names it)",
                ),
                unreadable=lambda reason: PackRefused(
                    f"{where}: cannot read it ({reason})",
                    fix="check the pack's URL and the network",
                ),
                gave_up=lambda fault, attempts: PackRefused(
                    f"{where}: {host_of(source)} {fault.what_happened} ({attempts} attempt(s))",
                    fix="check the pack's URL and the network, then run the command again",
                ),
                timeout_fix="check the pack's address and the network, then run the command "
                f"again (or give it longer: {settings_fix()})",
            )
            if gcs.is_gs(source):
                # The same spool, bounds and deadline, through the one Cloud Storage client.
                bucket, name = _gs_object(source, network)
                try:
                    bucket.download(name, download.fresh, download.size, size=download.size())
                except gcs.ObjectMissing:
                    raise PackRefused(
                        f"{where} is not in its bucket", fix="check the lane's pack index"
                    ) from None
            else:
                http_request(
                    source, network, failures, size=download.size(), write=download.fresh,
                    sized=download.size, secrets=url_secrets(source),
                )  # fmt: skip
            try:
                spooled.flush()
            except OSError as error:
                raise spool_fault(error, directory) from None
            spooled.seek(0)
            yield spooled
        return
    path = Path(source)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as error:
        what = "is a symbolic link" if error.errno == 40 else f"cannot be read: {error.strerror}"
        raise UsageError(
            f"the pack {path} {what}", fix="pass the pack file itself (or its URL) to --pack"
        ) from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise UsageError(
            f"the pack {path} is not a regular file", fix="pass the pack file itself to --pack"
        )
    os.set_blocking(descriptor, True)
    with os.fdopen(descriptor, "rb") as handle:
        yield handle


def _gs_object(source: str, network: NetworkPolicy) -> tuple[gcs.Bucket, str]:
    """The bucket of ``gs://bucket/<name>`` (no prefix: the name is the whole path)."""
    address = gcs.parse(source, fix="pass the pack's gs:// address (the lane's index names it)")
    return gcs.Bucket(gcs.Address(address.bucket, ""), network), address.prefix


def install(
    source: str,
    cache: Path,
    keys: Sequence[PublicKey],
    host: HostFacts,
    *,
    network: NetworkPolicy = DEFAULT_NETWORK,
    expected_sha256: str | None = None,
) -> Installed:
    """Verify the pack at ``source`` and install its entries into ``cache``, all or none
    (module doc). Raises before anything is written when the signature fails or the pack
    is not for ``host``; names the entry whose content differs from its manifest row.
    ``expected_sha256``: the pack file's digest as the lane's index records it (a pack
    fetched by hash); a file of other bytes is refused before any entry is linked. The
    installed pack's manifest is recorded in ``cache/.xla-packs/`` (what ``cache prune``
    keeps and ``cache explain`` compares with) before the first entry is linked, under
    the install lock ``cache prune --apply`` takes too (:func:`install_lock`): a prune
    never sees an entry of this pack without its record."""
    began = time.monotonic()
    named = masked_url(source)  # what messages say: the URL's credentials masked
    staged: dict[str, Path] = {}
    linked: list[Path] = []
    bookkeeping: list[Path] = []
    runs: list[StagingRun] = []  # this install's staging (made once the pack verifies)
    # Made by this call (parents too) only once the pack is verified; removed on failure.
    created = [p for p in (cache, *cache.parents) if not p.exists()]
    try:
        spool = next((p for p in (cache, *cache.parents) if p.is_dir()), None)
        with open_pack(source, network, _verified(keys, named), spool) as raw_stream:
            stream = _Hashing(raw_stream)
            try:
                # Closed by `with tar:` below; opened apart so a non-tar is named as such.
                tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]  # noqa: SIM115
            except tarfile.TarError:
                raise _format_error(named, "not a tar file") from None
            with tar:
                result = _install_stream(named, tar, cache, keys, host, staged, runs)
            while stream.read(1 << 20):
                pass  # the tar's end blocks: the whole file's digest
        if expected_sha256 is not None and stream.hexdigest() != expected_sha256:
            raise PackRefused(
                f"{named} is not the pack the lane's index names (sha256 "
                f"{stream.hexdigest()[:16]}…, the index says {expected_sha256[:16]}…)",
                fix="fetch the pack again from the lane; never install a pack of other bytes",
            )
        records, made = records_directory(cache)
        if made:
            bookkeeping.append(records)
        with install_lock(cache, exclusive=False) as lock:
            if records in bookkeeping:
                bookkeeping.insert(0, lock)
            # The record first: an entry linked below is never without it.
            bookkeeping[:0] = record_installed(cache, result.manifest, source)
            _link_entries(result, cache, staged, linked)
    except BaseException:
        # All or nothing: the entries linked by this call go, the ones found there stay;
        # then the record, the lock and the records' directory where this call made them.
        for path in (*linked, *bookkeeping):
            with contextlib.suppress(OSError):
                path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)
        for path in staged.values():
            path.unlink(missing_ok=True)
        for run in runs:
            run.close()
        for directory in created:
            with contextlib.suppress(OSError):
                directory.rmdir()  # only when empty: never what someone else put there
        raise
    finally:
        for path in staged.values():
            path.unlink(missing_ok=True)
        for run in runs:
            run.close()
    result.seconds = time.monotonic() - began
    return result


def _link_entries(
    result: Installed, cache: Path, staged: Mapping[str, Path], linked: list[Path]
) -> None:
    """Link each verified entry into place (a link never replaces a file); one there with
    the same content is counted as present (found now, under the install lock: one a
    prune removed since the first check is linked again)."""
    result.present = []
    for entry in result.manifest.entries:
        target = cache / entry.name
        if entry.name not in staged:  # in the directory at the first check, not in the tar
            if not _holds(target, entry):
                raise PackRefused(
                    f"the entry {entry.name} left {cache} while the pack was installed, "
                    "and the pack does not carry it",
                    fix="run the same command again",
                )
            result.present.append(entry.name)
            continue
        try:
            os.link(staged[entry.name], target)
        except FileExistsError:
            # Written by another process since the check: the same content is fine.
            if not _holds(target, entry):
                raise _differs(entry.name, cache) from None
            result.present.append(entry.name)
            continue
        linked.append(target)
        result.installed.append(entry.name)


#: Where ``cache fetch`` records each pack it installed, inside the cache directory: a
#: hidden name, which torch_xla never loads and a pack's entries can never have.
INSTALLED_DIR = ".xla-packs"
#: The lock of the records: ``cache fetch`` holds it shared while it records a pack and
#: links its entries, ``cache prune --apply`` exclusively while it lists and removes.
INSTALL_LOCK = "install.lock"
#: The prefix of a fetch's staged files in the cache directory (hidden: never an entry).
STAGED_PREFIX = ".xlapack-"


def _linked_control(path: Path, what: str) -> NotARegularFile:
    """The refusal of a control path of the cache directory that is a symbolic link:
    followed, the fetch or prune would write outside the cache (exit 2)."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return NotARegularFile(
        f"{path} is a symbolic link{target}: it is {what} of the cache directory, and "
        "nothing of the cache is written through a link",
        fix=f"remove the link (`rm {path}` removes the link, not what it points to), "
        "then run it again",
    )


def records_directory(cache: Path, *, create: bool = True) -> tuple[Path, bool]:
    """``cache/.xla-packs``, a directory of the cache itself, and whether this call made
    it: checked from ``lstat`` where it is used (a link to another directory would get
    the records and the lock written there), made when missing with ``create``."""
    path = cache / INSTALLED_DIR
    made = False
    while True:
        try:
            info = path.lstat()
        except FileNotFoundError:
            if not create:
                raise
            try:
                path.mkdir()
                made = True
            except FileExistsError:
                pass  # a prune or another fetch made it at the same time: look again
            continue
        break
    if stat.S_ISLNK(info.st_mode):
        raise _linked_control(path, "the records' directory")
    if not stat.S_ISDIR(info.st_mode):
        raise NotARegularFile(
            f"{path} is not a directory: it is the records' directory of the cache",
            fix=f"remove what is at {path} (`ls -l {path}`), then run it again",
        )
    return path, made


def _locked(path: Path, *, exclusive: bool, create: bool, wait: bool) -> int | None:
    """A descriptor of ``path`` holding its ``flock``, or None: ``path`` is absent (and
    not ``create``), or held by another process (and not ``wait``). Checked where it is
    opened: never a link (O_NOFOLLOW), never opened blocking, only a regular file; and
    the locked file must still be ``path`` (a cleaner that removed it under its lock
    leaves a descriptor of nothing: then it is opened again)."""
    flags = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            descriptor = os.open(path, flags | (os.O_CREAT if create else 0), 0o666)
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as error:
            if error.errno == errno.ELOOP:  # O_NOFOLLOW met a link
                raise _linked_control(path, "a lock") from None
            raise
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise NotARegularFile(
                    f"{path} is not a regular file: it is a lock of the cache directory",
                    fix=f"remove what is at {path} (`ls -l {path}`), then run it again",
                )
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(descriptor, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    os.close(descriptor)
                    return None
                log.info(f"waiting for another process that holds {path} ...")
                fcntl.flock(descriptor, mode)
            try:
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(descriptor).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(descriptor)
            raise
        if same:
            return descriptor
        os.close(descriptor)
        if not create:
            return None


@contextlib.contextmanager
def install_lock(cache: Path, *, exclusive: bool) -> Iterator[Path]:
    """Hold the install lock of ``cache`` (its records' directory must exist): shared by
    fetches (they may install at once), exclusive for a prune. Yields the lock's path."""
    records, _ = records_directory(cache, create=False)
    path = records / INSTALL_LOCK
    descriptor = _locked(path, exclusive=exclusive, create=True, wait=True)
    assert descriptor is not None  # created and waited for
    try:
        yield path
    finally:
        os.close(descriptor)  # releases the flock


class StagingRun:
    """One install's staged files in a cache directory: ``.xlapack-<run>-<entry>``, and
    the run's lock ``.xlapack-<run>.lock``, held while the run lives. A process killed
    with SIGKILL releases its flock with its last descriptor, so a later install tells
    a dead run's staged files from a live one's (:func:`remove_dead_staging`)."""

    def __init__(self, cache: Path) -> None:
        while True:
            self.token = secrets.token_hex(6)
            self.lock = cache / f"{STAGED_PREFIX}{self.token}.lock"
            if not os.path.lexists(self.lock):
                break
        descriptor = _locked(self.lock, exclusive=True, create=True, wait=False)
        if descriptor is None:
            raise PackRefused(f"{self.lock} is held by another process", fix="run it again")
        self._descriptor: int | None = descriptor

    def staged_path(self, name: str) -> Path:
        return self.lock.parent / f"{STAGED_PREFIX}{self.token}-{name}"

    def close(self) -> None:
        """The lock goes (its staged files are gone by then); idempotent."""
        if self._descriptor is not None:
            self.lock.unlink(missing_ok=True)
            os.close(self._descriptor)
            self._descriptor = None


def remove_dead_staging(cache: Path) -> list[Path]:
    """Remove the staged files of installs into ``cache`` that died (SIGKILL, a lost
    host): each run's lock that no process holds any more, with the files of that run.
    A live run holds its lock, so its files stay; files without a run lock (another
    program's) are never touched. Returns what was removed."""
    removed: list[Path] = []
    for lock in sorted(cache.glob(f"{STAGED_PREFIX}*.lock")):
        token = lock.name[len(STAGED_PREFIX) : -len(".lock")]
        if not re.fullmatch(r"[0-9a-f]{12}", token):
            continue
        descriptor = _locked(lock, exclusive=True, create=False, wait=False)
        if descriptor is None:
            continue  # a live run's, or gone
        try:
            for path in cache.glob(f"{STAGED_PREFIX}{token}-*"):
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISREG(path.lstat().st_mode):
                        path.unlink()
                        removed.append(path)
            lock.unlink(missing_ok=True)
        finally:
            os.close(descriptor)
    if removed:
        log.info(f"removed {len(removed)} staged file(s) a killed `cache fetch` left in {cache}")
    return removed


def record_installed(cache: Path, manifest: Manifest, source: str) -> list[Path]:
    """The installed pack's manifest in ``cache/.xla-packs/<id>.json`` (by rename; an
    existing record of the same manifest is left as it is), with ``source`` as records
    keep a URL: no userinfo, every query value masked (every worker of a slice reads the
    directory). Returns what it created."""
    payload = json.dumps(manifest.to_json(), sort_keys=True).encode()
    record = cache / INSTALLED_DIR / f"{hashlib.sha256(payload).hexdigest()[:32]}.json"
    made: list[Path] = []
    if records_directory(cache)[1]:
        made.append(record.parent)
    if os.path.lexists(record):
        return made
    text = json.dumps(
        {
            "source": masked_url(source, record=True),
            "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "manifest": manifest.to_json(),
        },
        indent=2,
    )
    write_by_rename(record, text + "\n")
    # Undone in this order on failure: the record, then its directory if this made it.
    return [record, *made]


@dataclass(frozen=True)
class InstallRecords:
    """The records of the packs installed into a cache directory."""

    manifests: list[tuple[Path, Manifest]]
    """Each readable record and its pack's manifest, oldest first."""
    unreadable: list[tuple[Path, str]]
    """Each record that cannot be read (damaged, empty, not a file) and why: the entries
    it names are unknown, so a prune keeps every entry while one is there."""


def read_installed(cache: Path) -> InstallRecords:
    """The records of the packs ``cache fetch`` installed into ``cache``."""
    manifests: list[tuple[Path, Manifest]] = []
    unreadable: list[tuple[Path, str]] = []
    for path in sorted((cache / INSTALLED_DIR).glob("*.json")):
        try:
            raw = read_shared(path, what="record of an installed pack")
            data = loads_json(raw, source=str(path), error=PackFormatError)
            payload = json.dumps(data["manifest"]).encode()
            manifests.append((path, parse_manifest(payload, str(path))))
        except FileNotFoundError:
            continue  # removed since the listing (a failed fetch's, undone)
        except NotARegularFile as error:
            unreadable.append((path, error.message))
        except OSError as error:
            unreadable.append((path, f"cannot be read: {error.strerror}"))
        except (ValueError, KeyError, TypeError, OverflowError, PackFormatError):
            unreadable.append((path, "not the record of an installed pack (damaged or empty)"))
    return InstallRecords(manifests, unreadable)


def installed_manifests(cache: Path) -> list[tuple[Path, Manifest]]:
    """The packs ``cache fetch`` installed into ``cache`` (their records, oldest first);
    a record that cannot be read is named in a warning and left out."""
    records = read_installed(cache)
    for path, problem in records.unreadable:
        log.warning(f"{path}: {problem}; left out")
    return records.manifests


def read_manifest(
    source: str, keys: Sequence[PublicKey], network: NetworkPolicy = DEFAULT_NETWORK
) -> Manifest:
    """A pack's manifest once its signature verifies; no entry is read."""
    named = masked_url(source)
    with open_pack(source, network, _verified(keys, named)) as stream:
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                return _signed_manifest(named, tar, iter(tar), keys)
        except tarfile.TarError:
            raise _format_error(named, "not a tar file") from None


def _manifest_bytes(tar: tarfile.TarFile, first: tarfile.TarInfo, source: str) -> bytes:
    """The envelope's bytes of the first member; a pack cut inside them is refused."""
    reader = tar.extractfile(first)
    assert reader is not None  # a regular member
    try:
        return reader.read()
    except tarfile.TarError:
        raise PackRefused(
            f"{source} ends inside its manifest: the pack is truncated",
            fix="fetch the pack again from the lane; never install a truncated pack",
        ) from None


def _verified(keys: Sequence[PublicKey], source: str) -> Callable[[bytes], Manifest]:
    """The manifest of a pack's envelope bytes once its signature verifies with ``keys``."""
    return lambda raw: parse_manifest(verify_envelope(raw, keys, source), source)


class _Hashing:
    """A stream that computes the sha256 of what is read through it."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream, self._digest = stream, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._digest.update(data)
        return data

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _entry(manifest: Manifest, name: str) -> Entry:
    return next(e for e in manifest.entries if e.name == name)


def _sha256_of(path: Path) -> str:
    return file_sha256(path)


def _holds(path: Path, entry: Entry) -> bool:
    """``path`` is a regular file (never a link) with ``entry``'s content."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        return file_sha256(path) == entry.sha256
    except (FileNotFoundError, NotARegularFile):
        return False


def _differs(name: str, cache: Path) -> PackRefused:
    return PackRefused(
        f"the cache directory {cache} already holds an entry {name} with other content than "
        "the pack's: an entry is never replaced, so nothing was installed",
        fix="install into an empty cache directory (--into), or find out who wrote that entry "
        "(a different build writing the same key is what the gate's cache checks look for)",
    )


def _install_stream(
    source: str,
    tar: tarfile.TarFile,
    cache: Path,
    keys: Sequence[PublicKey],
    host: HostFacts,
    staged: dict[str, Path],
    runs: list[StagingRun],
) -> Installed:
    members = iter(tar)
    manifest = _signed_manifest(source, tar, members, keys)
    if manifest.cache_format != CACHE_FORMAT:
        raise PackRefused(
            f"{source} holds cache entries of format {manifest.cache_format}, this host reads "
            f"{CACHE_FORMAT}",
            fix="use a pack made by a gate of this version",
        )
    differ = differences(manifest, host)
    if differ:
        raise PackRefused(
            f"{source} is not for this host: " + "; ".join(differ),
            fix="fetch the pack the lane made for this bundle, topology and build (or pass "
            "--bundle/--topology/--device as this host really runs)",
        )
    result = Installed(manifest)
    # Before a byte of an entry is written: an existing entry that differs refuses the pack.
    cache.mkdir(parents=True, exist_ok=True)
    for entry in manifest.entries:
        target = cache / entry.name
        if os.path.lexists(target):
            if not _holds(target, entry):  # a link, a FIFO, other bytes
                raise _differs(entry.name, cache)
            result.present.append(entry.name)
    # What killed installs of this directory left, before this one stages its own.
    remove_dead_staging(cache)
    runs.append(StagingRun(cache))

    def stage(name: str, data: IO[bytes], entry: Entry) -> None:
        staged[name] = _stage(runs[-1].staged_path(name), data, entry, source)

    _read_entries(source, tar, members, manifest, result.present, stage)
    result.bytes_read = sum(e.size for e in manifest.entries if e.name in staged)
    return result


def _signed_manifest(
    source: str,
    tar: tarfile.TarFile,
    members: Iterator[tarfile.TarInfo],
    keys: Sequence[PublicKey],
) -> Manifest:
    """The pack's first member, its signed manifest, once the signature verifies."""
    try:
        first = next(members, None)
    except tarfile.TarError:
        raise _format_error(source, "not a tar file") from None
    if first is None or first.name != MANIFEST_MEMBER or not first.isreg():
        raise _format_error(source, f"its first member is not {MANIFEST_MEMBER}")
    if first.size > MAX_MANIFEST_BYTES:
        raise _format_error(source, f"a manifest larger than {MAX_MANIFEST_BYTES} bytes")
    return parse_manifest(
        verify_envelope(_manifest_bytes(tar, first, source), keys, source), source
    )


def _read_entries(
    source: str,
    tar: tarfile.TarFile,
    members: Iterator[tarfile.TarInfo],
    manifest: Manifest,
    present: Sequence[str],
    take: Callable[[str, IO[bytes], Entry], None],
) -> None:
    """Every member after the manifest handed to ``take`` (which checks its content), once
    it is a regular file its signed manifest names with its size, exactly once; then every
    entry the manifest names and ``present`` does not hold must have come. The one reading
    of a pack's entries: a host installing it (``install``) and the lane publishing it
    (``verify_pack``) judge a pack alike."""
    expected = {e.name: e for e in manifest.entries}
    seen: set[str] = set()
    try:
        for member in members:
            name = member.name[len(ENTRY_PREFIX) :]
            if not member.name.startswith(ENTRY_PREFIX) or name not in expected:
                raise PackRefused(
                    f"{source} holds {member.name!r}, which its signed manifest does not name",
                    fix="fetch the pack again from the lane; never install a tampered pack",
                )
            entry = expected[name]
            if not member.isreg() or member.size != entry.size or name in seen:
                raise PackRefused(
                    f"{source}: entry {name} is not the file its manifest names ({entry.size} "
                    f"bytes, sha256 {entry.sha256[:16]}…): the pack was tampered with",
                    fix="fetch the pack again from the lane; never install a tampered pack",
                )
            data = tar.extractfile(member)
            assert data is not None
            take(name, data, entry)
            seen.add(name)
    except tarfile.TarError as error:
        raise PackRefused(
            f"{source} is damaged after its manifest ({error})",
            fix="fetch the pack again from the lane; never install a damaged pack",
        ) from None
    missing = [name for name in expected if name not in seen and name not in present]
    if missing:
        raise PackRefused(
            f"{source} lacks entries its manifest names: {', '.join(missing[:5])}",
            fix="fetch the pack again from the lane; never install a truncated pack",
        )


def _entry_mismatch(source: str, name: str, digest: str, entry: Entry) -> PackRefused:
    return PackRefused(
        f"{source}: entry {name} does not match its signed manifest (sha256 "
        f"{digest[:16]}…, the manifest says {entry.sha256[:16]}…): the "
        "entry was tampered with, so nothing was installed",
        fix="fetch the pack again from the lane; never install a tampered pack",
    )


def verify_pack(
    source: str, keys: Sequence[PublicKey], network: NetworkPolicy = DEFAULT_NETWORK
) -> Manifest:
    """The pack's manifest once its signature verifies **and** every entry is the file
    the manifest names (size and sha256), none missing, none extra: what a host checks
    before it installs (:func:`install`), done without writing anything. Publishing a pack
    runs this first, so a lane never serves a pack every host would refuse."""
    named = masked_url(source)
    with open_pack(source, network, _verified(keys, named)) as stream:
        try:
            tar = tarfile.open(fileobj=stream, mode="r|")  # noqa: SIM115 - closed by `with tar:`
        except tarfile.TarError:
            raise _format_error(named, "not a tar file") from None
        with tar:
            members = iter(tar)
            manifest = _signed_manifest(named, tar, members, keys)

            def check(name: str, data: IO[bytes], entry: Entry) -> None:
                digest = hashlib.sha256()
                while chunk := data.read(1 << 20):
                    digest.update(chunk)
                if digest.hexdigest() != entry.sha256:
                    raise _entry_mismatch(named, name, digest.hexdigest(), entry)

            _read_entries(named, tar, members, manifest, (), check)
    return manifest


def _stage(temporary: Path, data: IO[bytes], entry: Entry, source: str) -> Path:
    """``data`` in the new file ``temporary`` of the cache directory (a staged file's name,
    never an entry's: torch_xla never loads it), its sha256 computed on the way; a
    mismatch names the entry."""
    name = entry.name
    digest = hashlib.sha256()
    # A new file (O_EXCL, never a link): nothing that is there is opened.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(temporary, flags, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as out:
            while chunk := data.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        as_if_created(temporary)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:
            # A full disk names no file on write or fsync: the staged file is where.
            raise OSError(error.errno, error.strerror, str(temporary)) from None
        raise
    if digest.hexdigest() != entry.sha256:
        temporary.unlink(missing_ok=True)
        raise _entry_mismatch(source, name, digest.hexdigest(), entry)
    return temporary


# --- after a gate run ---------------------------------------------------------------------


def pack_gate_run(
    directory: Path | None,
    sign_key: Path | None,
    outcome: GateOutcome,
    receipt: Path,
    bundle: str | None,
    workload_spec: WorkloadSpec | None = None,
    timeout_s: float = 600.0,
) -> Path | None:
    """The pack of a finished gate run (``--pack``): written when its restart check passed,
    from the cold run's cache it kept; the temporary copy goes either way. Returns the
    pack's path, or None when no pack is due.

    With ``workload_spec``, one more run of it records the key components of the entries
    (``cache_keys.record_run``, on an empty scratch cache: a run under the same
    settings writes entries of the same names): written as ``keys.json`` beside the
    gate's report and carried in the manifest's ``keys`` (what ``cache explain`` reads).
    An entry of the cold run that the record did not see is packed without its keys."""
    cold = outcome.cold_cache
    try:
        if directory is None or sign_key is None:
            return None
        restart = next((r for r in outcome.results if r.name == "restart"), None)
        if restart is None or not restart.passed or cold is None:
            why = "was not run" if restart is None else "did not pass" if not restart.passed \
                else "kept no cold cache (a reader of the cache)"  # fmt: skip
            log.warning(f"no cache pack: the restart check {why}")
            return None
        target = outcome.target
        stored = read_receipt(receipt)
        slice_topology = (outcome.slice_record or {}).get("topology")
        topology = slice_topology or slice_topology_of(
            target.device, target.accelerator_type, 1, len(target.runtime_devices) or None
        )
        workload = dict(target.workload or {})
        manifest = Manifest(
            bundle=bundle,
            workload={k: workload.get(k) for k in ("name", "sha256", "params")},
            topology=topology,
            device=target.device,
            torch_version=target.torch_version,
            torch_xla_version=target.torch_xla_version,
            libtpu_version=_libtpu_version(stored.receipt),
            receipt_digest=stored.digest or None,
            entries=(),
        )
        if workload_spec is not None:
            out = outcome.json_path.parent
            record = cache_keys.record_run(
                target.python, workload_spec, target.device, topology, out / "runs", timeout_s
            )
            (out / "keys.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            names = [e.name for e, _ in entries_of(cold)]
            keys = cache_keys.manifest_keys(record, names)
            unseen = sorted(set(names) - set(keys["entries"]))
            if unseen:
                log.warning(
                    f"the key record saw {len(keys['entries'])} of the cold run's {len(names)} "
                    f"entries written (not {', '.join(unseen[:3])}): those are packed without keys"
                )
            manifest = replace(manifest, keys=keys)
        path, full = write_pack(directory, cold, sign_key, manifest)
        log.info(f"cache pack: {path} ({len(full.entries)} entries, {full.size} bytes)")
        return path
    finally:
        if cold is not None:
            shutil.rmtree(cold.parent, ignore_errors=True)


def _libtpu_version(receipt: Any) -> str | None:
    versions = getattr(receipt, "versions", None) or {}
    value = versions.get("libtpu") if isinstance(versions, Mapping) else None
    return str(value) if value else None
