"""No gate child outlives the gate (xla_host.lineage, gate/children.py): a gate killed with
SIGKILL takes its children with it (the parent-death signal), also when a worker thread
that has since ended started them, and a child's processes in sessions of their own are
ended when its run ends (the gate is their subreaper; its run's marker finds them).

Real processes throughout: a plain Python parent standing in for the gate, and plain
Python children with the gate's child contract; no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.gate_helpers import process_alive
from tests.waiting import STOPPED_WITHIN_S

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the parent-death signal and /proc are Linux's"
)

# A gate child: says who it is, answers once the test asks (so it is known to run after
# its starting thread ended), then stays until something ends it.
LINGERING_CHILD = """
import argparse, os, pathlib, time
parser = argparse.ArgumentParser()
parser.add_argument("--out"); parser.add_argument("--dir")
args = parser.parse_args()
where = pathlib.Path(args.dir)
(where / "child.pid").write_text(str(os.getpid()))
while not (where / "go").exists():
    time.sleep(0.05)
(where / "answered").write_text("yes")
time.sleep(3600)
"""

# Stands in for the gate: starts the child from a worker thread, which then ends (as the
# gate's side-by-side checks do on their pool), and stays until the test kills it.
GATE_STAND_IN = """
import os, pathlib, sys, threading, time
from xla_host.gate.children import runtime_env, start_child
where = pathlib.Path(sys.argv[1])
thread = threading.Thread(target=lambda: start_child(
    sys.executable, "lingering", where / "runs", ["--dir", str(where)],
    runtime_env("CPU"), script=where / "child.py"))
thread.start()
thread.join()
(where / "thread-ended").write_text("yes")
time.sleep(3600)
"""

# A child that leaves a process in a session of its own behind, then reports and exits.
LEAVES_A_DAEMON = """
import argparse, json, pathlib, subprocess, sys
parser = argparse.ArgumentParser()
parser.add_argument("--out"); parser.add_argument("--dir")
args = parser.parse_args()
daemon = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(3600)"],
    start_new_session=True, stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
(pathlib.Path(args.dir) / "daemon.pid").write_text(str(daemon.pid))
pathlib.Path(args.out).write_text(json.dumps({"ok": True}))
"""

# Runs one child to its end as the gate does, then says whether the daemon still runs.
RUN_THEN_LOOK = """
import json, pathlib, sys
from tests.gate_helpers import process_alive
from xla_host.gate.children import run_child, runtime_env
where = pathlib.Path(sys.argv[1])
result = run_child(
    sys.executable, "daemonizing", where / "runs", ["--dir", str(where)],
    runtime_env("CPU"), 120, script=where / "child.py")
daemon = int((where / "daemon.pid").read_text())
print(json.dumps({"ok": result.ok, "daemon": daemon, "running": process_alive(daemon)}))
"""


def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll until ``condition`` holds; fail only at a bound no load reaches (waiting.py)."""
    deadline = time.monotonic() + STOPPED_WITHIN_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {STOPPED_WITHIN_S:.0f} s"
        time.sleep(0.05)


@pytest.fixture
def pids_to_end() -> Iterator[list[int]]:
    """Whatever the test started that a failure could leave running, killed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _repo_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_a_gate_killed_with_sigkill_takes_its_child_with_it(
    tmp_path: Path, pids_to_end: list[int]
) -> None:
    (tmp_path / "child.py").write_text(LINGERING_CHILD)
    gate = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(GATE_STAND_IN), str(tmp_path)],
        env=_repo_env(), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    pids_to_end.append(gate.pid)
    _until(lambda: (tmp_path / "thread-ended").exists() or gate.poll() is not None, "start")
    assert gate.poll() is None, "the stand-in gate ended on its own"
    _until(lambda: (tmp_path / "child.pid").exists(), "the child's start")
    child = int((tmp_path / "child.pid").read_text())
    pids_to_end.append(child)
    # The thread that started it has ended: the child still runs, and answers.
    (tmp_path / "go").touch()
    _until(lambda: (tmp_path / "answered").exists(), "the child's answer after its thread ended")

    gate.send_signal(signal.SIGKILL)
    gate.wait()
    _until(lambda: not process_alive(child), "the child's end after the gate was killed")


def test_a_process_a_child_started_in_a_session_of_its_own_ends_with_the_run(
    tmp_path: Path, pids_to_end: list[int]
) -> None:
    (tmp_path / "child.py").write_text(LEAVES_A_DAEMON)
    gate = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RUN_THEN_LOOK), str(tmp_path)],
        env=_repo_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=STOPPED_WITHIN_S * 3,
    )  # fmt: skip
    if (tmp_path / "daemon.pid").exists():
        pids_to_end.append(int((tmp_path / "daemon.pid").read_text()))
    assert gate.returncode == 0, gate.stderr
    seen = json.loads(gate.stdout.strip().splitlines()[-1])
    assert seen["ok"], seen
    # Gone by the time run_child returned, not merely after the gate exited.
    assert seen["running"] is False, f"the child's daemon {seen['daemon']} outlived its run"
    assert not process_alive(seen["daemon"])
    assert "ending 1 process(es) a finished child left running" in gate.stderr
