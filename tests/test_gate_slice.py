"""``xla-host gate`` as two workers of one slice: two real gate processes sharing one
cache directory and one slice directory, their children a stand-in interpreter.

The stand-in (written below) answers the gate's child protocol the way a torch_xla whose
persistent cache works would, without torch: the probe names one CPU device; a training
run finds the cache entry (a hit, no compile) or compiles (a miss) and writes the entry
unless ``XLA_PERSISTENT_CACHE_READ_ONLY=1``; it says in its log what it was told and did.
So the gate's roles, phases and merge run for real in seconds; what torch_xla's runtime
does across hosts is for a TPU slice (README, "What runs where").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from xla_host.errors import ExitCode
from xla_host.gate.slice import DEAD_AFTER_S
from xla_host.slice import WRITER_LEASE, LeaseHolder

STAND_IN = textwrap.dedent(
    """
    import json, os, sys, time
    args = sys.argv[2:]
    out = args[args.index("--out") + 1]
    mode = args[args.index("--mode") + 1]
    report = {"ok": True, "torch_version": "0+standin", "torch_xla_version": "0+standin"}
    if mode == "probe":
        report.update(device_type="CPU", runtime_devices=["CPU:0"], tpu_version=None,
                      has_runtime_memory_info=False)
    else:
        cache = os.environ["XLA_PERSISTENT_CACHE_PATH"]
        read_only = os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY") == "1"
        entry = os.path.join(cache, "entry")
        if read_only and out.endswith("cold-1.json"):
            time.sleep(0.5)  # a reader's cold run looks after the writer's wrote: a hit
        hit = os.path.exists(entry)
        print(f"read-only={int(read_only)} hit={int(hit)}")
        if out.endswith("warm-1.json") and os.environ.get("STANDIN_WARM_S"):
            # A warm run that takes a while: its worker can be killed in the warm phase.
            with open(os.path.join(os.path.dirname(out), "warm-1.pid"), "w") as f:
                f.write(str(os.getpid()))
            time.sleep(float(os.environ["STANDIN_WARM_S"]))
        if not hit and not read_only:
            with open(entry + ".tmp", "w") as f:
                f.write("compiled")
            os.rename(entry + ".tmp", entry)
            print("wrote the cache entry")
        report.update(
            counters={"PersistentCacheMiss": 0 if hit else 1, "PersistentCacheHit": int(hit)},
            xla_compiles=0 if hit else 1, ready_s=0.1 if hit else 1.0, import_s=0.01,
            loss_hex=["0x1.0p+0"],
            first_step={"sync_cpu_s": 0.01 if hit else 1.0, "sync_s": 0.01 if hit else 1.0,
                        "setup_s": 0.01, "trace_s": 0.01, "execute_s": 0.01},
        )
    with open(out, "w") as f:
        json.dump(report, f)
    """
)


def _argv(
    tmp_path: Path, worker: int, python: Path, timeout: str = "60", meet: tuple[str, ...] = ()
) -> list[str]:
    return [
        sys.executable, "-m", "xla_wheels", "gate", "--python", str(python), "--device", "CPU",
        "--checks", "restart", "--worker-id", str(worker), "--workers", "2",
        *(meet or ("--slice-dir", str(tmp_path / "slice"))),
        "--xla-cache-dir", str(tmp_path / "cache"),
        "--out", str(tmp_path / f"out-{worker}"), "--slice-timeout", timeout,
    ]  # fmt: skip


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), **more}


def _gate(
    tmp_path: Path, worker: int, python: Path, meet: tuple[str, ...] = (), **env: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _argv(tmp_path, worker, python, meet=meet), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_env(tmp_path, **env), cwd=tmp_path,
    )  # fmt: skip


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    python.chmod(0o755)
    return python


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("board", ["slice-dir", "coordinator"])
def test_two_gate_workers_form_one_run_worker_0_writes_and_merges(
    tmp_path: Path, stand_in: Path, board: str
) -> None:
    meet = ("--coordinator", f"127.0.0.1:{_free_port()}") if board == "coordinator" else ()
    workers = [_gate(tmp_path, w, stand_in, meet) for w in (0, 1)]
    out = [p.communicate(timeout=120) for p in workers]
    assert [p.returncode for p in workers] == [0, 0], out
    logs = {w: tmp_path / f"out-{w}" / "runs" / "restart" for w in (0, 1)}
    # Worker 1 ran every child read-only and wrote nothing; worker 0's cold run wrote.
    for log in logs[1].glob("*.log"):
        assert "read-only=1" in log.read_text() and "wrote" not in log.read_text(), log
    assert "wrote the cache entry" in (logs[0] / "cold-1.log").read_text()
    # Worker 1's warm runs started after worker 0's cold run wrote: they hit. Its own cold
    # run (started with the writer's, it found the entry) is no reference: the writer's is.
    assert "hit=1" in (logs[1] / "warm-1.log").read_text()
    assert "hit=1" in (logs[1] / "cold-1.log").read_text()
    reader = json.loads((tmp_path / "out-1" / "report.json").read_text())["checks"][0]
    assert "judged against the writer's (worker 0's) cold run" in reader["notes"]
    assert reader["figures"]["cold_misses"] == 1
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["entry"]  # lease released
    report = json.loads((tmp_path / "out-0" / "report.json").read_text())
    merged = next(c for c in report["checks"] if c["name"] == "slice")
    assert merged["passed"] and merged["figures"]["topology"] == "cpu-2x1"
    assert merged["figures"]["hosts"] == 2
    receipt = json.loads((tmp_path / "out-0" / "receipt.json").read_text())
    assert [w["role"] for w in receipt["slice"]["workers"]] == ["writer", "reader"]
    assert all(c["passed"] for w in receipt["slice"]["workers"] for c in w["checks"])
    assert "no receipt from worker 1" in out[1][0]
    assert not (tmp_path / "out-1" / "receipt.json").exists()


@pytest.mark.slow
def test_a_worker_that_never_comes_is_named_and_the_run_ends_with_exit_8(
    tmp_path: Path, stand_in: Path
) -> None:
    alone = subprocess.run(
        _argv(tmp_path, 0, stand_in, timeout="3"),
        capture_output=True, text=True, timeout=60, env=_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert alone.returncode == ExitCode.TIMED_OUT, alone.stderr
    assert "worker 1 (never started) did not arrive within 3s" in alone.stderr
    assert "--slice-timeout" in alone.stderr  # the fix names the knob
    assert not (tmp_path / "cache" / WRITER_LEASE).exists()
    # The failed slice leaves its reports, the failure and its exit code in them.
    report = json.loads((tmp_path / "out-0" / "report.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == ExitCode.TIMED_OUT
    assert "worker 1 (never started) did not arrive within 3s" in report["error"]
    junit = (tmp_path / "out-0" / "junit.xml").read_text()
    assert "<error" in junit and "did not arrive within 3s" in junit


@pytest.mark.slow
@pytest.mark.parametrize("board", ["slice-dir", "coordinator"])
def test_worker_0_killed_in_the_warm_phase_fails_worker_1_naming_it_never_a_pass(
    tmp_path: Path, stand_in: Path, board: str
) -> None:
    meet = ("--coordinator", f"127.0.0.1:{_free_port()}") if board == "coordinator" else ()
    writer = _gate(tmp_path, 0, stand_in, meet, STANDIN_WARM_S="60")
    reader = _gate(tmp_path, 1, stand_in, meet)
    pid_file = tmp_path / "out-0" / "runs" / "restart" / "warm-1.pid"
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), writer.communicate()
        writer.send_signal(signal.SIGKILL)
        out, err = reader.communicate(timeout=120)
    finally:
        writer.kill()
        writer.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the orphaned warm run
    # Worker 1's warm-1 was done; it waited at warm-2 for worker 0, which had died.
    assert reader.returncode == ExitCode.TIMED_OUT, out + err
    assert "PASS" not in out
    assert "worker 0 stopped" in err, err
    # Named by the heartbeat bound (the board's or the coordinator's), not by the 60 s
    # slice timeout it would have waited for without one.
    assert re.search(rf"worker 0 stopped\b.* for more than {DEAD_AFTER_S:g}s", err), err
    assert "within 60s" not in err
    assert not (tmp_path / "out-1" / "runs" / "restart" / "warm-2.log").exists()
    report = json.loads((tmp_path / "out-1" / "report.json").read_text())
    assert report["exit_code"] == ExitCode.TIMED_OUT and "worker 0 stopped" in report["error"]
    assert "worker 0 stopped" in (tmp_path / "out-1" / "junit.xml").read_text()


def test_a_second_job_on_a_leased_cache_directory_runs_read_only_and_names_the_holder(
    tmp_path: Path, stand_in: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    # Another job (this test process: alive, on this host) holds the writer role.
    holder = LeaseHolder(socket.gethostname(), os.getpid(), "job-train-7", 1.0, 1.0)
    (cache / WRITER_LEASE).write_text(json.dumps(holder.__dict__))
    argv = [a for a in _argv(tmp_path, 0, stand_in) if a not in ("--worker-id", "0")]
    argv = argv[: argv.index("--workers")] + argv[argv.index("--xla-cache-dir") :]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                         env=_env(tmp_path), cwd=tmp_path)  # fmt: skip
    assert f"has a writer already ({socket.gethostname()} pid {os.getpid()} job job-train-7" in (
        run.stderr
    )
    assert "read-only=1" in (tmp_path / "out-0" / "runs" / "restart" / "cold-1.log").read_text()
    # Its cold run wrote nothing, so it has no restart to judge: a failed check, and the
    # holder's lease is left as it was.
    assert run.returncode == ExitCode.FAILED, run.stderr
    assert "the cold run wrote no cache entry" in run.stdout
    assert json.loads((cache / WRITER_LEASE).read_text())["job"] == "job-train-7"
