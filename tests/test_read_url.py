"""One attempt of an HTTP read (index pages, lane copies, the devpi push, the Debian
toolchain): ``xla_host.net.read_url``, the project's one reader.

Against real loopback servers: the whole body arrives; a server that never answers, one
that trickles bytes forever without ever stalling (in the body, or already in the status
line), an answer cut before the length it announced (or mid-chunk) and an HTTP 503 are
faults worth retrying (:class:`Transient`) within the bounds given; a 404 is not (the
caller names it), and its body is already read under the same bounds.
"""

from __future__ import annotations

import http.server
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.network_faults_support import silent_server
from tests.servers import serving
from xla_host.net import ERROR_BODY_BYTES, Transient, read_url

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
        elif self.path == "/slow-status":
            # Even the status line comes a byte at a time, then a header that never ends.
            for byte in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 10**6:
                try:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
        elif self.path == "/cut":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY[: len(BODY) // 2])
            self.close_connection = True
        elif self.path == "/cut-chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"100\r\n" + b"x" * 0x80)
            self.close_connection = True
        elif self.path == "/busy":
            self.send_error(503)
        elif self.path == "/conflict":
            self.send_response(409)
            self.send_header("Content-Length", "15")
            self.end_headers()
            self.wfile.write(b"already there\r\n")
        elif self.path == "/huge-refusal":
            # A refusal whose body goes on for a GiB: what it says is read, not all of it.
            self.send_response(403)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.sent = 0
            try:
                for _ in range(1 << 10):
                    self.wfile.write(b"d" * (1 << 20))
                    self.sent += 1 << 20
            except OSError:
                return
        else:
            self.send_error(404)


@contextmanager
def file_server() -> Iterator[str]:
    with serving(_Handler) as server:
        yield server.base


def test_the_whole_body_is_written() -> None:
    chunks: list[bytes] = []
    with file_server() as base:
        assert read_url(f"{base}/whole", write=chunks.append, limit_s=30, idle_s=10) == b""
        assert read_url(f"{base}/whole", limit_s=30, idle_s=10) == BODY
    assert b"".join(chunks) == BODY


def test_a_server_that_never_answers_is_a_transient_timeout() -> None:
    with silent_server() as silent:
        with pytest.raises(Transient) as caught:
            read_url(f"{silent.base}/x", limit_s=30, idle_s=1)
        connections = silent.connections()
    assert caught.value.kind == "timed out"
    # Ended by the idle timeout (1 s), not the whole limit (30 s): the fault says which.
    assert caught.value.after_s == 1 and not caught.value.unfinished
    assert connections == 1  # one attempt: retrying is the caller's


@pytest.mark.slow
def test_a_trickle_that_never_stalls_still_ends_at_the_whole_limit() -> None:
    # Each read gets bytes within the socket timeout: only the whole-transfer limit ends it.
    with file_server() as base, pytest.raises(Transient) as caught:
        read_url(f"{base}/trickle", limit_s=2, idle_s=5)
    # Ended by the whole limit (2 s), which the fault names, not by the idle timeout, nor
    # by the trickle's end (a day away).
    assert caught.value.kind == "timed out" and "not finished after 2s" in caught.value.detail
    assert caught.value.unfinished and caught.value.after_s == 2


@pytest.mark.slow
def test_a_trickle_inside_the_status_line_ends_at_the_whole_limit_too() -> None:
    # No answer is ever complete enough to check a deadline between reads: the limit
    # must end the reading itself.
    with file_server() as base, pytest.raises(Transient) as caught:
        read_url(f"{base}/slow-status", limit_s=2, idle_s=5)
    assert caught.value.kind == "timed out" and caught.value.unfinished
    assert caught.value.after_s == 2  # the whole limit ended the reading itself


def test_an_answer_cut_before_its_announced_length_is_a_transient_cut() -> None:
    with file_server() as base:
        for path in ("/cut", "/cut-chunked"):
            with pytest.raises(Transient) as caught:
                read_url(f"{base}{path}", write=lambda _: None, limit_s=10, idle_s=5)
            assert caught.value.kind == "cut", path
            assert "cut the connection before the end of its answer" in caught.value.what_happened


def test_http_503_is_transient_and_404_is_left_to_the_caller() -> None:
    with file_server() as base:
        with pytest.raises(Transient) as caught:
            read_url(f"{base}/busy", limit_s=10, idle_s=5)
        assert caught.value.kind == "HTTP 503"
        with pytest.raises(urllib.error.HTTPError) as missing:
            read_url(f"{base}/nothing", limit_s=10, idle_s=5)
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as conflict:
            read_url(f"{base}/conflict", limit_s=10, idle_s=5)
    # The server's message was read with the answer, under its limits; the server is gone.
    assert conflict.value.code == 409 and conflict.value.read() == b"already there\r\n"


def test_a_refusal_with_an_endless_body_is_read_only_as_far_as_its_message() -> None:
    with file_server() as base, pytest.raises(urllib.error.HTTPError) as refused:
        read_url(f"{base}/huge-refusal", limit_s=60, idle_s=10)
    assert refused.value.code == 403
    # What a refusal says is kept for its message, up to the cap; the GiB behind it is not.
    assert len(refused.value.read()) == ERROR_BODY_BYTES
