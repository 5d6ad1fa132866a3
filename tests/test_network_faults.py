"""Every network step ends in bounded time, retries what may pass, and says what happened.

Classes, each against a real server on loopback (pypiserver, a server that accepts and
never answers, a proxy that answers scripted statuses, a closed port), through the CLI
and make:

- no answer: the step ends after its timeout and retries (exit 8), ``error:`` naming the
  step and the host, ``fix:`` naming the setting;
- a transient fault (HTTP 503) is retried and the step succeeds; one that persists is
  tried a bounded number of times, then a clear error;
- credentials refused (401/403) are never retried, and say so, with the credential
  settings in the fix, also from verify-install (not pip's "No matching distribution");
- a stopped index (connection refused) says refused.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.clirunner import REPO_ROOT, CliResult
from tests.network_faults_support import (
    NET_TIMEOUT_S,
    assert_clean_end,
    error_lines,
    faulty_proxy,
    network_cli,
    network_env,
    silent_server,
)
from tests.publish_support import (
    BUNDLE,
    USER,
    FakeWheels,
    IndexServer,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import free_port, stop


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Path:
    return make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])


# --- no answer ------------------------------------------------------------------------


@pytest.mark.slow
def test_upload_to_a_server_that_never_answers_ends_and_names_host_and_step(
    project: Path,
    index_server: IndexServer,
) -> None:
    with silent_server() as silent:
        result = network_cli(
            "publish", "--index-url", index_server.url, "--upload-url", f"{silent.base}/",
            project=project, env={**index_server.credentials, **network_env(retries=1)},
        )  # fmt: skip
        attempts = silent.connections()
    assert result.exit_code == 8, result.output
    error = error_lines(result)
    host = rf"127\.0\.0\.1:{silent.port}"
    assert re.search(rf"error: uploading torch-\S+: {host} did not answer", error), error
    assert "(2 attempts)" in error and "XLA_WHEELS_NET_TIMEOUT" in error
    assert attempts == 2  # the timeout was retried once, as NET_RETRIES=1 asks
    # It said it was waiting, and for whom, before the wait.
    assert f"waiting for 127.0.0.1:{silent.port}: uploading torch-" in result.stderr
    # Each attempt ended at the timeout (named above), then one pause of 2 s.
    assert result.stderr.count("trying again in 2s") == 1
    assert_clean_end(result)
    assert list(index_server.packages.iterdir()) == []


@pytest.mark.slow
def test_verify_install_against_an_index_that_never_answers_ends_through_make(
    project: Path, tmp_path: Path
) -> None:
    with silent_server() as silent:
        # The recipe's own limit: hundreds of times the step's NET_TIMEOUT (a hang fails).
        process = subprocess.run(
            ["make", "--no-print-directory", "verify-install", f"BUNDLE={BUNDLE}",
             f"INDEX_URL={silent.base}/simple/", "NO_DEPS=1",
             f"NET_TIMEOUT={NET_TIMEOUT_S}", "NET_RETRIES=0"],
            cwd=REPO_ROOT, text=True, capture_output=True, timeout=600, check=False,
            env={**_inherited_env(), "XLA_WHEELS_ROOT": str(project),
                 "XLA_WHEELS_OUT": str(tmp_path / "out")},
        )  # fmt: skip
    result = CliResult(process.returncode, process.stdout, process.stderr)
    # make exits 2 for any failed recipe; the CLI's own code is in make's last line.
    assert "verify-install] Error 8" in result.stderr, result.output
    error = error_lines(result)
    assert f"127.0.0.1:{silent.port} did not answer within {NET_TIMEOUT_S}s" in error
    assert "NET_TIMEOUT" in error
    assert "No matching distribution" not in error and "hash" not in error
    assert "(1 attempt)" in error  # NET_RETRIES=0: pip's own retries are not added
    assert_clean_end(result)


def _inherited_env() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("TWINE_", "XLA_WHEELS_", "MAKE")) or name == "XLA_WHEELS_CACHE"
    }


# --- transient faults -----------------------------------------------------------------


@pytest.mark.slow
def test_a_503_is_retried_and_the_publish_succeeds(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [503]) as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=2)},
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert proxy.faults_served == 1
    # The same read was sent again after the 503, and answered.
    assert proxy.requests[0] == proxy.requests[1] == "GET /simple/"
    assert f"127.0.0.1:{proxy.port} answered HTTP 503" not in result.stderr
    assert "trying again in 2s" in result.stderr
    assert len([p for p in index_server.packages.iterdir() if p.suffix == ".whl"]) == 2


@pytest.mark.slow
def test_an_index_that_keeps_answering_503_is_tried_a_bounded_number_of_times(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [], forever=503) as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=2)},
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert len(proxy.requests) == 3  # the first try and NET_RETRIES=2 more
    error = error_lines(result)
    assert f"127.0.0.1:{proxy.port} is not reachable: it answered HTTP 503" in error
    assert "(3 attempts)" in error and "check its logs" in error
    # Between the attempts, the pauses of the backoff (2 and 4 s), each said, no more.
    pauses = re.findall(r"trying again in (\d+)s", result.stderr)
    assert pauses == ["2", "4"], result.stderr
    assert_clean_end(result)


# --- credentials refused: never retried -------------------------------------------------


def test_refused_credentials_are_not_retried(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [], forever=401) as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=3)},
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert len(proxy.requests) == 1
    error = error_lines(result)
    assert "refused our credentials" in error and "HTTP 401" in error
    assert "TWINE_USERNAME" in error and "TWINE_PASSWORD" in error
    assert_clean_end(result)


@pytest.mark.slow
def test_verify_install_with_a_wrong_password_says_the_credentials_were_refused(
    project: Path, tmp_path: Path
) -> None:
    # Reading needs the account, as on a private index; the wheels are on it.
    process, server = start_pypiserver(tmp_path / "index", "update,download,list")
    try:
        for wheel in (project / "dist" / BUNDLE).glob("*.whl"):
            (server.packages / wheel.name).write_bytes(wheel.read_bytes())
        wrong = "Wr0ng-and-Secret-7710"
        result = network_cli(
            "verify-install", "--index-url", server.url, "--no-deps",
            project=project,
            env={"TWINE_USERNAME": USER, "TWINE_PASSWORD": wrong, **network_env(retries=1)},
        )  # fmt: skip
    finally:
        stop(process)
    assert result.exit_code == 1, result.output
    error = error_lines(result)
    assert "refused our credentials" in error and re.search(r"HTTP 40[13]", error)
    assert "TWINE_USERNAME and TWINE_PASSWORD" in error
    assert "No matching distribution" not in error and "hash" not in error
    assert wrong not in result.output
    assert_clean_end(result)


# --- a stopped index ------------------------------------------------------------------------


@pytest.mark.slow
def test_verify_install_against_a_stopped_index_says_refused(project: Path) -> None:
    port = free_port()
    result = network_cli(
        "verify-install", "--index-url", f"http://127.0.0.1:{port}/simple/", "--no-deps",
        project=project, env=network_env(retries=1),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    error = error_lines(result)
    assert f"127.0.0.1:{port} is not reachable: it refused the connection" in error
    assert "fix: check that the index server is running" in error
    assert "No matching distribution" not in error and "hash" not in error
    assert_clean_end(result)
