"""A fresh host's first run with and without a cache pack fetched from a lane over HTTP.

    .venv/bin/python scripts/bench_cache_pack.py [--python ENV/bin/python] [--workload small]
        [--rounds 3] [--out DIR]

Default environment: stock torch_xla 2.7.0 from the per-machine cache (built on first
use; its persistent cache loads on CPU). Steps, all real:

1. a cold run of the workload in an empty cache directory (what the gate's cold run
   leaves), packed and signed with a key made for the run (openssl ed25519) and published
   by hash into a static lane directory (``xla_wheels.release.lane_packs``), which
   ``python -m http.server`` serves on 127.0.0.1;
2. each round, a fresh host *without* the pack: an empty cache directory, the first run's
   time to ready (``ready_s``: setup, trace, compile or load, first execution until every
   warm-up step is done, as the gate measures it);
3. each round, a fresh host *with* the pack: ``python -m xla_host cache fetch --lane URL``
   into an empty cache directory (the whole process's wall time: index, fetch, signature,
   every entry's sha256, install), then the first run's time to ready.

Prints the medians, the pack's size, the ratio (with / without, and with the fetch added)
and writes ``DIR/bench-cache-pack.json``. Exit 0 when every run with the pack compiled
nothing and loaded every executable, 1 otherwise.

At scale, no torch_xla run: ``--synthetic-gib G [--store http|gs|both]``

    .venv/bin/python scripts/bench_cache_pack.py --synthetic-gib 2 --store both --rounds 3

A pack of G GiB of entries of random bytes (256 MiB each, the last one the rest), signed
(openssl ed25519), published by hash into a lane (``xla_wheels.release.lane_packs``):

- ``http``: a static lane directory served by ``python -m http.server`` on 127.0.0.1;
- ``gs``: a static lane directory whose pack store is a bucket of fake-gcs-server
  (tests/gcs_support.py; its filesystem backend, so the pack is not held in memory),
  the bundle document naming the store, as ``publish-lane`` writes it for
  ``packs = "gs://…"``.

Each round, in fresh processes: ``python -m xla_host cache fetch --lane <the lane>``
(index, download, signature, sha256 of the pack and of every entry, install) against the
same bytes downloaded once and hashed once (``curl`` into a file, then ``sha256sum``; for
``gs`` also google-cloud-storage's own ``download_to_filename``, then ``sha256sum``).
Each process's peak resident memory is the kernel's count (``wait4``'s ``ru_maxrss``).
Writes ``DIR/bench-cache-pack-synthetic.json``; needs about 4 x G GiB of free disk in
``--work-dir`` (the pack, the store's copy, the spool, the installed entries), all removed
at the end. Exit 0 when every fetch installed every entry, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "host" / "src")]

from xla_host import cache_pack  # noqa: E402
from xla_host.gate import workload as workloads  # noqa: E402
from xla_host.gate.children import run_child, runtime_env  # noqa: E402
from xla_host.gate.restart import summarize  # noqa: E402
from xla_wheels.release import lane_packs  # noqa: E402
from xla_wheels.release.lanes import Lane, Policy  # noqa: E402


def _python(given: str | None) -> Path:
    if given:
        return Path(given)
    from xla_wheels import stock_envs

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "xla-wheels"
    return stock_envs.ensure_stock_env("2.7.0", root=cache)


def _first_run(python: Path, spec: workloads.WorkloadSpec, cache: Path, runs: Path,
               name: str) -> dict[str, Any]:  # fmt: skip
    child = run_child(python, name, runs, ["--mode", "train", *spec.child_args()],
                      runtime_env("CPU", cache_dir=cache), 900)  # fmt: skip
    summary = summarize(child)
    if not summary.get("ok"):
        raise SystemExit(f"error: run {name} failed: {summary.get('error')} (log {child.log_path})")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", help="the environment's interpreter (default: stock 2.7.0)")
    parser.add_argument("--workload", default="small", help="a preset or PATH:FACTORY")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-cache-pack")
    parser.add_argument("--synthetic-gib", type=float,
                        help="no torch_xla run: a signed pack of this many GiB of random "
                        "entries, fetched against a plain download and one sha256sum")  # fmt: skip
    parser.add_argument("--store", choices=("http", "gs", "both"), default="both",
                        help="with --synthetic-gib: where the lane keeps the pack")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()),
                        help="with --synthetic-gib: where the pack and its copies go")  # fmt: skip
    args = parser.parse_args()
    if args.synthetic_gib is not None:
        from bench_synthetic_pack import synthetic

        return synthetic(args)
    python = _python(args.python)
    spec = workloads.resolve(args.workload)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-pack-"))
    server = None
    try:
        key = work / "key.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(key)],
                       check=True, capture_output=True)  # fmt: skip
        subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out",
                        str(work / "key.pub.pem")], check=True, capture_output=True)  # fmt: skip
        cold_cache = work / "cold"
        cold_cache.mkdir()
        cold = _first_run(python, spec, cold_cache, args.out / "runs", "cold")
        manifest = cache_pack.Manifest(
            bundle=None, workload={"name": spec.name}, topology="cpu-1x1", device="CPU",
            torch_version=str(cold.get("torch_version", "")),
            torch_xla_version=str(cold.get("torch_xla_version", "")), libtpu_version=None,
            receipt_digest=None, entries=(),
        )  # fmt: skip
        # The host checks the pack's torch_xla against its own installed metadata.
        version = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('torch_xla'))"],
            text=True, capture_output=True, check=True,
        ).stdout.strip()  # fmt: skip
        manifest = cache_pack.Manifest(**{**manifest.__dict__, "torch_xla_version": version})
        pack, full = cache_pack.write_pack(work / "packs", cold_cache, key, manifest)
        pack_bytes = pack.stat().st_size
        lane_dir = work / "lane"
        lane = Lane("bench", lane_dir, None, None, None, Policy())
        lane_packs.publish_pack(lane, pack, full, {None: "serves"})
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        url = f"http://127.0.0.1:{port}/"
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
             str(lane_dir), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        rows: list[dict[str, Any]] = []
        for i in range(args.rounds):
            bare = work / f"bare-{i}"
            bare.mkdir()
            without = _first_run(python, spec, bare, args.out / "runs", f"without-{i}")
            into = work / f"packed-{i}"
            env = {**os.environ, "PYTHONPATH": str(ROOT / "host" / "src")}
            began = time.perf_counter()
            fetched = subprocess.run(
                [sys.executable, "-m", "xla_host", "cache", "fetch", "--lane", url,
                 "--workload", spec.name, "--into", str(into), "--key",
                 str(work / "key.pub.pem"), "--python", str(python), "--device", "CPU",
                 "--topology", "cpu-1x1"], env=env, text=True, capture_output=True,
            )  # fmt: skip
            fetch_s = time.perf_counter() - began
            if fetched.returncode != 0:
                raise SystemExit(f"error: cache fetch failed: {fetched.stderr}")
            with_pack = _first_run(python, spec, into, args.out / "runs", f"with-{i}")
            rows.append({
                "without_ready_s": without["ready_s"], "with_ready_s": with_pack["ready_s"],
                "fetch_verify_s": fetch_s, "with_hits": with_pack["hits"],
                "with_compiles": with_pack["xla_compiles"], "without_misses": without["misses"],
            })  # fmt: skip
            print(f"round {i + 1}: without {without['ready_s']:.2f}s, fetch+verify "
                  f"{fetch_s:.2f}s, with {with_pack['ready_s']:.2f}s "
                  f"({with_pack['hits']} hits, {with_pack['xla_compiles']} compiles)")  # fmt: skip
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in rows)

    result = {
        "workload": spec.name, "python": str(python), "rounds": rows,
        "pack_bytes": pack_bytes, "entry_bytes": full.size, "entries": len(full.entries),
        "without_ready_s": median("without_ready_s"), "with_ready_s": median("with_ready_s"),
        "fetch_verify_s": median("fetch_verify_s"),
    }  # fmt: skip
    result["ratio"] = result["with_ready_s"] / result["without_ready_s"]
    result["ratio_with_fetch"] = (result["with_ready_s"] + result["fetch_verify_s"]) / result[
        "without_ready_s"
    ]
    (args.out / "bench-cache-pack.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    warm = all(r["with_compiles"] == 0 and r["with_hits"] == r["without_misses"] for r in rows)
    return 0 if warm else 1


if __name__ == "__main__":
    sys.exit(main())
