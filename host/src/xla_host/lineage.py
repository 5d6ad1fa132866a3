"""Children that die with us, and the processes they leave behind, ended with their run.

Two ways a child outlived its starter:

- The starter was SIGKILLed (an OOM killer, a scheduler's preemption, ``kill -9``): no
  ``finally`` runs, and the child went on writing (the gate's torch child, the cache, for
  tens of seconds). :func:`popen` starts every child with ``PR_SET_PDEATHSIG`` set to
  SIGKILL in the child right after fork, before it runs anything, so the kernel ends it
  when its parent goes.
- A child started processes in sessions of their own (``setsid``, a workload factory's
  daemons) and exited: they leave its process group, so killing the group misses them,
  and they are reparented away from us. :func:`become_subreaper` makes this process a
  child subreaper (``PR_SET_CHILD_SUBREAPER``): orphans of its descendants are reparented
  to it, not to init, so each stays findable under ``/proc`` by its PPid chain, and
  :func:`end_marked` ends the ones a given run left (SIGTERM, then SIGKILL after a grace).

The parent-death signal fires when the parent *thread* ends, not the parent process (the
kernel's parent is the thread that forked). A child forked by a short-lived worker thread
(the gate's checks run side by side on a thread pool) would be killed when that thread
exits. So :func:`popen` forks on the main thread when called there, and from any other
thread hands the fork to one forking thread that lives as long as the process.

Linux only: elsewhere (no ``prctl``) both requests do nothing, and children outlive a
killed parent there as they always did.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from xla_host import log

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36

#: How often :func:`end_processes` looks whether the processes it signalled are gone.
_POLL_S = 0.05

Prctl = Callable[[int, int, int, int, int], int]


def _load_prctl() -> Prctl | None:
    """libc's ``prctl``, loaded once before any fork (a forked child must not load a
    library: another thread may have held the loader's lock at the fork)."""
    if not sys.platform.startswith("linux"):
        return None  # no prctl: children are started as before, without either request
    import ctypes  # only here: importing the module must stay cheap

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function: Prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    return function


_PRCTL = _load_prctl()


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """The ``preexec_fn`` of a child of ``parent``: ask for SIGKILL when the parent (the
    forking thread) ends; a parent that ended before the request is too late for it, so
    the child ends itself at once."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def in_the_child() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return in_the_child


def _fork(argv: Any, kwargs: dict[str, Any]) -> subprocess.Popen[Any]:
    assert "preexec_fn" not in kwargs, "lineage.popen sets the child's preexec_fn itself"
    return subprocess.Popen(argv, preexec_fn=_die_with_parent(os.getpid()), **kwargs)


_Request = tuple[Any, dict[str, Any], "Future[subprocess.Popen[Any]]"]
_REQUESTS: queue.SimpleQueue[_Request] = queue.SimpleQueue()
_FORKER: list[threading.Thread] = []
_FORKER_LOCK = threading.Lock()


def _forker() -> None:
    while True:
        argv, kwargs, result = _REQUESTS.get()
        try:
            result.set_result(_fork(argv, kwargs))
        except BaseException as error:  # the caller's thread raises it
            result.set_exception(error)


def popen(argv: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    """:class:`subprocess.Popen` whose child is SIGKILLed when this process ends, however
    it ends (see the module doc for why it is forked by a thread that never exits)."""
    if threading.current_thread() is threading.main_thread():
        return _fork(argv, kwargs)
    with _FORKER_LOCK:
        if not _FORKER:
            # A daemon: it ends only with the process, whose end the children share.
            thread = threading.Thread(target=_forker, name="xla-host-forker", daemon=True)
            thread.start()
            _FORKER.append(thread)
    result: Future[subprocess.Popen[Any]] = Future()
    _REQUESTS.put((argv, kwargs, result))
    return result.result()


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux); whether it is."""
    if _PRCTL is None:
        return False
    return _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _parents() -> dict[int, int]:
    """Every live process's parent, read from ``/proc/<pid>/stat`` (zombies left out:
    they have ended, only their reaper's wait is missing)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root: int | None = None) -> list[int]:
    """The live processes whose PPid chain leads back to ``root`` (default: us)."""
    root = os.getpid() if root is None else root
    parents = _parents()
    found: list[int] = []
    for pid in parents:
        seen: set[int] = set()
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor not in seen and ancestor > 1:
            if ancestor == root:
                found.append(pid)
                break
            seen.add(ancestor)
            ancestor = parents.get(ancestor)
    return sorted(found)


def _carries(pid: int, marker: bytes) -> bool:
    """Whether ``pid``'s environment (as it started) holds ``marker`` (``NAME=value``)."""
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z"


def _reap(pids: Iterable[int]) -> None:
    """Collect the ones that are our own children (orphans reparented to a subreaper),
    so that none stays a zombie; another's children are not ours to wait for."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def end_processes(pids: Iterable[int], grace_s: float) -> None:
    """SIGTERM each of ``pids``, then SIGKILL what still runs after ``grace_s``."""
    pending = list(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while True:
            _reap(pending)
            pending = [pid for pid in pending if _alive(pid)]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
    _reap(pending)


def end_marked(name: str, value: str, grace_s: float) -> list[int]:
    """End every descendant of ours started with ``name=value`` in its environment (what
    one run's processes inherit, whatever session or group they moved to); the pids."""
    marker = f"{name}={value}".encode()
    left = [pid for pid in descendants() if _carries(pid, marker)]
    if left:
        log.info(f"ending {len(left)} process(es) a finished child left running: {left}")
        end_processes(left, grace_s)
    return left
