"""Cloud Storage for real: a gs:// receipt store (and, below, a lane's gs:// pack store)
against a real server on loopback, through the real client library.

Real parts: fake-gcs-server (tests/gcs_support.py: what it does and does not emulate),
started once per run (the ``gcs_emulator`` session fixture) and reached by
google-cloud-storage through ``STORAGE_EMULATOR_HOST``; a loopback server that answers
403 stands for a bucket the account may not use (the emulator has no IAM), and
tests/network_faults_support.py's SilentServer for a bucket that never answers. Each test
makes its own bucket. A lane on a package index is a real pypiserver on loopback
(tests/gcs_support.py ``index_lane_with_bucket``), and the host that fetches from it a
fresh venv with only the host wheel and google-cloud-storage (``gcs_host_python``), its
command line run with ``-I``.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import servers
from tests.clirunner import CliResult
from tests.gcs_support import DeniedServer, GcsEmulator
from tests.gitrepos import REPO_ROOT
from tests.network_faults_support import SilentServer
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    fake_wheels,  # noqa: F401 - fixture
    make_publish_project,
)
from tests.test_cache_pack import cache_entry, host_cli, host_python, keypair, listing, manifest
from tests.test_receipt_store import _keypair, _lanes, _promote, _receipt
from xla_host import cache_pack, gcs, receipt_signing, receipt_store, receipts
from xla_host.errors import ExitCode, PipelineError
from xla_host.net import NetworkPolicy, NetworkTimedOut
from xla_wheels.cli import main
from xla_wheels.release import lane_packs as lane_store
from xla_wheels.release import lanes

__all__ = ["host_python"]  # the fixture, shared with test_cache_pack.py

HOST_SRC = REPO_ROOT / "host" / "src"
QUICK = NetworkPolicy(timeout_s=1.0, retries=1, backoff_s=0.1)


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket of the emulator, the library pointed at it."""
    monkeypatch.setenv(gcs.EMULATOR_ENV, gcs_emulator.host)
    return gcs_emulator.make_bucket(f"b-{secrets.token_hex(6)}")


def test_receipts_go_into_a_bucket_and_promotion_reads_them_from_it(
    bucket: str,
    tmp_path: Path,
    fake_wheels: FakeWheels,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    team, _ = _keypair(project / "keys", "gate")
    url = f"gs://{bucket}/team/receipts"
    _lanes(project, url, 'require-signed-receipts = true\nreceipt-keys = ["keys/gate.pub"]\n')
    store = receipt_store.store_for(url)
    assert isinstance(store, receipt_store.GcsStore)
    store.check_writable(BUNDLE)  # the bucket answers and may be listed
    # An edit re-sealed with a fresh digest, uploaded first: the signature refuses it.
    receipt = _receipt(project)
    name = f"{BUNDLE}/{receipts.receipt_file_name(receipt)}"
    envelope = json.loads(receipt_signing.sign(receipts.render(receipt).encode(), team))
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["checks"][0]["figures"]["warm_ready_s"] = 0.5
    del payload["digest"]
    payload["digest"] = receipts.canonical_digest(payload)
    envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    assert store.put_bytes(BUNDLE, name.split("/")[1], json.dumps(envelope).encode()) == name
    code, out = _promote(project, capsys)
    assert code == 1 and "does not verify" in out, out
    # The genuine receipt, uploaded under the same name: the bucket keeps the first one
    # (create-only), and the genuine one is numbered -2 beside it.
    second = store.put(_receipt(project), sign_key=team)
    assert second == name.replace(".json", "-2.json")
    assert sorted(store.list(BUNDLE)) == sorted([name, second])
    assert json.loads(store.get(name)) == envelope  # never replaced
    code, out = _promote(project, capsys)
    assert code == 0, out
    assert f"read from {url}/{second}; kept as receipts/{second}" in out
    home = project / "receipts" / second
    assert home.read_bytes() == store.get(second)  # byte for byte
    state = lanes.read_state(project)["staging"]
    assert state.receipt == f"receipts/{second}"


def test_two_writers_of_one_name_end_with_one_object_and_a_refusal(bucket: str) -> None:
    client = gcs.bucket_at(f"gs://{bucket}/race", QUICK, fix="")
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def write(data: bytes) -> None:
        start.wait()
        try:
            client.create("one-name.json", data)
            outcomes.append(f"created {data[:1].decode()}")
        except gcs.ObjectExists as refused:
            assert refused.exit_code == ExitCode.FAILED
            assert "never replaces" in refused.message
            outcomes.append("refused")

    writers = [threading.Thread(target=write, args=(c * 4096,)) for c in (b"A", b"B")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(outcomes)[1] == "refused", outcomes
    winner = outcomes[0] if outcomes[0] != "refused" else outcomes[1]
    assert client.read("one-name.json", max_bytes=8192)[0] == winner[-1].encode() * 4096
    assert client.list("") == ["one-name.json"]
    # The same bytes again (a retried upload whose answer was lost) is no refusal.
    assert client.create("one-name.json", winner[-1].encode() * 4096) is False
    # Two gates' receipts under one name through the store: both kept, numbered.
    store = receipt_store.GcsStore(f"gs://{bucket}/race", QUICK)
    names: list[str] = []
    barrier = threading.Barrier(2)

    def gate(host: str) -> None:
        barrier.wait()
        names.append(store.put_bytes(BUNDLE, "r.json", json.dumps({"host": host}).encode()))

    gates = [threading.Thread(target=gate, args=(h,)) for h in ("a", "b")]
    for thread in gates:
        thread.start()
    for thread in gates:
        thread.join()
    assert sorted(names) == [f"{BUNDLE}/r-2.json", f"{BUNDLE}/r.json"]
    assert {json.loads(store.get(n))["host"] for n in names} == {"a", "b"}


def test_a_bucket_that_does_not_exist_or_denies_access_is_exit_1(
    gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gcs.EMULATOR_ENV, gcs_emulator.host)
    store = receipt_store.GcsStore("gs://no-such-bucket-here/receipts", QUICK)
    with pytest.raises(PipelineError) as raised:
        store.check_writable(BUNDLE)
    assert raised.value.exit_code == ExitCode.FAILED
    assert "the bucket no-such-bucket-here does not exist" in raised.value.message
    denied = DeniedServer()
    try:
        monkeypatch.setenv(gcs.EMULATOR_ENV, denied.host)
        for call in (lambda: store.list(BUNDLE), lambda: store.put_bytes(BUNDLE, "r.json", b"{}")):
            with pytest.raises(PipelineError) as raised:
                call()
            assert raised.value.exit_code == ExitCode.FAILED
            assert "Cloud Storage denied the request (HTTP 403" in raised.value.message
            assert "roles/storage.objectCreator" in str(raised.value.fix)
    finally:
        denied.close()


def test_a_silent_bucket_ends_with_exit_8_within_the_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    silent = SilentServer()
    try:
        monkeypatch.setenv(gcs.EMULATOR_ENV, silent.base)
        store = receipt_store.GcsStore("gs://team/receipts", QUICK)
        began = time.monotonic()
        with pytest.raises(NetworkTimedOut) as raised:
            store.put_bytes(BUNDLE, "r.json", b"{}")
        took = time.monotonic() - began
        assert raised.value.exit_code == ExitCode.TIMED_OUT
        assert "2 attempts" in raised.value.message
        # Two attempts of the idle timeout (1 s) and one backoff (0.1 s), not the
        # library's own retries (minutes): bounded by the project's policy.
        assert took < 6, took
        # Each attempt reached the server (the library may open two connections in one).
        assert 2 <= silent.connections() <= 4
    finally:
        silent.close()


def test_without_the_client_library_a_gs_address_names_the_pip_line(tmp_path: Path) -> None:
    # The host package alone, site-packages off (as on a host without the library).
    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(HOST_SRC)!r})\n"
        "from xla_host import gcs, receipt_store\n"
        "try:\n"
        "    receipt_store.store_for('gs://team/receipts').list('b')\n"
        "except gcs.NoClientLibrary as error:\n"
        "    print(int(error.exit_code), error.message, error.fix)\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("2 a gs:// address is reached through"), done.stdout
    assert gcs.PIP_INSTALL in done.stdout


# --- a lane's pack store in a bucket ---------------------------------------------------


def _pack_of(tmp: Path, key: Path, bundle: str, created: str) -> tuple[Path, cache_pack.Manifest]:
    cache = tmp / f"cold-{created[:7]}"
    cache.mkdir()
    for i, size in enumerate((50_000, 1_200)):
        (cache / f"{1234567890123 + i}").write_bytes(cache_entry(os.urandom(size)))
    return cache_pack.write_pack(
        tmp / f"packs-{created[:7]}", cache, key, manifest(bundle=bundle, created=created)
    )


def test_a_pack_goes_into_a_lanes_bucket_and_a_host_fetches_it_by_the_lanes_address(
    bucket: str,
    gcs_emulator: GcsEmulator,
    tmp_path: Path,
    fake_wheels: FakeWheels,  # noqa: F811
    host_python: Path,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    store = f"gs://{bucket}/team/packs"
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
        f'packs = "{store}"\n\n[lanes.preferred]\nindex-url = "http://127.0.0.1:9/simple/"\n'
        f'packs = "{store}/preferred"\npromote-from = "validation"\n'
    )
    assert main(["publish-lane", "--root", str(project), "--bundle", BUNDLE]) == 0
    config = lanes.load_config(project)
    lane = config.lane("validation")
    assert lane.backend.named_pack_store() == store
    document = json.loads(
        (project / "dist/lanes/validation/bundles" / f"{BUNDLE}.json").read_text()
    )
    assert document["packs"] == store  # a host needs only the lane's address
    private, public = keypair(tmp_path, "packs")
    older, older_manifest = _pack_of(tmp_path, private, BUNDLE, "2026-01-01T00:00:00Z")
    first = lane_store.publish_pack(lane, older, older_manifest, {BUNDLE: "serves"})
    pack, full = _pack_of(tmp_path, private, BUNDLE, "2026-02-01T00:00:00Z")
    published = lane_store.publish_pack(lane, pack, full, {BUNDLE: "serves"})
    # Retention in the bucket: only the newest pack of the bundle, workload and topology.
    assert [r for r, _ in published.removed] == [first.row]
    objects = gcs.bucket_at(store, QUICK, fix="")
    assert objects.list("packs/") == ["packs/index.json", published.row.path]
    assert objects.read(published.row.path, max_bytes=1 << 20)[0] == pack.read_bytes()
    # Promotion's copy by hash into a lane on a package index: its own bucket prefix.
    copied = lane_store.copy_packs(lane, config.lane("preferred"), BUNDLE, {BUNDLE: "serves"})
    assert [c.row.sha256 for c in copied] == [published.row.sha256]
    assert lane_store.read_index(config.lane("preferred"))[0] == [published.row]
    # The host: the lane served over HTTP, the pack from the bucket its document names.
    directory = project / "dist" / "lanes" / "validation"
    server, url = servers.start_directory_server(directory, tmp_path / "http.log")
    try:

        def fetch(into: Path) -> CliResult:
            return host_cli(
                "cache", "fetch", "--lane", url, "--bundle", BUNDLE, "--workload", "small",
                "--into", str(into), "--key", str(public), "--python", str(host_python),
                "--device", "CPU", "--topology", "cpu-1x1",
                env={gcs.EMULATOR_ENV: gcs_emulator.host},
            )  # fmt: skip

        into = tmp_path / "host" / "cache"
        done = fetch(into)
        assert done.exit_code == 0, done.output
        assert listing(into) == listing(tmp_path / "cold-2026-02")
        # A tampered object (one byte of the tar's end blocks flipped, put back in the
        # bucket under its hash's name): refused by hash, nothing installed.
        raw = bytearray(pack.read_bytes())
        raw[-1] ^= 0x01
        objects.delete(published.row.path)
        assert objects.create(published.row.path, bytes(raw)) is True
        again = tmp_path / "host2" / "cache"
        done = fetch(again)
        assert done.exit_code == 1, done.output
        assert "is not the pack the lane's index names" in done.stderr
        assert not again.exists()
    finally:
        servers.stop(server)


# --- a lane on a package index, its packs in a bucket: a fresh host needs its address ---


def test_a_pack_in_an_index_lanes_bucket_reaches_a_fresh_host_by_cache_fetch_and_launch_env(
    bucket: str,
    gcs_emulator: GcsEmulator,
    tmp_path: Path,
    fake_wheels: FakeWheels,  # noqa: F811
    host_python: Path,
    gcs_host_python: Path,
) -> None:
    from tests.gcs_support import index_lane_with_bucket
    from xla_host import bundle_document as doc
    from xla_host.launch_profile import LaunchProfile

    with index_lane_with_bucket(
        tmp_path, [fake_wheels.torch, fake_wheels.torch_xla], gcs_emulator, bucket
    ) as lane:
        config = lanes.load_config(lane.project)
        assert config.lane("validation").backend.named_pack_store() == lane.store
        private, public = keypair(tmp_path, "packs")
        pack, full = _pack_of(tmp_path, private, BUNDLE, "2026-02-01T00:00:00Z")
        published = lane_store.publish_pack(
            config.lane("validation"), pack, full, {BUNDLE: "serves"}
        )
        # Nothing of the pack is on the index: it went into the bucket.
        assert not list(lane.index.glob("*pack*")), sorted(lane.index.iterdir())
        home = tmp_path / "host-home"
        home.mkdir()

        def host(*args: str) -> CliResult:
            """The fresh host's command line: -I, nothing of the checkout, its own HOME."""
            done = subprocess.run(
                [str(gcs_host_python), "-I", "-m", "xla_host", *args], cwd=home,
                env={"PATH": "/usr/bin:/bin", "HOME": str(home),
                     gcs.EMULATOR_ENV: gcs_emulator.host},
                text=True, capture_output=True, timeout=300, check=False,
            )  # fmt: skip
            return CliResult(done.returncode, done.stdout, done.stderr)

        into = home / "cache"
        fetched = host(
            "cache", "fetch", "--lane", lane.url, "--bundle", BUNDLE, "--workload", "small",
            "--into", str(into), "--key", str(public), "--python", str(host_python),
            "--device", "CPU", "--topology", "cpu-1x1",
        )  # fmt: skip
        assert fetched.exit_code == 0, fetched.output
        assert listing(into) == listing(tmp_path / "cold-2026-02")
        assert "2 entr(ies) written" in fetched.stdout, fetched.stdout
        # launch-env --pack-lane: the same fetch (cache_command.fetch_pack), through the
        # same lane address, into the launch profile's cache directory.
        cache = home / "launch-cache"
        profile = LaunchProfile(
            "train",
            {"device": {"PJRT_DEVICE": "CPU"}, "cache": {"XLA_PERSISTENT_CACHE_PATH": str(cache)}},
        )
        wheel = doc.LockedFile("torch_xla-2.7.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 10)
        made = doc.BundleDocument(
            bundle=BUNDLE, lane="validation", python="3.11", wheels=(wheel,),
            profiles={"train": profile},
        )  # fmt: skip
        document = home / "document.json"
        document.write_bytes(doc.dumps(made))
        launched = host(
            "launch-env", "--bundle-document", str(document), "--bundle-sha256",
            doc.sha256_of(document.read_bytes()), "--profile", "train", "--role", "writer",
            "--out", str(home / "launch"), "--python", str(host_python),
            "--pack-lane", lane.url, "--pack-public-key", str(public),
        )  # fmt: skip
        assert launched.exit_code == 0, launched.output
        assert "cache pack installed into" in launched.stdout, launched.output
        assert listing(cache) == listing(tmp_path / "cold-2026-02")
        assert (home / "launch" / "env.json").exists()
        # The object in the bucket tampered with (a byte of an entry flipped, put back
        # under its hash's name): launch-env installs nothing and writes no launch file.
        objects = gcs.bucket_at(lane.store, QUICK, fix="")
        raw = bytearray(pack.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        objects.delete(published.row.path)
        assert objects.create(published.row.path, bytes(raw)) is True
        refused = host(
            "launch-env", "--bundle-document", str(document), "--bundle-sha256",
            doc.sha256_of(document.read_bytes()), "--profile", "train", "--role", "writer",
            "--out", str(home / "launch-2"), "--python", str(host_python),
            "--pack-lane", lane.url, "--pack-public-key", str(public),
        )  # fmt: skip
        assert refused.exit_code == 1, refused.output
        assert "does not match its signed manifest" in refused.stderr, refused.stderr
        assert "nothing was installed" in refused.stderr and "Traceback" not in refused.stderr
        assert not (home / "launch-2").exists()
        assert listing(cache) == listing(tmp_path / "cold-2026-02")  # the earlier install
