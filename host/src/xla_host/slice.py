"""The writer lease of a shared cache directory, and the errors that end a slice.

A multi-host slice (its spec, its two board transports, membership and heartbeats, the
merge of its workers' verdicts) is the package ``xla_host.gate.slice``. The lease stays in
this module: any run with a cache directory claims it, a slice's worker 0 or one host.

The writer lease (``WRITER_LEASE``) keeps one writer per cache directory across jobs:
the writer role is claimed by linking a complete lease file into place (``link`` fails
when the lease exists, as ``O_EXCL`` does, and nobody sees it empty); a second claimant
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
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from xla_host import filemode, log
from xla_host.errors import ExitCode, PipelineError

#: The lease file in a cache directory: who is its writer (ignored by the cache checks).
WRITER_LEASE = ".xla-wheels-writer.lease"


def is_lease_file(name: str) -> bool:
    """The writer lease, a refresh's temporary (``filemode.write_by_rename``:
    ``.<lease>.<random>``) or a stale lease moved aside: the slice's coordination, never
    the cache's content, and each may come and go while another worker reads."""
    return name == WRITER_LEASE or name.startswith((f".{WRITER_LEASE}.", f"{WRITER_LEASE}.stale-"))


#: A lease whose heartbeat is older than this, read from another host, is stale.
LEASE_STALE_AFTER_S = 120.0


class SliceError(PipelineError):
    """The slice cannot go on (either kind: ``SliceTimeout``, ``SliceWorkerFailed``)."""


class SliceTimeout(SliceError):
    """A worker did not arrive at a phase in time (dead or never started), or the writer
    lease could not be claimed or read: exit 8."""

    exit_code = ExitCode.TIMED_OUT


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
    # In a shared cache directory: a FIFO or device there is refused, never opened.
    return LeaseHolder(**json.loads(filemode.read_shared(path, what="writer lease")))


def _create(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text`` unless it exists: one creator wins, and nobody
    ever sees it without its content. The content is written to a temporary file first,
    then hard-linked into place (``link`` fails if ``path`` exists, as ``O_EXCL`` does).
    Created empty and written afterwards, a claimant reading in between judged the empty
    lease unreadable and took it over: two writers."""
    staged = filemode.stage_by_rename(path.with_name(f".{path.name}.new"), text)
    try:
        os.link(staged.temporary, path)
    except FileExistsError:
        return False
    finally:
        staged.discard()
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


class _Worker(Protocol):
    """A slice's worker as the cache role needs it (``xla_host.gate.slice.SliceSpec``)."""

    @property
    def writer(self) -> bool: ...


def judged_role(spec: _Worker | None, lease: WriterLease | None) -> str:
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
