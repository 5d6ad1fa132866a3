"""Network steps: a bounded time, a visible wait, and retries of transient faults.

Every step that talks to another host (index reads, twine uploads, pip installs, lane and
toolchain downloads, devpi pushes, git fetches) runs through :func:`with_retries`, so each

- waits at most :attr:`NetworkPolicy.timeout_s` for an answer (a transfer gets more by its
  size: :meth:`NetworkPolicy.transfer_limit`);
- says it is waiting: a long step announces itself before it starts, any step that has
  not answered after a few seconds says so, and a ``still waiting`` line follows every
  progress interval;
- is tried again after a transient fault (connection refused or reset, HTTP 5xx, no
  answer in time) with growing sleeps, :attr:`NetworkPolicy.retries` times, as PyTorch's
  release scripts' ``retry`` helper does; anything else (HTTP 4xx, a TLS or name error,
  a refused hash) is never retried;
- ends in one ``error:`` naming the step and the host, never credentials: no answer in
  time is :class:`NetworkTimedOut` (exit 8, worth running again once the network is
  healthy); other transient faults that outlast the retries are the caller's error class.

The policy (:class:`~xla_wheels.options.NetworkPolicy`) is a setting
(``XLA_WHEELS_NET_TIMEOUT``, ``XLA_WHEELS_NET_RETRIES``, make's ``NET_TIMEOUT`` /
``NET_RETRIES``) read once at the CLI edge into ``PipelineOptions.network``; each step
receives it as an argument and hands it to :func:`with_retries`. This module keeps no
state of its own: two steps of one process may run under different policies.
"""

from __future__ import annotations

import errno
import http.client
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TypeVar

from xla_wheels import log, progress
from xla_wheels.errors import PipelineError
from xla_wheels.options import NetworkPolicy
from xla_wheels.redact import mask_url_credentials
from xla_wheels.runner import StepTimedOut

T = TypeVar("T")

#: Where the settings come from, for fixes ("raise NET_TIMEOUT").
TIMEOUT_SETTING = "XLA_WHEELS_NET_TIMEOUT (make: NET_TIMEOUT=)"
RETRIES_SETTING = "XLA_WHEELS_NET_RETRIES (make: NET_RETRIES=)"

#: A step that has not answered after this many seconds says it is waiting.
QUIET_BEFORE_WAITING_LINE_S = 5.0


class Transient(Exception):
    """Raised by one attempt of a step: the fault may pass, try again.

    ``kind``: ``timed out``, ``refused``, ``reset`` or ``HTTP <code>``; ``detail``: what
    the tool said (already free of credentials); ``after_s``: for a timeout, the wait that
    ran out when it is not the attempt's whole limit (git's stall limit within a fetch
    allowed hours)."""

    def __init__(self, kind: str, detail: str = "", *, after_s: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.after_s = after_s

    @property
    def what_happened(self) -> str:
        """The fault as the end of a sentence about the host ("... refused the connection")."""
        if self.kind.startswith("HTTP "):
            return f"answered {self.kind}" + (f" {self.detail}" if self.detail else "")
        sentence = {
            "refused": "refused the connection",
            "reset": "dropped the connection",
            "timed out": "did not answer in time",
        }.get(self.kind, self.kind)
        return sentence + (f" ({self.detail})" if self.detail else "")


class NetworkTimedOut(StepTimedOut):
    """A network step got no answer within its time on every attempt (exit 8)."""

    def __init__(self, step: str, host: str, seconds: float, attempts: int, fix: str) -> None:
        PipelineError.__init__(
            self,
            f"{step}: {host} did not answer within {seconds:.0f}s "
            f"({attempts_text(attempts)})",
            fix=fix,
        )


def host_of(url: str) -> str:
    """``host[:port]`` of ``url``, without any credentials, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if not host:
        return mask_url_credentials(url)
    return f"{host}:{parts.port}" if parts.port else host


def attempts_text(attempts: int) -> str:
    return "1 attempt" if attempts == 1 else f"{attempts} attempts"


def url_fault(error: BaseException) -> Transient | None:
    """The transient fault an ``urllib`` call raised, or None when retrying cannot help
    (HTTP 4xx, TLS, an unknown host): the caller turns that into its own error."""
    if isinstance(error, urllib.error.HTTPError):
        return Transient(f"HTTP {error.code}", str(error.reason)) if error.code >= 500 else None
    reason: object = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, ssl.SSLError) and not isinstance(reason, ssl.SSLEOFError):
        return None
    if isinstance(reason, TimeoutError):
        return Transient("timed out", str(reason))
    if isinstance(reason, ConnectionRefusedError):
        return Transient("refused", str(reason))
    if isinstance(reason, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return Transient("reset", str(reason))
    if isinstance(reason, http.client.IncompleteRead):
        return Transient("reset", str(reason) or type(reason).__name__)
    if isinstance(reason, socket.gaierror) and reason.errno == socket.EAI_AGAIN:
        return Transient("name lookup failed for now", str(reason))
    if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return Transient("unreachable", str(reason))
    return None


def copy_url(
    request: str | urllib.request.Request,
    write: Callable[[bytes], object],
    *,
    limit_s: float,
    socket_timeout_s: float,
) -> None:
    """Stream the body at ``request`` into ``write``, one attempt of a download step.

    ``socket_timeout_s`` bounds each wait for bytes; ``limit_s`` the whole transfer, so a
    trickle that never stalls still ends. A fault retrying can help is raised as
    :class:`Transient`; any other ``OSError`` propagates for the caller to name."""
    deadline = time.monotonic() + limit_s
    try:
        with urllib.request.urlopen(request, timeout=socket_timeout_s) as response:
            # read1, not read: read(n) waits for all n bytes, so a server trickling a
            # byte at a time would hold one call past any deadline checked between calls.
            while chunk := response.read1(1 << 20):
                write(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not complete after {limit_s:g}s")
    except OSError as error:
        if fault := url_fault(error):
            raise fault from None
        raise


def with_retries(
    step: str,
    host: str,
    attempt: Callable[[float], T],
    *,
    give_up: Callable[[Transient, int], PipelineError],
    timeout_fix: str,
    limit_s: float | None = None,
    long: bool = False,
    retry_kinds: tuple[str, ...] | None = None,
    network: NetworkPolicy,
) -> T:
    """``attempt(limit)``'s result, trying again after a :class:`Transient` fault.

    ``limit_s`` (default: the policy's timeout) is what each attempt may take; ``attempt``
    enforces it (a socket timeout, the runner's timeout) and raises ``Transient("timed
    out")`` past it. ``long``: announce the step before it starts. ``retry_kinds``: only
    these kinds are retried (a request that is not idempotent: only ``refused``, when the
    server never saw it). After the last attempt a timeout is :class:`NetworkTimedOut`
    with ``timeout_fix``; another fault is ``give_up(fault, attempts)``. ``network``: the
    run's policy (timeout, retries, heartbeat), from its options.
    """
    limit = network.timeout_s if limit_s is None else limit_s
    attempts = network.attempts
    for number in range(1, attempts + 1):
        counter = f", attempt {number} of {attempts}" if attempts > 1 else ""
        announced = long or number > 1
        if announced:
            log.info(f"waiting for {host}: {step} (up to {limit:.0f}s{counter})")
        try:
            # A line after a few quiet seconds (unless announced), then one every heartbeat.
            with progress.repeating(
                lambda elapsed: f"still waiting for {host}: {step}, "
                f"{log.format_duration(elapsed)} of up to {limit:.0f}s",
                first=network.heartbeat_s if announced else QUIET_BEFORE_WAITING_LINE_S,
                every=network.heartbeat_s,
            ):
                return attempt(limit)
        except Transient as fault:
            retryable = retry_kinds is None or fault.kind in retry_kinds
            if number == attempts or not retryable:
                if fault.kind == "timed out":
                    waited = limit if fault.after_s is None else fault.after_s
                    raise NetworkTimedOut(step, host, waited, number, timeout_fix) from None
                raise give_up(fault, number) from None
            pause = network.sleep_before(number)
            log.info(f"{step}: {host} {fault.kind}; trying again in {pause:g}s")
            time.sleep(pause)
    raise AssertionError("unreachable: the loop returns or raises")
