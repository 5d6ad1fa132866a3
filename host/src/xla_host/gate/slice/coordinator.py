"""A slice's board served by worker 0 over TCP (``--coordinator host:port``): the same
board as a directory's, in worker 0's memory, one JSON line per request and answer over a
short connection each; worker 0 reads its own memory directly.

Why not torch's ``TCPStore`` (what torchrun uses, and the first candidate for an
existing, tested store): the gate's orchestrator may not import torch. The host side is
standard library only (it is installed on TPU hosts beside any torch, and the builder
image runs it), and the orchestrator does not run in the torch environment it judges: it
looks at that environment from outside, through child processes of its interpreter, so
importing torch into the orchestrator would judge one torch with another. The board
needs a handful of operations (claim, put, arrivals, beats, finish, done); their
failure modes (a coordinator that died, or stopped and no longer answers) are tested
with real processes and sockets in tests/test_slice.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import time
from collections.abc import Mapping
from typing import Any

from xla_host.errors import UsageError
from xla_host.gate.slice.barrier import Arrival
from xla_host.gate.slice.spec import DEAD_AFTER_S, JOIN_TIMEOUT_S, POLL_S, WRITER, SliceTimeout


class _Memory:
    """The coordinator's state (worker 0's process): the same board, in memory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sections: dict[str, dict[int, dict[str, Any]]] = {}
        self.beats: dict[int, str] = {}
        self.claimed: set[int] = set()
        self.done: set[int] = set()
        self.finished = False

    def answer(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        with self.lock:
            if op == "claim":
                worker = int(request["worker"])
                fresh = worker not in self.claimed
                self.claimed.add(worker)
                return {"ok": fresh}
            if op == "put":
                arrival = dict(request["arrival"])
                self.sections.setdefault(str(request["section"]), {})[arrival["worker"]] = arrival
                return {"ok": True}
            if op == "arrivals":
                return {"arrivals": list(self.sections.get(str(request["section"]), {}).values())}
            if op == "beat":
                self.beats[int(request["worker"])] = str(request["value"])
                return {"ok": True}
            if op == "beats":
                return {"beats": {str(k): v for k, v in self.beats.items()}}
            if op == "finish":
                self.finished = True
                return {"ok": True}
            if op == "finished":
                return {"finished": self.finished}
            if op == "done":
                self.done.add(int(request["worker"]))
                return {"ok": True}
        return {"error": f"unknown request {op!r}"}


class CoordinatorBoard:
    """Where the workers meet: worker 0 serves the board on ``--coordinator host:port``
    (one JSON line per request and answer, over a short TCP connection each); the other
    workers ask it, worker 0 reads its own memory.

    Worker 0 gone is the coordinator gone: once the slice formed (a first answer), a
    worker that gets no answer for ``dead_after_s`` names worker 0 as stopped, whatever it
    was doing (waiting at a phase, posting its arrival, aborting); a post it could not
    make does not count as made. Before the first answer it waits ``wait_s`` for worker 0
    to come up (gcloud starts workers one after the other).

    Why not torch's ``TCPStore`` (what torchrun uses): this side is standard library only
    and the orchestrator does not run in the torch environment under test (it judges that
    environment from outside, through child processes), so it cannot import torch. The
    protocol here is one JSON line per connection over a handful of operations."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        serve: bool,
        wait_s: float = JOIN_TIMEOUT_S,
        dead_after_s: float = DEAD_AFTER_S,
    ) -> None:
        """``wait_s``: how long to wait for worker 0 to come up (``--slice-timeout``);
        ``dead_after_s``: how long a formed slice's coordinator may stay silent."""
        self.host, self.port, self.wait_s, self.dead_after_s = host, port, wait_s, dead_after_s
        # One request's bound: several fit in the heartbeat bound, so a coordinator that
        # accepts but never answers (stopped, not killed) is named in time too.
        self.timeout_s = max(0.2, min(5.0, dead_after_s / 4))
        self._memory = _Memory()
        self._server: socketserver.ThreadingTCPServer | None = None
        #: When the coordinator last answered (monotonic); None before it ever did.
        self.answered: float | None = None
        if serve:
            memory = self._memory
            timeout_s = self.timeout_s

            class Handler(socketserver.StreamRequestHandler):
                def handle(self) -> None:
                    self.connection.settimeout(timeout_s)
                    try:
                        request = json.loads(self.rfile.readline(1 << 20))
                        answer = memory.answer(request)
                    except (OSError, ValueError, TypeError, KeyError) as error:
                        answer = {"error": str(error)}
                    with contextlib.suppress(OSError):
                        self.wfile.write(json.dumps(answer).encode() + b"\n")

            socketserver.ThreadingTCPServer.allow_reuse_address = True
            try:
                self._server = socketserver.ThreadingTCPServer((host, port), Handler)
            except OSError as error:
                raise UsageError(
                    f"worker 0 cannot serve the slice's coordinator on {host}:{port}: {error}",
                    fix="pass --coordinator <worker 0's address>:<a free port> to every worker",
                ) from error
            self._server.daemon_threads = True
            threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def _ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        if self._server is not None:
            answer = self._memory.answer(request)  # worker 0: its own memory, no socket
        else:
            with socket.create_connection((self.host, self.port), timeout=self.timeout_s) as conn:
                conn.sendall(json.dumps(request).encode() + b"\n")
                answer = json.loads(conn.makefile("rb").readline(1 << 20))
        if not isinstance(answer, dict) or "error" in answer:
            raise OSError(f"the coordinator answered {answer!r}")
        self.answered = time.monotonic()
        return answer

    def gone(self) -> str | None:
        """Why the coordinator counts as stopped, or None while it may still answer."""
        if self._server is not None or self.answered is None:
            return None
        silent = time.monotonic() - self.answered
        if silent <= self.dead_after_s:
            return None
        return (
            f"worker 0 stopped: the coordinator {self.where} did not answer for more than "
            f"{self.dead_after_s:g}s (killed, or its host is gone)"
        )

    def _ask_until(
        self, request: Mapping[str, Any], deadline: float | None = None
    ) -> dict[str, Any]:
        """Ask until answered: before the slice formed, until worker 0 comes up (``wait_s``);
        after, until the coordinator counts as gone (or ``deadline``, monotonic)."""
        began = time.monotonic()
        while True:
            try:
                return self._ask(request)
            except (OSError, ValueError) as error:
                failure = error
            now = time.monotonic()
            gone = self.gone()
            if gone is not None:
                raise SliceTimeout(
                    f"the slice cannot go on: {gone}",
                    fix="read worker 0's output and logs (its --out directory); start a "
                    "new run with a fresh --coordinator port or --slice-dir",
                ) from failure
            if self.answered is None and now - began > self.wait_s:
                raise SliceTimeout(
                    f"the slice did not form: the coordinator {self.where} (worker 0) did "
                    f"not answer within {self.wait_s:g}s: {failure}",
                    fix="start worker 0 with the same --coordinator, or raise " "--slice-timeout",
                ) from failure
            if deadline is not None and now > deadline:
                raise SliceTimeout(
                    f"the coordinator {self.where} (worker 0) did not answer: {failure}",
                    fix="read worker 0's output and logs (its --out directory)",
                ) from failure
            time.sleep(POLL_S)

    def claim(self, worker: int, who: Mapping[str, Any]) -> bool:
        return bool(self._ask_until({"op": "claim", "worker": worker})["ok"])

    def put(self, section: str, arrival: Arrival, deadline: float | None = None) -> None:
        """Raises :class:`SliceTimeout` when the coordinator is gone: not posted."""
        request = {"op": "put", "section": section, "arrival": arrival.__dict__}
        self._ask_until(request, deadline)

    def arrivals(self, section: str) -> dict[int, Arrival] | None:
        """None when worker 0 does not answer (``gone`` says when that is final)."""
        try:
            rows = self._ask({"op": "arrivals", "section": section})["arrivals"]
            return {int(row["worker"]): Arrival(**row) for row in rows}
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def beat(self, worker: int, value: str) -> None:
        self._ask({"op": "beat", "worker": worker, "value": value})

    def beats(self, workers: int) -> dict[int, str]:
        try:
            return {int(k): str(v) for k, v in self._ask({"op": "beats"})["beats"].items()}
        except (OSError, ValueError, TypeError, KeyError):
            return {}  # worker 0 unreachable: ``gone`` names it once that lasts

    def finish(self, worker: int) -> None:
        """Worker 0: the results are recorded; the others may end."""
        if worker == WRITER:
            self._ask({"op": "finish"})

    def finished(self) -> bool:
        try:
            return bool(self._ask({"op": "finished"})["finished"])
        except (OSError, ValueError, TypeError, KeyError):
            return False

    def done(self, worker: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._ask({"op": "done", "worker": worker})

    def wait_done(self, workers: int, wait_s: float) -> None:
        """Worker 0 serves until every other worker saw the results recorded (bounded)."""
        deadline = time.monotonic() + wait_s
        while len(self._memory.done) < workers - 1 and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
