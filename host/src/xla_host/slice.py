"""A multi-host slice: the workers of one gate run, their barrier, and the writer lease.

``xla-wheels gate`` started on every worker of a slice (``gcloud compute tpus tpu-vm ssh
--worker=all``) forms one run. Worker 0 is the only writer of the shared cache directory;
every other worker is a reader (``XLA_PERSISTENT_CACHE_READ_ONLY=1``). The workers start
each phase (cold, warm, read-only) together through a barrier on a board they all see:
a directory on a shared mount (``--slice-dir``, ``DirectoryBoard``), or worker 0's
address (``--coordinator host:port``, ``CoordinatorBoard``: worker 0 keeps the same board
in memory and serves it over TCP):

* a worker arrives at a phase by writing ``<slice-dir>/<phase>/worker-<N>.json`` by
  rename (a reader never sees half a file), or telling the coordinator, with whether it
  is still fit to go on;
* it then polls until every worker has arrived, or a worker reports that it failed, or
  a missing worker is dead (its heartbeat file stopped changing for ``dead_after_s``,
  measured on the waiter's own clock, so clock skew between hosts does not matter), or
  the phase's deadline (``timeout_s``) passed; the error names the missing worker(s).

Why not torch_xla's own multi-process runtime: on TPU, libtpu forms a multi-host runtime
from the slice's metadata, but on CPU torch_xla cannot join processes of several hosts
into one runtime the way libtpu does, so a barrier that depended on it could never run
here. The barrier runs the same everywhere (this machine's tests, a TPU slice) and needs
nothing but a shared directory or a port on worker 0 the others can reach. Worker 0
gone (its process, or its coordinator) shows as its heartbeat no longer moving.

The writer lease (``WRITER_LEASE``) keeps one writer per cache directory across jobs:
the writer role is claimed by creating the lease file with ``O_EXCL``; a second claimant
runs read-only with a warning naming the holder; a stale lease (``lease_stale``: its
holder's process is gone on this host, or its heartbeat is older than ``stale_after_s``
as seen from another host) is taken over with a message.

Standard library only, like the whole host side.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from xla_host import filemode, log, signals
from xla_host.errors import CheckFailed, ExitCode, PipelineError, UsageError

#: The writer's role: the one worker that writes the shared cache directory.
WRITER = 0
#: The lease file in a cache directory: who is its writer (ignored by the cache checks).
WRITER_LEASE = ".xla-wheels-writer.lease"
#: How often a worker's heartbeat (and a held lease) is refreshed.
BEAT_S = 1.0
#: A worker whose heartbeat did not change for this long is dead (seconds).
DEAD_AFTER_S = 10.0
#: A phase's deadline for workers that never showed a heartbeat (gcloud starts workers
#: one after the other; each imports torch first).
JOIN_TIMEOUT_S = 600.0
#: A lease whose heartbeat is older than this, read from another host, is stale.
LEASE_STALE_AFTER_S = 120.0
_POLL_S = 0.2


class SliceError(PipelineError):
    """The slice cannot go on (either kind below)."""


class SliceTimeout(SliceError):
    """A worker did not arrive at a phase in time (dead or never started): exit 8."""

    exit_code = ExitCode.TIMED_OUT


class SliceWorkerFailed(SliceError, CheckFailed):
    """Another worker reported that it cannot go on: exit 1."""


@dataclass(frozen=True)
class SliceSpec:
    """Which worker this is, of how many, and where they meet."""

    worker_id: int
    workers: int
    directory: Path | None
    """The shared barrier directory (None only for a slice of one worker)."""
    accelerator_type: str | None = None
    """``v6e-32`` style, from ``TPU_ACCELERATOR_TYPE`` where the TPU VM sets it."""
    timeout_s: float = JOIN_TIMEOUT_S
    dead_after_s: float = DEAD_AFTER_S
    coordinator: tuple[str, int] | None = None
    """``--coordinator host:port``: worker 0 serves the board there instead of a directory."""

    @property
    def role(self) -> str:
        return "writer" if self.worker_id == WRITER else "reader"

    @property
    def writer(self) -> bool:
        return self.worker_id == WRITER


def slice_spec(
    worker_id: int | None,
    workers: int | None,
    directory: Path | None,
    env: Mapping[str, str],
    *,
    timeout_s: float = JOIN_TIMEOUT_S,
    coordinator: str | None = None,
) -> SliceSpec | None:
    """The slice from the options, else from the TPU VM's environment (``TPU_WORKER_ID``,
    ``TPU_WORKER_HOSTNAMES``); None when neither names one (one host, no slice)."""
    hostnames = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if worker_id is None and env.get("TPU_WORKER_ID", "").strip():
        try:
            worker_id = int(env["TPU_WORKER_ID"])
        except ValueError:
            raise UsageError(
                f"TPU_WORKER_ID={env['TPU_WORKER_ID']!r} is not a worker number",
                fix="pass --worker-id N explicitly",
            ) from None
    if workers is None and hostnames:
        workers = len(hostnames)
    if workers is None and worker_id == 0 and directory is None:
        workers = 1  # TPU_WORKER_ID=0 without a host list: a one-host slice
    if worker_id is None and workers is None and directory is None and coordinator is None:
        return None
    if worker_id is None or workers is None:
        raise UsageError(
            "a slice needs this worker's number and the number of workers",
            fix="pass --worker-id N --workers M (on a TPU VM TPU_WORKER_ID and "
            "TPU_WORKER_HOSTNAMES give them)",
        )
    if workers < 1 or not 0 <= worker_id < workers:
        raise UsageError(
            f"worker {worker_id} is not one of {workers} worker(s) (0 to {workers - 1})",
            fix="number the workers 0 to M-1 with --worker-id, and --workers M",
        )
    if workers > 1 and (directory is None) == (coordinator is None):
        raise UsageError(
            f"a slice of {workers} workers needs one place where they meet: a directory "
            "every worker sees, or worker 0's address",
            fix="pass --slice-dir DIR on a shared mount (a fresh one per run), or "
            "--coordinator <worker 0's host>:<port>, to every worker",
        )
    accelerator = env.get("TPU_ACCELERATOR_TYPE", "").strip() or None
    address = _address(coordinator) if coordinator is not None else None
    return SliceSpec(worker_id, workers, directory, accelerator, timeout_s, coordinator=address)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--coordinator {text!r} is not host:port",
            fix="pass --coordinator <worker 0's host or address>:<port>, e.g. t1v-n-0:8476",
        )
    return host.strip("[]"), int(port)


# --- the barrier -------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    """One worker's file at a phase."""

    worker: int
    host: str
    pid: int
    ok: bool
    reason: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BeatSeen:
    """A worker's heartbeat as this waiter saw it: its value, and since when (monotonic)."""

    value: str
    since: float


@dataclass(frozen=True)
class BarrierVerdict:
    state: str
    """``done``, ``wait``, ``failed`` (a worker reported failure) or ``timed_out``."""
    missing: tuple[int, ...] = ()
    message: str = ""


def judge_barrier(
    phase: str,
    workers: int,
    arrived: Mapping[int, Arrival],
    beats: Mapping[int, BeatSeen],
    *,
    now: float,
    started: float,
    timeout_s: float,
    dead_after_s: float,
) -> BarrierVerdict:
    """Whether a phase can start: a pure verdict from what the waiter has seen."""
    failed = sorted((a for a in arrived.values() if not a.ok), key=lambda a: a.worker)
    if failed:
        named = "; ".join(f"worker {a.worker} ({a.host}): {a.reason}" for a in failed)
        return BarrierVerdict("failed", (), f"{phase}: {named}")
    missing = tuple(w for w in range(workers) if w not in arrived)
    if not missing:
        return BarrierVerdict("done")
    dead = [w for w in missing if w in beats and now - beats[w].since > dead_after_s]
    if dead:
        names = ", ".join(f"worker {w}" for w in dead)
        return BarrierVerdict(
            "timed_out",
            tuple(dead),
            f"{phase}: {names} stopped: no heartbeat for more than {dead_after_s:g}s "
            "(killed, or its host is gone)",
        )
    if now - started > timeout_s:
        names = ", ".join(
            f"worker {w}" + ("" if w in beats else " (never started)") for w in missing
        )
        return BarrierVerdict(
            "timed_out", missing, f"{phase}: {names} did not arrive within {timeout_s:g}s"
        )
    return BarrierVerdict("wait", missing)


class DirectoryBoard:
    """Where the workers meet: files in a directory every worker sees (``--slice-dir``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def where(self) -> str:
        return str(self.directory)

    def claim(self, worker: int, who: Mapping[str, Any]) -> bool:
        """Register ``worker``; False when a finished run or this worker number used it."""
        (self.directory / "start").mkdir(parents=True, exist_ok=True)
        (self.directory / "alive").mkdir(parents=True, exist_ok=True)
        mine = self.directory / "start" / f"worker-{worker}.json"
        return not (self.directory / "finished.json").exists() and _create(mine, json.dumps(who))

    def put(self, section: str, arrival: Arrival) -> None:
        where = self.directory / section
        where.mkdir(parents=True, exist_ok=True)
        filemode.write_by_rename(
            where / f"worker-{arrival.worker}.json",
            json.dumps(arrival.__dict__, sort_keys=True) + "\n",
        )

    def arrivals(self, section: str) -> dict[int, Arrival]:
        return _read_arrivals(self.directory / section)

    def beat(self, worker: int, value: str) -> None:
        filemode.write_by_rename(self.directory / "alive" / f"worker-{worker}", value)

    def beats(self, workers: int) -> dict[int, str]:
        seen = {}
        for worker in range(workers):
            with contextlib.suppress(OSError):
                seen[worker] = (self.directory / "alive" / f"worker-{worker}").read_text()
        return seen

    def finish(self, worker: int) -> None:
        if worker == WRITER:
            filemode.write_by_rename(self.directory / "finished.json", "{}\n")

    def finished(self) -> bool:
        return (self.directory / "finished.json").exists()

    def done(self, worker: int) -> None:
        pass  # the directory stays: worker 0 waits for no one

    def gone(self) -> str | None:
        return None  # a directory does not die; worker 0's heartbeat says whether it did

    def close(self) -> None:
        pass


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
                    fix="start worker 0 with the same --coordinator, or raise "
                    "--slice-timeout",
                ) from failure
            if deadline is not None and now > deadline:
                raise SliceTimeout(
                    f"the coordinator {self.where} (worker 0) did not answer: {failure}",
                    fix="read worker 0's output and logs (its --out directory)",
                ) from failure
            time.sleep(_POLL_S)

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
            time.sleep(_POLL_S)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


Board: TypeAlias = DirectoryBoard | CoordinatorBoard


class Slice:
    """This worker's side of a running slice: heartbeat, phases, and the results."""

    def __init__(self, spec: SliceSpec, *, beat_s: float = BEAT_S) -> None:
        self.spec = spec
        self.host = socket.gethostname()
        self._beat_s = beat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats = 0
        self._board: Board | None = None
        # Every worker's heartbeat as this worker saw it, kept across phases: a worker
        # whose heartbeat stopped during a phase is dead at the next one at once.
        self._seen: dict[int, BeatSeen] = {}
        #: Seconds each barrier took on this worker, by phase (``barrier_costs``).
        self.waited: dict[str, float] = {}

    @property
    def board(self) -> Board:
        if self._board is None:
            board: Board
            if self.spec.coordinator is not None:
                host, port = self.spec.coordinator
                board = CoordinatorBoard(
                    host,
                    port,
                    serve=self.spec.writer,
                    wait_s=self.spec.timeout_s,
                    dead_after_s=self.spec.dead_after_s,
                )
            else:
                assert self.spec.directory is not None
                board = DirectoryBoard(self.spec.directory)
            self._board = board
            return board
        return self._board

    def _beat(self) -> None:
        self._beats += 1
        self.board.beat(self.spec.worker_id, f"{self._beats}\n")

    def start(self) -> None:
        """Announce this worker: refuse a board a finished run or this worker used."""
        if self.spec.workers == 1:
            return
        me = {"host": self.host, "pid": os.getpid()}
        with signals.interruptible():
            claimed = self.board.claim(self.spec.worker_id, me)
        if not claimed:
            raise UsageError(
                f"{self.board.where} already holds a run with worker {self.spec.worker_id} (a "
                "finished run, or two workers given the same --worker-id)",
                fix="give every run a fresh --slice-dir and each worker its own --worker-id",
            )
        with contextlib.suppress(OSError):
            self._beat()
        self._thread = threading.Thread(target=self._run_beats, name="slice-heartbeat", daemon=True)
        self._thread.start()
        log.info(
            f"slice: worker {self.spec.worker_id} of {self.spec.workers} ({self.spec.role} of "
            f"the cache), meeting at {self.board.where}"
        )

    def _run_beats(self) -> None:
        while not self._stop.wait(self._beat_s):
            with contextlib.suppress(OSError):  # a missed beat is a later one's job
                self._beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # A daemon thread: one request's bound at most, never the run's end delayed.
            self._thread.join(timeout=1)
        if self._board is not None:
            self._board.close()

    def _look(self) -> None:
        """Move every worker's heartbeat as seen on this worker's clock."""
        now = time.monotonic()
        for worker, value in self.board.beats(self.spec.workers).items():
            if worker not in self._seen or self._seen[worker].value != value:
                self._seen[worker] = BeatSeen(value, now)

    def _gone(self, phase: str) -> None:
        """Raise when the coordinator stopped answering (worker 0 gone)."""
        gone = self.board.gone()
        if gone is not None:
            raise SliceTimeout(
                f"the slice cannot go on: {phase}: {gone}",
                fix="read worker 0's output and logs (its --out directory); start a new run "
                "with a fresh --coordinator port or --slice-dir",
            )

    def join(
        self,
        phase: str,
        *,
        ok: bool = True,
        reason: str = "",
        payload: Mapping[str, Any] | None = None,
    ) -> dict[int, Arrival]:
        """Arrive at ``phase`` and wait for every worker; return every worker's arrival.

        Raises :class:`SliceWorkerFailed` when a worker reported failure (``ok=False``:
        this one too, once the others know) and :class:`SliceTimeout` naming the missing
        workers, or worker 0 when its coordinator stopped answering."""
        me = Arrival(self.spec.worker_id, self.host, os.getpid(), ok, reason, dict(payload or {}))
        if self.spec.workers == 1:
            return {me.worker: me}
        started = time.monotonic()
        with signals.interruptible():
            self.board.put(phase, me)  # a coordinator gone raises: nothing was posted
            if not ok:
                return {me.worker: me}  # the others learn it; this worker goes its own way
            arrived = self._wait(phase, me, started)
        self.waited[phase] = round(time.monotonic() - started, 4)
        return arrived

    def _wait(self, phase: str, me: Arrival, started: float) -> dict[int, Arrival]:
        seen: dict[str, dict[int, Arrival]] = {phase: {me.worker: me}, "aborted": {}}
        while True:
            for section in seen:
                # None: the coordinator did not answer this time; ``_gone`` says when that
                # is final. What was seen before stays seen (arrivals are never withdrawn).
                if (fresh := self.board.arrivals(section)) is not None:
                    seen[section] = {**seen[section], **fresh}
            self._gone(phase)
            # A worker that gave up anywhere (``abort``) fails every phase it has not reached.
            arrived = {**seen[phase], **seen["aborted"]}
            self._look()
            verdict = judge_barrier(
                phase,
                self.spec.workers,
                arrived,
                self._seen,
                now=time.monotonic(),
                started=started,
                timeout_s=self.spec.timeout_s,
                dead_after_s=self.spec.dead_after_s,
            )
            if verdict.state == "done":
                return arrived
            if verdict.state == "failed":
                raise SliceWorkerFailed(
                    f"the slice cannot go on: {verdict.message}",
                    fix="read that worker's report and logs (its --out directory)",
                )
            if verdict.state == "timed_out":
                raise SliceTimeout(
                    f"the slice did not form: {verdict.message}",
                    fix="start `xla-wheels gate` on every worker with the same --workers and "
                    "--slice-dir or --coordinator (gcloud compute tpus tpu-vm ssh "
                    "--worker=all), or raise --slice-timeout",
                )
            time.sleep(_POLL_S)

    def abort(self, reason: str) -> None:
        """Tell the other workers this one stopped (an error before or between phases):
        within one heartbeat bound at most, and at once on a second signal."""
        if self.spec.workers > 1:
            me = Arrival(self.spec.worker_id, self.host, os.getpid(), False, reason)
            deadline = time.monotonic() + self.spec.dead_after_s
            with signals.interruptible(), contextlib.suppress(OSError, PipelineError):
                if isinstance(self.board, CoordinatorBoard):
                    self.board.put("aborted", me, deadline)
                else:
                    self.board.put("aborted", me)

    def finish(self) -> None:
        """The results are recorded: worker 0 says so and serves until every other worker
        saw it (bounded); every other worker waits for that word, and fails, never passes,
        when worker 0 stops before it (a slice's verdict is worker 0's record)."""
        if self.spec.workers == 1:
            return
        board = self.board
        with signals.interruptible():
            if self.spec.writer:
                board.finish(WRITER)
                if isinstance(board, CoordinatorBoard):
                    board.wait_done(self.spec.workers, self.spec.dead_after_s)
                return
            started = time.monotonic()
            while not board.finished():
                self._gone("recording the results")
                self._look()
                beat = self._seen.get(WRITER)
                now = time.monotonic()
                if beat is not None and now - beat.since > self.spec.dead_after_s:
                    raise SliceTimeout(
                        "the slice cannot go on: worker 0 stopped before it recorded the "
                        f"results: no heartbeat for more than {self.spec.dead_after_s:g}s",
                        fix="read worker 0's output and logs (its --out directory)",
                    )
                if now - started > self.spec.timeout_s:
                    raise SliceTimeout(
                        f"worker 0 did not record the results within {self.spec.timeout_s:g}s",
                        fix="read worker 0's output and logs (its --out directory)",
                    )
                time.sleep(_POLL_S)
            board.done(self.spec.worker_id)


def _read_arrivals(where: Path) -> dict[int, Arrival]:
    arrived: dict[int, Arrival] = {}
    for path in where.glob("worker-*.json"):
        try:
            data = json.loads(path.read_text())
            arrival = Arrival(**data)
        except (OSError, ValueError, TypeError):
            continue  # written by rename: a file that does not parse is not ours
        arrived[arrival.worker] = arrival
    return arrived


@contextlib.contextmanager
def running(spec: SliceSpec, *, beat_s: float = BEAT_S) -> Iterator[Slice]:
    """A started slice whose heartbeat stops with the block."""
    member = Slice(spec, beat_s=beat_s)
    member.start()
    try:
        yield member
    finally:
        member.stop()


# --- what worker 0 records ---------------------------------------------------------------


def merge_slice(spec: SliceSpec, device: str, arrivals: Mapping[int, Arrival]) -> dict[str, Any]:
    """The receipt's record of the slice from every worker's results payload: accelerator
    type, number of hosts, chips per host (addressable devices), each worker's verdicts."""
    rows: list[dict[str, Any]] = []
    for worker in sorted(arrivals):
        arrival = arrivals[worker]
        rows.append(
            {
                "worker": worker,
                "host": arrival.host,
                "role": "writer" if worker == WRITER else "reader",
                "addressable-devices": list(arrival.payload.get("addressable_devices", [])),
                "checks": list(arrival.payload.get("checks", [])),
            }
        )
    counts = sorted({len(r["addressable-devices"]) for r in rows})
    chips = counts[0] if len(counts) == 1 else None
    return {
        "accelerator-type": spec.accelerator_type,
        "hosts": spec.workers,
        "chips-per-host": chips,
        "topology": topology(device, spec.accelerator_type, spec.workers, chips),
        "workers": rows,
    }


def topology(device: str, accelerator_type: str | None, hosts: int, chips: int | None) -> str:
    """What promotion compares receipts by: the accelerator type where the TPU VM names it
    (``v6e-32``), else the device with hosts x devices per host (``cpu-2x1``)."""
    if accelerator_type:
        return accelerator_type
    return f"{device.lower()}-{hosts}x{chips if chips is not None else '?'}"


def slice_verdicts(record: Mapping[str, Any]) -> list[str]:
    """Why the slice as a whole fails: each other worker's failed check, and devices per
    host that differ between workers."""
    reasons = []
    for row in record.get("workers", []):
        for check in row.get("checks", []):
            if row["worker"] != WRITER and check.get("passed") is False:
                why = "; ".join(check.get("reasons", [])[:2])
                reasons.append(f"worker {row['worker']} ({row['host']}): {check['name']}: {why}")
    if record.get("chips-per-host") is None and record.get("workers"):
        counts = {r["worker"]: len(r["addressable-devices"]) for r in record["workers"]}
        reasons.append(f"the workers address different numbers of devices: {counts}")
    return reasons


# --- the writer lease --------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseHolder:
    host: str
    pid: int
    job: str
    since: float
    """UTC seconds when the lease was claimed."""
    heartbeat: float
    """UTC seconds of the holder's last refresh."""

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
        return f"{self.host} pid {self.pid} job {self.job or '-'} since {since}"


def lease_stale(
    holder: LeaseHolder,
    *,
    this_host: str,
    pid_alive: Callable[[int], bool],
    now: float,
    stale_after_s: float = LEASE_STALE_AFTER_S,
) -> str | None:
    """Why a lease is stale, or None when its holder may still be writing.

    On this host the holder's pid says it all. From another host only the heartbeat can:
    a shared FS gives no view of the holder's processes, and the clocks of two hosts agree
    only roughly, so ``stale_after_s`` is minutes, not seconds."""
    if holder.host == this_host:
        # A reused pid makes a gone holder look alive: the safe way round (read-only).
        if pid_alive(holder.pid):
            return None
        return f"its holder pid {holder.pid} on this host is gone"
    age = now - holder.heartbeat
    if age > stale_after_s:
        return f"its heartbeat is {age:.0f}s old (stale after {stale_after_s:g}s)"
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, alive
    return True


@dataclass
class WriterLease:
    """The outcome of a claim: whether this process holds the writer role."""

    path: Path
    held: bool
    holder: LeaseHolder
    message: str

    def refresh(self) -> None:
        """Move the heartbeat on, if the lease is still this process's: one taken over
        (judged stale while this process was stopped, say) is never written back."""
        if not self.held:
            return
        try:
            still_mine = _read_lease(self.path) == self.holder
        except (OSError, ValueError, TypeError):
            still_mine = False
        if not still_mine:
            self.held = False
            log.warning(f"the writer lease {self.path} is no longer this run's: taken over")
            return
        self.holder = LeaseHolder(**{**self.holder.__dict__, "heartbeat": time.time()})
        filemode.write_by_rename(self.path, _lease_text(self.holder))

    def release(self) -> None:
        """Remove the lease if it is still this process's."""
        if self.held:
            with contextlib.suppress(OSError, ValueError, TypeError):
                if _read_lease(self.path) == self.holder:
                    self.path.unlink()
            self.held = False


def _lease_text(holder: LeaseHolder) -> str:
    return json.dumps(holder.__dict__, sort_keys=True) + "\n"


def _read_lease(path: Path) -> LeaseHolder:
    return LeaseHolder(**json.loads(path.read_text()))


def _create(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` unless it exists (``O_EXCL``: one creator wins)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return True


def claim_writer(
    cache_dir: Path,
    job: str,
    *,
    stale_after_s: float = LEASE_STALE_AFTER_S,
    alive: Callable[[int], bool] = pid_alive,
) -> WriterLease:
    """Claim the writer role of ``cache_dir``; never raises for a held lease (the caller
    runs read-only and says so), only for a directory it cannot write."""
    path = cache_dir / WRITER_LEASE
    now = time.time()
    me = LeaseHolder(socket.gethostname(), os.getpid(), job, now, now)
    for _ in range(3):
        if _create(path, _lease_text(me)):
            return WriterLease(path, True, me, f"writer lease claimed: {path}")
        try:
            holder = _read_lease(path)
        except FileNotFoundError:
            continue  # released between our create and read: try again
        except (OSError, ValueError, TypeError):
            # A half-written lease (its creator died between create and write) or junk:
            # nobody holds it in a form anyone can check.
            holder = LeaseHolder("?", 0, "unreadable lease", 0.0, 0.0)
        why: str | None = "it is unreadable"
        if holder.pid:
            why = lease_stale(
                holder, this_host=me.host, pid_alive=alive, now=now, stale_after_s=stale_after_s
            )
        if why is None:
            return WriterLease(
                path,
                False,
                holder,
                f"the cache directory {cache_dir} has a writer already ({holder.describe()}): "
                "this run is read-only",
            )
        # Take over: move the stale lease aside under a name of our own; only one claimant's
        # rename of that same file succeeds, and the winner then creates its own.
        aside = path.with_name(f"{WRITER_LEASE}.stale-{me.host}-{me.pid}")
        try:
            os.rename(path, aside)
            moved = _read_lease(aside) if holder.pid else None
        except FileNotFoundError:
            continue
        except (OSError, ValueError, TypeError):
            moved = None
        if holder.pid and moved != holder:
            # Another claimant took over first and we moved its fresh lease: put it back
            # (link fails if a third one exists already) and judge again.
            with contextlib.suppress(OSError):
                os.link(aside, path)
            aside.unlink(missing_ok=True)
            continue
        aside.unlink(missing_ok=True)
        if _create(path, _lease_text(me)):
            return WriterLease(
                path,
                True,
                me,
                f"took over the stale writer lease of {holder.describe()} ({why}): {path}",
            )
    raise SliceTimeout(
        f"could not claim or read the writer lease {path}: others keep changing it",
        fix="run one job per cache directory at a time",
    )


def judged_role(spec: SliceSpec | None, lease: WriterLease | None) -> str:
    """The cache role a worker runs with: the slice's, demoted to reader by a held lease."""
    if spec is not None and not spec.writer:
        return "reader"
    if lease is not None and not lease.held:
        return "reader"
    return "writer"


#: How often a held lease's heartbeat is refreshed (well inside LEASE_STALE_AFTER_S).
LEASE_REFRESH_S = 20.0


@contextlib.contextmanager
def writer_lease(
    cache_dir: Path, job: str, *, refresh_s: float = LEASE_REFRESH_S
) -> Iterator[WriterLease]:
    """Claim the writer role of ``cache_dir`` for the block (saying what happened), keep
    the lease's heartbeat fresh while it runs, and release it at the end."""
    lease = claim_writer(cache_dir, job)
    if lease.held:
        log.info(lease.message)
    else:
        log.warning(lease.message)
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(refresh_s):
            with contextlib.suppress(OSError):
                lease.refresh()

    thread = threading.Thread(target=refresh, name="writer-lease", daemon=True)
    if lease.held:
        thread.start()
    try:
        yield lease
    finally:
        stop.set()
        if lease.held:
            thread.join(timeout=5)
        lease.release()
