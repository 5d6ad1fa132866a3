"""A real git server on loopback that counts what it is asked: git's smart HTTP protocol
(``git http-backend``, git's own server side) over a directory of bare repositories.

A test that must prove a command fetched nothing, or asked nothing at all, before it
refused its input points the command at :attr:`GitHttpServer.base` and reads
:attr:`GitHttpServer.requests` (every request, in order) and :attr:`GitHttpServer.fetches`
(the requests that asked for objects: a fetch or a clone started), never the clock.
"""

from __future__ import annotations

import gzip
import http.server
import os
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.servers import InProcessServer


class GitHttpServer:
    """``git http-backend`` for every repository under ``root``, at ``base``/<path>.git."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        """``METHOD path?query`` of every request, in the order they came."""
        self.fetches = 0
        """Requests whose body asked for objects (``want`` lines): fetches started."""
        self._lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # the test reads the requests, not a log

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                wanted = body
                if self.headers.get("Content-Encoding") == "gzip":
                    wanted = gzip.decompress(body)
                with server._lock:
                    server.requests.append(f"{self.command} {self.path}")
                    if b"want " in wanted:  # protocol v0/v1 and v2's fetch command alike
                        server.fetches += 1
                path, _, query = self.path.partition("?")
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(server.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": urllib.parse.unquote(path),
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "REMOTE_ADDR": "127.0.0.1",
                }
                if self.headers.get("Content-Encoding"):
                    env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
                done = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True,
                    check=False, timeout=120,
                )  # fmt: skip
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                status = 200
                headers: list[tuple[str, str]] = []
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _handle

        self._serving = InProcessServer.start(Handler)
        self.port = self._serving.port

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._serving.close()


@contextmanager
def git_http_server(root: Path) -> Iterator[GitHttpServer]:
    server = GitHttpServer(root)
    try:
        yield server
    finally:
        server.close()
