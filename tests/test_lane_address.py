"""One lane address: every host command that takes a lane reads it the same from each form
(a directory, a ``file://`` URL, an http URL of the lane's root or of its ``simple/``
index, with the credential as userinfo or as a ``?token=``), keeps the credential on every
request, and never shows or writes it.

Real parts: a static lane written by the builder's ``publish-lane`` (the stand-in wheels
of tests/publish_support.py, their bundle document with a launch profile), a signed cache
pack published into it (``xla_wheels.release.lane_packs``), a loopback server that
refuses every request without the credential (tests/guarded_lane_server.py), and
``python -m xla_host`` run as processes. No torch_xla starts: each command either succeeds
after reading the lane or fails on what it read there (doctor judges the stand-in
interpreter; the gate is asked for a profile the document does not have).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import servers
from tests.clirunner import REPO_ROOT, CliResult, run_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
)
from tests.test_cache_pack import host_python, keypair, listing, manifest
from xla_host import cache_pack, lane_address
from xla_host.errors import ExitCode
from xla_host.redact import REDACTED
from xla_wheels.release import lane_packs as lane_store
from xla_wheels.release.lane_static import StaticLane
from xla_wheels.release.lanes import Lane, Policy

__all__ = ["host_python"]  # the fixture, shared with test_cache_pack.py

SECRET = "s3cret-lane-token-0042"
PREFIX = "/validation/"


@dataclass(frozen=True)
class PublishedLane:
    directory: Path
    url: str
    """The guarded server's root of the lane, without credentials (it refuses that)."""
    public_key: Path
    cold_cache: Path
    """What the lane's pack holds."""
    launch_cache: Path
    """The profile ``train``'s cache directory, where ``launch-env --pack-lane`` installs."""


@pytest.fixture(scope="module")
def published(
    tmp_path_factory: pytest.TempPathFactory,
    fake_wheels: FakeWheels,
) -> Iterator[PublishedLane]:
    tmp = tmp_path_factory.mktemp("guarded-lane")
    launch_cache = tmp / "launch-cache"
    profile = (
        '\n[profiles.train.device]\nPJRT_DEVICE = "CPU"\n'
        f'[profiles.train.cache]\nXLA_PERSISTENT_CACHE_PATH = "{launch_cache}"\n'
    )
    project = make_publish_project(tmp, [fake_wheels.torch, fake_wheels.torch_xla], runtime=profile)
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
    )
    done = run_cli("publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert done.exit_code == 0, done.output
    directory = project / "dist" / "lanes" / "validation"
    cold = tmp / "cold-cache"
    cold.mkdir()
    for i, size in enumerate((70_000, 1_500, 9)):
        (cold / f"{1234567890123 + i}").write_bytes(os.urandom(size))
    private, public = keypair(tmp, "lane")
    pack, full = cache_pack.write_pack(tmp / "packs", cold, private, manifest(bundle=BUNDLE))
    lane = Lane("validation", StaticLane("validation", directory), policy=Policy())
    lane_store.publish_pack(lane, pack, full, {BUNDLE: "serves"})
    port = servers.free_port()
    server = servers.start(
        "guarded lane",
        [sys.executable, str(REPO_ROOT / "tests" / "guarded_lane_server.py"), str(directory),
         str(port), PREFIX, SECRET],
        log=tmp / "server.log",
        ready=servers.answers_http(f"http://127.0.0.1:{port}{PREFIX}?token={SECRET}"),
        timeout_s=30,
    )  # fmt: skip
    try:
        yield PublishedLane(directory, f"http://127.0.0.1:{port}{PREFIX}", public, cold,
                            launch_cache)  # fmt: skip
    finally:
        servers.stop(server)


def forms(lane: PublishedLane) -> dict[str, str]:
    """Every address form the docs name, of the one lane."""
    with_user = lane.url.replace("http://", f"http://lane:{SECRET}@")
    return {
        "directory": str(lane.directory),
        "file://": lane.directory.as_uri() + "/",
        "http root ?token=": f"{lane.url}?token={SECRET}",
        "http simple/ ?token=": f"{lane.url}simple/?token={SECRET}",
        "http root, userinfo": with_user,
    }


def host(*args: str, home: Path, env: dict[str, str] | None = None) -> CliResult:
    done = subprocess.run(
        [sys.executable, "-m", "xla_host", *args], cwd=home, text=True, capture_output=True,
        timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "XLA_WHEELS_CACHE": str(home / "cache"),
             "PYTHONPATH": str(REPO_ROOT / "host" / "src"), **(env or {})},
    )  # fmt: skip
    return CliResult(done.returncode, done.stdout, done.stderr)


def secret_forms() -> list[bytes]:
    """The credential as any output could carry it: as typed, and as a basic-auth header."""
    return [SECRET.encode(), base64.b64encode(f"lane:{SECRET}".encode())]


def assert_never_written(done: CliResult, home: Path) -> None:
    for form in secret_forms():
        assert form.decode() not in done.output, done.output
    for path in home.rglob("*"):
        if path.is_file() and not path.is_symlink():
            content = path.read_bytes()
            assert not any(form in content for form in secret_forms()), path


@pytest.mark.slow
def test_the_guarded_lane_refuses_a_request_without_its_credential(
    published: PublishedLane,
) -> None:
    """The server the test below reads through: a reader that drops the token fails."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{published.url}packs/index.json", timeout=30)
    assert refused.value.code == 401
    let_in = f"{published.url}packs/index.json?token={SECRET}"
    with urllib.request.urlopen(let_in, timeout=30) as answer:
        assert answer.status == 200


@pytest.mark.slow
def test_every_command_that_takes_a_lane_reads_every_form_and_never_shows_the_credential(
    published: PublishedLane, host_python: Path, tmp_path: Path
) -> None:
    key, python = str(published.public_key), str(host_python)
    for name, given in forms(published).items():
        home = tmp_path / name.replace(" ", "-").replace("/", "").replace(":", "").replace(",", "")
        home.mkdir()
        # doctor: the document and every wheel it lists come from the lane (then the
        # stand-in interpreter, torch_xla 2.7.0 by its metadata, fails the checks).
        doctor = host("doctor", "--lane", given, "--bundle", BUNDLE, "--python", python,
                      "--wheel-dir", str(home / "wheels"), home=home)  # fmt: skip
        assert doctor.exit_code == ExitCode.FAILED, (name, doctor.output)
        assert sorted(p.name for p in (home / "wheels").glob("*.whl")) == sorted(
            p.name for p in published.directory.glob("*.whl")
        ), (name, doctor.output)
        if given.startswith("http"):
            assert REDACTED in doctor.stdout, (name, doctor.stdout)  # the masked fix line
        assert_never_written(doctor, home)

        # cache fetch --lane: the pack index, then the pack by hash; the install record
        # names the pack's URL without the credential.
        into = home / "fetched"
        fetched = host("cache", "fetch", "--lane", given, "--bundle", BUNDLE, "--into",
                       str(into), "--key", key, "--python", python, "--device", "CPU",
                       "--topology", "cpu-1x1", home=home)  # fmt: skip
        assert fetched.exit_code == 0, (name, fetched.output)
        assert listing(into) == listing(published.cold_cache)
        (record,) = (into / cache_pack.INSTALLED_DIR).glob("*.json")
        source = record.read_text()
        if given.startswith("http"):
            assert "@" not in source and "127.0.0.1" in source, source
        assert_never_written(fetched, home)

        # launch-env --lane and --pack-lane: the document's profile, then the pack
        # installed into its cache directory before the launch files are written.
        shutil.rmtree(published.launch_cache, ignore_errors=True)
        launch = host("launch-env", "--lane", given, "--bundle", BUNDLE, "--profile", "train",
                      "--role", "writer", "--out", str(home / "launch"), "--python", python,
                      "--pack-lane", given, "--pack-public-key", key, home=home)  # fmt: skip
        assert launch.exit_code == 0, (name, launch.output)
        assert listing(published.launch_cache) == listing(published.cold_cache)
        assert (home / "launch" / "env.sh").is_file()
        assert_never_written(launch, home)
        for path in published.launch_cache.rglob("*.json"):
            assert SECRET not in path.read_text(), path

        # gate --lane: the document is read, then a profile it lacks is refused (exit 2)
        # before anything runs.
        gate = host("gate", "--lane", given, "--bundle", BUNDLE, "--profile", "absent",
                    "--python", python, "--out", str(home / "gate"), home=home)  # fmt: skip
        assert gate.exit_code == ExitCode.BAD_INPUT, (name, gate.output)
        assert "absent" in gate.stderr and "Traceback" not in gate.stderr, (name, gate.output)
        assert_never_written(gate, home)


def test_a_lane_address_of_no_form_is_refused_naming_the_forms(tmp_path: Path) -> None:
    for given, problem in (
        ("ftp://lanes.corp/validation/", "has the scheme ftp://"),
        ("http:///validation/", "names no host"),
        ("file://elsewhere/lanes/validation", "names another machine"),
    ):
        done = host("doctor", "--lane", given, "--bundle", BUNDLE, home=tmp_path)
        assert done.exit_code == ExitCode.BAD_INPUT, done.output
        assert problem in done.stderr and "fix: give the lane as" in done.stderr, done.output
        assert "Traceback" not in done.stderr


def test_a_link_keeps_the_lanes_credential_only_on_the_lanes_own_server() -> None:
    lane = lane_address.parse(f"https://lane:{SECRET}@lanes.corp/v/simple/?token={SECRET}")
    page = lane.project_page("torch")
    assert page == f"https://lane:{SECRET}@lanes.corp/v/simple/torch/?token={SECRET}"
    assert lane.linked(page, "../../torch-2.9.0-py3-none-any.whl#sha256=ab") == (
        f"https://lane:{SECRET}@lanes.corp/v/torch-2.9.0-py3-none-any.whl?token={SECRET}",
        "sha256=ab",
    )
    assert lane.linked(page, "https://cdn.example/torch.whl") == (
        "https://cdn.example/torch.whl",
        "",
    )
    assert SECRET not in lane.shown(page)
    assert lane_address.recorded(lane.url("packs/index.json")) == (
        f"https://lanes.corp/v/packs/index.json?token={REDACTED}"
    )


def test_a_directory_and_its_file_url_with_or_without_simple_are_one_local_lane(
    tmp_path: Path,
) -> None:
    for given in (str(tmp_path), f"{tmp_path}/simple/", tmp_path.as_uri(),
                  f"{tmp_path.as_uri()}/simple"):  # fmt: skip
        lane = lane_address.parse(given)
        assert lane.directory == tmp_path, given
        assert lane.path("packs/index.json") == tmp_path / "packs" / "index.json"
    for given, root, index in (
        ("https://lanes.corp/validation", "/validation/", "/validation/simple/"),
        ("https://lanes.corp/validation/simple/", "/validation/", "/validation/simple/"),
        ("https://devpi.corp/team/dev/+simple/", "/team/dev/", "/team/dev/+simple/"),
    ):
        lane = lane_address.parse(given)
        assert (lane.root_path, lane.index_path) == (root, index), given
