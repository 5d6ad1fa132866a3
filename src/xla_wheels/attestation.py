"""Signed build attestations: per wheel, an in-toto statement with an SLSA provenance
predicate, signed as a DSSE envelope with the team's key.

``make attest BUNDLE=…`` writes ``dist/<bundle>/<wheel>.intoto.jsonl`` (one DSSE envelope
as one JSON line, the file form SLSA's tools use) for each wheel ``wheels.lock`` records:

- subject: the wheel's file name and sha256 (the locked one);
- predicate (https://slsa.dev/provenance/v1): ``buildDefinition.externalParameters``
  names the bundle, its manifest digest and the runtime pins (libtpu, jax): the facts
  that are per bundle and so cannot be inside the shared wheel bytes (``sbom``);
  ``resolvedDependencies`` holds each component's remote and full commit and each patch
  with its sha256, read from the provenance stamped into the torch_xla wheel (one source);
  ``internalParameters`` the build settings and toolchain; ``runDetails.builder.id`` the
  builder identity (``XLA_WHEELS_BUILDER_ID``); ``byproducts`` the SBOM with its digest.

Signing and verifying are securesystemslib's (DSSE envelope, ed25519/ECDSA/RSA signer
from a PEM key via ``cryptography``); nothing here does cryptography by hand. The private
key is a PEM file named by ``XLA_WHEELS_SIGNING_KEY`` (never printed, never in the
repository); the public key that verifies is a PEM file named by a lane
(``signing-public-key`` in build/lanes.toml) or ``XLA_WHEELS_PUBLIC_KEY``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_host.errors import PipelineError, UsageError
from xla_host.provenance import Provenance
from xla_host.tables import read_regular
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import sbom, wheel_stamp
from xla_wheels.bundle import Bundle
from xla_wheels.settings_rows import by_flag
from xla_wheels.wheels_lock import BundleEntry, Lock, WheelRecord

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner, Key

# securesystemslib and cryptography are imported in the functions that sign or verify,
# not at the top: they took 60-80 ms of the start of every publish and release command
# (python -X importtime), most of which never touch a key.

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "urn:xla-wheels:build:v1"
"""Names this pipeline's build (its recipes and stages); a URI, as SLSA asks."""
DEFAULT_BUILDER_ID = str(by_flag("--builder-id").default)  # its row of the settings table
ENVELOPE_SUFFIX = ".intoto.jsonl"


class AttestationError(PipelineError):
    """A wheel is unsigned, its signature does not verify, or it attests another file."""


def envelope_name(wheel_name: str) -> str:
    return wheel_name + ENVELOPE_SUFFIX


def _key_file(path: Path, what: str, setting: str) -> bytes:
    try:
        # A FIFO or device is refused from its stat, before it is opened.
        return read_regular(path, UsageError, what=what)
    except OSError as error:
        raise UsageError(
            f"cannot read the {what} {path}: {error.strerror}",
            fix=f"set {setting} to the PEM file of the team's key "
            '(docs/supply-chain.md "Signed attestations" says how the team makes one)',
        ) from None


def load_signer(path: Path) -> CryptoSigner:
    """The team's private key (PEM, unencrypted); errors never show its content."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    data = _key_file(path, "signing key", "XLA_WHEELS_SIGNING_KEY")
    try:
        private_key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise UsageError(
            f"the signing key {path} is not an unencrypted PEM private key",
            fix="make one with `openssl genpkey -algorithm ed25519 -out <file>` and set "
            "XLA_WHEELS_SIGNING_KEY to it",
        ) from None
    return CryptoSigner(private_key)


def load_public_key(path: Path) -> Key:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.signer import SSlibKey

    data = _key_file(path, "public key", "XLA_WHEELS_PUBLIC_KEY (or the lane's signing-public-key)")
    try:
        return SSlibKey.from_crypto(load_pem_public_key(data))
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:
        raise UsageError(
            f"the public key {path} is not a PEM public key ({type(error).__name__})",
            fix="export it from the private key: `openssl pkey -in <key> -pubout -out <file>`",
        ) from None


def statement(
    wheel: Path,
    record: WheelRecord,
    bundle: Bundle,
    entry: BundleEntry,
    provenance: Provenance,
    builder_id: str,
) -> dict[str, Any]:
    """The in-toto statement for one locked wheel (``wheel`` holds its bytes)."""
    package = parse_wheel_name(record.name).project
    facts = sbom.facts_for(package, provenance)
    dependencies: list[dict[str, Any]] = []
    for name, component in sorted(facts.components.items()):
        remote = bundle.component(name).remote
        dependencies.append(
            {
                "name": name,
                "uri": f"git+{remote}@{component.commit}",
                "digest": {"gitCommit": component.commit},
                "annotations": {"series_sha256": component.series_sha256},
            }
        )
        extra = facts.torch_xla_openxla_patches if name == "openxla" else ()
        for patch in (*component.patches, *extra):
            dependencies.append(
                {"name": f"{name}:{patch.path}", "digest": {"sha256": patch.sha256}}
            )
    try:
        sbom_digest = {"sha256": hashlib.sha256(sbom.read_sbom(wheel)).hexdigest()}
        byproducts = [{"name": sbom.arcname(wheel), "digest": sbom_digest}]
    except sbom.SbomError:
        byproducts = []
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": record.name, "digest": {"sha256": record.sha256}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "bundle": bundle.name,
                    "manifest": entry.manifest,
                    "manifest_sha256": entry.manifest_sha256,
                    "python": entry.python,
                    "runtime": {
                        name: pin.specifier for name, pin in sorted(bundle.runtime.items())
                    },
                },
                "internalParameters": {
                    "build": facts.build.to_json(),
                    "toolchain": dict(sorted(facts.toolchain.items())),
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": builder_id},
                "metadata": {"built_by": facts.built_by},
                "byproducts": byproducts,
            },
        },
    }


def sign(statement_json: Mapping[str, Any], signer: CryptoSigner) -> bytes:
    from securesystemslib.dsse import Envelope

    payload = json.dumps(statement_json, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(signer)
    return (json.dumps(envelope.to_dict(), sort_keys=True) + "\n").encode()


def verify(raw: bytes, key: Key, wheel_name: str, sha256: str) -> dict[str, Any]:
    """The statement of an envelope that ``key`` signed for exactly this file.

    Raises :class:`AttestationError` naming what is wrong: not an envelope, a signature
    the key does not verify (another key, or a changed byte), another payload type, or a
    subject that is not this file name with this sha256.
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError

    envelope_file = envelope_name(wheel_name)
    try:
        envelope = Envelope.from_dict(json.loads(raw))
    except (ValueError, KeyError, TypeError) as error:
        raise AttestationError(f"{envelope_file} is not a DSSE envelope: {error}") from None
    try:
        envelope.verify([key], 1)
    except VerificationError:
        raise AttestationError(
            f"the signature of {envelope_file} does not verify with the team's "
            "public key (signed with another key, or changed after signing)"
        ) from None
    if envelope.payload_type != PAYLOAD_TYPE:
        raise AttestationError(
            f"{envelope_file} carries {envelope.payload_type}, not an in-toto statement"
        )
    data = json.loads(envelope.payload)
    subjects = {(s.get("name"), s.get("digest", {}).get("sha256")) for s in data.get("subject", [])}
    if data.get("_type") != STATEMENT_TYPE or data.get("predicateType") != PREDICATE_TYPE:
        raise AttestationError(f"{envelope_file} is not an SLSA provenance statement")
    if (wheel_name, sha256) not in subjects:
        raise AttestationError(
            f"{envelope_file} is signed but attests "
            f"{', '.join(f'{n} sha256:{d}' for n, d in sorted(subjects, key=str))}, "
            f"not {wheel_name} sha256:{sha256}"
        )
    return dict(data)


@dataclass(frozen=True)
class Signed:
    wheel: str
    envelope: Path


def check_signed(
    wheels: Sequence[tuple[str, str]], search: Sequence[Path], key: Key, where: str
) -> list[Signed]:
    """Each (file name, sha256) has an envelope in one of ``search`` that ``key`` verifies
    for exactly that file. Raises one :class:`AttestationError` listing every problem."""
    problems: list[str] = []
    found: list[Signed] = []
    for name, sha256 in wheels:
        candidates = [d / envelope_name(name) for d in search]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            problems.append(f"{name} is unsigned: no {envelope_name(name)}")
            continue
        try:
            verify(path.read_bytes(), key, name, sha256)
        except AttestationError as error:
            problems.append(error.message)
            continue
        found.append(Signed(name, path))
    if problems:
        raise AttestationError(
            f"{where} requires signed wheels:\n  " + "\n  ".join(problems),
            fix="sign the bundle's locked wheels with the team's key: `make attest "
            "BUNDLE=<bundle>` (XLA_WHEELS_SIGNING_KEY=<private key PEM>); never publish a "
            "wheel whose signature fails",
        )
    return found


def attest_bundle(
    lock: Lock, bundle: Bundle, dist: Path, signer: CryptoSigner, builder_id: str
) -> list[Path]:
    """Sign every wheel ``lock`` records for ``bundle`` found in ``dist`` (checked by sha256); the
    envelopes are written next to the wheels, all or none (a full disk half way leaves
    every envelope as it was). Returns their paths."""
    from xla_host.filemode import write_all
    from xla_wheels.publish.wheels import locked_wheels

    entry = lock.entry(bundle.name)
    wheels = locked_wheels(lock, bundle.name, dist)
    torch_xla = next((w for w in wheels if w.name.normalized == "torch-xla"), None)
    if torch_xla is None:
        raise AttestationError(
            f"wheels.lock records no torch_xla wheel for {bundle.name}: nothing carries the "
            "provenance the attestations are made from",
            fix=f"build the bundle: `make wheels BUNDLE={bundle.name}`",
        )
    provenance = wheel_stamp.read_provenance(torch_xla.path)
    envelopes = []
    for wheel in wheels:
        body = statement(wheel.path, wheel.record, bundle, entry, provenance, builder_id)
        envelopes.append((dist / envelope_name(wheel.record.name), sign(body, signer)))
    write_all(envelopes)
    return [target for target, _ in envelopes]


@dataclass(frozen=True)
class SignatureCheck:
    status: str
    """``ok`` or ``FAIL``."""
    wheel: str
    detail: str


def signature_checks(
    public_key: Path, wheels: Sequence[tuple[str, str]], search: Sequence[Path]
) -> list[SignatureCheck]:
    """verify-install's and doctor's findings: one per locked (file name, sha256)."""
    key = load_public_key(public_key)
    checks = []
    for name, sha256 in wheels:
        try:
            (signed,) = check_signed([(name, sha256)], search, key, "the team")
        except AttestationError as error:
            detail = error.message.split("\n  ", 1)[-1]
            checks.append(SignatureCheck("FAIL", name, detail))
        else:
            detail = f"{signed.envelope.name} verifies with {public_key.name}"
            checks.append(SignatureCheck("ok", name, detail))
    return checks
