"""Servers the tests run as real processes on loopback: one way to start one, wait until
it answers, and stop it (pypiserver, devpi-server, redis-server).

A server that exits or never answers fails the test with its own log, not a bare
timeout; stopping asks first (SIGTERM, so it can flush and release its port) and kills
only one that does not listen.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from xla_host import runner

STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    """A loopback TCP port nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers_http(url: str) -> Callable[[], bool]:
    """A readiness probe: ``url`` answers a GET with a success status."""

    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return False

    return probe


def start(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    ready: Callable[[], bool],
    timeout_s: float,
) -> subprocess.Popen[bytes]:
    """``argv`` started with its output in ``log``, returned once ``ready()`` holds; stop
    it with :func:`stop`. Fails the test (AssertionError with the log) if it exits first or
    is not ready within ``timeout_s``."""
    with log.open("wb") as handle:
        process = subprocess.Popen(list(argv), stdout=handle, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while not ready():
        if process.poll() is not None:
            raise AssertionError(f"{name} exited with {process.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            stop(process)
            waited = f"{timeout_s:.0f}s"
            raise AssertionError(f"{name} did not answer within {waited}: {log.read_text()}")
        time.sleep(0.2)
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    """Ask the server to stop; kill it if it has not within :data:`STOP_TIMEOUT_S`."""
    runner.stop(process, STOP_TIMEOUT_S)


@dataclass(frozen=True)
class InProcessServer:
    """An HTTP server of the test's own (a handler class) on a loopback port, in a thread
    of the test's process: for answers no real server gives (a trickle, a cut, a refusal)."""

    server: http.server.ThreadingHTTPServer
    thread: threading.Thread

    @classmethod
    def start(
        cls, handler: type[http.server.BaseHTTPRequestHandler], port: int = 0
    ) -> InProcessServer:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        return cls(server, thread)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Shut the server down and close its port (a handler still writing sees its
        client go: it should return)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=STOP_TIMEOUT_S)


@contextmanager
def serving(
    handler: type[http.server.BaseHTTPRequestHandler], port: int = 0
) -> Iterator[InProcessServer]:
    """``handler`` served on loopback until the block ends."""
    running = InProcessServer.start(handler, port)
    try:
        yield running
    finally:
        running.close()


def start_directory_server(directory: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A lane (or any directory) served as static files by ``python -m http.server`` on
    loopback, a real process: it and the root URL it answers at (``http://127.0.0.1:N/``).
    Stop it with :func:`stop`."""
    import sys

    port = free_port()
    root = f"http://127.0.0.1:{port}/"
    process = start(
        "http.server",
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
         str(directory), str(port)],
        log=log, ready=answers_http(root), timeout_s=60,
    )  # fmt: skip
    return process, root
