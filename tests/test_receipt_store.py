"""Receipts come home without git: a lane's receipt store (a directory, a WebDAV server;
gs:// in tests/test_gcs_store.py), promotion and compare reading from it, and signed
receipts.

Real parts: WsgiDAV (pinned in tests/webdav-requirements.txt) on loopback with basic auth,
started once for this module; openssl signs on the "host" side and securesystemslib
verifies on the promoting side; lanes are static directories with stand-in wheels (no
torch_xla: the receipts are written here, as the gate would write them, for exactly the
locked files).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests import webdav_server
from tests.clirunner import run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
)
from xla_host import receipt_store, receipts
from xla_host.errors import ExitCode, UsageError
from xla_host.installed import WheelMatch
from xla_host.net import NetworkPolicy
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.cli import main
from xla_wheels.release import lanes, promote
from xla_wheels.wheels_lock import read_lock

USER = "gate-uploader"


@pytest.fixture(scope="module")
def dav(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[webdav_server.WebDavServer, str]]:
    password = "pw-" + secrets.token_hex(8)
    server = webdav_server.start(tmp_path_factory.mktemp("dav") / "root", USER, password)
    try:
        yield server, password
    finally:
        webdav_server.stop(server)


def _credentials(password: str) -> dict[str, str]:
    return {receipt_store.USERNAME_ENV: USER, receipt_store.PASSWORD_ENV: password}


def _receipt(project: Path, created: str = "2026-11-26T08:00:00Z") -> receipts.Receipt:
    """A passing CPU gate receipt for exactly the bundle's locked files."""
    records = read_lock(project / "wheels.lock").entry(BUNDLE).wheels or ()
    wheels = tuple(
        WheelMatch(r.name, r.sha256, parse_wheel_name(r.name).project,
                   str(parse_wheel_name(r.name).version), True, 1)
        for r in records
    )  # fmt: skip
    restart = receipts.CheckEvidence("restart", True, (), {"warm_ready_s": 1.0})
    return receipts.Receipt(
        kind="gate", bundle=BUNDLE, created=created, host="tpu-vm-0", device="CPU", chip=None,
        workload="mlp-small", versions={"torch": "2.9.0", "torch_xla": "2.9.0"},
        wheels_match_lock=True, wheels=wheels, problems=(), checks=(restart,),
    )  # fmt: skip


def _lanes(project: Path, store: str, policy: str = "") -> None:
    (project / "build" / "lanes.toml").write_text(
        f'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
        f'receipts = "{store}"\n\n[lanes.staging]\npath = "dist/lanes/staging"\n'
        'promote-from = "validation"\n\n[lanes.staging.policy]\ndevice = "CPU"\n'
        f'checks = ["restart"]\n{policy}'
    )
    assert main(["publish-lane", "--root", str(project), "--bundle", BUNDLE]) == 0


def _promote(project: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["promote", "--root", str(project), "--bundle", BUNDLE, "--lane", "staging"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# --- the WebDAV store ------------------------------------------------------------------


# Slow: the first test of the module starts WsgiDAV (about 5 s).
@pytest.mark.slow
def test_webdav_put_list_get_and_a_receipt_is_never_replaced(
    dav: tuple[webdav_server.WebDavServer, str],
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, password = dav
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    receipt = _receipt(project)
    # A store under a collection that does not exist yet: it is made (MKCOL) on first put.
    store = receipt_store.store_for(server.url + "team/receipts", environ=_credentials(password))
    first = store.put(receipt)
    assert first == f"{BUNDLE}/{receipts.receipt_file_name(receipt)}"
    assert store.list(BUNDLE) == [first]
    assert store.get(first) == receipts.render(receipt).encode()
    # On the server's disk: <store>/<bundle>/<file>, as the layout says.
    assert (server.root / "team" / "receipts" / first).read_bytes() == store.get(first)
    second = store.put(receipt)
    assert second == first.replace(".json", "-2.json")
    # A listing that is out of date (another gate uploaded meanwhile) still never replaces:
    # the PUT asks the server to refuse an existing name (If-None-Match: *).
    monkeypatch.setattr(store, "list", lambda bundle: [])
    third = store.put(receipt)
    assert third == first.replace(".json", "-2.json").replace("-2.json", "-3.json")
    assert len(list((server.root / "team" / "receipts" / BUNDLE).glob("*.json"))) == 3
    read = store.receipts(BUNDLE)
    assert all(r.digest_ok and r.origin and r.origin.startswith(server.url) for r in read)
    assert store.list("another-bundle") == []


@pytest.mark.slow
def test_a_wrong_password_is_named_and_never_shown(
    dav: tuple[webdav_server.WebDavServer, str],
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    server, password = dav
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    _lanes(project, server.url + "receipts/")
    wrong = "wrong-" + secrets.token_hex(8)
    result = run_cli(
        "compare", BUNDLE, BUNDLE, root=project, inherit_env=True,
        env={**_credentials(wrong)}, timeout=120,
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "refused the request with the credentials given (HTTP 401)" in result.stderr
    assert f"fix: set {receipt_store.USERNAME_ENV} and {receipt_store.PASSWORD_ENV}" in (
        result.stderr
    )
    assert wrong not in result.output and password not in result.output
    assert "Traceback" not in result.output


def test_a_store_that_does_not_answer_ends_with_exit_8(tmp_path: Path) -> None:
    from tests.servers import free_port

    # The one network client's policy: a refused connection is tried again, then named.
    network = NetworkPolicy(retries=1, backoff_s=0.1)
    password = "pw-" + secrets.token_hex(4)
    url = f"http://127.0.0.1:{free_port()}/receipts/"
    store = receipt_store.WebDavStore(url, USER, password, network)
    with pytest.raises(receipt_store.StoreTimedOut) as raised:
        store.list(BUNDLE)
    assert raised.value.exit_code == ExitCode.TIMED_OUT
    assert "the receipt store refused the connection" in raised.value.message
    assert "(2 attempt(s))" in raised.value.message
    assert password not in str(raised.value)


@pytest.mark.slow
def test_promote_and_compare_read_the_receipt_from_the_webdav_store(
    dav: tuple[webdav_server.WebDavServer, str],
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server, password = dav
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    url = f"{server.url}promote-{secrets.token_hex(4)}/"
    _lanes(project, url)
    for name, value in _credentials(password).items():
        monkeypatch.setenv(name, value)
    code, out = _promote(project, capsys)
    assert code == 1 and f"no receipt for bundle {BUNDLE}" in out
    assert f'GATE_ARGS="--receipts {url}"' in out  # the fix names the store
    # The gate on a host without the checkout uploads its receipt; the checkout has none.
    name = receipt_store.store_for(url).put(_receipt(project))
    assert not (project / "receipts").exists()
    assert main(["compare", "--root", str(project), BUNDLE, BUNDLE]) == 0
    assert f"A: {url}{name}" in capsys.readouterr().out
    monkeypatch.setenv("XLA_WHEELS_DRY_RUN", "1")
    code, out = _promote(project, capsys)
    monkeypatch.delenv("XLA_WHEELS_DRY_RUN")
    assert code == 0 and f"would be kept as receipts/{name}" in out, out
    assert not (project / "receipts").exists()  # a dry run changes nothing
    code, out = _promote(project, capsys)
    assert code == 0, out
    assert f"read from {url}{name}; kept as receipts/{name}" in out
    # Now in the checkout and in the store: one receipt, counted once.
    stores = lanes.load_config(project).receipt_stores
    assert len(promote.bundle_evidence(project, BUNDLE, stores)) == 1
    # It came home byte for byte, and lanes.lock names the checkout's copy.
    home = project / "receipts" / name
    assert home.read_bytes() == (server.root / url.rsplit("/", 2)[1] / name).read_bytes()
    state = lanes.read_state(project)["staging"]
    assert state.bundle == BUNDLE and state.receipt == f"receipts/{name}"
    assert state.receipt_digest == receipts.read_receipt(home).digest


# --- the directory store, gs://, bad locations -------------------------------------------


def test_the_directory_store_writes_by_link_and_reads_back(tmp_path: Path) -> None:
    project = make_project_stub(tmp_path)
    store = receipt_store.store_for("store", root=project)
    assert isinstance(store, receipt_store.DirectoryStore)
    assert store.root == project / "store"  # relative to the checkout
    receipt = replace(_stub_receipt(), bundle=BUNDLE)
    names = [store.put(receipt), store.put(receipt)]
    assert names[1] == names[0].replace(".json", "-2.json")
    assert store.list(BUNDLE) == sorted(names)
    # Nothing half-written is left beside them.
    assert sorted(p.name for p in (project / "store" / BUNDLE).iterdir()) == sorted(
        n.split("/")[1] for n in names
    )
    assert [r.digest_ok for r in store.receipts(BUNDLE)] == [True, True]
    with pytest.raises(UsageError):
        store.put(replace(receipt, bundle=None))
    # A file of the store that is not a receipt is named by where it is in the store.
    junk = store.put_bytes(BUNDLE, "20261126T090000Z-cpu-gate.json", b'{"receipt-version": "0"}')
    with pytest.raises(receipts.ReceiptError, match=f"{project / 'store' / junk} has receipt-ve"):
        store.receipts(BUNDLE)


def make_project_stub(tmp_path: Path) -> Path:
    project = tmp_path / "checkout"
    project.mkdir()
    return project


def _stub_receipt() -> receipts.Receipt:
    return receipts.Receipt(
        kind="gate", bundle=BUNDLE, created="2026-11-26T08:00:00Z", host="h", device="CPU",
        chip=None, workload="mlp-small", versions={}, wheels_match_lock=False, wheels=(),
        problems=("none",), checks=(),
    )  # fmt: skip


@pytest.mark.slow
def test_a_bad_store_location_is_bad_input_and_credentials_in_it_are_never_shown(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    for location, problem in (
        ("ftp://host/receipts", "cannot be a ftp:// URL"),
        ("https:///receipts", "names no host"),
        ("gs://", "names no bucket"),
    ):
        with pytest.raises(UsageError, match=problem):
            receipt_store.parse_location(location)
    with pytest.raises(UsageError) as raised:
        receipt_store.parse_location("https://me:hunter22@dav.example/receipts/")
    assert "hunter22" not in str(raised.value) and "carries credentials" in raised.value.message
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    (project / "build" / "lanes.toml").write_text(
        '[lanes.validation]\npath = "x"\nreceipts = "ftp://host/receipts"\n'
    )
    bad = run_cli("status", root=project, inherit_env=True, timeout=120)
    assert bad.exit_code == 2, bad.output
    assert "key 'lanes.validation.receipts': ftp://host/receipts: a receipt store cannot be" in (
        bad.stderr
    )


# --- signed receipts -----------------------------------------------------------------------


def _keypair(directory: Path, name: str) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{name}.pem", directory / f"{name}.pub"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)], check=True
    )
    subprocess.run(
        ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)], check=True
    )
    return private, public


def test_a_lane_that_requires_signed_receipts(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    team, _ = _keypair(project / "keys", "gate")
    stranger, _ = _keypair(tmp_path / "elsewhere", "stranger")
    _lanes(
        project,
        "receipt-store",
        'require-signed-receipts = true\nreceipt-keys = ["keys/gate.pub"]\n',
    )
    store = receipt_store.store_for("receipt-store", root=project)
    held = project / "receipt-store" / BUNDLE

    def attempt(raw: bytes | None = None, **put: Path) -> tuple[int, str]:
        shutil.rmtree(held, ignore_errors=True)
        if raw is None:
            store.put(_receipt(project), **put)
        else:
            store.put_bytes(BUNDLE, "20261126T080000Z-cpu-gate.json", raw)
        return _promote(project, capsys)

    code, out = attempt()
    assert code == 1 and "signature: 20261126T080000Z-cpu-gate.json is unsigned" in out
    code, out = attempt(sign_key=stranger)
    assert code == 1 and "its signature does not verify with any of gate.pub" in out
    # An edit re-sealed with a fresh digest (what anyone can do) is caught by the signature.
    name = store.put(_receipt(project), sign_key=team)
    envelope = json.loads(store.get(name))
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["checks"][0]["figures"]["warm_ready_s"] = 0.5
    del payload["digest"]
    payload["digest"] = receipts.canonical_digest(payload)
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    code, out = attempt(json.dumps(envelope).encode())
    assert code == 1 and "does not verify" in out and "seal" not in out
    code, out = attempt(sign_key=team)
    assert code == 0, out
    # The checkout's copy is the envelope itself: it still verifies there.
    state = lanes.read_state(project)["staging"]
    home = receipts.read_receipt(project / str(state.receipt))
    assert home.envelope is not None and home.digest_ok
    # The same receipt also unsigned beside it: it counts once, as the signed copy.
    receipt = receipts.read_receipt(project / str(state.receipt)).receipt
    (project / "receipts" / BUNDLE / "0-unsigned.json").write_text(receipts.render(receipt))
    stores = lanes.load_config(project).receipt_stores
    (counted,) = promote.bundle_evidence(project, BUNDLE, stores)
    assert counted.envelope is not None


# --- the gate's upload -------------------------------------------------------------------


@pytest.mark.slow
def test_the_gate_sends_its_written_receipt_home_signed(
    dav: tuple[webdav_server.WebDavServer, str],
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, password = dav
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    private, public = _keypair(tmp_path / "keys", "gate")
    written = receipts.write_receipt(
        receipts.receipt_path(project, _receipt(project)), _receipt(project)
    )
    for name, value in _credentials(password).items():
        monkeypatch.setenv(name, value)
    url = f"{server.url}gate-{secrets.token_hex(4)}/"
    upload = receipt_store.Upload.checked(url, private, BUNDLE)
    sent = upload.send(written)
    assert sent == f"{url}{BUNDLE}/{written.name}"
    (home,) = receipt_store.store_for(url).receipts(BUNDLE)
    # The same receipt, inside an envelope the builder side verifies with the public key.
    assert home.digest == receipts.read_receipt(written).digest and home.envelope is not None
    from xla_wheels.release import receipt_trust

    assert receipt_trust.signature_problems([home], [public]) == [None]
    # A store that does not answer: the step ends (exit 8) and says where the receipt is.
    from tests.servers import free_port

    down_url = f"http://127.0.0.1:{free_port()}/r/"
    quick = NetworkPolicy(retries=0)
    with pytest.raises(receipt_store.StoreTimedOut):
        receipt_store.Upload.checked(down_url, None, BUNDLE, network=quick)  # before a gate run
    down = receipt_store.Upload(down_url, None, quick)  # one that went down during the run
    with pytest.raises(receipt_store.StoreTimedOut) as raised:
        down.send(written)
    assert f"(the receipt is kept at {written})" in raised.value.message


def test_the_gate_refuses_a_store_it_cannot_use_before_it_runs(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    for extra, problem in (
        (["--receipts", "ftp://host/receipts", "--bundle", BUNDLE], "cannot be a ftp:// URL"),
        (["--receipts", "store"], "is not a bundle name"),
        (["--receipts", "store", "--bundle", BUNDLE, "--sign-key", "none.pem"], "not a file"),
    ):
        result = run_cli(
            "gate", "--python", "/nonexistent/python", *extra, root=project, inherit_env=True,
            timeout=120,
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert problem in result.stderr
        assert not (project / "store").exists()


def test_the_gate_proves_the_store_takes_writes_before_any_child_starts(
    dav: tuple[webdav_server.WebDavServer, str],
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    server, password = dav
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    store = server.url + "checked/receipts/"
    wrong = "wrong-" + secrets.token_hex(8)
    # No interpreter to judge: a gate that got past the store check would exit 2 for it.
    args = ("gate", "--python", "/nonexistent/python", "--receipts", store, "--bundle", BUNDLE)
    refused = run_cli(*args, root=project, inherit_env=True, env=_credentials(wrong), timeout=120)
    assert refused.exit_code == 1, refused.output
    assert "refused the request with the credentials given (HTTP 401)" in refused.stderr
    assert "/nonexistent/python" not in refused.stderr
    assert wrong not in refused.output and password not in refused.output
    accepted = run_cli(
        *args, root=project, inherit_env=True, env=_credentials(password), timeout=120
    )
    assert accepted.exit_code == 2 and "/nonexistent/python" in accepted.stderr, accepted.output
    # The check wrote and deleted a file of its own: the store holds no receipt, no leftover.
    listed = receipt_store.store_for(store, environ=_credentials(password))
    assert listed.list(BUNDLE) == []
    assert [p.name for p in (server.root / "checked" / "receipts" / BUNDLE).iterdir()] == []


def test_status_shows_store_receipts_and_names_a_store_that_does_not_answer(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.servers import free_port

    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    _lanes(project, "receipt-store")
    name = receipt_store.store_for("receipt-store", root=project).put(_receipt(project))
    capsys.readouterr()
    assert main(["status", "--root", str(project)]) == 0
    out = capsys.readouterr().out
    assert f"receipt {project / 'receipt-store' / name}: passed on CPU" in out
    assert "promotion into staging: would be admitted" in out
    down = f"http://127.0.0.1:{free_port()}/receipts/"
    with (project / "build" / "lanes.toml").open("a") as lanes_toml:
        lanes_toml.write(f'\n[lanes.offline]\npath = "dist/lanes/offline"\nreceipts = "{down}"\n')
    assert main(["status", "--root", str(project), "--net-retries", "0"]) == 1
    out = capsys.readouterr().out
    assert (
        f"UNREAD: receipt store {down}: PROPFIND {down}{BUNDLE}/: the receipt store refused the "
        "connection" in out
    )
    assert "promotion into staging: would be admitted" in out  # the rest is still judged


def test_signed_receipts_need_keys_and_keys_need_the_requirement(tmp_path: Path) -> None:
    (tmp_path / "build" / "bundles").mkdir(parents=True)
    for rules in ("require-signed-receipts = true\n", 'receipt-keys = ["keys/gate.pub"]\n'):
        (tmp_path / "build" / "lanes.toml").write_text(
            f'[lanes.validation]\npath = "x"\n[lanes.validation.policy]\n{rules}'
        )
        with pytest.raises(lanes.LaneFileError, match="require-signed-receipts = true needs"):
            lanes.load_config(tmp_path)
    (tmp_path / "build" / "lanes.toml").write_text(
        '[lanes.validation]\npath = "x"\nreceipts = "store"\n[lanes.validation.policy]\n'
        'require-signed-receipts = true\nreceipt-keys = ["keys/gate.pub"]\n'
    )
    config = lanes.load_config(tmp_path)
    assert config.lane("validation").policy.receipt_keys == (tmp_path / "keys" / "gate.pub",)
    assert config.receipt_stores == (str(tmp_path / "store"),)
    shown = run_cli("lanes", root=tmp_path, inherit_env=True, timeout=120)
    assert shown.exit_code == 0, shown.output
    assert f"  receipts: {tmp_path / 'store'}\n" in shown.stdout
    assert "signed-receipts=gate.pub" in shown.stdout


def test_a_key_the_host_cannot_sign_with_is_named_at_once(tmp_path: Path) -> None:
    from xla_host import receipt_signing

    encrypted, rsa = tmp_path / "encrypted.pem", tmp_path / "rsa.pem"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-aes256", "-pass", "pass:secret",
         "-out", str(encrypted)], check=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:1024",
         "-out", str(rsa)], check=True, capture_output=True,
    )  # fmt: skip
    # An encrypted key fails without waiting for a passphrase nobody types on a TPU VM (no
    # terminal here, so openssl would fail anyway: the commands are checked as data too).
    plan = receipt_signing.sign_plan(encrypted, tmp_path / "m", tmp_path / "s")
    assert all(argv[argv.index("-passin") + 1] == "pass:" for argv in plan)
    with pytest.raises(UsageError, match=f"openssl could not use the signing key {encrypted}"):
        receipt_signing.sign(b"{}", encrypted)
    with pytest.raises(UsageError, match=f"the signing key {rsa} is not an ed25519 key"):
        receipt_signing.sign(b"{}", rsa)


def test_the_host_gate_proves_the_store_before_any_child_starts(
    dav: tuple[webdav_server.WebDavServer, str], tmp_path: Path
) -> None:
    # `xla-host gate` on a host without the checkout: the bundle's document as a file, the
    # project's own interpreter standing for the training environment (no child starts).
    import sys

    from xla_host import bundle_document as doc

    server, password = dav
    document = doc.BundleDocument(
        BUNDLE, "validation", "3.11",
        (doc.LockedFile("torch_xla-2.9.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 10),),
    )  # fmt: skip
    path = tmp_path / "document.json"
    path.write_bytes(doc.dumps(document))
    out = tmp_path / "out" / "gate"
    store = server.url + "host-gate/receipts/"
    wrong = "wrong-" + secrets.token_hex(8)
    result = subprocess.run(
        [sys.executable, "-m", "xla_host", "gate", "--bundle-document", str(path),
         "--bundle-sha256", doc.sha256_of(path.read_bytes()), "--python", sys.executable,
         "--device", "CPU", "--out", str(out), "--receipts", store],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **_credentials(wrong)},
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # Exit 1 (docs/exit-codes.md: StoreError), with the store's answer and its fix.
    assert result.returncode == ExitCode.FAILED, result.stdout + result.stderr
    assert "refused the request with the credentials given (HTTP 401)" in result.stderr
    assert f"fix: set {receipt_store.USERNAME_ENV} and {receipt_store.PASSWORD_ENV}" in (
        result.stderr
    )
    assert wrong not in result.stdout + result.stderr
    assert password not in result.stdout + result.stderr
    # No child ran: the gate's run directory (its children's logs) was never made.
    assert not (tmp_path / "out").exists()
    assert not (server.root / "host-gate" / "receipts" / BUNDLE).exists() or not any(
        (server.root / "host-gate" / "receipts" / BUNDLE).iterdir()
    )


# --- a kind of store of one's own ----------------------------------------------------------


@dataclass
class MountStore(receipt_store.DirectoryStore):
    """A kind of store this test adds: ``mount://<name>`` is the directory ``<name>`` of
    ``$TEST_RECEIPT_MOUNTS`` (a stand-in for a bucket: a subclass, its schemes, its form,
    how a location is checked and opened)."""

    schemes = ("mount",)
    form = '"mount://<name>"'

    @classmethod
    def checked(cls, value: str, root: Path | None) -> str:
        if not urllib.parse.urlsplit(value).netloc:
            raise UsageError(f"{value} names no mount", fix="write mount://<name>")
        return value

    @classmethod
    def opened(
        cls, location: str, environ: Mapping[str, str], network: NetworkPolicy
    ) -> receipt_store.ReceiptStore:
        return cls(Path(environ["TEST_RECEIPT_MOUNTS"]) / urllib.parse.urlsplit(location).netloc)


def test_a_new_kind_of_store_is_a_subclass_and_its_place_in_the_registry(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(receipt_store, "STORE_KINDS", (*receipt_store.STORE_KINDS, MountStore))
    monkeypatch.setenv("TEST_RECEIPT_MOUNTS", str(tmp_path / "mounts"))
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    # Chosen by its scheme, from lanes.toml as from the command line; its own form checked.
    _lanes(project, "mount://team")
    (location,) = lanes.load_config(project).receipt_stores
    store = receipt_store.store_for(location, root=project)
    assert isinstance(store, MountStore) and store.root == tmp_path / "mounts" / "team"
    with pytest.raises(UsageError, match="names no mount"):
        receipt_store.parse_location("mount://")
    # Every kind's form in the fix of a location of no known kind, the new one included.
    with pytest.raises(UsageError) as unknown:
        receipt_store.parse_location("ftp://host/receipts")
    assert '"mount://<name>"' in str(unknown.value.fix) and '"gs://' in str(unknown.value.fix)
    # The rest of the code never asks which kind: promote reads the receipt from it.
    name = store.put(_receipt(project))
    (found,) = promote.bundle_evidence(project, BUNDLE, [location])
    assert found.origin == f"{tmp_path / 'mounts' / 'team'}/{name}"
