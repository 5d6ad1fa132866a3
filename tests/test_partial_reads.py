"""An answer cut off mid-way and a server that trickles end like every network fault.

Against real loopback servers: pypiserver behind a proxy (tests/network_faults_support.py)
that cuts an answer after half its announced body, trickles it one byte a second (so no
single read ever waits long), or never answers a download:

- a cut is retried and, when it passes, the step succeeds; when it persists, one
  ``error:`` saying the host cut the connection, exit 1, never a traceback;
- a trickle ends at the whole-transfer deadline (``NET_TIMEOUT`` + size at 256 KiB/s),
  exit 8 with the network fix;
- in publish (the listing read), promote (the lane download), the devpi push (which obeys
  ``NET_TIMEOUT``, not a fixed limit) and verify-install (pip's download);
- two publishes of one bundle at once: the loser's twine error is explained, and publish
  run again skips the file the other one uploaded.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.network_faults_support import (
    CUT,
    NET_TIMEOUT_S,
    SILENT,
    TRICKLE,
    assert_clean_end,
    error_lines,
    faulty_proxy,
    network_cli,
    network_env,
    silent_server,
)
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    IndexServer,
    make_publish_project,
)
from xla_host.filemode import file_sha256
from xla_host.net import NetworkPolicy, NetworkTimedOut
from xla_wheels.publish.errors import IndexUnreachable
from xla_wheels.publish.index import Credentials
from xla_wheels.release import devpi
from xla_wheels.release.lane_index import IndexLane
from xla_wheels.release.lanes import Lane, Policy
from xla_wheels.release.promote import fetch_from_lane
from xla_wheels.wheels_lock import WheelRecord

#: A page read's deadline under NET_TIMEOUT_S: 3 s + 1 MiB at 256 KiB/s.
PAGE_DEADLINE_S = 7
#: Function-level steps: short waits and pauses, and a rate that makes a deadline of
#: about NET_TIMEOUT for the small wheels.
FAST = NetworkPolicy(timeout_s=2, retries=1, backoff_s=0.1, heartbeat_s=0, min_bytes_per_s=1e9)


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Path:
    return make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])


def _wheels_on(server: IndexServer) -> list[str]:
    return sorted(p.name for p in server.packages.iterdir() if p.suffix == ".whl")


# --- publish: the index's listing --------------------------------------------------------


@pytest.mark.slow
def test_a_listing_cut_mid_answer_is_read_again_and_publish_succeeds(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [CUT], only="/simple/") as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=1)},
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert proxy.faults_served == 1
    assert proxy.requests[0] == proxy.requests[1] == "GET /simple/"
    assert f"127.0.0.1:{proxy.port} cut; trying again in 2s" in result.stderr
    assert len(_wheels_on(index_server)) == 2
    assert_clean_end(result)


@pytest.mark.slow
def test_a_project_page_cut_every_time_is_exit_1_saying_so(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    # The root answers; every project page is cut (the listing publish compares with).
    with faulty_proxy(base, [], forever=CUT, only="/simple/torch") as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=1)},
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert len(proxy.requests) == 2
    error = error_lines(result)
    assert f"127.0.0.1:{proxy.port} is not reachable: it cut the connection before the end" in error
    assert "(2 attempts)" in error and "fix: the index fails on its side" in error
    assert _wheels_on(index_server) == []
    assert_clean_end(result)


@pytest.mark.slow
def test_an_index_trickling_one_byte_a_second_ends_publish_at_its_deadline(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [], forever=TRICKLE, trickle_s=1) as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=0)},
        )  # fmt: skip
    assert result.exit_code == 8, result.output
    error = error_lines(result)
    assert (
        f"reading {proxy.base}/simple/: 127.0.0.1:{proxy.port} did not finish within "
        f"{PAGE_DEADLINE_S}s, the whole-transfer deadline (1 attempt)"
    ) in error
    assert "XLA_WHEELS_NET_TIMEOUT" in error
    assert f"up to {PAGE_DEADLINE_S}s" in result.stderr  # the wait said how long it may be
    # Ended by that deadline on its one attempt: the trickle was asked once, not again.
    assert len(proxy.requests) == 1, proxy.requests
    assert_clean_end(result)


# --- promote: the download from a lane ---------------------------------------------------


def _lane(index_url: str) -> Lane:
    return Lane("validation", IndexLane("validation", index_url), policy=Policy())


def _records(project: Path) -> list[WheelRecord]:
    return [
        WheelRecord(p.name, p.stat().st_size, file_sha256(p))
        for p in sorted((project / "dist" / BUNDLE).glob("*.whl"))
    ]


def _serve(project: Path, server: IndexServer) -> None:
    for wheel in (project / "dist" / BUNDLE).glob("*.whl"):
        shutil.copyfile(wheel, server.packages / wheel.name)


@pytest.mark.slow
def test_a_lane_download_cut_mid_file_is_fetched_again_whole(
    project: Path,
    index_server: IndexServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve(project, index_server)
    for name, value in index_server.credentials.items():
        monkeypatch.setenv(name, value)
    base = index_server.url.removesuffix("/simple/")
    workdir = tmp_path / "work"
    workdir.mkdir()
    records = _records(project)
    with faulty_proxy(base, [CUT], only="/packages/") as proxy:
        wheels = fetch_from_lane(_lane(f"{proxy.base}/simple/"), records, workdir, network=FAST)
    # Without the check of the announced length, the half file passed as the whole one
    # (and was then refused as "not the locked one").
    assert [file_sha256(w.path) for w in wheels] == [r.sha256 for r in records]
    assert proxy.faults_served == 1 and len(proxy.requests) == 3  # the cut one read again


@pytest.mark.slow
def test_a_lane_trickling_its_file_ends_at_the_transfer_deadline(
    project: Path,
    index_server: IndexServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _serve(project, index_server)
    for name, value in index_server.credentials.items():
        monkeypatch.setenv(name, value)
    base = index_server.url.removesuffix("/simple/")
    workdir = tmp_path / "work"
    workdir.mkdir()
    with (
        faulty_proxy(base, [], forever=TRICKLE, only="/packages/", trickle_s=0.5) as proxy,
        pytest.raises(NetworkTimedOut) as caught,
    ):
        fetch_from_lane(_lane(f"{proxy.base}/simple/"), _records(project), workdir, network=FAST)
    # Two attempts, each ended by the 2 s deadline, not the trickle's hours: the file was
    # asked for twice and never received whole.
    assert f"127.0.0.1:{proxy.port} did not finish within 2s" in caught.value.message
    assert "(2 attempts)" in caught.value.message and caught.value.exit_code == 8
    assert len(proxy.requests) == 2, proxy.requests
    assert proxy.trickled_whole == 0


# --- the devpi push ----------------------------------------------------------------------


def _devpi_lanes(server_base: str) -> tuple[devpi.DevpiLane, devpi.DevpiLane]:
    def lane(name: str, index: str) -> devpi.DevpiLane:
        base = f"{server_base}/"
        return devpi.DevpiLane(name, f"{base}{index}/+simple/", f"{base}{index}/", base, index)

    return lane("validation", "team/validation"), lane("preferred", "team/preferred")


@pytest.mark.slow
def test_a_trickling_devpi_push_ends_by_net_timeout_not_a_fixed_limit(
    index_server: IndexServer,
) -> None:
    # Any answer trickled one byte a second: the push waits NET_TIMEOUT plus the
    # release's size at the slowest allowed rate, not ten minutes.
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [], forever=TRICKLE, trickle_s=1) as proxy:
        source, target = _devpi_lanes(proxy.base)
        with pytest.raises(NetworkTimedOut) as caught:
            devpi.post_push(
                source, target, ("torch", "2.9.0"), 1000, Credentials(None, None, "none"), FAST
            )
    message = caught.value.message
    assert f"devpi push torch==2.9.0: 127.0.0.1:{proxy.port} did not finish within 2s" in message
    assert "(1 attempt)" in message  # a push devpi saw may have happened: never sent again
    assert "make lanes" in caught.value.fix and "XLA_WHEELS_NET_TIMEOUT" in caught.value.fix
    assert len(proxy.requests) == 1 and proxy.trickled_whole == 0  # one push, cut off


@pytest.mark.slow
def test_a_devpi_push_answer_cut_mid_way_is_one_clear_error_not_retried(
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    with faulty_proxy(base, [], forever=CUT) as proxy:
        source, target = _devpi_lanes(proxy.base)
        with pytest.raises(IndexUnreachable) as caught:
            devpi.post_push(
                source, target, ("torch", "2.9.0"), 1000, Credentials(None, None, "none"), FAST
            )
    assert len(proxy.requests) == 1
    assert caught.value.exit_code == 1
    assert "cut the connection before the end of its answer" in caught.value.message
    assert "may have gone through" in caught.value.fix and "make lanes" in caught.value.fix


# --- verify-install: pip's download ---------------------------------------------------


@pytest.mark.slow
def test_verify_install_whose_download_never_answers_is_exit_8_with_a_network_fix(
    project: Path,
    index_server: IndexServer,
) -> None:
    _serve(project, index_server)
    base = index_server.url.removesuffix("/simple/")
    # The pages answer; the files never do.
    with faulty_proxy(base, [], forever=SILENT, only="/packages/") as proxy:
        result = network_cli(
            "verify-install", "--index-url", f"{proxy.base}/simple/", "--no-deps",
            project=project, env={**index_server.credentials, **network_env(retries=0)},
        )  # fmt: skip
    assert result.exit_code == 8, result.output
    error = error_lines(result)
    assert f"pip install --require-hashes: 127.0.0.1:{proxy.port} did not answer" in error
    assert "XLA_WHEELS_NET_TIMEOUT" in error
    assert "hash" not in error.split("fix:")[1] and "admin" not in error
    # pip waited NET_TIMEOUT for the file, once (no retries of its own), then gave up.
    assert f"did not answer within {NET_TIMEOUT_S}s (1 attempt)" in error, error
    assert len(proxy.requests) == 1, proxy.requests
    assert_clean_end(result)


@pytest.mark.slow
def test_verify_install_whose_download_is_cut_is_a_network_error_not_a_hash_one(
    project: Path,
    index_server: IndexServer,
) -> None:
    _serve(project, index_server)
    base = index_server.url.removesuffix("/simple/")
    # pip's download is cut (pip does not check the announced length: it reports a
    # refused hash); the file on the index is the locked one.
    with faulty_proxy(base, [CUT], only="/packages/") as proxy:
        result = network_cli(
            "verify-install", "--index-url", f"{proxy.base}/simple/", "--no-deps",
            project=project, env={**index_server.credentials, **network_env(retries=0)},
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert len(proxy.requests) == 2  # pip's download, and ours
    error = error_lines(result)
    assert re.search(
        rf"error: pip install --require-hashes: 127\.0\.0\.1:{proxy.port} sent torch-\S+ "
        r"damaged \(pip got sha256 [0-9a-f]{64}\); downloaded again, it is the locked file",
        error,
    ), error
    assert "fix: the file on the index is right" in error and "run verify-install again" in error
    assert "admin" not in error
    assert_clean_end(result)


# --- two publishes at once -----------------------------------------------------------------


@pytest.mark.slow
def test_a_file_another_publish_uploaded_meanwhile_is_explained_and_skipped_on_rerun(
    project: Path,
    index_server: IndexServer,
) -> None:
    base = index_server.url.removesuffix("/simple/")
    dist = project / "dist" / BUNDLE

    def other_publish(request: str) -> None:
        # Between this run's comparison and its upload, another checkout's publish puts
        # the same files on the index.
        if request.startswith("POST"):
            _serve(project, index_server)

    with faulty_proxy(base, [], only="/", on_request=other_publish) as proxy:
        result = network_cli(
            "publish", "--index-url", f"{proxy.base}/simple/",
            project=project, env={**index_server.credentials, **network_env(retries=0)},
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    error = error_lines(result)
    assert re.search(
        r"error: the index now holds torch-\S+ with the same sha256: another publish uploaded "
        r"it while this one ran",
        error,
    ), error
    assert "fix: run publish again: files already on the index" in error
    assert_clean_end(result)
    # Run again, as the fix says: both files are on the index with the locked bytes.
    again = network_cli(
        "publish", "--index-url", index_server.url,
        project=project, env={**index_server.credentials, **network_env(retries=0)},
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert again.stderr.count("on the index with the same sha256") == 2
    assert _wheels_on(index_server) == sorted(p.name for p in dist.glob("*.whl"))


# --- the resolver of make requirements ------------------------------------------------


#: pip reads no other index, file or config of this machine than PIP_INDEX_URL.
_ONLY_THAT_INDEX = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": ""}


@pytest.mark.slow
def test_requirements_against_an_index_that_never_answers_obeys_net_timeout(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    # pip resolves the runtime pins from the index it is configured with: it waits
    # NET_TIMEOUT, not its own 15 s five times over, and the end says which host.
    runtime = '[runtime.jax]\nversion = "0.9.0"\n'
    project = make_publish_project(
        tmp_path, [fake_wheels.torch, fake_wheels.torch_xla], runtime=runtime
    )
    lock_before = (project / "wheels.lock").read_bytes()
    with silent_server() as silent:
        result = network_cli(
            "requirements", project=project,
            env={"PIP_INDEX_URL": f"{silent.base}/simple/", **_ONLY_THAT_INDEX,
                 **network_env(retries=0)},
        )  # fmt: skip
        connections = silent.connections()
    assert result.exit_code == 8, result.output
    error = error_lines(result)
    assert (
        f"pip resolving the runtime wheels: 127.0.0.1:{silent.port} did not answer within "
        f"{NET_TIMEOUT_S}s (1 attempt)"
    ) in error
    assert "XLA_WHEELS_NET_TIMEOUT" in error
    assert connections == 1  # one attempt of pip's, not its own five retries
    assert (project / "wheels.lock").read_bytes() == lock_before
    assert_clean_end(result)
