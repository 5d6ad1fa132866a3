"""Cache packs: a gate run's cold cache, signed, installed on a fresh host that then starts
warm; a tampered pack, a wrong signature and a pack of another topology install nothing.

Real parts only: openssl ed25519 keys, tar files, ``python -m xla_host cache fetch`` in a
fresh process (the host's own command line, as a host without the builder runs it), an
HTTP server on loopback, and, for the warm start, the stock torch_xla 2.7.0 environment
(whose persistent cache loads on CPU) with the pack the shared gate run ``gate_27`` wrote,
fetched from a static lane over HTTP and from a pypiserver lane's gs:// pack store
(fake-gcs-server, tests/gcs_support.py) by a host with only the host wheel and
google-cloud-storage installed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.clirunner import REPO_ROOT, CliResult
from tests.gate_helpers import GateRun
from tests.gcs_support import GcsEmulator
from tests.publish_support import FakeWheels
from xla_host import cache_pack
from xla_host.gate import workload as workloads
from xla_host.gate.children import run_child, runtime_env
from xla_host.gate.restart import summarize


def host_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """``python -m xla_host ARGS``: the host's command line in a fresh process."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PERSISTENT")}
    full.update(env or {})
    full["PYTHONPATH"] = str(REPO_ROOT / "host" / "src")
    done = subprocess.run(
        [sys.executable, "-m", "xla_host", *args],
        env=full, text=True, capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    return CliResult(done.returncode, done.stdout, done.stderr)


def keypair(directory: Path, name: str) -> tuple[Path, Path]:
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
                   check=True, capture_output=True)  # fmt: skip
    return private, public


@pytest.fixture(scope="module")
def host_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real interpreter whose installed metadata says torch_xla 2.7.0 (a venv with only
    the distribution's metadata: the fetch reads versions, it never imports torch_xla)."""
    root = tmp_path_factory.mktemp("host-env")
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True, capture_output=True, check=True,
    ).stdout.strip()  # fmt: skip
    info = Path(site) / "torch_xla-2.7.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_xla\nVersion: 2.7.0\n")
    return python


def cache_entry(payload: bytes) -> bytes:
    """A persistent cache entry as patch 0004 writes it: the payload, then the footer
    (magic, the payload's length, its 64-bit FNV-1a hash, both little-endian)."""
    fnv = 0xCBF29CE484222325
    for byte in payload:
        fnv = ((fnv ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return payload + b"XLAPCF01" + len(payload).to_bytes(8, "little") + fnv.to_bytes(8, "little")


def manifest(**changes: object) -> cache_pack.Manifest:
    fields: dict[str, object] = {
        "bundle": None,
        "workload": {"name": "small", "sha256": "0" * 64, "params": {}},
        "topology": "cpu-1x1",
        "device": "CPU",
        "torch_version": "2.7.0",
        "torch_xla_version": "2.7.0",
        "libtpu_version": None,
        "receipt_digest": "sha256:" + "1" * 64,
        "entries": (),
    }
    fields.update(changes)
    return cache_pack.Manifest(**fields)  # type: ignore[arg-type]


@pytest.fixture
def made(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A cache directory of three entries (real files), a key pair, and their pack."""
    cache = tmp_path / "cold-cache"
    cache.mkdir()
    for i, size in enumerate((70_000, 1_500, 9)):
        (cache / f"{1234567890123 + i}").write_bytes(os.urandom(size))
    private, public = keypair(tmp_path, "lane")
    pack, _ = cache_pack.write_pack(tmp_path / "packs", cache, private, manifest())
    yield {"cache": cache, "key": private, "pub": public, "pack": pack, "tmp": tmp_path}


def fetch(made: dict[str, Path], python: Path, into: Path, *extra: str, **kw: str) -> CliResult:
    pack = kw.get("pack", str(made["pack"]))
    return host_cli(
        "cache", "fetch", "--pack", pack, "--into", str(into), "--key", str(made["pub"]),
        "--python", str(python), "--device", "CPU", "--topology", "cpu-1x1", *extra,
    )  # fmt: skip


def listing(directory: Path) -> dict[str, bytes]:
    """The files of a cache directory (the record of installed packs apart)."""
    if not directory.exists():
        return {}
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.name != cache_pack.INSTALLED_DIR
    }


def test_a_pack_installs_every_entry_and_again_changes_nothing(
    made: dict[str, Path], host_python: Path
) -> None:
    into = made["tmp"] / "fresh-host" / "cache"
    first = fetch(made, host_python, into)
    assert first.exit_code == 0, first.output
    assert listing(into) == listing(made["cache"])  # exactly the entries, no temporary file
    assert "3 entr(ies) written, 0 already there" in first.stdout
    # The install is recorded in the directory (what `cache prune` keeps), once.
    [(record, installed)] = cache_pack.installed_manifests(into)
    assert {e.name for e in installed.entries} == set(listing(into))
    mtimes = {p.name: p.stat().st_mtime_ns for p in into.iterdir()}
    again = fetch(made, host_python, into)
    assert again.exit_code == 0, again.output
    assert "0 entr(ies) written, 3 already there" in again.stdout
    assert {p.name: p.stat().st_mtime_ns for p in into.iterdir()} == mtimes


@pytest.mark.slow
def test_the_pack_over_http_on_loopback(made: dict[str, Path], host_python: Path) -> None:
    server, root = servers.start_directory_server(made["pack"].parent, made["tmp"] / "http.log")
    try:
        into = made["tmp"] / "cache"
        done = fetch(made, host_python, into, pack=root + made["pack"].name)
        assert done.exit_code == 0, done.output
        assert listing(into) == listing(made["cache"])
        missing = fetch(made, host_python, made["tmp"] / "other", pack=root + "nothing.tar")
        assert missing.exit_code == 1 and "404" in missing.stderr, missing.output
        assert not (made["tmp"] / "other").exists()
    finally:
        servers.stop(server)


def _entry_offset(pack: Path, name: str) -> int:
    with tarfile.open(pack) as tar:
        return tar.getmember(cache_pack.ENTRY_PREFIX + name).offset_data


def test_one_flipped_byte_in_an_entry_is_named_and_installs_nothing(
    made: dict[str, Path], host_python: Path
) -> None:
    # The last entry in the pack: every other one was already streamed into the cache
    # directory when the flipped one is read, so all of them must go again.
    name = sorted(p.name for p in made["cache"].iterdir())[-1]
    raw = bytearray(made["pack"].read_bytes())
    raw[_entry_offset(made["pack"], name) + 3] ^= 0x01
    tampered = made["tmp"] / "tampered.xlapack.tar"
    tampered.write_bytes(bytes(raw))
    into = made["tmp"] / "new" / "cache"
    done = fetch(made, host_python, into, pack=str(tampered))
    assert done.exit_code == 1, done.output
    assert f"entry {name} does not match its signed manifest" in done.stderr
    assert "Traceback" not in done.stderr and "fix:" in done.stderr
    assert not (made["tmp"] / "new").exists()  # nothing left behind, not even the directory


def _with_envelope(pack: Path, envelope: bytes, out: Path) -> Path:
    """``pack`` with its manifest member replaced by ``envelope`` (entries unchanged)."""
    with tarfile.open(pack) as source, tarfile.open(out, "w") as tar:
        for member in source.getmembers():
            if member.name == cache_pack.MANIFEST_MEMBER:
                member.size = len(envelope)
                tar.addfile(member, io.BytesIO(envelope))
            else:
                tar.addfile(member, source.extractfile(member))
    return out


def _envelope(pack: Path) -> dict[str, object]:
    with tarfile.open(pack) as tar:
        data = tar.extractfile(cache_pack.MANIFEST_MEMBER)
        assert data is not None
        loaded: dict[str, object] = json.loads(data.read())
        return loaded


@pytest.mark.slow
def test_a_wrong_signature_installs_nothing(made: dict[str, Path], host_python: Path) -> None:
    # Signed by another key, under the lane key's id: only openssl's verification can tell.
    other, _ = keypair(made["tmp"], "intruder")
    forged, _ = cache_pack.write_pack(made["tmp"] / "forged", made["cache"], other, manifest())
    envelope = _envelope(forged)
    lane_id = _envelope(made["pack"])["signatures"][0]["keyid"]  # type: ignore[index]
    envelope["signatures"][0]["keyid"] = lane_id  # type: ignore[index]
    bad = _with_envelope(forged, json.dumps(envelope).encode(), made["tmp"] / "bad.tar")
    into = made["tmp"] / "cache"
    done = fetch(made, host_python, into, pack=str(bad))
    assert done.exit_code == 1, done.output
    assert "signature does not verify" in done.stderr
    assert not into.exists()
    # The same forged pack as it came (its own key id): no key given signs it.
    plain = fetch(made, host_python, into, pack=str(forged))
    assert plain.exit_code == 1 and "none of them a key given with --key" in plain.stderr
    assert not into.exists()
    # A manifest edited after signing (another topology claimed): the signature fails.
    payload = json.loads(__import__("base64").b64decode(_envelope(made["pack"])["payload"]))
    payload["torch-xla"] = "2.7.1"
    edited = _envelope(made["pack"])
    edited["payload"] = __import__("base64").b64encode(json.dumps(payload).encode()).decode()
    changed = _with_envelope(made["pack"], json.dumps(edited).encode(), made["tmp"] / "e.tar")
    assert fetch(made, host_python, into, pack=str(changed)).exit_code == 1
    assert not into.exists()


def test_a_pack_of_another_topology_is_refused_naming_it(
    made: dict[str, Path], host_python: Path
) -> None:
    pack, _ = cache_pack.write_pack(
        made["tmp"] / "v4", made["cache"], made["key"], manifest(topology="cpu-1x4")
    )
    into = made["tmp"] / "cache"
    done = fetch(made, host_python, into, pack=str(pack))
    assert done.exit_code == 1, done.output
    assert "topology: the pack's is cpu-1x4, this host's is cpu-1x1" in done.stderr
    assert not into.exists()
    # And a host of another torch_xla (its metadata, not a flag) is refused too.
    other = fetch(made, Path(sys.executable), into)
    assert other.exit_code == 1 and "torch_xla version: the pack's is 2.7.0" in other.stderr


def test_an_existing_different_entry_is_never_replaced(
    made: dict[str, Path], host_python: Path
) -> None:
    into = made["tmp"] / "cache"
    into.mkdir()
    name = sorted(p.name for p in made["cache"].iterdir())[0]
    (into / name).write_bytes(b"someone else's executable")
    (into / "notes.txt").write_text("the user's")
    before = listing(into)
    done = fetch(made, host_python, into)
    assert done.exit_code == 1, done.output
    assert f"already holds an entry {name} with other content" in done.stderr
    assert listing(into) == before


def test_a_reader_writes_nothing(made: dict[str, Path], host_python: Path) -> None:
    into = made["tmp"] / "cache"
    done = host_cli(
        "cache", "fetch", "--pack", str(made["pack"]), "--into", str(into),
        "--key", str(made["pub"]), "--python", str(host_python), "--topology", "cpu-1x1",
        env={"XLA_PERSISTENT_CACHE_READ_ONLY": "1"},
    )  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "read-only role" in done.stderr and "fix:" in done.stderr
    assert not into.exists()


def test_bad_input_is_named(made: dict[str, Path], host_python: Path) -> None:
    into = made["tmp"] / "cache"
    private = host_cli("cache", "fetch", "--pack", str(made["pack"]), "--into", str(into),
                       "--key", str(made["key"]), "--python", str(host_python))  # fmt: skip
    assert private.exit_code == 2 and "is a private key" in private.stderr
    assert "PRIVATE" not in private.output  # the key's content is never shown
    junk = made["tmp"] / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    done = fetch(made, host_python, into, pack=str(junk))
    assert done.exit_code == 2 and "is not a cache pack" in done.stderr, done.output
    fifo = made["tmp"] / "fifo"
    os.mkfifo(fifo)
    piped = fetch(made, host_python, into, pack=str(fifo))
    assert piped.exit_code == 2 and "not a regular file" in piped.stderr, piped.output
    assert not into.exists()


def test_a_pack_is_never_replaced(made: dict[str, Path]) -> None:
    stored = json.loads(__import__("base64").b64decode(_envelope(made["pack"])["payload"]))
    again = manifest(created=stored["created"])
    # The same manifest again: the same signed envelope, the same name, the same pack.
    same, _ = cache_pack.write_pack(made["pack"].parent, made["cache"], made["key"], again)
    assert same == made["pack"]
    # A file of that name with other bytes (changed after it was written) stays as it is.
    changed = made["pack"].read_bytes()[:-1] + b"x"
    made["pack"].write_bytes(changed)
    with pytest.raises(cache_pack.PackRefused, match="never replaced"):
        cache_pack.write_pack(made["pack"].parent, made["cache"], made["key"], again)
    assert made["pack"].read_bytes() == changed
    assert sorted(p.name for p in made["pack"].parent.iterdir()) == [made["pack"].name]


# --- the warm start, with the shared gate run on stock torch_xla 2.7.0 ------------------


def test_a_fresh_host_starts_warm_from_the_gates_pack_from_a_static_lane_or_an_index_lanes_bucket(
    gate_27: GateRun,
    stock_xla_python_27: Path,
    tmp_path: Path,
    gcs_emulator: GcsEmulator,
    gcs_host_python: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.gcs_support import index_lane_with_bucket
    from tests.publish_support import BUNDLE
    from xla_host import gcs
    from xla_wheels.release import lane_packs as lane_store
    from xla_wheels.release import lanes
    from xla_wheels.release.lane_static import StaticLane
    from xla_wheels.release.lanes import Lane, Policy

    made = gate_27.out_dir.parent
    packs = sorted((made / "packs").glob(f"*{cache_pack.SUFFIX}"))
    assert len(packs) == 1, gate_27.stdout[-3000:] + gate_27.stderr[-3000:]
    restart = gate_27.check("restart")
    assert restart["passed"], restart["reasons"]
    cold = next(row for row in restart["runs"] if row["name"] == "cold-1")
    receipt = json.loads((gate_27.out_dir / "receipt.json").read_text())
    envelope = _envelope(packs[0])
    payload = json.loads(__import__("base64").b64decode(str(envelope["payload"])))
    assert payload["receipt-digest"] == receipt["digest"]
    assert payload["topology"] == "cpu-1x1" and payload["torch-xla"] == "2.7.0"
    assert len(payload["entries"]) == restart["figures"]["cache_files"]
    # The gate recorded the key components of every entry it packed (keys.json beside its
    # report, and in the signed manifest): each entry's module fingerprint.
    keys = payload["keys"]
    assert set(keys["entries"]) == {row["name"] for row in payload["entries"]}
    assert all(e["module"].startswith("sha256:") for e in keys["entries"].values())
    assert keys["components"]["revisions"]["torch_xla"] == "2.7.0"
    assert json.loads((gate_27.out_dir / "keys.json").read_text())["key-record"] == 1

    # Published into a static lane directory by hash (the gate ran without a bundle: a
    # stock environment's pack), served by a real HTTP server on loopback.
    lane_dir = tmp_path / "lane"
    lane = Lane("validation", StaticLane("validation", lane_dir), policy=Policy())
    manifest_read = cache_pack.read_manifest(
        str(packs[0]), [cache_pack.read_public_key(made / "pack-key.pub.pem")]
    )
    lane_store.publish_pack(lane, packs[0], manifest_read, {None: "serves"})
    server, root = servers.start_directory_server(lane_dir, tmp_path / "http.log")
    try:
        into = tmp_path / "fresh-host-cache"
        done = host_cli(
            "cache", "fetch", "--lane", root, "--workload", "small", "--into", str(into),
            "--key", str(made / "pack-key.pub.pem"), "--python", str(stock_xla_python_27),
            "--device", "CPU",
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        for row in payload["entries"]:
            data = (into / row["name"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == row["sha256"]

        # The same executables through a lane on a package index (a real pypiserver) whose
        # packs are in a bucket (fake-gcs-server), fetched by a fresh host that has only
        # the host wheel and google-cloud-storage and is given only the lane's address.
        # Such a host finds the store through its bundle's document, so the pack must name
        # a bundle, and the gate ran without one (a stock environment): the gate's entries
        # are packed again under the lane's bundle (the publish tests' stand-in), signed
        # with the gate's own key, every other field of its manifest kept.
        bucket = gcs_emulator.make_bucket(f"warm-{os.getpid()}")
        monkeypatch.setenv(gcs.EMULATOR_ENV, gcs_emulator.host)
        entries = tmp_path / "gate-entries"
        entries.mkdir()
        for name, data in listing(into).items():
            (entries / name).write_bytes(data)
        relabelled = cache_pack.Manifest(
            **{**manifest_read.__dict__, "bundle": BUNDLE, "entries": (), "created": ""}
        )
        pack, relabelled = cache_pack.write_pack(
            tmp_path / "bundle-pack", entries, made / "pack-key.pem", relabelled
        )
        assert [e.sha256 for e in relabelled.entries] == [r["sha256"] for r in payload["entries"]]
        with index_lane_with_bucket(
            tmp_path / "index-lane", [fake_wheels.torch, fake_wheels.torch_xla], gcs_emulator,
            bucket,
        ) as index_lane:  # fmt: skip
            validation = lanes.load_config(index_lane.project).lane("validation")
            lane_store.publish_pack(validation, pack, relabelled, {BUNDLE: "serves"})
            home = tmp_path / "gcs-host-home"
            home.mkdir()
            from_bucket = home / "cache"
            fetched = subprocess.run(
                [str(gcs_host_python), "-I", "-m", "xla_host", "cache", "fetch", "--lane",
                 index_lane.url, "--bundle", BUNDLE, "--workload", "small", "--into",
                 str(from_bucket), "--key", str(made / "pack-key.pub.pem"), "--python",
                 str(stock_xla_python_27), "--device", "CPU"],
                cwd=home, env={"PATH": "/usr/bin:/bin", "HOME": str(home),
                               gcs.EMULATOR_ENV: gcs_emulator.host},
                text=True, capture_output=True, timeout=300, check=False,
            )  # fmt: skip
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        assert f"{index_lane.store}/packs/sha256/" in fetched.stderr, fetched.stderr
        assert listing(from_bucket) == listing(into)

        # The fresh host's first run of the same workload, from the bucket's pack: every
        # executable loaded, none compiled (the static lane's install is the same bytes).
        child = run_child(
            stock_xla_python_27, "fresh-host", tmp_path / "runs",
            ["--mode", "train", *workloads.DEFAULT.child_args()],
            runtime_env("CPU", cache_dir=from_bucket), 600,
        )  # fmt: skip
        first = summarize(child)
        assert first["ok"], first
        assert cold["misses"] >= 1
        assert first["hits"] == cold["misses"]
        assert first["xla_compiles"] == 0
        assert first["deserialize_failures"] == 0
        assert first["loss_hex"] == cold["loss_hex"]

        # A run under another setting misses; `cache explain` names the component.
        for setting, component, detail in (
            ({"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}, "compile options",
             "compile_options.xla_flags.xla_cpu_enable_fast_math: the reference's false, "
             "the run's true"),
            ({"XLA_USE_BF16": "1"}, "module",
             "module_switches.XLA_USE_BF16: the reference's unset, the run's 1"),
        ):  # fmt: skip
            record = tmp_path / f"run-{component.replace(' ', '-')}.json"
            recorded = host_cli(
                "cache", "record", "--python", str(stock_xla_python_27), "--device", "CPU",
                "--cache", str(into), "--out", str(record), env=setting,
            )  # fmt: skip
            assert recorded.exit_code == 0, recorded.output
            assert "0 hit(s)" in recorded.stdout, recorded.stdout
            for against in (["--pack", root + lane_store.read_index(lane)[0][0].path, "--key",
                             str(made / "pack-key.pub.pem")], ["--cache", str(into)]):  # fmt: skip
                told = host_cli("cache", "explain", "--run", str(record), *against)
                assert told.exit_code == 0, told.output
                assert f"1 miss(es)): {component} differs from" in told.stdout, told.stdout
                assert detail in told.stdout, told.stdout
    finally:
        servers.stop(server)


def test_the_gate_refuses_an_unsigned_pack_before_it_runs(tmp_path: Path) -> None:
    from tests.clirunner import run_cli

    done = run_cli("gate", "--pack", str(tmp_path / "packs"), "--out", str(tmp_path / "out"),
                   "--python", sys.executable, inherit_env=True)  # fmt: skip
    assert done.exit_code == 2, done.output
    assert "--pack needs --pack-key" in done.stderr and "fix:" in done.stderr
    assert not (tmp_path / "packs").exists() and not (tmp_path / "out" / "runs").exists()


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--pack", "{packs}", "--pack-key", "{public}"], "--pack-key {public} is a public key"),
        (["--pack", "{packs}", "--pack-key", "{notes}"], "--pack-key {notes} is no private key"),
        (["--pack-key", "{private}"], "--pack-key is given without --pack"),
        (["--sign-key", "{private}"], "--sign-key is given without --receipts"),
        (["--receipts", "{store}", "--sign-key", "{public}"], "--sign-key {public} is a public"),
    ],
)
def test_the_gate_refuses_a_key_it_cannot_use_before_any_child_starts(
    tmp_path: Path, flags: list[str], problem: str
) -> None:
    from tests.clirunner import run_cli

    private, public = keypair(tmp_path, "gate")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a key\n")
    names = {"packs": tmp_path / "packs", "public": public, "private": private, "notes": notes,
             "store": tmp_path / "store"}  # fmt: skip
    given = [flag.format(**names) for flag in flags]
    done = run_cli("gate", *given, "--out", str(tmp_path / "out"), "--python", sys.executable,
                   inherit_env=True)  # fmt: skip
    assert done.exit_code == 2, done.output
    assert problem.format(**names) in done.stderr and "fix:" in done.stderr, done.stderr
    assert "Traceback" not in done.output and "None is not" not in done.output
    assert not (tmp_path / "out" / "runs").exists()
    assert not (tmp_path / "packs").exists() and not (tmp_path / "store").exists()
