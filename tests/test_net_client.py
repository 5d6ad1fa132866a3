"""The one HTTP client's contract with its callers (``xla_host.net.http_request``).

The client decides when a failure is due (a status that is not retried, a transient fault
that outlasted the retries, no answer at all); the caller only words it (``Failures``).
A real HTTP server on loopback answers from a script; every request it got is counted.
"""

from __future__ import annotations

import http.server
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from tests.servers import free_port, serving
from xla_host.errors import PipelineError
from xla_host.net import Answer, Failures, NetworkPolicy, Transient, http_request

FAST = NetworkPolicy(timeout_s=5, retries=2, backoff_s=0.05, heartbeat_s=0)
SECRET = "s3cr3t-token-4711"


@dataclass
class Scripted:
    """A loopback server that answers each request with the next (status, reason, body)
    of its script (the last one again when the script runs out)."""

    script: list[tuple[int, str, bytes]]
    methods: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/thing"


@contextmanager
def scripted(*script: tuple[int, str, bytes]) -> Iterator[Scripted]:
    state = Scripted(list(script))

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            state.methods.append(self.command)
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            status, reason, body = state.script.pop(0) if len(state.script) > 1 else state.script[0]
            self.send_response(status, reason)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_POST = _answer  # http.server's names

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serving(Handler) as server:
        state.port = server.port
        yield state


class Worded(PipelineError):
    """The caller's own error class: what each hook made, and from what."""


def failures(*, judge_status_myself: bool = False) -> Failures:
    def answered(answer: Answer) -> PipelineError | None:
        if judge_status_myself:
            return None
        return Worded(f"answered {answer.status} {answer.reason}: {answer.body.decode()}")

    return Failures(
        answered=answered,
        unreadable=lambda reason: Worded(f"unreadable: {reason}"),
        gave_up=lambda fault, attempts: Worded(f"gave up after {attempts}: {fault.kind}"),
        timeout_fix="the caller's timeout fix",
    )


def test_a_4xx_is_the_callers_error_asked_once_or_an_answer_it_judges() -> None:
    with scripted((404, "Not Found", b"no such thing")) as server:
        with pytest.raises(Worded) as caught:
            http_request(server.url, FAST, failures())
        assert caught.value.message == "answered 404 Not Found: no such thing"
        assert server.methods == ["GET"]  # a 4xx is never asked again
        answer = http_request(server.url, FAST, failures(judge_status_myself=True))
        assert (answer.status, answer.body) == (404, b"no such thing")


def test_a_5xx_is_asked_again_and_a_whole_answer_ends_the_retries() -> None:
    with scripted((503, "Busy", b""), (200, "OK", b"the body")) as server:
        answer = http_request(server.url, FAST, failures())
    assert (answer.status, answer.body) == (200, b"the body")
    assert server.methods == ["GET", "GET"]


def test_a_5xx_that_lasts_is_the_callers_give_up_after_every_attempt() -> None:
    with scripted((503, "Busy", b"")) as server, pytest.raises(Worded) as caught:
        http_request(server.url, FAST, failures())
    assert caught.value.message == "gave up after 3: HTTP 503"
    assert len(server.methods) == FAST.attempts


@pytest.mark.parametrize("method", ["PUT", "POST"])
def test_a_request_that_may_change_the_server_is_sent_once_when_it_was_seen(method: str) -> None:
    # The server saw it (it answered 503): sent again, it might be made twice.
    with scripted((503, "Busy", b"")) as server:
        request = urllib.request.Request(server.url, data=b"x", method=method)
        with pytest.raises(Worded) as caught:
            http_request(request, FAST, failures())
    assert caught.value.message == "gave up after 1: HTTP 503"
    assert server.methods == [method]


def test_a_refused_connection_is_tried_again_even_for_a_put_then_given_up() -> None:
    url = f"http://127.0.0.1:{free_port()}/thing"  # nothing listens: the server never saw it
    request = urllib.request.Request(url, data=b"x", method="PUT")
    with pytest.raises(Worded) as caught:
        http_request(request, FAST, failures())
    assert caught.value.message == f"gave up after {FAST.attempts}: refused"


def test_a_secret_the_caller_names_never_reaches_its_error() -> None:
    with (
        scripted((403, f"Forbidden for {SECRET}", b"")) as server,
        pytest.raises(Worded) as caught,
    ):
        http_request(server.url, FAST, failures(), secrets=[SECRET])
    assert SECRET not in str(caught.value) and "Forbidden for" in caught.value.message


def test_a_transient_fault_reaches_the_give_up_without_the_secret() -> None:
    # The fault's detail is what the server said (its 5xx reason), masked like the rest.
    seen: list[Transient] = []

    def gave_up(fault: Transient, attempts: int) -> PipelineError:
        seen.append(fault)
        return Worded(fault.what_happened)

    with (
        scripted((502, f"Bad gateway for {SECRET}", b"")) as server,
        pytest.raises(Worded) as caught,
    ):
        http_request(
            server.url, FAST, Failures(lambda a: None, Worded, gave_up, "fix"), secrets=[SECRET]
        )
    assert SECRET not in caught.value.message and "answered HTTP 502" in caught.value.message
    assert [f.kind for f in seen] == ["HTTP 502"]
