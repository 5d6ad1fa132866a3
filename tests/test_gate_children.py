"""Children run side by side (gate/children.py ``run_side_by_side``), with real processes.

Each child here waits for its peer to have started: run one after the other, the first
would wait in vain; side by side, each sees the other.
"""

from __future__ import annotations

import sys
from pathlib import Path

from xla_wheels.gate.children import ChildSpec, run_side_by_side, runtime_env

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
