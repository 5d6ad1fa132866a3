"""The one network client of both sides: a bounded time, a visible wait, retries of
transient faults, credentials never shown.

Every step that talks to another host, on the builder (index reads, twine uploads, pip
installs, lane and toolchain downloads, devpi pushes, git fetches) and on a training host
(the bundle document and the wheel files from a lane, a WebDAV receipt store, a cache
pack), runs through :func:`with_retries`, so each

- waits at most :attr:`NetworkPolicy.timeout_s` for each next bytes (the idle timeout),
  and at most :meth:`NetworkPolicy.transfer_limit` for the whole transfer (the deadline:
  ``NET_TIMEOUT`` plus the size at the slowest allowed rate), so a server that trickles
  a byte at a time ends too; every HTTP request goes through :func:`http_request` (its
  caller only words its errors, :class:`Failures`), whose reads :func:`read_url` bounds
  both ways, and a child (twine, pip, git) runs under the deadline of its whole command;
- says it is waiting: a long step announces itself before it starts, any step that has
  not answered after a few seconds says so, and a ``still waiting`` line follows every
  progress interval;
- is tried again after a transient fault (connection refused or reset, an answer cut
  off before its end, HTTP 5xx, no answer in time) with growing sleeps,
  :attr:`NetworkPolicy.retries` times, as PyTorch's release scripts' ``retry`` helper
  does; anything else (HTTP 4xx, a TLS or name error, a refused hash) is never retried;
- ends in one ``error:`` naming the step and the host, never credentials (a URL's
  user and password are masked, :func:`host_of` names the host alone): no answer in
  time is :class:`NetworkTimedOut` (exit 8, worth running again once the network is
  healthy); other transient faults that outlast the retries are the caller's error class.

The policy (:class:`NetworkPolicy`) is made of settings rows (``--net-timeout``,
``--net-retries``, ``--progress-interval``; ``XLA_WHEELS_NET_TIMEOUT``,
``XLA_WHEELS_NET_RETRIES``, make's ``NET_TIMEOUT`` / ``NET_RETRIES``), read once at each
command line's edge: the builder's ``PipelineOptions.network``, the host's
:func:`add_network_arguments` and :func:`policy_from` (the same flags, ranges and
variables); each step receives it as an argument. This module keeps no state of its own:
two steps of one process may run under different policies. Standard library only: a
training host runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import socket
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, TypeVar

from xla_host import filemode, log, settings
from xla_host.arguments import add_setting, value_type
from xla_host.errors import PipelineError, UsageError
from xla_host.redact import Redactor, mask_url_credentials, masked_url, shown
from xla_host.runner import StepTimedOut
from xla_host.settings import by_flag
from xla_host.values import BadValue

if TYPE_CHECKING:
    import http.client
    import urllib.request

# http.client, ssl and urllib.request are imported by the functions that make a request,
# not at the top: they were 20-25 ms of the start of every command of both command lines
# (python -X importtime), and most commands never open a connection.

T = TypeVar("T")


@dataclass(frozen=True)
class NetworkPolicy:
    """How long network steps wait and how often they retry (this module):
    ``NET_TIMEOUT`` / ``NET_RETRIES`` and the progress interval, built once by a command
    line's edge (the builder's ``PipelineOptions.network``, the host's :func:`policy_from`)
    and handed to every step that talks to a host."""

    timeout_s: float = float(by_flag("--net-timeout").default or 0)
    """Seconds one attempt may wait for an answer (connect, or the next bytes)."""
    retries: int = int(by_flag("--net-retries").default or 0)
    """Attempts after the first one, when a fault is transient."""
    backoff_s: float = 2.0
    """Sleep before the first retry; it doubles for each next one (2, 4, 8 s)."""
    min_bytes_per_s: float = 256 * 1024
    """The slowest transfer rate a step's time limit allows for (a 500 MB wheel: ~33 min)."""
    start_allowance_s: float = 15.0
    """A child process (twine, pip) starts and reads its input before it talks to a host."""
    heartbeat_s: float = float(by_flag("--progress-interval").default or 0)
    """Seconds between ``still waiting`` lines and a long fetch's heartbeat lines off a
    terminal (``--progress-interval``; 0: none)."""

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def transfer_limit(self, size_bytes: int, *, child_process: bool = False) -> float:
        """Seconds a step that moves ``size_bytes`` may take, by the slowest allowed rate."""
        start = self.start_allowance_s if child_process else 0.0
        return start + self.timeout_s + size_bytes / self.min_bytes_per_s

    def sleep_before(self, retry: int) -> float:
        """The pause before retry number ``retry`` (1-based): exponential backoff."""
        return float(self.backoff_s * 2 ** (retry - 1))


#: The documented defaults (60 s, 3 retries): a constant, never changed at run time.
DEFAULT_NETWORK = NetworkPolicy()


#: The rows a network policy is made of, in the order the host's command line shows them.
NETWORK_FLAGS = ("--net-timeout", "--net-retries", "--progress-interval")


def add_network_arguments(parser: argparse.ArgumentParser | Any) -> None:
    """The host's ``--net-timeout``, ``--net-retries`` and ``--progress-interval``, each
    from its settings row (range, default, help): the builder's flags, the same values."""
    for flag in NETWORK_FLAGS:
        add_setting(parser, by_flag(flag))


def policy_from(args: argparse.Namespace, environ: Mapping[str, str]) -> NetworkPolicy:
    """The policy of a host command: each flag, else its ``XLA_WHEELS_*`` variable (checked
    against the row's range, refused with a fix naming the variable), else the row's
    default."""
    values: dict[str, float] = {}
    for flag in NETWORK_FLAGS:
        setting = by_flag(flag)
        given = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if given is None and setting.env and (text := environ.get(setting.env, "").strip()):
            try:
                given = value_type(setting).parse(text)
            except BadValue as bad:
                raise UsageError(
                    f"{setting.env}={text!r} {bad.reason}",
                    fix=f"set {setting.env} to e.g. {value_type(setting).example}, or unset it",
                ) from None
        if given is not None:
            values[flag] = float(given)
    default = DEFAULT_NETWORK
    return NetworkPolicy(
        timeout_s=values.get("--net-timeout", default.timeout_s),
        retries=int(values.get("--net-retries", default.retries)),
        heartbeat_s=values.get("--progress-interval", default.heartbeat_s),
    )


@contextlib.contextmanager
def repeating(line: Callable[[float], str], *, first: float, every: float) -> Iterator[None]:
    """Log ``line(seconds elapsed)`` after ``first`` seconds, then every ``every`` seconds,
    until the block ends (0 for either: no more lines)."""
    if first <= 0:
        yield
        return
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        wait = first
        while wait > 0 and not stop.wait(wait):
            log.info(line(time.monotonic() - start))
            wait = every

    thread = threading.Thread(target=beat, name="xla-wheels progress lines", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


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


def new_request(
    url: str, *, data: bytes | None = None, method: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> urllib.request.Request:  # fmt: skip
    """A request for :func:`http_request` (``urllib``'s, so proxies and redirects are as
    usual); made here so that only a command that sends one imports urllib.request."""
    import urllib.request

    return urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))


def file_url_path(url: str) -> str:
    """The local path a ``file://`` URL names (a lane given as a directory)."""
    import urllib.request

    return urllib.request.url2pathname(urllib.parse.urlsplit(url).path)


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
    import http.client
    import ssl

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
#: What is kept of a refusal's body (HTTP 4xx, or a 5xx after the retries): enough for any
#: server's message, never a download a misbehaving server could make endless.
ERROR_BODY_BYTES = 64 << 10


class _Deadline:
    """Ends a transfer at its deadline, whatever it is doing: shuts down the sockets it
    opened (a blocked read then returns), so a server trickling a byte at a time, even
    inside the status line or a header, cannot hold a read past it."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self.seconds = seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._started = time.monotonic()
        self._timer = self._timer_for(seconds)

    def _timer_for(self, seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, self._expire)
        timer.daemon = True
        return timer

    def __enter__(self) -> _Deadline:
        self._started = time.monotonic()
        self._timer.start()
        return self

    def move(self, seconds: float) -> None:
        """End the transfer ``seconds`` after it started instead (a size learnt from its
        first bytes: a pack's signed manifest); past already: at once."""
        with self._lock:
            if self.expired or seconds == self.seconds:
                return
            self._timer.cancel()
            self.seconds = seconds
            left = self._started + seconds - time.monotonic()
            self._timer = self._timer_for(max(0.0, left))
            self._timer.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
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
            if self._started + self.seconds > time.monotonic() + 0.001:
                return  # a timer moved later meanwhile: the new one ends it
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
    import http.client
    import urllib.request

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


def _drain(
    response: http.client.HTTPResponse,
    write: Callable[[bytes], object],
    *,
    max_bytes: int | None = None,
    after_chunk: Callable[[], object] | None = None,
) -> None:
    """Every byte of ``response`` into ``write`` (with ``max_bytes``: at most one byte
    more, so the caller can tell "too large" without holding all of it); an answer that
    ends before its announced length (or mid-chunk) raises
    :class:`http.client.IncompleteRead`. ``after_chunk`` runs after each chunk."""
    import http.client

    received = 0
    while max_bytes is None or received <= max_bytes:
        wanted = 1 << 20 if max_bytes is None else min(1 << 20, max_bytes + 1 - received)
        # read1, not read: read(n) waits for all n bytes before it returns any.
        chunk = response.read1(wanted)
        if not chunk:
            break
        received += len(chunk)
        write(chunk)
        if after_chunk is not None:
            after_chunk()
    else:
        return  # more than max_bytes: the rest is never read
    # http.client's read1 ends quietly where read() would raise; a file:// answer (a lane
    # given as a directory URL) is a plain file and has no length to fall short of.
    if getattr(response, "length", None):
        raise http.client.IncompleteRead(b"", response.length)


def read_url(
    request: str | urllib.request.Request,
    *,
    limit_s: float,
    idle_s: float,
    write: Callable[[bytes], object] | None = None,
    on_response: Callable[[http.client.HTTPResponse], object] | None = None,
    max_bytes: int | None = None,
    limit_now: Callable[[], float | None] | None = None,
) -> bytes:
    """One attempt of an HTTP read: the body at ``request`` (or ``b""`` when it streams
    into ``write``). Every urllib read of the project goes through here.

    ``max_bytes``: at most that many bytes and one more are read (the caller refuses a
    body longer than its limit without ever holding more). ``limit_now``: asked after
    each chunk, the whole attempt's limit as the bytes so far tell it (None: unchanged),
    e.g. a pack's signed size once its manifest has arrived.

    ``idle_s`` bounds each wait for bytes (connect, status, each read); ``limit_s`` the
    whole attempt, redirects and headers included. Raises :class:`Transient` for a fault
    retrying can help (no answer in time, a trickle past the deadline, refused, reset, an
    answer cut before its end, HTTP 5xx); ``urllib.error.HTTPError`` for another HTTP
    error, its body already read under the same limits (``error.read()`` is safe);
    another ``OSError`` (TLS, an unknown host, an answer that is not HTTP) for the caller
    to name. ``on_response`` is shown the answer (its status, its headers) before its body
    is read."""
    import http.client

    url = request if isinstance(request, str) else request.full_url
    if urllib.parse.urlsplit(url).scheme == "file":
        # urllib's file handler open()s the path, and no deadline ends a wait on a FIFO's
        # open (there is no socket to shut): a FIFO or device is refused from its stat.
        with contextlib.suppress(FileNotFoundError):  # urllib names a missing file
            filemode.check_shared(Path(file_url_path(url)))
    chunks: list[bytes] = []
    sink = chunks.append if write is None else write
    deadline = _Deadline(limit_s)

    def moved() -> None:
        if limit_now is not None and (seconds := limit_now()) is not None:
            deadline.move(seconds)

    try:
        with deadline:
            try:
                with _opener(deadline).open(request, timeout=idle_s) as response:
                    if on_response is not None:
                        on_response(response)
                    _drain(response, sink, max_bytes=max_bytes, after_chunk=moved)
            except urllib.error.HTTPError as error:
                body: list[bytes] = []
                if error.fp is not None:
                    with error:
                        _drain(error.fp, body.append, max_bytes=ERROR_BODY_BYTES)  # type: ignore[arg-type]
                kept = b"".join(body)[:ERROR_BODY_BYTES]
                raise urllib.error.HTTPError(
                    error.url, error.code, error.msg, error.hdrs, io.BytesIO(kept)
                ) from None
    except (OSError, http.client.HTTPException) as error:
        if deadline.expired:
            raise _unfinished(deadline.seconds) from None
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
        raise _unfinished(deadline.seconds)
    return b"".join(chunks)


def _unfinished(limit_s: float) -> Transient:
    return Transient(
        "timed out", f"not finished after {limit_s:g}s", after_s=limit_s, unfinished=True
    )


def settings_fix() -> str:
    """How a user gives a network step longer or more tries, for a fix."""
    return f"{TIMEOUT_SETTING} or --net-timeout; {RETRIES_SETTING} or --net-retries"


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
            with repeating(
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


class NotThere(Exception):
    """:func:`get` with ``missing_ok``: the server answered 404, an answer in itself."""


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, read whole: its status, its reason phrase, its body (``b""`` when
    it streamed into a ``write``)."""

    status: int
    reason: str
    body: bytes


@dataclass(frozen=True)
class Failures:
    """What one step's failures raise: the errors (class, message, fix) only its caller
    can word, handed to :func:`http_request`, which decides when each is due.

    ``answered(answer)``: an HTTP error status that is not retried (a 4xx; a 5xx of a
    request sent once), its body already read; the error to raise, or None: the status
    is an answer the caller judges itself (:func:`http_request` returns it).
    ``unreadable(reason)``: no HTTP answer, and retrying cannot help (TLS, an unknown
    host, an answer that is not HTTP). ``gave_up(fault, attempts)``: a transient fault
    that outlasted the retries (:attr:`Transient.what_happened` says it). Each text they
    are given is already free of credentials. ``timeout_fix``: the fix of
    :class:`NetworkTimedOut` (exit 8), no answer in time on every attempt."""

    answered: Callable[[Answer], PipelineError | None]
    unreadable: Callable[[str], PipelineError]
    gave_up: Callable[[Transient, int], PipelineError]
    timeout_fix: str


#: Methods that may change what the server holds: sent again only after a refused
#: connection (the server never saw it); a lost answer to one it made would otherwise
#: make it twice (a receipt numbered twice, a devpi push sent twice).
SENT_ONCE_METHODS = frozenset({"POST", "PUT", "PATCH"})


def rewound(handle: IO[bytes]) -> Callable[[], Callable[[bytes], object]]:
    """A ``write`` for :func:`http_request` into an open file: each attempt starts it
    again at byte 0 (an attempt after a cut-off one must not append to its half)."""

    def fresh() -> Callable[[bytes], object]:
        handle.seek(0)
        handle.truncate()
        return handle.write

    return fresh


def http_request(
    request: str | urllib.request.Request,
    network: NetworkPolicy,
    failures: Failures,
    *,
    step: str | None = None,
    size: int | None = None,
    write: Callable[[], Callable[[bytes], object]] | None = None,
    long: bool = False,
    secrets: Iterable[str] = (),
    max_bytes: int | None = None,
    sized: Callable[[], int | None] | None = None,
) -> Answer:
    """One HTTP request with the run's policy, every caller's retries and give-up in one
    place: the idle timeout, the whole-transfer deadline (for ``size`` bytes moved either
    way, else an answer's allowance), transient faults tried again (a request of
    :data:`SENT_ONCE_METHODS` only after a refused connection), the URL's credentials and
    ``secrets`` never shown. Each failure is the error ``failures`` words for it; no
    answer in time is :class:`NetworkTimedOut` with its ``timeout_fix``.

    ``step``: what the waiting lines and the timeout name (default: the method and the
    URL). ``write``: each attempt streams the body into what it returns (a fresh start,
    :func:`rewound`) instead of into memory. ``long``: announce the step before it
    starts. ``max_bytes``: a body is read up to one byte more than that, never further
    (the caller refuses a longer one). ``sized``: asked after each chunk, the size of the
    whole transfer as its first bytes tell it (None: not known yet); the deadline becomes
    that size's (a pack's, from its signed manifest), counted from the attempt's start."""
    request, secrets = _userinfo_as_basic_auth(request, secrets)
    url = request if isinstance(request, str) else request.full_url
    method = "GET" if isinstance(request, str) else request.get_method()
    redact = Redactor(secrets)

    def limit_now() -> float | None:
        known = sized() if sized is not None else None
        return None if known is None else network.transfer_limit(known)

    def attempt(limit: float) -> Answer:
        answered: list[tuple[int, str]] = []
        try:
            body = read_url(
                request, limit_s=limit, idle_s=network.timeout_s,
                write=write() if write is not None else None,
                # A file:// answer (a lane given as a directory) has no status: its content.
                on_response=lambda response: answered.append(
                    (getattr(response, "status", None) or 200, getattr(response, "reason", ""))
                ),
                max_bytes=max_bytes, limit_now=limit_now,
            )  # fmt: skip
        except urllib.error.HTTPError as error:
            answer = Answer(error.code, redact(str(error.reason)), error.read())
            refusal = failures.answered(answer)
            if refusal is None:
                return answer
            raise refusal from None
        except Transient as fault:
            raise Transient(
                fault.kind, redact(fault.detail), after_s=fault.after_s, unfinished=fault.unfinished
            ) from None
        except OSError as error:  # TLS, an unknown host, not HTTP: retrying cannot help
            raise failures.unreadable(redact(str(getattr(error, "reason", error)))) from None
        status, reason = answered[0] if answered else (200, "")
        return Answer(status, reason, body)

    return with_retries(
        step or f"{method} {redact(masked_url(url))}", host_of(url), attempt,
        give_up=failures.gave_up, timeout_fix=failures.timeout_fix,
        limit_s=network.transfer_limit(ANSWER_BYTES_ALLOWANCE if size is None else size),
        long=long, retry_kinds=("refused",) if method in SENT_ONCE_METHODS else None,
        network=network,
    )  # fmt: skip


def _userinfo_as_basic_auth(
    request: str | urllib.request.Request, secrets: Iterable[str]
) -> tuple[str | urllib.request.Request, list[str]]:
    """A URL's ``user:password@`` sent as a basic-auth header, the URL without it (urllib
    reads userinfo as part of the host name: the lookup fails), and the password added to
    what is never shown. The header is not sent on to where a redirect points."""
    import base64

    url = request if isinstance(request, str) else request.full_url
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return request, list(secrets)
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    if isinstance(request, str):
        request = new_request(bare)
    else:
        request.full_url = bare
    user = urllib.parse.unquote(parts.username or "")
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_unredirected_header("Authorization", f"Basic {token}")
    return request, [*secrets, password, parts.password or ""]


def get(
    url: str,
    network: NetworkPolicy,
    *,
    refused: Callable[[str], PipelineError],
    timeout_fix: str,
    size: int | None = None,
    write: Callable[[], Callable[[bytes], object]] | None = None,
    missing_ok: bool = False,
    secrets: Iterable[str] = (),
    max_bytes: int | None = None,
) -> bytes:
    """One GET through :func:`http_request` whose every failure is ``refused(what
    happened)``: a 4xx, another fault, or a transient one that outlasts the retries; no
    answer in time is :class:`NetworkTimedOut` with ``timeout_fix`` and the settings that
    give it longer; with ``missing_ok`` a 404 raises :class:`NotThere`. ``secrets``: values
    never shown (a lane address's, :attr:`xla_host.lane_address.LaneAddress.secrets`).
    ``max_bytes``: a body longer than that is cut one byte past it (the caller refuses it
    by its length)."""

    def answered(answer: Answer) -> PipelineError | None:
        if missing_ok and answer.status == 404:
            return None
        return refused(f"the server answered {answer.status} {answer.reason}")

    failures = Failures(
        answered=answered,
        unreadable=lambda reason: refused(f"cannot read it ({reason})"),
        gave_up=lambda fault, attempts: refused(
            f"{host_of(url)} {fault.what_happened} ({attempts_text(attempts)})"
        ),
        timeout_fix=f"{timeout_fix} (or give it longer: {settings_fix()})",
    )
    answer = http_request(
        url, network, failures, size=size, write=write, secrets=secrets, max_bytes=max_bytes
    )
    if answer.status == 404:
        raise NotThere(Redactor(secrets)(shown(url)))
    return answer.body
