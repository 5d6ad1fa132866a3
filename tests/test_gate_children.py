"""Children run side by side (gate/children.py ``run_side_by_side``), checks run side by side
(``run_in_parallel``) and a stalled child is stopped early (``stall_s``), with real
processes.

Each child here waits for its peer to have started: run one after the other, the first
would wait in vain; side by side, each sees the other.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.gate_helpers import process_alive
from xla_host.gate.children import (
    ChildResult,
    ChildSpec,
    finish_child,
    run_child,
    run_in_parallel,
    run_side_by_side,
    runtime_env,
    start_child,
)

# A child with the gate's contract (--out JSON report, standard library only).
PEER_WAITER = """
import argparse, json, pathlib, time
parser = argparse.ArgumentParser()
parser.add_argument("--out"); parser.add_argument("--me"); parser.add_argument("--peer")
parser.add_argument("--dir")
args = parser.parse_args()
rendezvous = pathlib.Path(args.dir)
(rendezvous / args.me).touch()
deadline = time.monotonic() + 20
while not (rendezvous / args.peer).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
report = {"ok": True, "me": args.me, "saw_peer": (rendezvous / args.peer).exists()}
pathlib.Path(args.out).write_text(json.dumps(report))
"""


def test_children_side_by_side_run_at_once_and_come_back_in_order(tmp_path: Path) -> None:
    script = tmp_path / "peer_waiter.py"
    script.write_text(PEER_WAITER)
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    env = runtime_env("CPU")
    specs = [
        ChildSpec(me, ["--me", me, "--peer", peer, "--dir", str(rendezvous)], env, script)
        for me, peer in (("first", "second"), ("second", "first"))
    ]
    results = run_side_by_side(sys.executable, tmp_path / "runs", specs, 60, device="CPU")
    assert [r.name for r in results] == ["first", "second"]
    assert all(r.ok for r in results), [r.failure() for r in results]
    assert [r.report["saw_peer"] for r in results if r.report] == [True, True]
    assert (tmp_path / "runs" / "first.log").is_file()


def test_on_a_tpu_children_run_one_after_the_other(tmp_path: Path) -> None:
    # A process that opens a TPU holds its chips: the second could not start beside it.
    script = tmp_path / "peer_waiter.py"
    script.write_text(PEER_WAITER.replace("+ 20", "+ 0.5"))
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    env = runtime_env("TPU")
    specs = [
        ChildSpec(me, ["--me", me, "--peer", peer, "--dir", str(rendezvous)], env, script)
        for me, peer in (("first", "second"), ("second", "first"))
    ]
    results = run_side_by_side(sys.executable, tmp_path / "runs", specs, 60, device="TPU")
    # The first finished before the second started, so only the second saw its peer.
    assert [r.report["saw_peer"] for r in results if r.report] == [False, True]


# A child that first computes for a while, then either keeps computing or blocks forever
# (as stock 2.7.0's SPMD warm run blocks in XLA's rendezvous).
COMPUTE_THEN = """
import argparse, json, pathlib, threading, time
parser = argparse.ArgumentParser()
parser.add_argument("--out"); parser.add_argument("--then"); parser.add_argument("--for-s")
args = parser.parse_args()
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
spin(1.0)
if args.then == "block":
    threading.Event().wait()
spin(float(args.for_s))
pathlib.Path(args.out).write_text(json.dumps({"ok": True}))
"""


def _compute_then(tmp_path: Path, then: str, for_s: float, stall_s: float | None, timeout: float):
    script = tmp_path / "compute_then.py"
    script.write_text(COMPUTE_THEN)
    args = ["--then", then, "--for-s", str(for_s)]
    began = time.monotonic()
    result = run_child(
        sys.executable, then, tmp_path / "runs", args, runtime_env("CPU"), timeout,
        stall_s=stall_s, script=script,
    )  # fmt: skip
    return result, time.monotonic() - began


@pytest.mark.slow
def test_a_child_that_stops_using_cpu_is_killed_after_the_stall_window(tmp_path: Path) -> None:
    result, _ = _compute_then(tmp_path, "block", 0, stall_s=2.0, timeout=60)
    assert result.timed_out and not result.ok
    # Killed by the stall window (which records how long it saw no CPU, never less than
    # the window), not at its 60 s bound: a child timed out by its bound has no stalled_s.
    assert result.extra["stalled_s"] >= 2.0
    assert "used no CPU time for" in result.failure() and "timed out after" not in result.failure()


@pytest.mark.slow
def test_a_child_computing_longer_than_the_stall_window_is_left_to_finish(tmp_path: Path) -> None:
    result, _ = _compute_then(tmp_path, "compute", 4.0, stall_s=2.0, timeout=60)
    assert result.ok, result.failure()
    assert "stalled_s" not in result.extra


@pytest.mark.slow
def test_without_a_stall_window_a_blocked_child_runs_to_its_bound(tmp_path: Path) -> None:
    result, took = _compute_then(tmp_path, "block", 0, stall_s=None, timeout=4)
    assert result.timed_out and "stalled_s" not in result.extra
    assert took >= 4


def test_checks_side_by_side_stop_every_child_when_one_fails(tmp_path: Path) -> None:
    script = tmp_path / "compute_then.py"
    script.write_text(COMPUTE_THEN)
    started: list[int] = []
    finished: list[ChildResult] = []

    def blocked_check() -> str:
        handle = start_child(
            sys.executable, "blocked", tmp_path / "runs", ["--then", "block", "--for-s", "0"],
            runtime_env("CPU"), script=script,
        )  # fmt: skip
        started.append(handle[0].pid)
        finished.append(finish_child(handle, "blocked", 120))
        start_child(sys.executable, "next", tmp_path / "runs", [], runtime_env("CPU"))
        return "never"

    def failing_check() -> str:
        while not started:
            time.sleep(0.05)
        raise RuntimeError("the cache directory is not writable")

    with pytest.raises(RuntimeError, match="not writable"):
        run_in_parallel([blocked_check, failing_check], side_by_side=True)
    # The blocked child was killed by the stop, not waited for until its 120 s bound.
    assert [result.timed_out for result in finished] == [False], finished
    assert not process_alive(started[0])
    # The stop ends with the run: a later gate in this process starts children again.
    result, _ = _compute_then(tmp_path, "compute", 0, stall_s=None, timeout=60)
    assert result.ok


# Counts this process's child processes once torch_xla is imported.
COUNT_CHILD_PROCESSES = """
import pathlib, torch_xla
tasks = pathlib.Path("/proc/self/task").iterdir()
print(sum(len((task / "children").read_text().split()) for task in tasks))
"""


def test_the_gate_environment_starts_no_inductor_compile_workers(
    stock_xla_python_27: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stock torch 2.7.0 from PyPI brings triton, so importing torch_xla starts inductor's
    # compile worker processes; under the gate's environment it must start none.
    monkeypatch.delenv("TORCH_WARM_POOL", raising=False)
    env = runtime_env("CPU")
    counted = [
        subprocess.run(
            [str(stock_xla_python_27), "-c", COUNT_CHILD_PROCESSES],
            env=run_env, capture_output=True, text=True, check=True, cwd=tmp_path,
        ).stdout.split()[-1]
        for run_env in (env, {**env, "TORCH_WARM_POOL": "1"})
    ]  # fmt: skip
    assert counted[0] == "0"
    # The control: with the pool on, the same import starts workers, so the count can fail.
    assert int(counted[1]) > 0


def test_a_callers_own_warm_pool_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCH_WARM_POOL", raising=False)
    assert runtime_env("CPU")["TORCH_WARM_POOL"] == "0"
    monkeypatch.setenv("TORCH_WARM_POOL", "1")
    assert runtime_env("CPU")["TORCH_WARM_POOL"] == "1"


def test_no_child_runs_under_a_switch_of_the_gate_s_own_making() -> None:
    # The verify switch (an earlier patch 0005) is gone: every child measures the warm
    # start a training process gets, with nothing on that training would not have.
    env = runtime_env("TPU", cache_dir=Path("c"), read_only=True)
    assert "XLA_PERSISTENT_CACHE_VERIFY" not in env


# A child in the workload's factory, as gate/child_workload.py says it: the phase file
# beside its report, then a factory that waits (a sleep, a lock, a server that never answers).
SLEEPING_FACTORY = """
import argparse, pathlib, time
parser = argparse.ArgumentParser()
parser.add_argument("--out")
args = parser.parse_args()
pathlib.Path(args.out + ".phase").write_text("the workload's factory (team.py:build)\\n")
time.sleep(120)
"""


@pytest.mark.slow
def test_a_child_that_stalls_in_the_workloads_factory_is_reported_as_the_workloads_wait(
    tmp_path: Path,
) -> None:
    from xla_host.gate import restart

    script = tmp_path / "sleeping_factory.py"
    script.write_text(SLEEPING_FACTORY)
    result = run_child(
        sys.executable, "warm-1", tmp_path / "runs", [], runtime_env("CPU"), 60,
        stall_s=2.0, script=script,
    )  # fmt: skip
    assert result.timed_out and result.extra["phase"] == "the workload's factory (team.py:build)"
    assert "in the workload's factory (team.py:build)" in result.failure()
    row = restart.summarize(result) | {"hang_bound_s": 60.0, "hang_rule": "3 x 20s"}
    said = restart._unfinished(row)
    assert said.startswith("warm-1 hung in the workload's factory (team.py:build): it used no")
    assert "the workload's own code waited" in said
    assert "it waited for something that does not come" not in said  # not blamed on XLA

    # A later child of the same name, stalled in the runtime, is not told the old phase.
    blocked = tmp_path / "blocked.py"
    blocked.write_text("import time\ntime.sleep(120)\n")
    again = run_child(
        sys.executable, "warm-1", tmp_path / "runs", [], runtime_env("CPU"), 60,
        stall_s=2.0, script=blocked,
    )  # fmt: skip
    assert again.timed_out and "phase" not in again.extra
    row = restart.summarize(again) | {"hang_bound_s": 60.0, "hang_rule": "3 x 20s"}
    assert "it waited for something that does not come" in restart._unfinished(row)
