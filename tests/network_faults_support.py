"""Real loopback servers that misbehave, for the network-fault tests.

- :class:`SilentServer` accepts every connection and never answers (nor closes it).
- :class:`FaultyProxy` stands in front of a real index (pypiserver) and answers the
  first requests with a scripted status (503, 401...) or fault, then forwards the rest; it
  counts every request, so a test can prove a retry, or that there was none. The faults
  of a response that starts: ``CUT`` sends the headers and half the body, then closes the
  connection; ``TRICKLE`` sends the whole answer (status line first) one byte every
  ``trickle_s`` seconds, so no single read waits long; ``SILENT`` never answers.
"""

from __future__ import annotations

import http.server
import re
import select
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.clirunner import CliResult, run_cli
from tests.publish_support import BUNDLE, PASSWORD
from tests.servers import InProcessServer

#: Headers not passed through the proxy (hop-by-hop, or recomputed by urllib).
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}

#: Scripted faults of :class:`FaultyProxy`, besides HTTP statuses.
CUT = "cut"
TRICKLE = "trickle"
SILENT = "silent"


class SilentServer:
    """A TCP server on 127.0.0.1 that accept()s and never says a word."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.port = int(self._socket.getsockname()[1])
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._accepting = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                self._take_pending(wait_s=0.2)
            except OSError:
                return

    def _take_pending(self, wait_s: float) -> None:
        """Accept every connection waiting in the backlog (waiting ``wait_s`` for one)."""
        with self._accepting:
            while select.select([self._socket], [], [], wait_s)[0]:
                connection, _ = self._socket.accept()
                self.accepted += 1
                self._held.append(connection)  # kept open: the client waits for an answer
                wait_s = 0

    def connections(self) -> int:
        """Connections made so far, counted exactly: a client's connect completes in the
        kernel's backlog before this server accepts it, so the backlog is taken first
        (however late a busy machine runs the accepting thread)."""
        self._take_pending(wait_s=0)
        return self.accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self._held:
            connection.close()
        self._socket.close()


Fault = int | str
"""An HTTP status to answer, or :data:`CUT`, :data:`TRICKLE`, :data:`SILENT`."""


class FaultyProxy:
    """HTTP proxy to ``upstream`` (a base URL) answering ``script``'s faults first.

    ``only``: the faults go to requests whose path starts with it (others are forwarded
    and not counted in ``requests``)."""

    def __init__(
        self,
        upstream: str,
        script: list[Fault],
        *,
        forever: Fault | None = None,
        only: str = "",
        trickle_s: float = 1.0,
        on_request: Callable[[str], None] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.on_request = on_request
        """Called with ``METHOD path`` of each request ``only`` selects, before it is
        answered: what another client does at that moment."""
        self.script = list(script)
        self.forever = forever
        """A fault served to every request once the script is used up (None: forward)."""
        self.only = only
        self.trickle_s = trickle_s
        self.requests: list[str] = []
        self.faults_served = 0
        self.trickled_whole = 0
        """Trickled answers sent to their last byte (a client that gave up saw none)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads the counts, not a log

            def _handle(self) -> None:
                fault: Fault | None = None
                if self.path.startswith(proxy.only):
                    with proxy._lock:
                        proxy.requests.append(f"{self.command} {self.path}")
                        fault = proxy.script.pop(0) if proxy.script else proxy.forever
                        if fault is not None:
                            proxy.faults_served += 1
                    if proxy.on_request is not None:
                        proxy.on_request(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if fault == SILENT:
                    proxy._stop.wait()  # the client waits for an answer that never comes
                    self.close_connection = True
                    return
                status = fault if isinstance(fault, int) else None
                if status is not None:
                    payload = f"scripted {status}\n".encode()
                    self.send_response(status)
                    if status == 401:
                        self.send_header("WWW-Authenticate", 'Basic realm="pypi"')
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=body, headers=headers, method=self.command
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        code, answer, reply = response.status, response.read(), response.headers
                except urllib.error.HTTPError as error:
                    code, answer, reply = error.code, error.read(), error.headers
                head = [f"HTTP/1.1 {code} {http.HTTPStatus(code).phrase}"]
                head += [f"{k}: {v}" for k, v in reply.items() if k.lower() not in _HOP_HEADERS]
                head += [f"Content-Length: {len(answer)}", "Connection: close", "", ""]
                raw = "\r\n".join(head).encode() + answer
                self.close_connection = True
                if fault == CUT:
                    # The headers promise the whole body; half of it comes, then the end.
                    self.wfile.write(raw[: len(raw) - max(1, len(answer) // 2)])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif fault == TRICKLE:
                    for index in range(len(raw)):
                        if proxy._stop.wait(proxy.trickle_s):
                            return
                        try:
                            self.wfile.write(raw[index : index + 1])
                            self.wfile.flush()
                        except OSError:
                            return  # the client gave up: what the test expects
                    with proxy._lock:
                        proxy.trickled_whole += 1
                else:
                    self.wfile.write(raw)

            do_GET = do_POST = do_HEAD = _handle

        self._serving = InProcessServer.start(Handler)
        self.port = self._serving.port

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._serving.close()


@contextmanager
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


@contextmanager
def faulty_proxy(
    upstream: str,
    script: list[Fault],
    *,
    forever: Fault | None = None,
    only: str = "",
    trickle_s: float = 1.0,
    on_request: Callable[[str], None] | None = None,
) -> Iterator[FaultyProxy]:
    proxy = FaultyProxy(
        upstream, script, forever=forever, only=only, trickle_s=trickle_s, on_request=on_request
    )
    try:
        yield proxy
    finally:
        proxy.close()


# --- the CLI against a publish project, as the network-fault tests run it ---------------

#: The network settings of the CLI runs: short, so that a hang shows as a slow test.
NET_TIMEOUT_S = 3
#: A CLI run that has not ended by then hung (the test fails). Each step it runs is bounded
#: by NET_TIMEOUT_S (and a few of its retries): forty times that, so that no load makes a
#: run that ended by its limits look hung. How it ended is read from what it said.
CLI_LIMIT_S = 40 * NET_TIMEOUT_S


def network_env(retries: int) -> dict[str, str]:
    return {"XLA_WHEELS_NET_TIMEOUT": str(NET_TIMEOUT_S), "XLA_WHEELS_NET_RETRIES": str(retries)}


def network_cli(*args: str, project: Path, env: dict[str, str]) -> CliResult:
    """The CLI on the project's bundle; one that runs past :data:`CLI_LIMIT_S` fails."""
    return run_cli(
        *args, "--bundle", BUNDLE, env=env, root=project, inherit_env=True, timeout=CLI_LIMIT_S
    )


def error_lines(result: CliResult) -> str:
    """The ``error:`` line and its ``fix:``, nothing else of the output."""
    match = re.search(r"^error: .*(\n\s+fix: .*)?", result.stderr, re.MULTILINE)
    assert match is not None, result.output
    return match.group(0)


def assert_clean_end(result: CliResult) -> None:
    """No traceback (an unhandled partial read included) and no credential in the output."""
    assert "Traceback" not in result.output and "IncompleteRead" not in result.output
    assert PASSWORD not in result.output
