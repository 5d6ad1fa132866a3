"""A real WebDAV server on loopback for the receipt-store tests: WsgiDAV 4.4 on cheroot.

``start(root, user, password)`` serves the directory ``root`` read-write at the URL it
returns, requiring HTTP basic auth with that one account (digest auth off: the store sends
basic auth); ``stop(server)`` ends it. WsgiDAV and its dependencies are pinned in
``tests/webdav-requirements.txt`` and installed once per machine into their own venv in the
per-machine cache (as BuildGrid is, ``tests/bazel_cache_support.py``), never into .venv.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests import servers
from tests.tool_venvs import pinned_tool

REQUIREMENTS = Path(__file__).with_name("webdav-requirements.txt")


def ensure_wsgidav() -> Path:
    """``wsgidav`` of the pinned venv in the per-machine cache (made if missing)."""
    return pinned_tool(REQUIREMENTS, "wsgidav", "wsgidav", timeout_s=600)


@dataclass
class WebDavServer:
    url: str
    """The root collection, ending in ``/``."""
    root: Path
    """The directory it serves."""
    process: subprocess.Popen[bytes]


def _listens(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    return probe


def start(root: Path, user: str, password: str) -> WebDavServer:
    """WsgiDAV serving ``root`` (created if missing) at ``http://127.0.0.1:<port>/``,
    basic auth with ``user``/``password`` required for every request. Its config and log
    are written beside ``root`` (``<root>.wsgidav.json``, ``<root>.wsgidav.log``)."""
    root.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    config = root.with_name(root.name + ".wsgidav.json")
    config.write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "port": port,
                "server": "cheroot",
                "provider_mapping": {"/": str(root)},
                "http_authenticator": {
                    "domain_controller": None,  # WsgiDAV's SimpleDomainController
                    "accept_basic": True,
                    "accept_digest": False,
                    "default_to_digest": False,
                    "trusted_auth_header": None,
                },
                "simple_dc": {"user_mapping": {"*": {user: {"password": password}}}},
                "verbose": 3,
                "logging": {"enable_loggers": []},
            }
        )
    )
    argv = [str(ensure_wsgidav()), "--config", str(config)]
    process = servers.start(
        "wsgidav",
        argv,
        log=root.with_name(root.name + ".wsgidav.log"),
        ready=_listens(port),
        timeout_s=60,
    )
    return WebDavServer(f"http://127.0.0.1:{port}/", root, process)


def stop(server: WebDavServer) -> None:
    servers.stop(server.process)
