"""Real wheels, a real index server and project roots for the publish-stage tests.

Wheels are built with setuptools through ``python -m build`` (small stand-ins named
torch / torch_xla with real metadata and a provenance file); the index is a real
pypiserver on 127.0.0.1 with an htpasswd file generated here, stopped by its fixture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import bundles, servers
from tests.bundles import Pin
from xla_host.provenance import PROVENANCE_NAME, BuildSettings, ComponentProvenance, Provenance
from xla_host.waitlock import make_once
from xla_wheels.builder.collect import records
from xla_wheels.bundle import load_bundle
from xla_wheels.options import machine_cache
from xla_wheels.patches import series_digest
from xla_wheels.wheels_lock import record_wheels, update_bundle_entry

BUNDLE = "pub-1"
TORCH_SHA = "21fec65781bebe867faf209f89bb687ffd236ca4"
XLA_SHA = "c04e61c3424142c0eebcc9e59984b9d8fced18c0"
OPENXLA_SHA = "9a9aa0e11e4fcda8d6a9c3267dca6776ddbdb0ca"
TORCH_VERSION = "2.9.0a0+git21fec65"
XLA_VERSION = "2.9.0+gitc04e61c"
USER = "uploader"
PASSWORD = "s3cr3t-Pa55word!"
SERVER_START_TIMEOUT_S = 60.0


def build_wheel(
    workdir: Path,
    dist_name: str,
    version: str,
    package: str,
    files: dict[str, str],
    requires: list[str] | None = None,
) -> Path:
    """A real wheel built by setuptools (``python -m build --wheel --no-isolation``)."""
    source = workdir / f"src-{dist_name}"
    (source / package).mkdir(parents=True)
    for name, text in files.items():
        (source / package / name).write_text(text)
    deps = ", ".join(f'"{r}"' for r in requires or [])
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{dist_name}"
            version = "{version}"
            dependencies = [{deps}]

            [tool.setuptools]
            packages = ["{package}"]

            [tool.setuptools.package-data]
            {package} = ["*.json"]
            """
        )
    )
    out = workdir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=source,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob(f"{dist_name}-*.whl")
    return wheel


def provenance() -> Provenance:
    """What the build stage would stamp into torch_xla for the default publish project."""
    return Provenance(
        built_by="xla-wheels tests",
        build=BuildSettings(mode="host", engine="host", image=None, knobs={}),
        components={
            name: ComponentProvenance(
                commit=sha,
                version=None,
                patches=(),
                series_sha256=series_digest([]),
            )
            for name, sha in (
                ("torch", TORCH_SHA),
                ("torch_xla", XLA_SHA),
                ("openxla", OPENXLA_SHA),
            )
        },
    )


@dataclass(frozen=True)
class FakeWheels:
    torch: Path
    torch_xla: Path


def build_fake_wheels(workdir: Path, *, with_provenance: bool = True) -> FakeWheels:
    torch = build_wheel(
        workdir,
        "torch",
        TORCH_VERSION,
        "torch",
        {"__init__.py": f'__version__ = "{TORCH_VERSION}"\n'},
    )
    files = {"__init__.py": f'import torch  # noqa\n__version__ = "{XLA_VERSION}"\n'}
    if with_provenance:
        files[PROVENANCE_NAME] = provenance().to_bytes().decode()
    torch_xla = build_wheel(
        workdir, "torch_xla", XLA_VERSION, "torch_xla", files, [f"torch=={TORCH_VERSION}"]
    )
    return FakeWheels(torch, torch_xla)


@pytest.fixture(scope="session")
def fake_wheels(tmp_path_factory: pytest.TempPathFactory) -> FakeWheels:
    return build_fake_wheels(tmp_path_factory.mktemp("fake-wheels"))


def manifest_text(
    bundle: str = BUNDLE, *, runtime: str = "", python: str = "3.11", xla_version: str = "2.9.0"
) -> str:
    pins = {
        component: Pin(f"https://example.invalid/{component}.git", sha, version, submodules=None)
        for component, sha, version in (
            ("torch", TORCH_SHA, "2.9.0a0"),
            ("torch_xla", XLA_SHA, xla_version),
            ("openxla", OPENXLA_SHA, None),
        )
    }
    return bundles.manifest_text(
        bundle, pins, python=python, description="publish test", runtime=runtime
    )


def make_publish_project(
    root: Path, wheels: list[Path], *, bundle: str = BUNDLE, runtime: str = "",
    python: str = "3.11", xla_version: str = "2.9.0",
) -> Path:  # fmt: skip
    """A project root whose lock records ``wheels`` (copied into dist/<bundle>/)."""
    project = root / "project"
    (project / "build" / "bundles").mkdir(parents=True)
    (project / "patches").mkdir()
    text = manifest_text(bundle, runtime=runtime, python=python, xla_version=xla_version)
    (project / "build" / "bundles" / f"{bundle}.toml").write_text(text)
    loaded = load_bundle(project, bundle)
    resolved: dict[str, str | None] = {c.name: c.commit for c in loaded.components.values()}
    update_bundle_entry(project / "wheels.lock", loaded, resolved, project)
    dist = project / "dist" / bundle
    dist.mkdir(parents=True)
    for wheel in wheels:
        shutil.copyfile(wheel, dist / wheel.name)
    # As the collect stage records them (the SBOM each wheel carries included).
    record_wheels(project / "wheels.lock", bundle, records(sorted(dist.glob("*.whl"))))
    return project


@dataclass
class IndexServer:
    url: str
    """The simple/ URL hosts install from."""
    packages: Path
    log: Path

    @property
    def credentials(self) -> dict[str, str]:
        return {"TWINE_USERNAME": USER, "TWINE_PASSWORD": PASSWORD}


def _write_htpasswd(path: Path) -> None:
    from passlib.apache import HtpasswdFile

    htpasswd = HtpasswdFile(str(path), new=True)
    htpasswd.set_password(USER, PASSWORD)
    htpasswd.save()


def start_pypiserver(
    workdir: Path, authenticate: str
) -> tuple[subprocess.Popen[bytes], IndexServer]:
    """pypiserver serving ``workdir/packages``, with the htpasswd account for the actions in
    ``authenticate``; stop it with :func:`tests.servers.stop`."""
    packages = workdir / "packages"
    packages.mkdir(parents=True)
    htpasswd = workdir / "htpasswd"
    _write_htpasswd(htpasswd)
    port = servers.free_port()
    log_path = workdir / "pypiserver.log"
    argv = [
        sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(port),
        "-P", str(htpasswd), "-a", authenticate, "--disable-fallback",
        "--hash-algo", "sha256", str(packages),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    process = servers.start(
        "pypiserver", argv, log=log_path, ready=servers.answers_http(f"{base}/health"),
        timeout_s=SERVER_START_TIMEOUT_S,
    )  # fmt: skip
    return process, IndexServer(f"{base}/simple/", packages, log_path)


@pytest.fixture
def index_server(tmp_path: Path) -> Iterator[IndexServer]:
    """pypiserver where reading and uploading both need the htpasswd account."""
    process, server = start_pypiserver(tmp_path / "index", "update,download,list")
    try:
        yield server
    finally:
        servers.stop(process)


STOCK_WHEEL_DOWNLOAD_TIMEOUT_S = 1800


def cached_stock_wheel(version: str, python_version: str) -> Path:
    """Stock torch_xla ``version`` from PyPI for CPython ``python_version`` ("3.11"),
    downloaded once per machine into ``<machine cache>/wheels/`` (``make_once``). torch is
    never downloaded (``--no-deps``)."""
    name = f"pypi-torch_xla-{version}-py{python_version}"  # apart from older, unmarked entries
    cache = machine_cache(os.environ) / "wheels" / name

    def download(staging: Path) -> dict[str, object]:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "--python-version", python_version,
             "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
             "--implementation", "cp", "-d", str(staging), f"torch_xla=={version}"],
            check=True, capture_output=True, timeout=STOCK_WHEEL_DOWNLOAD_TIMEOUT_S,
        )  # fmt: skip
        return {"torch_xla": version, "python": python_version}

    make_once(cache, download, marker=".complete.json", doing=f"downloading torch_xla {version}")
    (wheel,) = cache.glob("torch_xla-*.whl")
    return wheel


def host_venv(tmp_path: Path, wheels: list[Path]) -> Path:
    """The Python of a fresh venv standing for a training host, with ``wheels`` installed
    from the files alone (no index, no dependencies).

    The venv gets no pip of its own: ensurepip costs seconds per venv (10 s on a busy
    2-core machine), and the suite's pip installs into it with ``--python``."""
    venv = tmp_path / "host"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "--no-deps", "--no-index", *map(str, wheels)],
        check=True, timeout=300,
    )  # fmt: skip
    return python


#: The checkout whose host/ the host wheel is built from.
HOST_CHECKOUT = Path(__file__).resolve().parents[1]


def build_host_wheel(out: Path) -> Path:
    """``make host-wheel``'s build, from a copy of the working tree's host/ (the target
    builds from the commit; a test must see the code it tests)."""
    source = out / "host-src"
    shutil.copytree(
        HOST_CHECKOUT / "host",
        source,
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    env = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--wheel-dir", str(out / "wheel"), str(source)],
        check=True, timeout=300, env=env, capture_output=True,
    )  # fmt: skip
    (wheel,) = (out / "wheel").glob("xla_wheels_host-*.whl")
    return wheel


@pytest.fixture(scope="session")
def host_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host_wheel(tmp_path_factory.mktemp("host-wheel"))
