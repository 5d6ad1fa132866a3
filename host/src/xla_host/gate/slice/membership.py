"""This worker's side of a running slice: its heartbeat, its arrival at each phase and
the wait for the others (``join``), telling them it stopped (``abort``), and the end
(``finish``: worker 0 recorded the results; the others end only then).

Every wait here is bounded by the heartbeat bound once the slice formed (a worker whose
heartbeat stopped, or a coordinator that stopped answering, is named within
``dead_after_s``) and runs inside ``signals.interruptible``: a second SIGTERM or Ctrl-C
ends it at once."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeAlias

from xla_host import log, signals
from xla_host.errors import PipelineError, UsageError
from xla_host.gate.slice.barrier import Arrival, BeatSeen, judge_barrier
from xla_host.gate.slice.coordinator import CoordinatorBoard
from xla_host.gate.slice.directory import DirectoryBoard
from xla_host.gate.slice.spec import (
    BEAT_S,
    POLL_S,
    WRITER,
    SliceSpec,
    SliceTimeout,
    SliceWorkerFailed,
)

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
                    fix="start `xla-host gate` on every worker with the same --workers and "
                    "--slice-dir or --coordinator (gcloud compute tpus tpu-vm ssh "
                    "--worker=all), or raise --slice-timeout",
                )
            time.sleep(POLL_S)

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
                time.sleep(POLL_S)
            board.done(self.spec.worker_id)


@contextlib.contextmanager
def running(spec: SliceSpec, *, beat_s: float = BEAT_S) -> Iterator[Slice]:
    """A started slice whose heartbeat stops with the block."""
    member = Slice(spec, beat_s=beat_s)
    member.start()
    try:
        yield member
    finally:
        member.stop()
