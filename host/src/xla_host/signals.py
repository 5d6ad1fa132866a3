"""SIGTERM and SIGHUP end a run the way Ctrl-C (SIGINT) does.

Python's default for SIGTERM and SIGHUP is to die on the spot: no ``finally`` runs, so a
run killed with ``kill <pid>`` (or by ``make`` on its own SIGTERM, or a closed terminal)
would leave its lock file, its children (a build recipe, git, pip) running on as orphans
that commit half-done work, and no message. :func:`handled` turns either signal into
:class:`Terminated`, a :class:`KeyboardInterrupt`: every path that already ends a run
cleanly on Ctrl-C (the runner ends its child, the gate kills its children's process
groups, the bundle lock is released, the CLI edge prints one ``error:`` line) ends it the
same way.

Exit codes (the shell's convention, 128 + the signal's number): 130 after SIGINT, 143
after SIGTERM, 129 after SIGHUP.

Standard library only: the build recipe's entry point runs it inside the builder image.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

TERMINATING = (signal.SIGTERM, signal.SIGHUP)
"""Handled as SIGINT is; SIGINT itself is Python's KeyboardInterrupt already."""


class Terminated(KeyboardInterrupt):
    """The run received SIGTERM or SIGHUP: ended as Ctrl-C ends it, with its own code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_of(interrupt: KeyboardInterrupt) -> int:
    """The signal that interrupted the run: SIGINT for a plain Ctrl-C."""
    return interrupt.signum if isinstance(interrupt, Terminated) else int(signal.SIGINT)


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP)."""
    return 128 + signal_of(interrupt)


def describe(interrupt: KeyboardInterrupt) -> str:
    """The CLI's one line: ``interrupted`` for Ctrl-C, as before; the signal otherwise."""
    if isinstance(interrupt, Terminated):
        return f"interrupted by {signal.Signals(interrupt.signum).name}"
    return "interrupted"


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def end_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send us ``sig`` when our parent ends (Linux; elsewhere nothing).

    For a run under make: make passes its SIGTERM to the shell of the recipe, not to the
    command that shell runs, and a shell that dies of it leaves that command running on,
    writing ``dist/`` and ``wheels.lock`` after make has gone. Not for a run started by
    hand: a ``nohup ... &`` must outlive the shell that started it.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # only here: most commands never need it

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # it ended before the request: nothing would come
        os.kill(os.getpid(), sig)  # call it within handled(): Terminated, as if it had


#: How many :func:`interruptible` blocks the main thread is in.
_INTERRUPTIBLE = [0]


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block a second SIGTERM or SIGHUP raises too (:func:`handled`).

    For waits on other hosts (a slice's barrier, telling the others this worker stopped):
    nothing there needs a grace to end cleanly, and a user who signals twice wants the
    run gone now, not after a peer's timeout."""
    _INTERRUPTIBLE[0] += 1
    try:
        yield
    finally:
        _INTERRUPTIBLE[0] -= 1


@contextmanager
def handled() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread.

    Only the first one raises, outside an :func:`interruptible` block: a second SIGTERM
    while the run ends its children and releases its lock must not cut that short (each
    child still gets a bounded grace, then SIGKILL: ``runner.stop``). Inside one (a wait
    on other hosts) every one raises. Outside the main thread (where Python cannot install
    handlers) this does nothing. The previous handlers are restored on leaving.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def raise_terminated(signum: int, _frame: FrameType | None) -> None:
        if received and not _INTERRUPTIBLE[0]:
            return
        received.append(signum)
        raise Terminated(signum)

    previous = {sig: signal.getsignal(sig) for sig in TERMINATING}
    for sig in TERMINATING:
        # A run started with SIGHUP ignored (nohup) keeps ignoring it, as it asked.
        if previous[sig] != signal.SIG_IGN:
            signal.signal(sig, raise_terminated)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
