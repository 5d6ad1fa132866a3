"""A real devpi-server on 127.0.0.1 for the lane tests, set up as an admin would.

``devpi-init`` makes a server directory (no PyPI mirror: nothing here may reach the
network), ``devpi-server`` serves it on a free port, and the devpi client creates the
``team`` account and its non-volatile indexes, the commands docs/lanes.md "Lanes on devpi"
gives an admin. The server's log is kept: each request is one ``[reqN] <METHOD> <path>``
line, which is how a test shows what was (not) sent to an index.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests import servers

ROOT_PASSWORD = "r00t-Pa55"
TEAM_USER = "team"
TEAM_PASSWORD = "t3am-Pa55word!"
START_TIMEOUT_S = 90.0
ADMIN_COMMAND_TIMEOUT_S = 120.0


def _script(name: str) -> str:
    """A console script installed with the test interpreter (devpi-server's, here)."""
    return str(Path(sysconfig.get_path("scripts")) / name)


@dataclass
class DevpiServer:
    url: str
    """The server's root URL, with a trailing slash."""
    log: Path
    clientdir: Path
    process: subprocess.Popen[bytes]

    @property
    def credentials(self) -> dict[str, str]:
        return {"TWINE_USERNAME": TEAM_USER, "TWINE_PASSWORD": TEAM_PASSWORD}

    def simple_url(self, index: str) -> str:
        return f"{self.url}{index}/+simple/"

    def admin(self, *args: str) -> str:
        """The devpi client, with its own state directory (never the user's)."""
        result = subprocess.run(
            [sys.executable, "-m", "devpi", "--clientdir", str(self.clientdir), *args],
            capture_output=True, text=True, timeout=ADMIN_COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert result.returncode == 0, f"devpi {' '.join(args)}:\n{result.stdout}{result.stderr}"
        return result.stdout

    def create_index(self, index: str) -> None:
        # bases= : no inheritance from a PyPI mirror; volatile=False: a file, once
        # uploaded, is never replaced (what a lane needs).
        self.admin("index", "-c", index, "bases=", "volatile=False")

    def requests(self, since: int = 0) -> list[str]:
        """``<METHOD> <path>`` of every request logged after byte ``since`` of the log."""
        text = self.log.read_bytes()[since:].decode(errors="replace")
        found = []
        for line in text.splitlines():
            parts = line.split("] ", 1)
            if len(parts) == 2 and parts[0].rsplit("[", 1)[-1].startswith("req"):
                words = parts[1].split()
                if len(words) == 2 and words[0] in ("GET", "POST", "PUT", "PATCH", "DELETE"):
                    found.append(" ".join(words))
        return found

    def log_size(self) -> int:
        return self.log.stat().st_size


def start_devpi(workdir: Path) -> DevpiServer:
    """Init, start and set up (``team`` account, no index yet); stop with :func:`stop_devpi`."""
    serverdir = workdir / "server"
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [_script("devpi-init"), "--serverdir", str(serverdir), "--no-root-pypi",
         "--root-passwd", ROOT_PASSWORD],
        capture_output=True, check=True, timeout=ADMIN_COMMAND_TIMEOUT_S,
    )  # fmt: skip
    port = servers.free_port()
    url = f"http://127.0.0.1:{port}/"
    argv = [
        _script("devpi-server"), "--serverdir", str(serverdir), "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    log = workdir / "devpi-server.log"
    process = servers.start(
        "devpi-server", argv, log=log, ready=servers.answers_http(f"{url}+api"),
        timeout_s=START_TIMEOUT_S,
    )  # fmt: skip
    server = DevpiServer(url, log, workdir / "client", process)
    try:
        server.admin("use", server.url)
        server.admin("login", "root", "--password", ROOT_PASSWORD)
        server.admin("user", "-c", TEAM_USER, f"password={TEAM_PASSWORD}")
        server.admin("login", TEAM_USER, "--password", TEAM_PASSWORD)
    except BaseException:
        servers.stop(process)  # the caller gets no server to stop
        raise
    return server


def stop_devpi(server: DevpiServer) -> None:
    servers.stop(server.process)
