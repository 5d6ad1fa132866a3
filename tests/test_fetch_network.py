"""The sources stage's git fetch ends in bounded time and retries only what may pass.

Through the CLI, with a component whose remote is a real server on loopback:

- a server that accepts and never answers: git's own stall limit (``NET_TIMEOUT``) ends
  each attempt, the fetch is tried ``NET_RETRIES`` more times, and the run ends with exit
  8 and one ``error:`` naming the step and the host;
- a closed port (connection refused): retried, then exit 1 saying it was refused;
- a repository the server does not have (HTTP 404): never retried, git's message stands.
"""

from __future__ import annotations

import http.server
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.bundles import LIBTPU_RUNTIME, Pin, write_bundle
from tests.clirunner import CliResult
from tests.gitrepos import Upstream
from tests.network_faults_support import silent_server
from tests.servers import serving

#: Short settings, so that a fetch that hangs shows as a slow test.
NET_TIMEOUT_S = 2
NET_RETRIES = 1


def _project(root: Path, upstreams: dict[str, Upstream], torch_remote: str) -> Path:
    """A project whose torch component (fetched first) lives at ``torch_remote``."""
    project = root / "project"
    pins = {
        name: Pin(
            remote=torch_remote if name == "torch" else upstream.url,
            commit=upstream.commits[-1],
            version=None if name == "openxla" else "2.9.0",
        )
        for name, upstream in upstreams.items()
    }
    write_bundle(project, "test-1", pins, runtime=LIBTPU_RUNTIME)
    (project / "patches").mkdir()
    return project


def _sources(
    run_cli: Callable[..., CliResult], project: Path, *, retries: int = NET_RETRIES
) -> CliResult:
    """The sources stage under the short settings. A run that hangs fails the test at the
    ``run_cli`` fixture's limit (300 s: dozens of times these settings' attempts), never
    one that ended by its limits on a busy machine; how it ended is read from its output."""
    env = {"XLA_WHEELS_NET_TIMEOUT": str(NET_TIMEOUT_S), "XLA_WHEELS_NET_RETRIES": str(retries)}
    return run_cli("sources", "--bundle", "test-1", root=project, env=env)


def _error(result: CliResult) -> str:
    match = re.search(r"^error: .*(\n\s+fix: .*)?", result.stderr, re.MULTILINE)
    assert match is not None, result.output
    return match.group(0)


@pytest.mark.slow
def test_a_remote_that_never_answers_ends_after_the_stall_limit_with_exit_8(
    tmp_path: Path, upstreams: dict[str, Upstream], run_cli: Callable[..., CliResult]
) -> None:
    with silent_server() as silent:
        project = _project(tmp_path, upstreams, f"{silent.base}/pytorch/pytorch.git")
        result = _sources(run_cli, project)
        connections = silent.connections()
    assert result.exit_code == 8, result.output
    error = _error(result)
    host = f"127.0.0.1:{silent.port}"
    timed_out = f"did not answer within {NET_TIMEOUT_S}s (2 attempts)"
    assert f"error: fetch torch: {host} {timed_out}" in error
    assert "NET_TIMEOUT" in error and "MIRROR" in error
    assert "trying again in 2s" in result.stderr
    assert "Traceback" not in result.output
    # Each attempt ended at its stall limit (named above), then one pause of 2 s (the
    # backoff) and the next attempt: one retry, so the silent server saw both attempts and
    # no third one ("trying again" once).
    attempts = NET_RETRIES + 1
    assert connections >= attempts
    assert result.stderr.count("trying again") == NET_RETRIES


@pytest.mark.parametrize(
    "remote",
    [
        "git://127.0.0.1:{port}/pytorch/pytorch.git",
        "ssh://git@127.0.0.1:{port}/pytorch/pytorch.git",
    ],
    ids=["git", "ssh"],
)
@pytest.mark.slow
def test_a_git_or_ssh_remote_that_never_answers_ends_after_net_timeout_too(
    tmp_path: Path, upstreams: dict[str, Upstream], run_cli: Callable[..., CliResult], remote: str
) -> None:
    # git has a stall limit of its own only for http(s): over git:// and ssh a silent
    # server was waited on for the whole fetch's limit ("up to 16387s"; still waiting at
    # 90 s). An attempt that received nothing within NET_TIMEOUT now ends as a stall does.
    with silent_server() as silent:
        project = _project(tmp_path, upstreams, remote.format(port=silent.port))
        result = _sources(run_cli, project, retries=0)
        connections = silent.connections()
    assert result.exit_code == 8, result.output
    error = _error(result)
    assert f"127.0.0.1:{silent.port} did not answer within {NET_TIMEOUT_S}s" in error, error
    assert "Traceback" not in result.output
    # One attempt, ended by NET_TIMEOUT (named above), not by the fetch's whole limit.
    assert connections == 1 and "trying again" not in result.stderr


@contextmanager
def _closed_port() -> Iterator[int]:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()  # nothing listens there now: connections are refused
    yield port


@pytest.mark.slow
def test_a_refused_connection_is_retried_then_named(
    tmp_path: Path, upstreams: dict[str, Upstream], run_cli: Callable[..., CliResult]
) -> None:
    with _closed_port() as port:
        project = _project(tmp_path, upstreams, f"http://127.0.0.1:{port}/pytorch/pytorch.git")
        result = _sources(run_cli, project)
    assert result.exit_code == 1, result.output
    error = _error(result)
    assert f"error: fetch torch: 127.0.0.1:{port} refused the connection" in error
    assert "(2 attempts; from http://127.0.0.1" in error
    assert "fix: check that 127.0.0.1" in error
    assert result.stderr.count("trying again") == 1


@contextmanager
def _not_found_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that answers 404 to everything, and the paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(Handler) as server:
        yield server.base, asked


def test_a_missing_repository_is_not_retried(
    tmp_path: Path, upstreams: dict[str, Upstream], run_cli: Callable[..., CliResult]
) -> None:
    with _not_found_server() as (base, asked):
        project = _project(tmp_path, upstreams, f"{base}/pytorch/pytorch.git")
        result = _sources(run_cli, project, retries=3)
    assert result.exit_code == 1, result.output
    assert "trying again" not in result.stderr
    assert "not found" in _error(result)
    # One fetch by SHA and its fall-back to every branch; no retry of either.
    assert len([path for path in asked if "info/refs" in path]) <= 2, asked
