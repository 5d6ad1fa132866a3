"""Real loopback servers that misbehave, for the network-fault tests.

- :class:`SilentServer` accepts every connection and never answers (nor closes it).
- :class:`FaultyProxy` stands in front of a real index (pypiserver) and answers the
  first requests with a scripted status (503, 401...), then forwards the rest; it counts
  every request, so a test can prove a retry, or that there was none.
"""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

#: Headers not passed through the proxy (hop-by-hop, or recomputed by urllib).
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class SilentServer:
    """A TCP server on 127.0.0.1 that accept()s and never says a word."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(64)
        self.port = int(self._socket.getsockname()[1])
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        self._socket.settimeout(0.2)
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            self._held.append(connection)  # kept open: the client waits for an answer

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self._held:
            connection.close()
        self._socket.close()


class FaultyProxy:
    """HTTP proxy to ``upstream`` (a base URL) answering ``script``'s statuses first."""

    def __init__(self, upstream: str, script: list[int], *, forever: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.script = list(script)
        self.forever = forever
        """A status answered to every request once the script is used up (None: forward)."""
        self.requests: list[str] = []
        self.faults_served = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads the counts, not a log

            def _handle(self) -> None:
                with proxy._lock:
                    proxy.requests.append(f"{self.command} {self.path}")
                    status = proxy.script.pop(0) if proxy.script else proxy.forever
                    if status is not None:
                        proxy.faults_served += 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if status is not None:
                    payload = f"scripted {status}\n".encode()
                    self.send_response(status)
                    if status == 401:
                        self.send_header("WWW-Authenticate", 'Basic realm="pypi"')
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS
                }
                request = urllib.request.Request(
                    proxy.upstream + self.path, data=body, headers=headers, method=self.command
                )
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        code, answer, reply = response.status, response.read(), response.headers
                except urllib.error.HTTPError as error:
                    code, answer, reply = error.code, error.read(), error.headers
                self.send_response(code)
                for key, value in reply.items():
                    if key.lower() not in _HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_HEAD = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextmanager
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


@contextmanager
def faulty_proxy(
    upstream: str, script: list[int], *, forever: int | None = None
) -> Iterator[FaultyProxy]:
    proxy = FaultyProxy(upstream, script, forever=forever)
    try:
        yield proxy
    finally:
        proxy.close()
