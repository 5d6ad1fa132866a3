"""Signed receipts: a receipt wrapped in a DSSE envelope, signed on the host with openssl.

The envelope is the one the attestations use (``xla_wheels.attestation``: securesystemslib's
``Envelope``, ``{"payload", "payloadType", "signatures": [{"keyid", "sig"}]}``, base64,
signed over DSSE's pre-authentication encoding), so the builder side verifies a receipt
signed here with that library. Its payload type is the receipt's own
(:data:`PAYLOAD_TYPE`): the encoding binds the type into what is signed, so an envelope
signed for an attestation can never be passed off as a receipt, nor the reverse.

A TPU host has neither securesystemslib nor ``cryptography`` (the host side is standard
library only, and a torch environment must not gain packages), so signing runs
``openssl pkeyutl -sign -rawin`` (OpenSSL 3) on an ed25519 PEM key through the runner; the
encoding is computed here. The key id is securesystemslib's default one (sha256 of the
canonical JSON of the public key), which its ``Envelope.verify`` matches signatures by.
The key's content never reaches output: only its path is shown.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xla_host import runner
from xla_host.errors import PipelineError, UsageError

PAYLOAD_TYPE = "application/vnd.xla-wheels.receipt+json"
#: DER prefix of an ed25519 SubjectPublicKeyInfo (RFC 8410): the 32 key bytes follow.
_ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
SIGN_TIMEOUT_S = 60.0
_KEY_FIX = (
    "give an unencrypted ed25519 PEM private key: `openssl genpkey -algorithm ed25519 -out "
    "<file>`; the lane names its public half (`openssl pkey -in <file> -pubout`) in "
    "receipt-keys"
)


class EnvelopeError(PipelineError):
    """A receipt file looks like a DSSE envelope but is not a well-formed one."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature is over."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def is_envelope(data: object) -> bool:
    return isinstance(data, dict) and "payloadType" in data and "signatures" in data


def envelope_payload(data: Mapping[str, Any], source: str) -> bytes:
    """The signed bytes of an envelope (not verified here: the builder side verifies)."""
    if data.get("payloadType") != PAYLOAD_TYPE:
        raise EnvelopeError(
            f"{source} is a DSSE envelope of {data.get('payloadType')!r}, not a receipt "
            f"({PAYLOAD_TYPE})",
            fix="store only receipts the gate wrote (signed with --sign-key) here",
        )
    try:
        return base64.b64decode(str(data.get("payload", "")), validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(
            f"{source}: the envelope's payload is not base64", fix="restore the receipt"
        ) from None


def ed25519_keyid(public: bytes) -> str:
    """securesystemslib's default key id of an ed25519 key (``compute_default_keyid``)."""
    key = {"keytype": "ed25519", "scheme": "ed25519", "keyval": {"public": public.hex()}}
    return hashlib.sha256(
        json.dumps(key, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def sign_plan(key: Path, message: Path, signature: Path) -> list[list[str]]:
    """The two openssl commands: the public key (for the key id), then the signature."""
    # -passin pass: (empty): an encrypted key fails at once instead of prompting on the
    # terminal of an unattended gate.
    return [
        ["openssl", "pkey", "-in", str(key), "-passin", "pass:", "-pubout", "-outform", "PEM"],
        ["openssl", "pkeyutl", "-sign", "-inkey", str(key), "-passin", "pass:", "-rawin",
         "-in", str(message), "-out", str(signature)],
    ]  # fmt: skip


def _public_key(pem: str, key: Path) -> bytes:
    body = "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))
    try:
        der = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        der = b""
    if not der.startswith(_ED25519_SPKI_PREFIX) or len(der) != len(_ED25519_SPKI_PREFIX) + 32:
        raise UsageError(f"the signing key {key} is not an ed25519 key", fix=_KEY_FIX)
    return der[len(_ED25519_SPKI_PREFIX) :]


def check_signing_key(key: Path, flag: str) -> None:
    """Before a run that signs only at its end (the gate's ``--sign-key``, ``--pack-key``):
    ``key`` is an ed25519 private key openssl can use, or a UsageError naming ``flag``. A
    public key, another algorithm or a passphrase costs seconds here, not a gate run."""
    fix = f"pass {flag} <file>: {_KEY_FIX}"
    if shutil.which("openssl") is None:
        raise UsageError(
            f"{flag} signs with openssl (3.0 or newer), which is not on PATH",
            fix=f"install openssl (Debian: apt-get install openssl), or leave out {flag}",
        )
    if not key.is_file():
        raise UsageError(f"{flag} {key} is not a file", fix=fix)

    def refused(result: Any) -> PipelineError:
        first = (result.stderr or "").strip().splitlines()[:1] or ["no message"]
        # Sniffed only to name the mistake; the key's bytes are never shown.
        public = b"BEGIN PUBLIC KEY" in key.read_bytes()[:4096]
        what = "is a public key; it needs the private key" if public else "is no private key"
        return UsageError(f"{flag} {key} {what} openssl can use ({first[0]})", fix=fix)

    public_cmd, _ = sign_plan(key, key, key)
    answer = runner.run(public_cmd, echo="log", timeout=SIGN_TIMEOUT_S, error=refused,
                        step="openssl")  # fmt: skip
    try:
        _public_key(answer.stdout, key)
    except UsageError:
        raise UsageError(f"{flag} {key} is not an ed25519 key", fix=fix) from None


def sign(payload: bytes, key: Path, *, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """``payload`` (a rendered receipt) as a signed DSSE envelope, one JSON document.
    ``payload_type``: another document's type (a cache pack's manifest), bound into what
    is signed so neither can pass for the other."""
    if shutil.which("openssl") is None:
        raise UsageError(
            "signing a receipt needs openssl (3.0 or newer), which is not on PATH",
            fix="install openssl (Debian: apt-get install openssl), or leave out --sign-key",
        )
    if not key.is_file():
        raise UsageError(f"the signing key {key} is not a file", fix=_KEY_FIX)

    def refused(result: Any) -> PipelineError:
        # openssl's stderr names the problem with the key file, never its content.
        tail = (result.stderr or "").strip().splitlines()[-1:] or ["no message"]
        return UsageError(f"openssl could not use the signing key {key}: {tail[0]}", fix=_KEY_FIX)

    with tempfile.TemporaryDirectory(prefix="xla-receipt-sign-") as tmp:
        message, signature = Path(tmp) / "pae", Path(tmp) / "sig"
        message.write_bytes(pae(payload_type, payload))
        public_cmd, sign_cmd = sign_plan(key, message, signature)
        common: dict[str, Any] = {
            "echo": "log",
            "timeout": SIGN_TIMEOUT_S,
            "error": refused,
            "step": "openssl",
        }
        public = _public_key(runner.run(public_cmd, **common).stdout, key)
        runner.run(sign_cmd, **common)
        sig = signature.read_bytes()
    envelope = {
        "payload": base64.b64encode(payload).decode(),
        "payloadType": payload_type,
        "signatures": [{"keyid": ed25519_keyid(public), "sig": base64.b64encode(sig).decode()}],
    }
    return (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode()
