"""Signed attestations: an in-toto statement with an SLSA provenance predicate per wheel,
signed as a DSSE envelope (securesystemslib) with the team's key. Real ed25519 keys made
in tmp_path; a lane that requires signatures refuses an unsigned wheel, another key's
signature and a changed byte; verify-install and doctor verify with the public key."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.clirunner import CliResult, run_cli
from tests.publish_support import (
    BUNDLE,
    OPENXLA_SHA,
    TORCH_SHA,
    XLA_SHA,
    XLA_VERSION,
    build_fake_wheels,
    host_venv,
    make_publish_project,
    provenance,
)
from xla_host.filemode import file_sha256
from xla_wheels import attestation as attest
from xla_wheels import sbom
from xla_wheels.wheels_lock import read_lock

EPOCH = 1700000000


def make_key(directory: Path, name: str) -> tuple[Path, Path]:
    """(private PEM, public PEM) of a fresh ed25519 key, as `openssl genpkey` writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private = directory / f"{name}.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = directory / f"{name}.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return private, public


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    fake = build_fake_wheels(tmp_path_factory.mktemp("attest-wheels"))
    for wheel in (fake.torch, fake.torch_xla):
        sbom.add_sbom(wheel, provenance(), EPOCH)
    return [fake.torch, fake.torch_xla]


LANES = (
    'publish-lane = "validation"\n\n'
    '[lanes.validation]\npath = "dist/lanes/validation"\n'
    "require-signature = true\n"
    'signing-public-key = "keys/team.pub.pem"\n\n'
    '[lanes.open]\npath = "dist/lanes/open"\n\n'
    '[lanes.signed]\npath = "dist/lanes/signed"\npromote-from = "open"\n'
    "require-signature = true\n"
    'signing-public-key = "keys/team.pub.pem"\n'
)


@pytest.fixture
def project(tmp_path: Path, wheels: list[Path]) -> Path:
    project = make_publish_project(tmp_path, wheels)
    make_key(project / "keys", "team")  # the public half is what the lanes name
    (project / "build" / "lanes.toml").write_text(LANES)
    return project


def cli(project: Path, *args: str, **env: str) -> CliResult:
    return run_cli(*args, env=env, root=project, inherit_env=True)


def envelope(project: Path, wheel: Path) -> Path:
    return project / "dist" / BUNDLE / attest.envelope_name(wheel.name)


@pytest.mark.slow
def test_attest_signs_an_slsa_statement_per_locked_wheel(
    project: Path, wheels: list[Path], tmp_path: Path
) -> None:
    private = project / "keys" / "team.pem"
    signed = cli(
        project, "attest", "--bundle", BUNDLE,
        XLA_WHEELS_SIGNING_KEY=str(private), XLA_WHEELS_BUILDER_ID="urn:example:builder:ci-1",
    )  # fmt: skip
    assert signed.exit_code == 0, signed.output
    assert private.read_text().splitlines()[1] not in signed.output  # never the key
    entry = read_lock(project / "wheels.lock").bundles[BUNDLE]
    key = attest.load_public_key(project / "keys" / "team.pub.pem")
    for wheel in wheels:
        sha = file_sha256(wheel)
        data = attest.verify(envelope(project, wheel).read_bytes(), key, wheel.name, sha)
        assert data["subject"] == [{"name": wheel.name, "digest": {"sha256": sha}}]
        predicate = data["predicate"]
        assert predicate["runDetails"]["builder"]["id"] == "urn:example:builder:ci-1"
        external = predicate["buildDefinition"]["externalParameters"]
        assert external["bundle"] == BUNDLE
        assert external["manifest_sha256"] == entry.manifest_sha256
        resolved = {d["name"]: d for d in predicate["buildDefinition"]["resolvedDependencies"]}
        assert resolved["torch"]["digest"] == {"gitCommit": TORCH_SHA}
        assert resolved["torch"]["uri"] == f"git+https://example.invalid/torch.git@{TORCH_SHA}"
        # The torch wheel attests torch's inputs; torch_xla's the three components.
        if wheel.name.startswith("torch_xla-"):
            assert resolved["torch_xla"]["digest"] == {"gitCommit": XLA_SHA}
            assert resolved["openxla"]["digest"] == {"gitCommit": OPENXLA_SHA}
        else:
            assert "torch_xla" not in resolved
        # Signed, but for another file: refused by name and sha256.
        with pytest.raises(attest.AttestationError, match="is signed but attests"):
            attest.verify(envelope(project, wheel).read_bytes(), key, wheel.name, "0" * 64)
        (byproduct,) = predicate["runDetails"]["byproducts"]
        assert byproduct["digest"]["sha256"] == file_sha256_bytes(sbom.read_sbom(wheel))

    # A key that is not a PEM key, and none at all: named, exit 2.
    (tmp_path / "bad.pem").write_text("not a key\n")
    bad = cli(
        project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY=str(tmp_path / "bad.pem")
    )
    assert bad.exit_code == 2 and "is not an unencrypted PEM private key" in bad.stderr
    none = cli(project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY="")
    assert none.exit_code == 2 and "fix: set XLA_WHEELS_SIGNING_KEY" in none.stderr


def file_sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _tamper_payload(path: Path) -> None:
    """Change one byte of the signed statement, keeping the envelope well-formed."""
    data = json.loads(path.read_text())
    payload = bytearray(base64.b64decode(data["payload"]))
    at = payload.index(b"urn:xla-wheels:build:v1")
    payload[at] = ord("U")
    data["payload"] = base64.b64encode(bytes(payload)).decode()
    path.write_text(json.dumps(data))


@pytest.mark.slow
def test_a_lane_that_requires_signatures_refuses_unsigned_wrong_key_and_changed_byte(
    project: Path, wheels: list[Path], tmp_path: Path
) -> None:
    unsigned = cli(project, "publish-lane", "--bundle", BUNDLE)
    assert unsigned.exit_code == 1, unsigned.output
    assert "lane validation requires signed wheels" in unsigned.stderr
    assert f"{wheels[0].name} is unsigned: no {wheels[0].name}.intoto.jsonl" in unsigned.stderr
    assert not (project / "dist" / "lanes" / "validation").exists()

    other, _ = make_key(tmp_path / "other", "other")
    assert (
        cli(project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY=str(other)).exit_code == 0
    )
    wrong_key = cli(project, "publish-lane", "--bundle", BUNDLE)
    assert wrong_key.exit_code == 1
    assert "does not verify with the team's public key" in wrong_key.stderr

    team = str(project / "keys" / "team.pem")
    assert cli(project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY=team).exit_code == 0
    _tamper_payload(envelope(project, wheels[1]))
    changed = cli(project, "publish-lane", "--bundle", BUNDLE)
    assert changed.exit_code == 1
    assert f"the signature of {wheels[1].name}.intoto.jsonl does not verify" in changed.stderr

    assert cli(project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY=team).exit_code == 0
    published = cli(project, "publish-lane", "--bundle", BUNDLE)
    assert published.exit_code == 0, published.output
    lane = project / "dist" / "lanes" / "validation"
    for wheel in wheels:  # each envelope next to its wheel on the lane
        assert (lane / attest.envelope_name(wheel.name)).read_bytes() == envelope(
            project, wheel
        ).read_bytes()


def test_promotion_into_a_signed_lane_verifies_the_envelopes(
    project: Path, wheels: list[Path]
) -> None:
    assert cli(project, "publish-lane", "--bundle", BUNDLE, "--lane", "open").exit_code == 0
    refused = cli(project, "promote", "--bundle", BUNDLE, "--lane", "signed")
    assert refused.exit_code == 1 and "lane signed requires signed wheels" in refused.stderr
    assert not (project / "dist" / "lanes" / "signed").exists()
    team = str(project / "keys" / "team.pem")
    assert cli(project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY=team).exit_code == 0
    promoted = cli(project, "promote", "--bundle", BUNDLE, "--lane", "signed")
    assert promoted.exit_code == 0, promoted.output
    for wheel in wheels:
        assert (project / "dist" / "lanes" / "signed" / attest.envelope_name(wheel.name)).is_file()


def test_a_lane_that_requires_signatures_names_its_key(project: Path) -> None:
    (project / "build" / "lanes.toml").write_text(
        '[lanes.validation]\npath = "dist/lanes/validation"\nrequire-signature = true\n'
    )
    result = cli(project, "publish-lane", "--bundle", BUNDLE)
    assert result.exit_code == 2 and "require-signature = true needs signing-public-key" in (
        result.stderr
    )


@pytest.mark.slow
def test_verify_install_and_doctor_verify_with_the_team_public_key(
    project: Path, wheels: list[Path], tmp_path: Path
) -> None:
    team_public = project / "keys" / "team.pub.pem"
    team = str(project / "keys" / "team.pem")
    assert cli(project, "attest", "--bundle", BUNDLE, XLA_WHEELS_SIGNING_KEY=team).exit_code == 0
    verified = cli(project, "verify-install", "--bundle", BUNDLE, "--public-key", str(team_public))
    assert verified.exit_code == 0, verified.output
    for wheel in wheels:
        assert re.search(rf"ok +signature {re.escape(wheel.name)} ", verified.stdout)
    # verify-install reads the installed SBOMs too.
    assert re.search(
        r"ok +sbom torch_xla +torch_xla-\S+/sboms/xla-wheels.cdx.json", verified.stdout
    )
    assert "FAIL" not in verified.stdout

    _, stranger = make_key(tmp_path / "stranger", "stranger")
    refused = cli(project, "verify-install", "--bundle", BUNDLE, "--public-key", str(stranger))
    assert refused.exit_code == 1
    assert "does not verify with the team's public key" in refused.stdout

    python = host_venv(tmp_path, wheels)
    cache = tmp_path / f"xla_cache_{BUNDLE}_txla{XLA_VERSION}"  # the contract's name
    cache.mkdir()
    env = {
        "PJRT_DEVICE": "TPU",
        "XLA_NO_SPECIAL_SCALARS": "1",
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
    }
    doctor = ("doctor", "--bundle", BUNDLE, "--python", str(python))
    healthy = cli(project, *doctor, "--public-key", str(team_public), **env)
    assert healthy.exit_code == 0, healthy.output
    assert f"signature {wheels[1].name}" in healthy.stdout
    _tamper_payload(envelope(project, wheels[1]))
    tampered = cli(project, *doctor, "--public-key", str(team_public), **env)
    assert tampered.exit_code == 1, tampered.output
    assert re.search(
        rf"FAIL signature {re.escape(wheels[1].name)} .*does not verify", tampered.stdout
    )
