"""Lanes on devpi: publish through its upload API, promote by devpi's own push, install by hash.

Against a real devpi-server on 127.0.0.1 (tests/devpi_support.py), its real client for the
admin's set-up, twine for uploads and pip for installs. The wheels are the small
setuptools ones of the publish tests (a torch and a torch_xla, locked as bundle pub-1).
That a promotion re-uploads nothing is shown by the server's own request log: no request
at all reaches the target index's upload URL while the bundle is promoted, and the file
the target serves has the source's sha256.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.devpi_support import DevpiServer, start_devpi, stop_devpi
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    build_fake_wheels,
    make_publish_project,
)
from xla_host import bundle_document
from xla_host.errors import PipelineError
from xla_host.filemode import file_sha256
from xla_host.net import DEFAULT_NETWORK
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.publish.index import Credentials, project_files
from xla_wheels.release import devpi, lanes

NO_CREDENTIALS = Credentials(None, None, "none")


def devpi_lanes_toml(server: DevpiServer, *, extra: str = "") -> str:
    return (
        'publish-lane = "validation"\n\n'
        f'[lanes.validation]\nbackend = "devpi"\nserver = "{server.url}"\n'
        'index = "team/validation"\n\n'
        f'[lanes.preferred]\nbackend = "devpi"\nserver = "{server.url}"\n'
        'index = "team/preferred"\npromote-from = "validation"\n\n' + extra
    )


@dataclass
class DevpiRelease:
    server: DevpiServer
    root: Path
    wheels: FakeWheels

    def run(self, *args: str, **env: str) -> CliResult:
        return run_cli(
            *args, root=self.root, env={**self.server.credentials, **env}, inherit_env=True,
            timeout=300,
        )  # fmt: skip

    def served(self, index: str, wheel: Path) -> str:
        """sha256 of the bytes the index serves for ``wheel``'s file name (downloaded)."""
        project = parse_wheel_name(wheel.name).project
        listed = project_files(
            self.server.simple_url(index), project, NO_CREDENTIALS, network=DEFAULT_NETWORK
        )
        with urllib.request.urlopen(listed[wheel.name].url, timeout=30) as response:
            return hashlib.sha256(response.read()).hexdigest()


# The tests are one story on one module-scoped devpi server (publish, then promote, then
# the refusals against what the earlier tests published): under pytest-xdist they must run
# on one worker, in file order (`--dist loadgroup`).
pytestmark = [pytest.mark.xdist_group("devpi"), pytest.mark.slow]


@pytest.fixture(scope="module")
def devpi_release(
    fake_wheels: FakeWheels,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DevpiRelease]:
    work = tmp_path_factory.mktemp("devpi")
    server = start_devpi(work / "devpi")
    try:
        for index in ("team/validation", "team/preferred", "team/empty", "team/extra"):
            server.create_index(index)
        root = make_publish_project(work, [fake_wheels.torch, fake_wheels.torch_xla])
        extra = "".join(
            f'[lanes.{name}]\nbackend = "devpi"\nserver = "{server.url}"\nindex = "team/{name}"\n'
            for name in ("empty", "extra")
        )
        (root / "build" / "lanes.toml").write_text(devpi_lanes_toml(server, extra=extra))
        yield DevpiRelease(server, root, fake_wheels)
    finally:
        stop_devpi(server)


def test_publish_uploads_through_devpi_then_skips_what_is_there(
    devpi_release: DevpiRelease,
) -> None:
    first = devpi_release.run("publish-lane", "--bundle", BUNDLE)
    assert first.exit_code == 0, first.stderr
    # The two wheels, and the bundle document in its document wheel.
    assert first.stdout.count("uploaded") == 3, first.stdout
    assert f"uploaded   xla_wheels_document_{BUNDLE.replace('-', '_')}-1+sha256." in first.stdout
    simple = f"{devpi_release.server.url}team/validation/+simple/"
    assert simple in first.stdout
    for wheel in (devpi_release.wheels.torch, devpi_release.wheels.torch_xla):
        assert devpi_release.served("team/validation", wheel) == file_sha256(wheel)
    # A host reads the document from devpi's simple page alone, verified by hash.
    copy = devpi_release.root / "dist" / "lanes" / "validation" / "bundles" / f"{BUNDLE}.json"
    document, digest = bundle_document.fetch(simple, BUNDLE)
    assert document.bundle == BUNDLE and digest == file_sha256(copy)
    again = devpi_release.run("publish-lane", "--bundle", BUNDLE)
    assert again.exit_code == 0, again.stderr
    assert again.stdout.count("skipped") == 3 and "uploaded" not in again.stdout
    state = lanes.read_state(devpi_release.root)["validation"]
    assert state.bundle == BUNDLE and len(state.wheels) == 2


def test_promotion_is_devpis_push_of_the_same_bytes_without_an_upload(
    devpi_release: DevpiRelease, tmp_path: Path
) -> None:
    server = devpi_release.server
    before = server.log_size()
    promoted = devpi_release.run("promote", "--bundle", BUNDLE)
    assert promoted.exit_code == 0, promoted.stderr
    requests = server.requests(before)
    # The push is one POST to the source index per release; of the bundle's wheels nothing
    # is sent to the target's upload URL (twine POSTs /team/preferred/): the one upload
    # there is the preferred lane's own bundle document (its lane and policy differ).
    assert "POST /team/validation" in requests, requests
    assert len([r for r in requests if r.startswith("POST /team/preferred")]) == 1, requests
    assert promoted.stdout.count("pushed") == 2, promoted.stdout
    assert promoted.stdout.count("uploaded") == 1, promoted.stdout
    assert "uploaded   xla_wheels_document_" in promoted.stdout
    for wheel in (devpi_release.wheels.torch, devpi_release.wheels.torch_xla):
        source = devpi_release.served("team/validation", wheel)
        assert devpi_release.served("team/preferred", wheel) == source == file_sha256(wheel)
    assert lanes.read_state(devpi_release.root)["preferred"].bundle == BUNDLE

    # Installs by hash from the preferred lane's simple page.
    wheels = devpi_release.wheels
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(
        "".join(
            f"{n.project}=={n.version} --hash=sha256:{file_sha256(w)}\n"
            for w in (wheels.torch, wheels.torch_xla)
            for n in [parse_wheel_name(w.name)]
        )
    )
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--require-hashes",
         "--no-deps", "--isolated", "--index-url", server.simple_url("team/preferred"),
         "--target", str(target), "-r", str(requirements)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert (target / "torch_xla" / "__init__.py").is_file()

    again = devpi_release.run("promote", "--bundle", BUNDLE)
    assert again.exit_code == 0, again.stderr
    assert again.stdout.count("skipped") == 3 and "pushed" not in again.stdout


def test_promote_refuses_a_wheel_missing_from_the_source_lane(
    devpi_release: DevpiRelease,
) -> None:
    before = devpi_release.server.log_size()
    refused = devpi_release.run("promote", "--bundle", BUNDLE, "--from", "empty")
    assert refused.exit_code == 1, refused.stderr
    assert "error: lane empty" in refused.stderr and "does not hold" in refused.stderr
    assert devpi_release.wheels.torch_xla.name in refused.stderr
    assert "fix: publish the bundle there first" in refused.stderr
    assert "Traceback" not in refused.stderr
    posts = [r for r in devpi_release.server.requests(before) if r.startswith("POST")]
    assert posts == [], posts


def test_promote_refuses_a_source_file_that_is_not_the_locked_one(
    devpi_release: DevpiRelease, tmp_path: Path
) -> None:
    """The same file names, other bytes (a torch_xla without its provenance file)."""
    other = build_fake_wheels(tmp_path / "wheels", with_provenance=False)
    assert other.torch_xla.name == devpi_release.wheels.torch_xla.name
    assert file_sha256(other.torch_xla) != file_sha256(devpi_release.wheels.torch_xla)
    root = make_publish_project(tmp_path, [other.torch, other.torch_xla])
    (root / "build" / "lanes.toml").write_text(devpi_lanes_toml(devpi_release.server))
    refused = run_cli(
        "promote", "--bundle", BUNDLE, root=root, env=devpi_release.server.credentials,
        inherit_env=True, timeout=300,
    )  # fmt: skip
    assert refused.exit_code == 1, refused.stderr
    assert "refusing to promote files that are not the locked ones" in refused.stderr
    assert file_sha256(other.torch_xla) in refused.stderr, refused.stderr
    assert "fix: " in refused.stderr


def test_promote_refuses_a_source_release_with_files_the_lock_does_not_record(
    devpi_release: DevpiRelease, tmp_path: Path
) -> None:
    """devpi's push moves every file of a release: an unlocked one would ride along."""
    torch = devpi_release.wheels.torch
    # The same release (torch 2.9.0a0+git21fec65) built for another Python tag.
    other_tag = tmp_path / torch.name.replace("-py3-", "-py311-")
    shutil.copyfile(torch, other_tag)
    uploaded = subprocess.run(
        [sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar",
         "--repository-url", f"{devpi_release.server.url}team/extra/",
         str(torch), str(devpi_release.wheels.torch_xla), str(other_tag)],
        env={**os.environ, **devpi_release.server.credentials},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert uploaded.returncode == 0, uploaded.stdout + uploaded.stderr
    before = devpi_release.server.log_size()
    refused = devpi_release.run("promote", "--bundle", BUNDLE, "--from", "extra")
    assert refused.exit_code == 1, refused.stderr
    assert f"wheels.lock does not record for this bundle: {other_tag.name}" in refused.stderr
    assert "fix: rebuild the bundle under its own version" in refused.stderr
    posts = [r for r in devpi_release.server.requests(before) if r.startswith("POST")]
    assert posts == [], posts


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ('backend = "devpi"\nindex = "team/x"\n', "key 'lanes.x.server': missing"),
        (
            'backend = "devpi"\nserver = "http://127.0.0.1:3141"\nindex = "x"\n',
            "key 'lanes.x.index': must be \"<user>/<index>\"",
        ),
        (
            'backend = "devpi"\nserver = "http://h/"\nindex = "t/x"\npath = "dist/x"\n',
            "key 'lanes.x.path': unknown key",
        ),
        ('backend = "artifactory"\npath = "dist/x"\n', "key 'lanes.x.backend': 'artifactory'"),
        (
            'backend = "devpi"\nserver = "http://h/"\nindex = "t/x"\npromote-from = "nope"\n',
            "key 'lanes.x.promote-from': no lane 'nope'",
        ),
    ],
)
def test_a_wrong_devpi_lane_is_refused_naming_the_key(
    tmp_path: Path, table: str, problem: str
) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "lanes.toml").write_text(f"[lanes.x]\n{table}")
    with pytest.raises(PipelineError) as refused:
        lanes.load_config(tmp_path)
    assert problem in str(refused.value)
    assert refused.value.fix and "lanes.toml" in refused.value.fix


def test_a_devpi_lane_reads_as_its_simple_page_and_upload_url(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "lanes.toml").write_text(
        '[lanes.validation]\nbackend = "devpi"\nserver = "https://devpi.example/"\n'
        'index = "team/validation"\n'
    )
    lane = lanes.load_config(tmp_path).lane("validation")
    assert lane.simple_url == "https://devpi.example/team/validation/+simple/"
    assert isinstance(lane.backend, devpi.DevpiLane)
    assert lane.backend.upload_url == "https://devpi.example/team/validation/"
    assert (lane.kind, lane.backend.devpi_index) == ("devpi", "team/validation")
