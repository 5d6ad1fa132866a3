"""Network steps: a bounded time, a visible wait, and retries of transient faults.

Every step that talks to another host (index reads, twine uploads, pip installs, lane and
toolchain downloads, devpi pushes, git fetches) runs through :func:`with_retries`, so each

- waits at most :attr:`NetworkPolicy.timeout_s` for each next bytes (the idle timeout),
  and at most :meth:`NetworkPolicy.transfer_limit` for the whole transfer (the deadline:
  ``NET_TIMEOUT`` plus the size at the slowest allowed rate), so a server that trickles
  a byte at a time ends too; every HTTP read goes through :func:`read_url`, which enforces
  both, and a child (twine, pip, git) runs under the deadline of its whole command;
- says it is waiting: a long step announces itself before it starts, any step that has
  not answered after a few seconds says so, and a ``still waiting`` line follows every
  progress interval;
- is tried again after a transient fault (connection refused or reset, an answer cut
  off before its end, HTTP 5xx, no answer in time) with growing sleeps,
  :attr:`NetworkPolicy.retries` times, as PyTorch's release scripts' ``retry`` helper
  does; anything else (HTTP 4xx, a TLS or name error, a refused hash) is never retried;
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

import contextlib
import errno
import http.client
import io
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from xla_host import log, settings
from xla_host.errors import PipelineError
from xla_host.redact import mask_url_credentials
from xla_host.runner import StepTimedOut
from xla_wheels import progress
from xla_wheels.options import NetworkPolicy

T = TypeVar("T")

#: Where the settings come from, for fixes ("raise NET_TIMEOUT").
TIMEOUT_SETTING = settings.where("--net-timeout")
RETRIES_SETTING = settings.where("--net-retries")

#: A step that has not answered after this many seconds says it is waiting.
QUIET_BEFORE_WAITING_LINE_S = 5.0


class Transient(Exception):
    """Raised by one attempt of a step: the fault may pass, try again.

    ``kind``: ``timed out``, ``refused``, ``reset``, ``cut`` (the answer ended before the
    length it announced) or ``HTTP <code>``; ``detail``: what the tool said (already free
    of credentials); ``after_s``: for a timeout, the wait that ran out when it is not the
    attempt's whole limit (the idle timeout within a transfer allowed longer, git's stall
    limit within a fetch allowed hours); ``unfinished``: the timeout is the whole-transfer
    deadline (bytes kept coming, too slowly), not a silence."""

    def __init__(
        self,
        kind: str,
        detail: str = "",
        *,
        after_s: float | None = None,
        unfinished: bool = False,
    ) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.after_s = after_s
        self.unfinished = unfinished

    @property
    def what_happened(self) -> str:
        """The fault as the end of a sentence about the host ("... refused the connection")."""
        if self.kind.startswith("HTTP "):
            return f"answered {self.kind}" + (f" {self.detail}" if self.detail else "")
        sentence = {
            "refused": "refused the connection",
            "reset": "dropped the connection",
            "cut": "cut the connection before the end of its answer",
            "timed out": "did not answer in time",
        }.get(self.kind, self.kind)
        return sentence + (f" ({self.detail})" if self.detail else "")


class NetworkTimedOut(StepTimedOut):
    """A network step got no answer within its time on every attempt (exit 8)."""

    def __init__(
        self,
        step: str,
        host: str,
        seconds: float,
        attempts: int,
        fix: str,
        *,
        unfinished: bool = False,
    ) -> None:
        # A trickle is not a silence: say which limit ran out.
        what = (
            f"did not finish within {seconds:.0f}s, the whole-transfer deadline"
            if unfinished
            else f"did not answer within {seconds:.0f}s"
        )
        PipelineError.__init__(self, f"{step}: {host} {what} ({attempts_text(attempts)})", fix=fix)


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
        return Transient("cut", _incomplete(reason))
    if isinstance(reason, socket.gaierror) and reason.errno == socket.EAI_AGAIN:
        return Transient("name lookup failed for now", str(reason))
    if isinstance(reason, OSError) and reason.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return Transient("unreachable", str(reason))
    return None


def _incomplete(error: http.client.IncompleteRead) -> str:
    if error.expected is None:
        return "mid-chunk"
    return f"{error.expected} more bytes were announced"


#: The size an answer of unknown length (an index page, a server's reply) is allowed for
#: in its deadline: 1 MiB, 4 s at the slowest allowed rate.
ANSWER_BYTES_ALLOWANCE = 1 << 20


class _Deadline:
    """Ends a transfer at its deadline, whatever it is doing: shuts down the sockets it
    opened (a blocked read then returns), so a server trickling a byte at a time, even
    inside the status line or a header, cannot hold a read past it."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, also under TLS: SSLSocket's own would drop its state
    # while the reading thread uses it.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies, redirects, TLS as usual) whose connections ``deadline``
    can end: every socket is handed to it as soon as it exists."""

    class Http(http.client.HTTPConnection):
        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)

    class Https(http.client.HTTPSConnection):
        def connect(self) -> None:
            create = self._create_connection

            def created(*args: Any, **kwargs: Any) -> socket.socket:
                raw = create(*args, **kwargs)
                deadline.watch(raw)  # the TLS handshake is bounded too
                return raw

            self._create_connection = created
            super().connect()
            deadline.watch(self.sock)

    class HttpHandler(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Http, req)

    class HttpsHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
            return self.do_open(Https, req, context=self._context)  # type: ignore[attr-defined]

    return urllib.request.build_opener(HttpHandler, HttpsHandler)


def _drain(response: http.client.HTTPResponse, write: Callable[[bytes], object]) -> None:
    """Every byte of ``response`` into ``write``; an answer that ends before its announced
    length (or mid-chunk) raises :class:`http.client.IncompleteRead`."""
    # read1, not read: read(n) waits for all n bytes before it returns any.
    while chunk := response.read1(1 << 20):
        write(chunk)
    if response.length:  # http.client's read1 ends quietly where read() would raise
        raise http.client.IncompleteRead(b"", response.length)


def read_url(
    request: str | urllib.request.Request,
    *,
    limit_s: float,
    idle_s: float,
    write: Callable[[bytes], object] | None = None,
) -> bytes:
    """One attempt of an HTTP read: the body at ``request`` (or ``b""`` when it streams
    into ``write``). Every urllib read of the project goes through here.

    ``idle_s`` bounds each wait for bytes (connect, status, each read); ``limit_s`` the
    whole attempt, redirects and headers included. Raises :class:`Transient` for a fault
    retrying can help (no answer in time, a trickle past the deadline, refused, reset, an
    answer cut before its end, HTTP 5xx); ``urllib.error.HTTPError`` for another HTTP
    error, its body already read under the same limits (``error.read()`` is safe);
    another ``OSError`` (TLS, an unknown host, an answer that is not HTTP) for the caller
    to name."""
    chunks: list[bytes] = []
    sink = chunks.append if write is None else write
    deadline = _Deadline(limit_s)
    unfinished = Transient(
        "timed out", f"not finished after {limit_s:g}s", after_s=limit_s, unfinished=True
    )
    try:
        with deadline:
            try:
                with _opener(deadline).open(request, timeout=idle_s) as response:
                    _drain(response, sink)
            except urllib.error.HTTPError as error:
                body: list[bytes] = []
                if error.fp is not None:
                    with error:
                        _drain(error.fp, body.append)  # type: ignore[arg-type]
                raise urllib.error.HTTPError(
                    error.url, error.code, error.msg, error.hdrs, io.BytesIO(b"".join(body))
                ) from None
    except (OSError, http.client.HTTPException) as error:
        if deadline.expired:
            raise unfinished from None
        fault = url_fault(error)
        if fault is not None:
            if fault.kind == "timed out" and fault.after_s is None:
                fault.after_s = idle_s
            raise fault from None
        if isinstance(error, http.client.HTTPException):
            not_http = f"the answer is not valid HTTP ({type(error).__name__}: {error})"
            raise OSError(not_http) from None
        raise
    if deadline.expired:
        # Shut down mid-headers, an answer can look whole (no length, ended by the close).
        raise unfinished
    return b"".join(chunks)


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
                    raise NetworkTimedOut(
                        step, host, waited, number, timeout_fix, unfinished=fault.unfinished
                    ) from None
                raise give_up(fault, number) from None
            pause = network.sleep_before(number)
            log.info(f"{step}: {host} {fault.kind}; trying again in {pause:g}s")
            time.sleep(pause)
    raise AssertionError("unreachable: the loop returns or raises")
