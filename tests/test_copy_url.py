"""One attempt of a download (lane copies, the Debian toolchain): ``retrying.copy_url``.

Against real loopback servers: the whole body arrives; a server that never answers, one
that trickles bytes forever without ever stalling, and an HTTP 503 are faults worth
retrying (:class:`Transient`) within the bounds given; a 404 is not (the caller names it).
"""

from __future__ import annotations

import http.server
import threading
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.network_faults_support import silent_server
from xla_wheels.retrying import Transient, copy_url

BODY = b"x" * (3 << 20)  # more than one 1 MiB read


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/whole":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
        elif self.path == "/trickle":
            # A byte every 0.1 s, for far longer than any limit the tests give.
            self.send_response(200)
            self.send_header("Content-Length", str(10**6))
            self.end_headers()
            for _ in range(10**6):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
        elif self.path == "/busy":
            self.send_error(503)
        else:
            self.send_error(404)


@contextmanager
def file_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_whole_body_is_written() -> None:
    chunks: list[bytes] = []
    with file_server() as base:
        copy_url(f"{base}/whole", chunks.append, limit_s=30, socket_timeout_s=10)
    assert b"".join(chunks) == BODY


def test_a_server_that_never_answers_is_a_transient_timeout() -> None:
    with silent_server() as silent:
        start = time.monotonic()
        with pytest.raises(Transient) as caught:
            copy_url(f"{silent.base}/x", lambda _: None, limit_s=30, socket_timeout_s=1)
    assert caught.value.kind == "timed out"
    assert time.monotonic() - start < 10


@pytest.mark.slow
def test_a_trickle_that_never_stalls_still_ends_at_the_whole_limit() -> None:
    # Each read gets bytes within the socket timeout: only the whole-transfer limit ends it.
    with file_server() as base:
        start = time.monotonic()
        with pytest.raises(Transient) as caught:
            copy_url(f"{base}/trickle", lambda _: None, limit_s=2, socket_timeout_s=5)
    assert caught.value.kind == "timed out" and "not complete after 2s" in caught.value.detail
    assert time.monotonic() - start < 15


def test_http_503_is_transient_and_404_is_left_to_the_caller() -> None:
    with file_server() as base:
        with pytest.raises(Transient) as caught:
            copy_url(f"{base}/busy", lambda _: None, limit_s=10, socket_timeout_s=5)
        assert caught.value.kind == "HTTP 503"
        with pytest.raises(urllib.error.HTTPError) as missing:
            copy_url(f"{base}/nothing", lambda _: None, limit_s=10, socket_timeout_s=5)
    assert missing.value.code == 404
