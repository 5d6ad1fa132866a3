"""The loop a TPU team runs, end to end, with real parts (issue: the gate where a team runs it).

The project publishes a lane: stock torch_xla 2.7.0 from PyPI stands in for our wheel, with
the host wheel (built from host/) and the bundle document beside it, served over HTTP on
loopback. Two fresh "hosts" (each its own HOME, working directory and environment, nothing
of the checkout on any path) install the host package from that lane by hash and run the
gate as worker 0 and worker 1 of one slice, on a workload the team wrote (the workload
tests' file: a dataclass from a factory importing a neighbour module), sharing one cache
directory. Worker 0's merged receipt goes to a real WebDAV server
(WsgiDAV) on loopback, and ``promote`` in the project reads it from there. The torch
environment of both hosts is the cached stock 2.7.0 one the gate tests use: installing
torch (gigabytes) into two more environments would prove nothing more.

The whole operator loop continues from there in one test: the writer's signed pack is
published for the bundle on the slice's receipt (``cache-pack``), a third new host installs
the host package by the runbook's line, fetches the pack by the lane's address alone and
its first run of the team's workload compiles nothing; a second bundle reaches the lane
and a rollback with a reason takes it back, a fourth new host's doctor judges the bundle
rolled back to, ``status`` is right after every step, and a stale install list made by
hand is reported, never "in sync".

What only a TPU slice shows (libtpu's multi-host runtime, real HBM, the accelerator type
read from the metadata server) is not here: the workers' runtimes are one CPU device each.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests import webdav_server
from tests.clirunner import run_cli
from tests.publish_support import (
    build_host_wheel,
    cached_stock_wheel,
    make_publish_project,
    manifest_text,
)
from tests.servers import start_directory_server, stop
from tests.test_gate_workload import write_tiny
from tests.test_release_history import _add_second_bundle_of
from tests.test_supply_attest import make_key
from xla_host import receipts
from xla_host.filemode import file_sha256
from xla_host.gate.slice import DEAD_AFTER_S

BUNDLE = "stock-2.7"
USER, PASSWORD = "gate", "webdav-secret-7"
TOPOLOGY = "cpu-2x1"
WORKLOAD = "tiny_workload.py:build"

LANES = """\
publish-lane = "validation"

[lanes.validation]
path = "dist/lanes/validation"
receipts = "{store}"

[lanes.preferred]
path = "dist/lanes/preferred"
promote-from = "validation"

[lanes.preferred.policy]
device = "CPU"
checks = ["restart"]
workload = "{workload}"
topologies = ["{topology}"]
"""


@dataclass(frozen=True)
class Loop:
    project: Path
    lane_url: str
    store: webdav_server.WebDavServer
    store_url: str
    hosts: tuple[Path, Path]
    """Each host's own directory: HOME, working directory, site (the host package)."""
    python: Path
    """The hosts' torch environment (the cached stock 2.7.0 one)."""
    shared: Path
    """The slice's shared mount: the cache directory and the slice directory."""
    workload: Path
    pack_key: tuple[Path, Path]
    """The gate's pack signing key: (private PEM, public PEM)."""


def _install_host_package(lane_url: str, requirements: str, site: Path) -> None:
    """The runbook's install, by hash from the lane: here only the host package's line (the
    torch environment exists already)."""
    lines = requirements.replace("\\\n", " ").splitlines()
    (wanted,) = [line for line in lines if line.startswith("xla-wheels-host==")]
    pinned = site.with_name("host-requirements.txt")
    pinned.write_text(wanted + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-cache-dir", "--no-deps", "--require-hashes", "--target", str(site),
         "--index-url", f"{lane_url}simple/", "-r", str(pinned)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _host_env(host: Path) -> dict[str, str]:
    """A host's environment: its own HOME, the installed host package alone on the path,
    and the receipt store's account (never on the command line)."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(host),
        "PYTHONPATH": str(host / "site"),
        "XLA_WHEELS_CACHE": str(host / "cache"),
        "XLA_WHEELS_RECEIPTS_USERNAME": USER,
        "XLA_WHEELS_RECEIPTS_PASSWORD": PASSWORD,
    }


def _gate(loop: Loop, worker: int, shared: Path, *extra: str) -> subprocess.Popen[str]:
    """``xla-host gate`` as worker ``worker`` runs it: one command per worker."""
    host = loop.hosts[worker]
    argv = [
        str(loop.python), "-s", "-m", "xla_host", "gate",
        "--lane", loop.lane_url, "--bundle", BUNDLE, "--device", "CPU",
        "--checks", "restart", "--warm-runs", "2", "--workload", f"{loop.workload}:build",
        "--worker-id", str(worker), "--workers", "2", "--slice-dir", str(shared / "slice"),
        "--xla-cache-dir", str(shared / "cache"), "--out", str(host / "out"),
        "--receipts", loop.store_url, *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=host, env=_host_env(host), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory, stock_xla_python_27: Path) -> Iterator[Loop]:
    root = tmp_path_factory.mktemp("team-loop")
    store = webdav_server.start(root / "webdav", USER, PASSWORD)
    store_url = f"{store.url}receipts/"
    project = make_publish_project(
        root, [cached_stock_wheel("2.7.0", "3.11")], bundle=BUNDLE, python="3.11",
        xla_version="2.7.0",
    )  # fmt: skip
    (project / "dist" / "host").mkdir(parents=True)
    host_wheel = build_host_wheel(root / "host-wheel")
    shutil.copyfile(host_wheel, project / "dist" / "host" / host_wheel.name)
    (project / "build" / "lanes.toml").write_text(
        LANES.format(store=store_url, workload=WORKLOAD, topology=TOPOLOGY)
    )
    published = run_cli("publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert published.exit_code == 0, published.output
    made = run_cli("lane-requirements", root=project, inherit_env=True)
    assert made.exit_code == 0, made.output
    lane = project / "dist" / "lanes" / "validation"
    index, lane_url = start_directory_server(lane, root / "lane-http.log")
    hosts = (root / "host-0", root / "host-1")
    for host in hosts:
        (host / "site").mkdir(parents=True)
        _install_host_package(lane_url, (lane / "requirements.txt").read_text(), host / "site")
    # The team's model: its own file returning a dataclass, importing a neighbour module.
    workload = write_tiny(root / "team")
    try:
        yield Loop(
            project,
            lane_url,
            store,
            store_url,
            hosts,
            stock_xla_python_27,
            root / "shared",
            workload,
            make_key(root / "keys", "pack-key"),
        )
    finally:
        stop(index)
        webdav_server.stop(store)


@dataclass(frozen=True)
class SliceRun:
    codes: tuple[int, int]
    outputs: tuple[str, str]


@pytest.fixture(scope="module")
def slice_run(loop: Loop) -> SliceRun:
    # The writer packs its cold run's cache, signed (the reader has none to pack).
    pack = ("--pack", str(loop.shared / "packs"), "--pack-key", str(loop.pack_key[0]))
    workers = [
        _gate(loop, worker, loop.shared, *(pack if worker == 0 else ())) for worker in (0, 1)
    ]
    try:
        done = [w.communicate(timeout=900) for w in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
    return SliceRun(
        (workers[0].returncode, workers[1].returncode),
        (done[0][0] + done[0][1], done[1][0] + done[1][1]),
    )


def _store_receipts(loop: Loop) -> list[Path]:
    return sorted((loop.store.root / "receipts" / BUNDLE).glob("*.json"))


@pytest.mark.slow
def test_two_hosts_from_the_lane_form_one_gate_run_and_the_receipt_goes_home(
    loop: Loop, slice_run: SliceRun
) -> None:
    assert slice_run.codes == (0, 0), slice_run.outputs
    # Nothing of the checkout on the hosts: the package they ran is the lane's.
    for host in loop.hosts:
        assert not (host / "site" / "xla_wheels").exists()
        assert (host / "site" / "xla_host" / "gate" / "run.py").is_file()
    # Worker 1 was a reader: every child read-only, nothing written to the shared cache.
    # Each child says which cache it was given and how: the writer's cold run wrote, every
    # one of the reader's children ran read-only on the same directory.
    cache = str(loop.shared / "cache")
    for worker in (0, 1):
        children = sorted((loop.hosts[worker] / "out" / "runs" / "restart").glob("*.json"))
        assert {c.stem for c in children} >= {"cold-1", "warm-1", "warm-2", "read-only"}
        for child in children:
            given = json.loads(child.read_text())["persistent_cache"]
            assert given["path"] == cache, child
            assert given["read_only"] == (worker == 1 or child.stem == "read-only"), child
    assert "no receipt from worker 1" in slice_run.outputs[1]
    assert not (loop.hosts[1] / "out" / "receipts").exists()
    # The team's workload ran as written: loaded by path (its neighbour imported), cold
    # compiled and wrote, every warm run and the read-only run loaded what it wrote.
    report = json.loads((loop.hosts[0] / "out" / "report.json").read_text())
    check = next(c for c in report["checks"] if c["name"] == "restart")
    assert check["passed"], check["reasons"]
    runs = {row["name"]: row for row in check["runs"]}
    cold = runs["cold-1"]
    assert cold["workload"]["name"] == WORKLOAD
    assert cold["workload"]["source"] == str(loop.workload)
    assert cold["misses"] >= 1 and len(cold["loss_hex"]) == 3
    for name in ("warm-1", "warm-2", "read-only"):
        assert runs[name]["hits"] == cold["misses"] and runs[name]["xla_compiles"] == 0
    # AdamW: two graphs before the steady state, compiled cold and loaded warm, and
    # time-to-ready covers both; its parts add up, none clamped, none negative.
    assert check["figures"]["cold_ready_graphs"] == check["figures"]["warm_ready_graphs"] == 2
    for name, run in runs.items():
        assert (run["ready_steps"], run["ready_graphs"]) == (2, 2), name
        parts = {k: v for k, v in run["breakdown"].items() if k != "import" and v is not None}
        assert all(v >= 0 for v in parts.values()), (name, parts)
        assert abs(sum(parts.values()) - run["ready_s"]) < 1e-3, (name, parts, run["ready_s"])
        assert parts.get("compile", 0.0) <= run["ready_s"]
    # Worker 0's receipt: the slice, the team's workload, the document, home in the store.
    (stored,) = _store_receipts(loop)
    read = receipts.read_receipt(stored)
    assert read.digest_ok
    receipt = read.receipt
    assert receipt.topology == TOPOLOGY
    assert [w["role"] for w in (receipt.slice or {})["workers"]] == ["writer", "reader"]
    assert receipt.workload == WORKLOAD
    assert receipt.workload_sha256 == file_sha256(loop.workload)
    assert receipt.workload_params == {"width": 16, "hidden": 32}
    kept = next(c for c in json.loads(stored.read_text())["checks"] if c["name"] == "restart")
    assert {run["name"]: run["ready_graphs"] for run in kept["figures"]["runs"]}["cold-1"] == 2
    assert json.loads(stored.read_text())["workload-sha256"] == receipt.workload_sha256
    assert receipt.bundle == BUNDLE and receipt.wheels_match_lock, receipt.problems
    wheel = cached_stock_wheel("2.7.0", "3.11")
    assert receipt.locked_files == {(wheel.name, file_sha256(wheel))}
    assert receipt.bundle_document is not None
    (document,) = (loop.project / "dist" / "lanes" / "validation" / "bundles").glob("*.json")
    assert receipt.bundle_document == f"sha256:{file_sha256(document)}"
    # The store's account never shows.
    assert PASSWORD not in slice_run.outputs[0] + slice_run.outputs[1]


@pytest.mark.slow
def test_promote_reads_the_receipt_from_the_store_and_compares_only_like_with_like(
    loop: Loop, slice_run: SliceRun
) -> None:
    assert slice_run.codes == (0, 0), slice_run.outputs
    (stored,) = _store_receipts(loop)
    merged = receipts.read_receipt(stored).receipt
    # A receipt of this bundle from one host, of another workload, lands in the store too:
    # it is judged and refused by name, never compared with the slice's.
    other = replace(merged, slice=None, workload="small", workload_sha256=None)
    local = receipts.write_receipt(loop.hosts[0] / "other" / "receipt.json", other, replace=True)
    shutil.copyfile(local, stored.with_name("one-host-small.json"))
    promoted = run_cli(
        "promote", "--bundle", BUNDLE, "--lane", "preferred", root=loop.project,
        inherit_env=True, env={"XLA_WHEELS_RECEIPTS_USERNAME": USER,
                               "XLA_WHEELS_RECEIPTS_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert promoted.exit_code == 0, promoted.output
    lanes_lock = (loop.project / "lanes.lock").read_text()
    assert f'bundle = "{BUNDLE}"' in lanes_lock
    # The receipt that let the bundle in is the slice's, brought home byte for byte.
    home = loop.project / "receipts" / BUNDLE / stored.name
    assert home.read_bytes() == stored.read_bytes()
    assert stored.name in lanes_lock and "one-host-small" not in lanes_lock
    assert PASSWORD not in promoted.output


def _arrived(board: Path, worker: int) -> bool:
    """Whether ``worker`` arrived at a phase (not only started) on the slice's board."""
    return any(p.parent.name != "start" for p in board.rglob(f"worker-{worker}.json"))


@pytest.mark.slow
def test_a_killed_worker_fails_the_run_naming_it_within_a_bound(
    loop: Loop, slice_run: SliceRun
) -> None:
    # After the first run (the stock environment is warm); a slice of its own.
    shared = loop.shared.with_name("shared-killed")
    writer = _gate(loop, 0, shared)
    reader = _gate(loop, 1, shared)
    # Worker 1 dies once it has arrived at the cold phase (its arrival is on the board).
    deadline = time.monotonic() + 300
    while not _arrived(shared / "slice", 1) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not _arrived(shared / "slice", 1):
        for worker in (writer, reader):
            os.killpg(worker.pid, signal.SIGKILL)
        pytest.fail("worker 1 never reached the cold phase")
    os.killpg(reader.pid, signal.SIGKILL)
    reader.communicate(timeout=60)
    try:
        out, err = writer.communicate(timeout=300)
    finally:
        if writer.poll() is None:  # it did not end: take it down with its children
            os.killpg(writer.pid, signal.SIGKILL)
    assert writer.returncode not in (0, None), out + err
    # Named as a worker that stopped (its heartbeat, within its bound), not one that never
    # came or did not arrive by the slice timeout.
    assert f"worker 1 stopped: no heartbeat for more than {DEAD_AFTER_S:g}s" in err, out + err
    assert "did not arrive within" not in err


RC = "stock-2.7-rc"


def _status(loop: Loop) -> str:
    """``make status``'s line of the validation lane, checked to be what it should be."""
    done = run_cli("status", root=loop.project, inherit_env=True, env=_store_account())
    line = next((x for x in done.stdout.splitlines() if x.strip().startswith("validation (")), None)
    assert line is not None, done.output
    return f"{done.exit_code} {line.strip()}"


def _store_account() -> dict[str, str]:
    return {"XLA_WHEELS_RECEIPTS_USERNAME": USER, "XLA_WHEELS_RECEIPTS_PASSWORD": PASSWORD}


def _fresh_host(loop: Loop, name: str) -> Path:
    """A new host following the runbook: the host package alone, by hash, from the lane's
    host install list (the torch environment is the stock one every host here shares)."""
    host = loop.project.parent / name
    (host / "site").mkdir(parents=True)
    listed = urllib.request.urlopen(f"{loop.lane_url}requirements.txt", timeout=30).read()
    _install_host_package(loop.lane_url, listed.decode(), host / "site")
    return host


def _host(loop: Loop, host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(loop.python), "-s", "-m", "xla_host", *args], cwd=host, env=_host_env(host),
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_the_whole_loop_pack_to_a_fresh_host_then_a_rollback_reaches_the_next_one(
    loop: Loop, slice_run: SliceRun
) -> None:
    assert slice_run.codes == (0, 0), slice_run.outputs
    lane = loop.project / "dist" / "lanes" / "validation"
    serving = f"serves {BUNDLE}; in sync with lanes.lock"
    assert _status(loop) == f"0 validation ({lane}): {serving}"
    # The writer's pack, published for the bundle on the slice's receipt (the store's).
    (pack,) = (loop.shared / "packs").glob("*.xlapack.tar")
    published = run_cli(
        "cache-pack", "--bundle", BUNDLE, "--workload", f"{loop.workload}:build",
        "--packs", str(pack.parent), "--public-key", str(loop.pack_key[1]),
        root=loop.project, inherit_env=True, env=_store_account(),
    )  # fmt: skip
    assert published.exit_code == 0, published.output
    assert f"published {pack.name} into lane validation" in published.stdout
    assert PASSWORD not in published.output
    assert _status(loop) == f"0 validation ({lane}): {serving}"

    # A third host, new: the runbook's host line, the pack by the lane's address alone,
    # and its first run of the team's workload compiles nothing.
    third = _fresh_host(loop, "host-2")
    fetched = _host(
        loop, third, "cache", "fetch", "--lane", loop.lane_url, "--bundle", BUNDLE,
        "--workload", f"{loop.workload}:build", "--into", str(third / "xla-cache"),
        "--key", str(loop.pack_key[1]), "--python", str(loop.python), "--device", "CPU",
        "--topology", TOPOLOGY,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    first = _host(
        loop, third, "cache", "record", "--workload", f"{loop.workload}:build",
        "--cache", str(third / "xla-cache"), "--python", str(loop.python), "--device", "CPU",
        "--topology", TOPOLOGY, "--out", str(third / "first-run.json"),
    )  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert " 0 miss(es))" in first.stdout and " 0 hit(s)" not in first.stdout, first.stdout

    # A second bundle reaches the lane, and a rollback with a reason takes it back.
    wheel = cached_stock_wheel("2.7.0", "3.11")
    _add_second_bundle_of(
        loop.project, RC, manifest_text(RC, python="3.11", xla_version="2.7.0"), [wheel]
    )
    for bundle, step in (
        (RC, ("publish-lane", "--bundle", RC)),
        (BUNDLE, ("rollback", "--lane", "validation", "--to", BUNDLE, "--reason", "oncall")),
    ):
        done = run_cli(*step, root=loop.project, inherit_env=True, env=_store_account())
        assert done.exit_code == 0, done.output
        assert _status(loop) == f"0 validation ({lane}): serves {bundle}; in sync with lanes.lock"
        listed = urllib.request.urlopen(f"{loop.lane_url}requirements.txt", timeout=30).read()
        assert f"# Hash-pinned requirements of bundle {bundle} ".encode() in listed
    # The next new host, by the runbook, checks itself against the bundle rolled back to.
    fourth = _fresh_host(loop, "host-3")
    doctor = _host(loop, fourth, "doctor", "--lane", loop.lane_url, "--bundle", BUNDLE)
    documents = {
        json.loads(path.read_text())["bundle"]: path for path in (lane / "bundles").glob("*.json")
    }
    assert set(documents) == {BUNDLE, RC}
    said = doctor.stdout + doctor.stderr
    # It judged the document of the bundle rolled back to; what it holds against this host
    # is only the launch environment this bare test host lacks (the runbook's next step).
    assert f"doctor: bundle {BUNDLE} (document sha256:{file_sha256(documents[BUNDLE])})" in said
    assert doctor.returncode == 1 and "XLA_PERSISTENT_CACHE_PATH" in said, said
    history = run_cli("lanes", "--history", root=loop.project, inherit_env=True)
    assert "oncall" in history.stdout, history.output

    # By hand: the install list of the bundle served before; status names it, never "in sync".
    requirements = lane / "requirements.txt"
    requirements.write_text(requirements.read_text().replace(f"bundle {BUNDLE} ", f"bundle {RC} "))
    stale = _status(loop)
    assert stale.startswith("1 ") and "in sync" not in stale, stale
    assert f"serves {BUNDLE}; FAILURE" in stale
