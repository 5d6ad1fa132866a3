"""A real WebDAV server on loopback for the receipt-store tests: WsgiDAV 4.4 on cheroot.

``start(root, user, password)`` serves the directory ``root`` read-write at the URL it
returns, requiring HTTP basic auth with that one account (digest auth off: the store sends
basic auth); ``stop(server)`` ends it. WsgiDAV and its dependencies are pinned in
``tests/webdav-requirements.txt`` and installed once per machine into their own venv in the
per-machine cache (as BuildGrid is, ``tests/bazel_cache_support.py``), never into .venv.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests import servers
from xla_host.waitlock import make_once
from xla_wheels.options import machine_cache

REQUIREMENTS = Path(__file__).with_name("webdav-requirements.txt")
MARKER = ".complete.json"


def ensure_wsgidav() -> Path:
    """``wsgidav`` of the pinned venv in the per-machine cache (made if missing)."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    name = f"wsgidav-{digest}-cp{sys.version_info[0]}{sys.version_info[1]}"

    def build(tmp: Path) -> dict[str, object]:
        log = tmp.with_name(tmp.name + ".log")
        with log.open("wb") as handle:
            for argv in (
                [sys.executable, "-m", "venv", str(tmp)],
                [str(tmp / "bin" / "python"), "-m", "pip", "install", "--quiet",
                 "--disable-pip-version-check", "--no-deps", "-r", str(REQUIREMENTS)],
            ):  # fmt: skip
                done = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, timeout=600)
                if done.returncode != 0:
                    raise AssertionError(f"setting up WsgiDAV failed: {log.read_text()}")
        log.unlink()
        return {"requirements": REQUIREMENTS.read_text(encoding="utf-8")}

    env = make_once(
        machine_cache(os.environ) / "envs" / name,
        build,
        marker=MARKER,
        doing=f"installing {name}",
        usable=lambda d: (d / "bin" / "wsgidav").exists(),
        # In place: a venv's scripts name their interpreter by its absolute path.
        in_place=True,
    )
    return env / "bin" / "wsgidav"


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
