"""A multi-host slice (xla_host.gate.slice): workers, their barrier, the merge; the writer
lease (xla_host.slice).

Two workers are two real processes meeting in a directory, as two hosts on a shared mount
would; each runs a stand-in phase (no torch_xla: the barrier, the lease and the merge are
standard library) so a slice costs well under a second.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from xla_host import slice as leases
from xla_host.errors import ExitCode, UsageError
from xla_host.gate import slice as slices

# A worker: joins each phase, records when it started it (after the barrier), runs the
# stand-in phase (the writer writes one cache entry, readers write nothing), posts its
# verdicts; worker 0 prints the merged slice. STALL=<worker>:<phase> makes a worker sleep
# before it arrives there (STALL_S seconds), "<worker>:finish" before worker 0 records the
# results. DEAD is the heartbeat bound (2 s), TIMEOUT each phase's deadline (30 s).
# Marker files say where a worker is: arrived-<w>-<phase> before it arrives,
# started-<w>-<phase> once the barrier let it start. Run as the gate runs it: signals
# handled, an abort on any error, the exit code of the error or signal.
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    sys.path.insert(0, sys.argv[5])  # a copy of the host package, nothing else
    from dataclasses import replace
    from pathlib import Path
    from xla_host import signals
    from xla_host.gate import slice as slices
    from xla_host.errors import PipelineError

    worker, workers = int(sys.argv[1]), int(sys.argv[2])
    where, cache = Path(sys.argv[3]), Path(sys.argv[4])
    tpu = {"TPU_ACCELERATOR_TYPE": "v6e-16"}
    coord = os.environ.get("COORD") or None
    spec = slices.slice_spec(
        worker, workers, None if coord else where, tpu,
        timeout_s=float(os.environ.get("TIMEOUT", "30")), coordinator=coord,
    )
    spec = replace(spec, dead_after_s=float(os.environ.get("DEAD", "2")))
    started, arrived = {}, {}

    def mark(what):
        (cache.parent / what).touch()

    def stall(at):
        if os.environ.get("STALL") == f"{worker}:{at}":
            time.sleep(float(os.environ.get("STALL_S", "60")))

    try:
        with signals.handled(), slices.running(spec, beat_s=0.2) as member:
            try:
                mark(f"started-{worker}")  # its heartbeat runs
                for phase in ("cold", "warm", "warm-2", "read-only"):
                    stall(phase)
                    mark(f"arrived-{worker}-{phase}")
                    arrived[phase] = time.time()
                    member.join(phase)
                    started[phase] = time.time()
                    mark(f"started-{worker}-{phase}")
                    if phase == "cold" and spec.writer:
                        (cache / "entry").write_text("compiled")
                if os.environ.get("FAIL") == str(worker):
                    member.abort("its restart check could not run")
                    sys.exit(1)
                payload = {"addressable_devices": ["CPU:0"],
                           "checks": [{"name": "restart", "passed": True, "reasons": []}]}
                arrivals = member.join("results", payload=payload)
                mark(f"arrived-{worker}-finish")
                stall("finish")
                merged = slices.merge_slice(spec, "CPU", arrivals) if spec.writer else None
                member.finish()
            except (Exception, KeyboardInterrupt) as error:
                member.abort(getattr(error, "message", None) or type(error).__name__)
                raise
    except PipelineError as error:
        print(f"error: {error.message}", file=sys.stderr)
        sys.exit(error.exit_code)
    except KeyboardInterrupt as interrupt:
        print(f"error: {signals.describe(interrupt)}", file=sys.stderr)
        sys.exit(signals.exit_code(interrupt))
    print(json.dumps({"started": started, "arrived": arrived, "merged": merged,
                      "waited": member.waited}))
    """
)


def _start(tmp_path: Path, worker: int, workers: int, **env: str) -> subprocess.Popen[str]:
    """A worker as a "host" of its own: its own HOME and environment, the interpreter
    isolated without site-packages (``-I -S``), and only a copy of the standard-library
    host package on its path, not this checkout."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    (tmp_path / "cache").mkdir(exist_ok=True)
    package = tmp_path / "host-package"
    if not package.exists():
        shutil.copytree(Path(leases.__file__).parent, package / "xla_host")
    home = tmp_path / f"home-{worker}"
    home.mkdir(exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-I",
            "-S",
            str(script),
            str(worker),
            str(workers),
            str(tmp_path / "slice"),
            str(tmp_path / "cache"),
            str(package),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"HOME": str(home), "PATH": os.defpath, **env},
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(params=["slice-dir", "coordinator"])
def board(request: pytest.FixtureRequest) -> dict[str, str]:
    """Where the workers meet: a shared directory, or worker 0's address on loopback."""
    return {} if request.param == "slice-dir" else {"COORD": f"127.0.0.1:{_free_port()}"}


@pytest.mark.slow
def test_two_worker_processes_start_every_phase_together_and_worker_0_merges(
    tmp_path: Path, board: dict[str, str]
) -> None:
    # Worker 1 arrives 1.2 s late at the warm phase: worker 0 must not start it before.
    # The heartbeat bound and each phase's deadline are an hour: a barrier that let the
    # workers go on any timer, not on the last arrival, would still hold them at the 60 s
    # the test waits, however slow the machine.
    late = {"STALL": "1:warm", "STALL_S": "1.2", "DEAD": "3600", "TIMEOUT": "3600", **board}
    workers = [_start(tmp_path, w, 2, **late) for w in (0, 1)]
    out = [p.communicate(timeout=60) for p in workers]
    assert [p.returncode for p in workers] == [0, 0], out
    w0, w1 = (json.loads(stdout) for stdout, _ in out)
    # No worker starts a phase before every worker has arrived at it, and every worker
    # starts it once the last one arrived (above: no timer lets them go). The barrier's
    # cost per phase is shown, not judged: a busy machine stretches it.
    costs = {}
    for phase in ("cold", "warm", "warm-2", "read-only"):
        last = max(w["arrived"][phase] for w in (w0, w1))
        assert min(w["started"][phase] for w in (w0, w1)) >= last, phase
        costs[phase] = max(w["started"][phase] for w in (w0, w1)) - last
    print(f"barrier cost per phase ({'coordinator' if board else 'directory'}): {costs}")
    # The stall happened (measured on worker 1's own clock: worker 0's pace between the
    # phases is the machine's, not the test's).
    assert w1["arrived"]["warm"] - w1["started"]["cold"] >= 1.2
    merged = w0["merged"]
    assert merged["hosts"] == 2 and merged["chips-per-host"] == 1
    assert merged["accelerator-type"] == merged["topology"] == "v6e-16"
    assert [(r["worker"], r["role"]) for r in merged["workers"]] == [(0, "writer"), (1, "reader")]
    assert all(r["checks"][0]["passed"] for r in merged["workers"])
    assert w1["merged"] is None
    if board:
        return
    # The run is over: the directory cannot be reused by a later run by mistake.
    with pytest.raises(UsageError, match="already holds a run"):
        slices.Slice(slices.SliceSpec(0, 2, tmp_path / "slice")).start()


def _wait_started(tmp_path: Path, worker: int) -> None:
    deadline = time.monotonic() + 60
    while not (tmp_path / f"started-{worker}").exists():
        assert time.monotonic() < deadline, f"worker {worker} did not start"
        time.sleep(0.05)
    time.sleep(0.5)  # a few heartbeats seen by the others


@pytest.mark.slow
def test_a_killed_worker_fails_the_run_naming_it_within_seconds(
    tmp_path: Path, board: dict[str, str]
) -> None:
    w0 = _start(tmp_path, 0, 2, **board)
    w1 = _start(tmp_path, 1, 2, STALL="1:warm", **board)  # stays in its cold phase, beating
    _wait_started(tmp_path, 1)
    w1.send_signal(signal.SIGKILL)
    _, stderr = w0.communicate(timeout=30)
    w1.wait()
    assert w0.returncode == ExitCode.TIMED_OUT, stderr
    assert "worker 1 stopped" in stderr and "warm" in stderr
    # Named by the heartbeat bound (dead_after, 2 s), not the 30 s phase deadline.
    assert "worker 1 stopped: no heartbeat for more than 2s" in stderr, stderr
    assert "did not arrive within" not in stderr


@pytest.mark.slow
def test_a_killed_coordinator_is_named_by_the_workers_waiting_on_it(tmp_path: Path) -> None:
    board = {"COORD": f"127.0.0.1:{_free_port()}"}
    w0 = _start(tmp_path, 0, 2, STALL="0:warm", **board)  # serves, then stays in cold
    w1 = _start(tmp_path, 1, 2, **board)
    _wait_started(tmp_path, 1)
    w0.send_signal(signal.SIGKILL)
    _, stderr = w1.communicate(timeout=30)
    w0.wait()
    assert w1.returncode == ExitCode.TIMED_OUT, stderr
    assert "worker 0 stopped" in stderr


def _wait_for(tmp_path: Path, marker: str, *workers: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not (tmp_path / marker).exists():
        if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
            for worker in workers:
                worker.kill()
            pytest.fail(f"no {marker}: {[w.communicate() for w in workers]}")
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stall", "killed_at", "seconds"),
    [
        # Worker 1 waits at warm-2, worker 0 has not arrived: killed there.
        ("0:warm-2", "arrived-1-warm-2", 0.0),
        # Worker 0 waits at the read-only phase, worker 1 is 1.5 s from arriving: worker 1
        # must not post to a dead coordinator as if posted, nor start the phase alone.
        ("1:read-only", "arrived-0-read-only", 1.5),
        # Both posted their results; worker 0 dies before it records them.
        ("0:finish", "arrived-1-finish", 0.0),
    ],
    ids=["waiting", "posting", "recording"],
)
def test_a_killed_worker_0_is_named_within_the_heartbeat_bound_and_no_worker_passes(
    tmp_path: Path, board: dict[str, str], stall: str, killed_at: str, seconds: float
) -> None:
    env = {"STALL": stall, "STALL_S": str(seconds) if seconds else "60", **board}
    w0, w1 = (_start(tmp_path, w, 2, **env) for w in (0, 1))
    _wait_for(tmp_path, killed_at, w0, w1)
    if stall == "0:finish":
        _wait_for(tmp_path, "arrived-0-finish", w0, w1)
    w0.send_signal(signal.SIGKILL)
    w0.wait()
    _, stderr = w1.communicate(timeout=60)
    assert w1.returncode == ExitCode.TIMED_OUT, stderr  # never 0, never a pass
    assert "worker 0 stopped" in stderr, stderr
    if stall != "0:finish" and (board or stall == "0:warm-2"):
        # Worker 0's arrival died with its coordinator (in a directory it stays: it did
        # arrive): worker 1 never starts the phase alone.
        assert not (tmp_path / "started-1-read-only").exists()
    # The bound that named it is the heartbeat's (2 s here), the board's or the
    # coordinator's, never the 30 s phase deadline.
    assert re.search(r"worker 0 stopped\b.* for more than 2s", stderr), stderr
    assert "within 30s" not in stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "signals", "dead_s"),
    [
        # A second signal ends it at once, though the heartbeat bound is an hour.
        (signal.SIGTERM, 2, "3600"),
        (signal.SIGINT, 2, "3600"),
        # One signal: telling the stopped coordinator waits one heartbeat bound (3 s) at
        # most, though each phase's deadline is an hour.
        (signal.SIGTERM, 1, "3"),
    ],
    ids=["SIGTERM-twice", "SIGINT-twice", "SIGTERM-once"],
)
def test_a_signalled_worker_ends_within_a_bound_even_when_its_coordinator_does_not_answer(
    tmp_path: Path, sig: signal.Signals, signals: int, dead_s: str
) -> None:
    # Worker 0 (the coordinator) is stopped, not dead: it accepts connections and never
    # answers, so telling it "worker 1 stopped" could wait for as long as one waits for
    # a coordinator that is merely slow. Every bound but the one under test is an hour:
    # a worker that waited on any of them would still be waiting at the 60 s the test
    # waits for it (20 times the 3 s bound), and fail it, however slow the machine.
    env = {
        "COORD": f"127.0.0.1:{_free_port()}", "STALL": "0:warm-2", "DEAD": dead_s,
        "TIMEOUT": "3600",
    }  # fmt: skip
    w0, w1 = (_start(tmp_path, w, 2, **env) for w in (0, 1))
    try:
        _wait_for(tmp_path, "arrived-1-warm-2", w0, w1)
        w0.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        for _ in range(signals):
            w1.send_signal(sig)
            time.sleep(0.5)
        _, stderr = w1.communicate(timeout=60)
    finally:
        w1.kill()  # when it did not end (the test fails): not left behind
        w0.kill()
        w0.send_signal(signal.SIGCONT)
        w0.wait()
    assert w1.returncode == 128 + sig, stderr


def test_a_worker_that_gives_up_stops_the_others_with_its_reason(tmp_path: Path) -> None:
    workers = [_start(tmp_path, w, 2, FAIL="1") for w in (0, 1)]
    out = [p.communicate(timeout=60) for p in workers]
    assert workers[0].returncode == ExitCode.FAILED, out
    assert "worker 1" in out[0][1] and "its restart check could not run" in out[0][1]


# --- pure verdicts -------------------------------------------------------------------------


def _arrival(worker: int, ok: bool = True) -> slices.Arrival:
    return slices.Arrival(worker, f"host-{worker}", 100 + worker, ok, "" if ok else "broke")


def test_the_barrier_waits_for_missing_workers_and_names_the_dead_or_late() -> None:
    def judge(arrived: list[int], beats: dict[int, float], now: float) -> slices.BarrierVerdict:
        return slices.judge_barrier(
            "restart:warm",
            3,
            {w: _arrival(w) for w in arrived},
            {w: slices.BeatSeen("1", since) for w, since in beats.items()},
            now=now,
            started=0.0,
            timeout_s=100.0,
            dead_after_s=5.0,
        )

    assert judge([0, 1, 2], {}, 1).state == "done"
    assert judge([0], {1: 0.0}, 3).state == "wait"
    dead = judge([0, 2], {1: 1.0}, 7)
    assert (dead.state, dead.missing) == ("timed_out", (1,))
    assert "worker 1 stopped" in dead.message and "restart:warm" in dead.message
    late = judge([0], {1: 99.0}, 101)
    assert late.state == "timed_out" and "worker 2 (never started)" in late.message
    failed = slices.judge_barrier(
        "x",
        2,
        {0: _arrival(0), 1: _arrival(1, ok=False)},
        {},
        now=0,
        started=0,
        timeout_s=1,
        dead_after_s=1,
    )
    assert failed.state == "failed" and "worker 1 (host-1): broke" in failed.message


def test_the_slice_comes_from_the_options_or_the_tpu_vms_environment(tmp_path: Path) -> None:
    assert slices.slice_spec(None, None, None, {}) is None
    tpu = {
        "TPU_WORKER_ID": "2",
        "TPU_WORKER_HOSTNAMES": "a,b,c,d",
        "TPU_ACCELERATOR_TYPE": "v6e-32",
    }
    spec = slices.slice_spec(None, None, tmp_path, tpu)
    assert spec is not None
    assert (spec.worker_id, spec.workers, spec.role, spec.accelerator_type) == (
        2,
        4,
        "reader",
        "v6e-32",
    )
    one = slices.slice_spec(
        None, None, None, {"TPU_WORKER_ID": "0"} | {"TPU_WORKER_HOSTNAMES": "a"}
    )
    assert one is not None and one.writer and one.directory is None
    with pytest.raises(UsageError, match="needs one place where they meet"):
        slices.slice_spec(1, 2, None, {})
    with pytest.raises(UsageError, match="needs one place where they meet"):
        slices.slice_spec(1, 2, tmp_path, {}, coordinator="h:1")
    with pytest.raises(UsageError, match="is not host:port"):
        slices.slice_spec(1, 2, None, {}, coordinator="worker-0")
    at = slices.slice_spec(1, 2, None, {}, coordinator="t1v-n-0:8476")
    assert at is not None and at.coordinator == ("t1v-n-0", 8476)
    with pytest.raises(UsageError, match="worker 2 is not one of 2"):
        slices.slice_spec(2, 2, tmp_path, {})


def test_the_merged_slice_fails_on_another_workers_failed_check() -> None:
    spec = slices.SliceSpec(0, 2, None)
    ok = {"name": "restart", "passed": True, "reasons": []}
    bad = {"name": "hbm", "passed": False, "reasons": ["TPU:0: query failed"]}
    payload = {"addressable_devices": ["TPU:0", "TPU:1"], "checks": [ok]}
    arrivals = {
        0: slices.Arrival(0, "h0", 1, True, "", payload),
        1: slices.Arrival(1, "h1", 1, True, "", {**payload, "checks": [ok, bad]}),
    }
    record = slices.merge_slice(spec, "TPU", arrivals)
    assert record["topology"] == "tpu-2x2" and record["chips-per-host"] == 2
    assert slices.slice_verdicts(record) == ["worker 1 (h1): hbm: TPU:0: query failed"]


# --- the writer lease ----------------------------------------------------------------------


def _holder(host: str, pid: int, heartbeat: float) -> leases.LeaseHolder:
    return leases.LeaseHolder(host, pid, "job", heartbeat, heartbeat)


def test_a_lease_is_stale_when_its_holder_is_gone_here_or_silent_elsewhere() -> None:
    def stale(holder: leases.LeaseHolder, alive: bool) -> str | None:
        return leases.lease_stale(
            holder, this_host="here", pid_alive=lambda _: alive, now=1000.0, stale_after_s=120
        )

    assert stale(_holder("here", 5, 0.0), alive=True) is None
    assert "pid 5 on this host is gone" in str(stale(_holder("here", 5, 999.0), alive=False))
    assert stale(_holder("there", 5, 900.0), alive=False) is None
    assert "heartbeat is 500s old" in str(stale(_holder("there", 5, 500.0), alive=True))


def test_a_second_claimant_reads_only_and_a_stale_lease_is_taken_over(tmp_path: Path) -> None:
    first = leases.claim_writer(tmp_path, "job-a")
    assert first.held and (tmp_path / leases.WRITER_LEASE).exists()
    second = leases.claim_writer(tmp_path, "job-b")
    assert not second.held
    assert f"pid {os.getpid()} job job-a" in second.message and "read-only" in second.message
    assert leases.judged_role(None, second) == "reader"
    second.release()  # not its lease: left alone
    assert (tmp_path / leases.WRITER_LEASE).exists()
    first.release()
    assert not (tmp_path / leases.WRITER_LEASE).exists()

    # A holder that died on this host: a process that ran and was reaped.
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = leases.LeaseHolder(socket.gethostname(), int(gone.stdout), "job-old", 1.0, 1.0)
    (tmp_path / leases.WRITER_LEASE).write_text(json.dumps(dead.__dict__))
    taken = leases.claim_writer(tmp_path, "job-c")
    assert taken.held and "took over the stale writer lease" in taken.message
    assert f"pid {dead.pid}" in taken.message
    assert json.loads((tmp_path / leases.WRITER_LEASE).read_text())["job"] == "job-c"
    taken.refresh()
    assert json.loads((tmp_path / leases.WRITER_LEASE).read_text())["heartbeat"] > 1.0
    # Taken over behind its back: its refresh does not write its lease back.
    other = leases.LeaseHolder("other-host", 1, "job-x", 2.0, 2.0)
    (tmp_path / leases.WRITER_LEASE).write_text(json.dumps(other.__dict__))
    taken.refresh()
    assert not taken.held
    assert json.loads((tmp_path / leases.WRITER_LEASE).read_text())["job"] == "job-x"
    taken.release()
    assert (tmp_path / leases.WRITER_LEASE).exists()

    # Another host's lease: its heartbeat decides.
    fresh = leases.LeaseHolder("other-host", 1, "job-far", time.time(), time.time())
    (tmp_path / leases.WRITER_LEASE).write_text(json.dumps(fresh.__dict__))
    assert not leases.claim_writer(tmp_path, "job-d").held
    old = leases.LeaseHolder("other-host", 1, "job-far", 0.0, time.time() - 600)
    (tmp_path / leases.WRITER_LEASE).write_text(json.dumps(old.__dict__))
    assert leases.claim_writer(tmp_path, "job-e").held


def test_a_coordinator_that_never_comes_up_is_named_after_the_slice_timeout() -> None:
    spec = slices.SliceSpec(1, 2, None, timeout_s=0.5, coordinator=("127.0.0.1", _free_port()))
    # Named after the slice timeout it was given, not the default one.
    named = r"coordinator 127\.0\.0\.1:\d+ \(worker 0\) did not answer within 0\.5s"
    with pytest.raises(slices.SliceTimeout, match=named):
        slices.Slice(spec).start()


def _read_while_claimed(lease: str, stop: Any, empty: Any) -> None:
    """Read the lease as fast as a claimant could, counting the reads that find it empty."""
    found = 0
    while not stop.is_set():
        try:
            with open(lease, "rb") as handle:
                found += handle.read() == b""
        except OSError:
            continue  # not there between a release and the next claim
    empty.put(found)


def test_a_claimed_lease_is_never_visible_without_its_content(tmp_path: Path) -> None:
    # It used to be created empty (O_EXCL) and written after: a claimant reading in between
    # judged it unreadable and took it over (2-3 holders among 6 simultaneous claims). Its
    # content is now complete before it becomes visible (a temporary file, then a link):
    # a reader spinning beside 100 claims never finds it empty (before: thousands of times).
    context = multiprocessing.get_context("fork")
    stop, empty = context.Event(), context.Queue()
    reader = context.Process(
        target=_read_while_claimed, args=(str(tmp_path / leases.WRITER_LEASE), stop, empty)
    )
    reader.start()
    try:
        for _ in range(100):
            lease = leases.claim_writer(tmp_path, "job-a")
            assert lease.held, lease.message
            lease.release()
    finally:
        stop.set()
        found = empty.get(timeout=30)
        reader.join(timeout=30)
    assert found == 0, f"the lease was seen empty {found} times"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary file left
