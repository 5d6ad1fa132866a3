"""Build stage end to end inside a real container: buildah (and podman build), docker.

The image is the top-level Dockerfile's ``base`` stage built FROM a local Debian bookworm
image made with debootstrap (no registry pulls here), so the synthetic recipes run in the
same entry point and mounts as a real build; the ``smoke`` stage then installs the wheels
into a clean Python and imports them. The ``builder`` stage (clang 17, bazelisk) needs
apt.llvm.org and GitHub, which these machines cannot reach: only a builder shows it.

Needs root with podman, buildah and debootstrap (``make test`` installs them); skipped
with the reason otherwise. The base image is cached in the engine's storage per machine
(debootstrap takes about two minutes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.clirunner import CliResult, run_cli
from tests.missing_tools import skip_impossible, skip_missing
from tests.synthetic_upstream import Synthetic, cli_args, copy_synthetic
from xla_wheels import wheel_stamp
from xla_wheels.builder.container import build_image_argv, probe_engine

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "localhost/xla-wheels-test-base:bookworm"
TEST_IMAGE = "localhost/xla-wheels-test-builder:latest"
PACKAGES = "python3,python3-venv,python3-pip,python3-setuptools,python3-wheel,git,patch"


def _why_not_oci() -> str | None:
    if os.geteuid() != 0:
        return "needs root (buildah/podman with chroot isolation as root)"
    for tool in ("podman", "buildah", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make test installs it when run as root)"
    return None


def ensure_base_image() -> None:
    """The debootstrap base image, made once per machine (cached in containers storage)."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE]).returncode == 0:
        return
    with tempfile.TemporaryDirectory(prefix="xla-wheels-debootstrap-") as tmp:
        rootfs = Path(tmp) / "root"
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm",
             str(rootfs)],
            check=True, capture_output=True, timeout=1200,
        )  # fmt: skip
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True,
            capture_output=True,
        )  # fmt: skip
        tar.wait()


@pytest.fixture(scope="module")
def test_image() -> str:
    reason = _why_not_oci()
    if reason:
        skip_missing(reason)
    ensure_base_image()
    argv = build_image_argv("podman", TEST_IMAGE, REPO, target="base")
    argv[-1:-1] = ["--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    subprocess.run(argv, check=True, capture_output=True, timeout=900)
    return TEST_IMAGE


@pytest.fixture
def syn(synthetic_template: Synthetic) -> Synthetic:
    # Not pytest's tmp_path: the container user must traverse the path, and pytest's base
    # directory is private (0700); this one is removed afterwards.
    base = Path(tempfile.mkdtemp(prefix="xla-wheels-ctr-", dir="/var/tmp"))
    base.chmod(0o755)
    yield copy_synthetic(synthetic_template, base)
    shutil.rmtree(base, ignore_errors=True)


def run_wheels(syn: Synthetic, *extra: str, bundle: str = "syn") -> CliResult:
    return run_cli(*cli_args(syn, *extra, bundle=bundle), inherit_env=True, timeout=900)


@pytest.mark.slow
def test_buildah_builds_collects_and_smoke_imports(test_image: str, syn: Synthetic) -> None:
    result = run_wheels(syn, "--mode", "container", "--engine", "buildah", "--image", test_image)
    assert result.exit_code == 0, result.stderr[-4000:]
    assert "buildah run --isolation chroot" in result.stderr
    assert "python3 -m xla_wheels.builder.run_recipe" in result.stderr
    wheels = sorted((syn.root / "dist" / "syn").glob("*.whl"))
    assert len(wheels) == 2
    provenance = wheel_stamp.read_provenance(wheels[1])
    assert provenance.build.engine == "buildah"
    assert provenance.toolchain["python"].startswith("3.11")  # the image's Python
    assert ".p" in wheels[1].name.split("+")[1]
    # No container left behind.
    left = subprocess.run(["buildah", "containers", "--quiet"], capture_output=True, text=True)
    names = subprocess.run(
        ["buildah", "containers", "--format", "{{.ContainerName}}"],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "xla-wheels-" not in names, left.stdout

    # The Dockerfile's smoke stage: a clean Python installs the wheels and imports them.
    smoke = build_image_argv("podman", "localhost/xla-wheels-test-smoke", REPO, target="smoke")
    smoke[-1:] = [
        # buildah's layer cache does not hash bind-mounted files: always run the smoke.
        "--no-cache",
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
        "--build-arg", "WHEELS_DIR=dist/syn",
        "--build-arg", "SMOKE_PIP_ARGS=--no-index --find-links /wheels",
        "--file", str(REPO / "Dockerfile"),
        str(syn.root),
    ]  # fmt: skip
    built = subprocess.run(smoke, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    assert f"smoke: 2.9.0a0+git{syn.commits['torch'][:7]}" in built.stdout + built.stderr


@pytest.mark.slow
def test_buildah_failing_ship_check_keeps_dist_empty(test_image: str, syn: Synthetic) -> None:
    syn.write_bundle("unfixed", xla_patches=("torch_xla/0002-comment.patch",))
    result = run_wheels(
        syn, "--mode", "container", "--engine", "buildah", "--image", test_image,
        bundle="unfixed",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "kept out of dist/unfixed" in result.stderr
    assert not (syn.root / "dist").exists()


@pytest.mark.slow
def test_docker_engine_or_reason(syn: Synthetic) -> None:
    problem = probe_engine("docker", timeout=10)
    if problem:
        # The sandboxes these tests run in start no daemons: this test runs where one is.
        skip_impossible("a docker daemon", f"docker cannot run containers here: {problem}")
    image = os.environ.get("XLA_WHEELS_DOCKER_TEST_IMAGE")
    if not image:
        skip_missing("set XLA_WHEELS_DOCKER_TEST_IMAGE to a `base`-stage image with Python")
    result = run_wheels(syn, "--mode", "container", "--engine", "docker", "--image", image)
    assert result.exit_code == 0, result.stderr[-4000:]
    assert len(list((syn.root / "dist" / "syn").glob("*.whl"))) == 2


def test_preflight_names_a_missing_image(syn: Synthetic) -> None:
    if shutil.which("buildah") is None:
        skip_missing("buildah is not installed")
    result = run_wheels(
        syn, "--mode", "container", "--engine", "buildah", "--image", "localhost/no-such:image"
    )
    assert result.exit_code == 1, result.stderr  # a preflight blocker: FAILED
    assert "builder image localhost/no-such:image not found" in result.stderr
    assert "make builder-image ENGINE=buildah" in result.stderr
    assert not (syn.root / "dist").exists()
