"""`make runtime-image`: an image to train from, built with buildah from a loopback lane.

Real parts: the demonstration wheels `make demo` builds (the stand-in upstream, NOT
PyTorch: stock torch would put gigabytes into every run) built and published by the CLI,
a pypiserver on 127.0.0.1 serving the lane, buildah (chroot isolation) building FROM the
container tests' local debootstrap image, and the image's own entrypoint run with
`buildah run`. One image build is shared by the assertions (module fixture).

Needs root with podman, buildah and debootstrap (``make test`` installs them); skipped
with the reason otherwise, as tests/test_build_container.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from tests.clirunner import REPO_ROOT, CliResult, run_cli
from tests.missing_tools import skip_missing
from tests.publish_support import start_pypiserver
from tests.servers import stop
from tests.test_build_container import BASE_IMAGE, _why_not_oci, ensure_base_image
from xla_host.errors import UsageError
from xla_host.net import NetworkPolicy
from xla_host.stamp import read_stamp
from xla_wheels.bundle import load_bundle
from xla_wheels.demo import BUNDLE, make_demo_project, stages
from xla_wheels.release import lanes, runtime_image
from xla_wheels.release.lane_index import IndexLane
from xla_wheels.wheels_lock import BundleEntry, WheelRecord, read_lock

# Its own name per run: the engine's storage is shared by every run on this machine.
TAG = f"localhost/xla-wheels-test-runtime:demo-{uuid.uuid4().hex[:12]}"
PROFILE = """
[profiles.train.device]
PJRT_DEVICE = "CPU"

[profiles.train.cache]
XLA_PERSISTENT_CACHE_PATH = "/var/cache/xla/{build}"

[profiles.train.compiler]
XLA_NO_SPECIAL_SCALARS = "1"
"""
JOB = ["python", "-c", "import torch_xla; print('job ran', torch_xla.__version__)"]


@dataclass
class Image:
    root: Path
    tag: str
    config: dict[str, object]
    """The image's OCI config (``buildah inspect``)."""
    stamps: Path
    dry_run: CliResult

    @property
    def locked(self) -> dict[str, str]:
        entry = read_lock(self.root / "wheels.lock").entry(BUNDLE)
        return {w.name: w.sha256 for w in entry.wheels or ()}

    def job(self, *env: str, command: list[str] = JOB, stamp: str = "job.json",
            container: str | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """The image's entrypoint and ``command`` in a container, as a job runner starts it
        (``buildah run`` runs no entrypoint by itself: it is given from the config)."""
        entrypoint = self.config["Entrypoint"]
        assert isinstance(entrypoint, list)
        name = container or _container(self.tag)
        options = ["-v", f"{self.stamps}:/stamps", "-e", f"XLA_WHEELS_STAMP=/stamps/{stamp}"]
        for item in env:
            options += ["-e", item]
        try:
            return subprocess.run(
                ["buildah", "run", "--isolation", "chroot", *options, name, "--",
                 *entrypoint, *command],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
        finally:
            if container is None:
                subprocess.run(["buildah", "rm", name], capture_output=True, check=False)


def _container(tag: str) -> str:
    made = subprocess.run(
        ["buildah", "from", "--pull-never", tag], capture_output=True, text=True, check=True
    )
    return made.stdout.strip()


def _image_present(tag: str) -> bool:
    inspect = ["buildah", "inspect", "--type", "image", tag]
    return subprocess.run(inspect, capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    reason = _why_not_oci()
    if reason:
        skip_missing(reason)
    ensure_base_image()
    work = tmp_path_factory.mktemp("runtime-image")
    root = make_demo_project(work)
    manifest = root / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text() + PROFILE)
    # The host wheel, published with the bundle: the image bakes the one the lane pins.
    runtime_image.build_host_wheel(sys.executable, REPO_ROOT / "host", root / "dist" / "host")
    for stage in stages(work, root)[:2]:  # the demo's build and publish, as `make demo`
        done = run_cli(*stage.args, inherit_env=True, timeout=600)
        assert done.exit_code == 0, done.output[-3000:]
    process, server = start_pypiserver(work / "index", "update")
    # The stamps directory is mounted into the container: not pytest's private tmp.
    stamps = Path(tempfile.mkdtemp(prefix="xla-wheels-stamps-", dir="/var/tmp"))
    try:
        for wheel in (root / "dist" / "lanes" / "validation").glob("*.whl"):
            shutil.copyfile(wheel, server.packages / wheel.name)
        # The lane becomes the loopback index; lanes.lock still says it serves the bundle.
        (root / "build" / "lanes.toml").write_text(
            f'publish-lane = "validation"\n\n[lanes.validation]\nindex-url = "{server.url}"\n'
        )
        subprocess.run(["buildah", "rmi", "--force", TAG], capture_output=True, check=False)
        common = (
            "runtime-image", "--bundle", BUNDLE, "--lane", "validation", "--profile", "train",
            "--engine", "buildah", "--base-image", BASE_IMAGE, "--tag", TAG,
        )  # fmt: skip
        dry = run_cli(*common, "--dry-run", root=root, inherit_env=True, timeout=120)
        assert dry.exit_code == 0, dry.output
        assert not _image_present(TAG)  # a dry run builds nothing
        built = run_cli(*common, root=root, inherit_env=True, timeout=900)
        assert built.exit_code == 0, built.output[-4000:]
        inspected = subprocess.run(
            ["buildah", "inspect", "--type", "image", TAG], capture_output=True, text=True,
            check=True,
        )  # fmt: skip
        config = json.loads(inspected.stdout)["OCIv1"]["config"]
        yield Image(root, TAG, config, stamps, dry)
    finally:
        stop(process)
        shutil.rmtree(stamps, ignore_errors=True)
        subprocess.run(["buildah", "rmi", "--force", TAG], capture_output=True, check=False)


@pytest.mark.slow
def test_the_dry_run_prints_the_containerfile_and_the_engines_command(image: Image) -> None:
    plan = image.dry_run.stdout
    assert f"FROM {BASE_IMAGE}" in plan and "DRY_RUN: nothing built" in plan
    assert "download --no-deps --require-hashes --index-url http://127.0.0.1:" in plan
    assert "buildah bud --isolation chroot --format docker --network host" in plan
    assert 'ENTRYPOINT ["/opt/xla-wheels/venv/bin/python", "-m", "xla_host.entrypoint"' in plan


@pytest.mark.slow
def test_the_images_labels_match_the_lock_and_the_lane(image: Image) -> None:
    labels = image.config["Labels"]
    assert isinstance(labels, dict)
    state = lanes.read_state(image.root)["validation"]
    assert json.loads(labels["dev.xla-wheels.wheels"]) == image.locked == dict(state.wheels)
    profile = load_bundle(image.root, BUNDLE).profiles["train"]
    assert labels["dev.xla-wheels.profile"] == "train"
    assert labels["dev.xla-wheels.profile-sha256"] == profile.sha256
    assert labels["dev.xla-wheels.bundle"] == BUNDLE
    assert labels["dev.xla-wheels.lane"] == "validation"
    assert labels["dev.xla-wheels.receipt-digest"] == (state.receipt_digest or "")
    host_wheel, digest = labels["dev.xla-wheels.host-package"].split(" sha256:")
    assert host_wheel.startswith("xla_wheels_host-") and len(digest) == 64
    torch_xla = next(n for n in image.locked if n.startswith("torch_xla-"))
    assert labels["org.opencontainers.image.version"] == torch_xla.split("-")[1]
    env = image.config["Env"]
    assert isinstance(env, list) and "PJRT_DEVICE=CPU" in env


@pytest.mark.slow
def test_a_job_runs_after_the_check_and_its_stamp_names_the_installed_wheels(
    image: Image,
) -> None:
    job = image.job(stamp="job-ok.json")
    assert job.returncode == 0, job.stderr[-3000:]
    assert "job ran 2.9.0+" in job.stdout
    assert "xla-wheels stamp:" in job.stderr  # the job's log keeps it
    stamp = read_stamp(image.stamps / "job-ok.json")
    assert stamp.verdict == "ok" and not stamp.problems
    # Installed by hash: every file of each locked wheel is in the image, byte for byte.
    assert {w.name: w.sha256 for w in stamp.wheels} == image.locked
    assert all(w.matched for w in stamp.wheels)
    assert (stamp.bundle, stamp.lane, stamp.profile, stamp.role) == (
        BUNDLE, "validation", "train", "writer",
    )  # fmt: skip
    assert stamp.cache_path and stamp.cache_path.startswith("/var/cache/xla/xla_cache_demo_")
    torch_xla = next(n for n in image.locked if n.startswith("torch_xla-"))
    ran = run_cli("jobs", "--wheel", torch_xla, "--stamps", str(image.stamps))
    assert ran.exit_code == 0 and "job-ok.json" in ran.stdout, ran.output


@pytest.mark.slow
def test_the_entrypoint_refuses_a_host_mismatch_unless_told_to_warn(image: Image) -> None:
    refused = image.job("PJRT_DEVICE=TPU", stamp="job-refused.json")
    assert refused.returncode != 0
    assert "job ran" not in refused.stdout
    assert "error: this job does not run what image demo/validation was built with" in (
        refused.stderr
    )
    assert "PJRT_DEVICE=TPU, the profile says CPU" in refused.stderr
    assert "XLA_WHEELS_ON_MISMATCH=warn" in refused.stderr
    assert read_stamp(image.stamps / "job-refused.json").verdict == "refused"

    warned = image.job("PJRT_DEVICE=TPU", "XLA_WHEELS_ON_MISMATCH=warn", stamp="job-warned.json")
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert "job ran" in warned.stdout and "warning: launch environment" in warned.stderr
    assert read_stamp(image.stamps / "job-warned.json").verdict == "warned"

    # An extra logging switch changes what is printed, not what runs: a warning, as doctor.
    chatty = image.job("TF_CPP_MIN_LOG_LEVEL=1", stamp="job-chatty.json")
    assert chatty.returncode == 0, chatty.stderr[-3000:]
    assert "TF_CPP_MIN_LOG_LEVEL=1 is set but not in the profile" in chatty.stderr
    assert read_stamp(image.stamps / "job-chatty.json").verdict == "ok"


@pytest.mark.slow
def test_the_entrypoint_refuses_an_installed_file_that_is_not_the_wheels(image: Image) -> None:
    container = _container(image.tag)
    try:
        changed = subprocess.run(
            ["buildah", "run", "--isolation", "chroot", container, "--", "sh", "-c",
             "echo '# changed' >> \"$(python -c 'import torch_xla; print(torch_xla.__file__)')\""],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert changed.returncode == 0, changed.stderr
        refused = image.job(stamp="job-changed.json", container=container)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    assert refused.returncode != 0 and "job ran" not in refused.stdout
    assert "torch-xla: installed torch_xla/__init__.py differs from the wheel's" in refused.stderr
    stamp = read_stamp(image.stamps / "job-changed.json")
    assert [w.matched for w in stamp.wheels if w.name.startswith("torch_xla-")] == [False]


@dataclass(frozen=True)
class _Entry:
    """The part of a wheels.lock entry the image reads: its wheels."""

    wheels: tuple[WheelRecord, ...]


def test_an_image_is_refused_for_a_bundle_the_lane_does_not_serve_as_locked() -> None:
    lane = lanes.Lane("preferred", IndexLane("preferred", "http://127.0.0.1:1/simple/"))
    record = WheelRecord("torch_xla-2.9.0+pa-py3-none-any.whl", 1, "a" * 64)
    entry = cast(BundleEntry, _Entry((record,)))
    served = lanes.LaneState("v6e-2.10", ((record.name, "a" * 64),), None, None)
    with pytest.raises(UsageError) as other:
        runtime_image.current_wheels(lane, served, "v6e-2.11", entry)
    assert "lane preferred serves v6e-2.10, not bundle v6e-2.11" in other.value.message
    assert "BUNDLE=v6e-2.10" in (other.value.fix or "")
    drifted = lanes.LaneState("v6e-2.11", ((record.name, "b" * 64),), None, None)
    with pytest.raises(UsageError) as disagree:
        runtime_image.current_wheels(lane, drifted, "v6e-2.11", entry)
    assert "wheels.lock locks" in disagree.value.message
    same = lanes.LaneState("v6e-2.11", ((record.name, "a" * 64),), None, None)
    assert runtime_image.current_wheels(lane, same, "v6e-2.11", entry) == [(record.name, "a" * 64)]
    assert runtime_image.uses_loopback(lane)


def test_each_engine_builds_with_its_own_command() -> None:
    context = Path("/ctx")
    assert runtime_image.build_argv("docker", "t", context, network_host=False) == [
        "docker", "build", "--file", "/ctx/Containerfile", "--tag", "t", "/ctx",
    ]  # fmt: skip
    assert runtime_image.build_argv("podman", "t", context, network_host=True)[:6] == [
        "podman", "build", "--isolation=chroot", "--format", "docker", "--network",
    ]  # fmt: skip
    assert runtime_image.build_argv("buildah", "t", context, network_host=False)[:5] == [
        "buildah", "bud", "--isolation", "chroot", "--format",
    ]  # fmt: skip


def test_the_base_image_is_the_python_the_bundles_wheels_are_for(tmp_path: Path) -> None:
    root = make_demo_project(tmp_path)
    bundle = load_bundle(root, BUNDLE)
    cp311 = [WheelRecord(f"{p}-2.7.0-cp311-cp311-manylinux_2_28_x86_64.whl", 1, "a" * 64)
             for p in ("torch", "torch_xla")]  # fmt: skip
    entry = BundleEntry("m", "0" * 64, "3.13", {}, {}, wheels=tuple(cp311))
    assert runtime_image.image_python(bundle, entry) == "3.11"
    assert runtime_image.default_base_image("3.11") == (
        "docker.io/library/python:3.11-slim-bookworm"
    )
    assert runtime_image.default_base_image("3.13") == runtime_image.DEFAULT_BASE_IMAGE
    # Pure-Python wheels say nothing: the manifest's Python.
    pure = BundleEntry("m", "0" * 64, "3.13", {}, {}, wheels=(WheelRecord(
        "torch-2.7.0-py3-none-any.whl", 1, "a" * 64),))  # fmt: skip
    assert runtime_image.image_python(bundle, pure) == bundle.python
    mixed = BundleEntry("m", "0" * 64, "3.13", {}, {}, wheels=(*cp311, WheelRecord(
        "torch_xla-2.7.0-cp313-cp313-linux_x86_64.whl", 1, "b" * 64)))  # fmt: skip
    with pytest.raises(UsageError, match="for Pythons 3.11, 3.13"):
        runtime_image.image_python(bundle, mixed)


def test_the_image_bakes_the_host_wheel_the_lanes_document_pins_by_hash(tmp_path: Path) -> None:
    from xla_host import bundle_document as doc
    from xla_wheels.cli.runtime import _fetched_host_wheel, _lane_host_wheel
    from xla_wheels.release.lane_backend import write_document
    from xla_wheels.release.lane_static import StaticLane

    lane_dir = tmp_path / "lane"
    lane = lanes.Lane("validation", StaticLane("validation", lane_dir))
    with pytest.raises(UsageError) as none:
        _lane_host_wheel(tmp_path, lane, "v6e-2.11")
    assert "lane validation holds no bundle document of v6e-2.11" in none.value.message
    torch_xla = doc.LockedFile("torch_xla-2.11.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 1)
    bare = doc.BundleDocument("v6e-2.11", "validation", "3.11", (torch_xla,))
    write_document(lane_dir / doc.DIRNAME, "v6e-2.11", doc.dumps(bare))
    with pytest.raises(UsageError) as unpinned:
        _lane_host_wheel(tmp_path, lane, "v6e-2.11")
    assert "pins no host wheel" in unpinned.value.message
    assert "make host-wheel, then make publish" in (unpinned.value.fix or "")
    # The lane serves a host wheel: the document pins it, the image gets it by that hash.
    lane_dir.mkdir(exist_ok=True)
    served = lane_dir / "xla_wheels_host-0.1.3+gabc-py3-none-any.whl"
    served.write_bytes(b"the host wheel the lane serves")
    pin = doc.LockedFile(served.name, doc.sha256_of(served.read_bytes()), served.stat().st_size)
    pinned = dataclasses.replace(bare, host_wheel=pin)
    write_document(lane_dir / doc.DIRNAME, "v6e-2.11", doc.dumps(pinned))
    assert _lane_host_wheel(tmp_path, lane, "v6e-2.11") == pin
    network = NetworkPolicy()
    host = _fetched_host_wheel(lane, pin, tmp_path / "fetched", network)
    assert (host.name, host.sha256) == (pin.name, pin.sha256)
    assert host.source.read_bytes() == served.read_bytes()
    # Other bytes under the pinned name are never baked.
    served.write_bytes(b"other bytes")
    with pytest.raises(doc.DocumentError, match=f"the bundle document has {pin.sha256}"):
        _fetched_host_wheel(lane, pin, tmp_path / "again", network)
    assert not (tmp_path / "again" / pin.name).exists()


def test_an_unknown_engine_is_refused_by_the_builds_engine_setting() -> None:
    # The same row as the build's --engine: its choices, and a refusal naming the flag (and
    # for the variable, where the value came from), before any lane or bundle is read.
    for args, env, said in (
        (("--engine", "kaniko"), {}, "--engine: invalid choice: 'kaniko' (choose from "
         "'docker', 'podman', 'buildah')"),
        ((), {"XLA_WHEELS_ENGINE": "kaniko"}, "--engine / XLA_WHEELS_ENGINE: 'kaniko' (from "
         "XLA_WHEELS_ENGINE) is not one of docker, podman, buildah"),
    ):  # fmt: skip
        result = run_cli("runtime-image", "--bundle", "v6e-2.11", *args, env=env)
        assert result.exit_code == 2, result.stderr
        assert f"error: {said}" in result.stderr and "fix: " in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
