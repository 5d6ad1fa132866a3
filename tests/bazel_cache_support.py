"""A real Bazel and real remote-cache servers for tests/test_remote_cache_bazel.py.

- Bazel: Debian's ``bazel-bootstrap`` (Bazel 4.2.3, ``make bazel-cache-tools``), which has
  no embedded rule repositories: ``rules_cc`` and ``rules_java`` are written here as local
  repositories whose ``defs.bzl`` forward to the native rules, given with
  ``--override_repository`` (Debian's ``bazel-rules-cc`` is too new for Bazel 4).
- BuildGrid (gRPC: an REAPI action cache and CAS in memory), pinned in
  ``tests/buildgrid-requirements.txt``, installed once per machine into its own venv in
  the per-machine cache (not into .venv: 54 packages the pipeline never imports).
- nginx (HTTP: Bazel's HTTP cache protocol is plain GET/PUT, which nginx's WebDAV module
  serves), requiring a bearer token, so a header that is not sent fails the build's hits.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests import servers
from tests.tool_venvs import pinned_tool

REQUIREMENTS = Path(__file__).with_name("buildgrid-requirements.txt")
#: The one instance BuildGrid serves: a builder must name it (remote_instance_name).
INSTANCE = "xla-wheels"
#: A Bazel server left behind by a killed test run exits by itself after this long.
MAX_IDLE_S = 120

_RULES_CC = "".join(
    f"{name} = native.{name}\n"
    for name in (
        "cc_binary", "cc_import", "cc_library", "cc_proto_library", "cc_test",
        "cc_toolchain", "cc_toolchain_suite", "objc_library",
    )
)  # fmt: skip
_RULES_JAVA = "".join(
    f"{name} = native.{name}\n"
    for name in (
        "java_binary", "java_import", "java_library", "java_proto_library", "java_runtime",
        "java_test", "java_toolchain",
    )
)  # fmt: skip
GREET = "int greet() { return 42; }\n"


def missing_tools() -> str | None:
    for tool in ("bazel", "nginx", "cc"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin") is None:
            return f"{tool} is not installed (`make bazel-cache-tools` installs it as root)"
    return None


def nginx() -> str:
    found = shutil.which("nginx", path=os.environ.get("PATH", "") + ":/usr/sbin")
    assert found is not None
    return found


# --- BuildGrid, once per machine -------------------------------------------------------------


def ensure_buildgrid() -> Path:
    """``bgd`` of the pinned BuildGrid venv in the per-machine cache (made if missing)."""
    return pinned_tool(REQUIREMENTS, "buildgrid", "bgd", timeout_s=900)


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    store: Path | None = None
    """nginx: the directory the cache's files are written to."""

    def stored_files(self) -> int:
        assert self.store is not None
        return sum(1 for path in self.store.rglob("*") if path.is_file())


def start_buildgrid(directory: Path) -> Server:
    port = servers.free_port()
    config = directory / "buildgrid.yml"
    config.write_text(
        "server:\n"
        f'  - !channel {{address: "127.0.0.1:{port}", insecure-mode: true}}\n'
        "authorization: {method: none}\n"
        "storages:\n  - !lru-storage &cas {size: 256M}\n"
        "caches:\n  - !lru-action-cache &ac\n"
        "    {storage: *cas, max-cached-refs: 10000, allow-updates: true}\n"
        f'instances:\n  - name: "{INSTANCE}"\n    services:\n'
        "      - !action-cache {cache: *ac}\n"
        "      - !cas {storage: *cas}\n"
        "      - !bytestream {storage: *cas}\n"
    )
    argv = [str(ensure_buildgrid()), "server", "start", "-v", str(config)]
    process = servers.start(
        "bgd", argv, log=directory / "buildgrid.log", ready=listens(port), timeout_s=60
    )
    return Server(f"grpc://127.0.0.1:{port}", process)


def start_nginx(directory: Path, token: str) -> Server:
    """nginx as a WebDAV store that answers 401 to a request without ``Bearer <token>``."""
    port = servers.free_port()
    store, tmp = directory / "store", directory / "tmp"
    store.mkdir()
    tmp.mkdir()
    temp_paths = "".join(
        f"  {kind}_temp_path {tmp};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    config = directory / "nginx.conf"
    config.write_text(
        # In the foreground, one process: the test owns it and stops it by its pid.
        "daemon off;\nmaster_process off;\nworker_processes 1;\n"
        f"pid {directory}/nginx.pid;\nerror_log {directory}/error.log;\n"
        "events { worker_connections 64; }\n"
        "http {\n"
        f"  access_log {directory}/access.log;\n{temp_paths}"
        "  server {\n"
        f"    listen 127.0.0.1:{port};\n"
        "    location / {\n"
        f'      if ($http_authorization != "Bearer {token}") {{ return 401; }}\n'
        f"      root {store};\n"
        "      dav_methods PUT;\n      create_full_put_path on;\n"
        "      client_max_body_size 0;\n"
        "    }\n  }\n}\n"
    )
    argv = [nginx(), "-c", str(config), "-p", str(directory)]
    process = servers.start(
        "nginx", argv, log=directory / "nginx.out", ready=listens(port), timeout_s=20
    )
    return Server(f"http://127.0.0.1:{port}", process, store)


def listens(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        with socket.socket() as sock:
            sock.settimeout(1)
            return sock.connect_ex(("127.0.0.1", port)) == 0

    return probe


# --- the workspace and the builds -------------------------------------------------------------


def write_rules(directory: Path) -> tuple[Path, Path]:
    """The local ``rules_cc`` and ``rules_java`` repositories Bazel 4's tools load."""
    for name, package, text in (
        ("rules_cc", "cc", _RULES_CC),
        ("rules_java", "java", _RULES_JAVA),
    ):
        repo = directory / name
        (repo / package).mkdir(parents=True)
        (repo / "WORKSPACE").write_text(f'workspace(name = "{name}")\n')
        (repo / "BUILD").write_text("")
        (repo / package / "BUILD").write_text("")
        (repo / package / "defs.bzl").write_text(text)
    return directory / "rules_cc", directory / "rules_java"


def write_workspace(directory: Path, rules: tuple[Path, Path], greet: str = GREET) -> Path:
    """A C++ workspace of three actions (two compiles, one link) whose ``.bazelrc`` ends
    as torch_xla's does: upstream's ``--noremote_upload_local_results``, then
    ``try-import %workspace%/.bazelrc.user``, the file the pipeline writes."""
    directory.mkdir(parents=True)
    (directory / "WORKSPACE").write_text('workspace(name = "cachetest")\n')
    (directory / "BUILD").write_text(
        'cc_library(name = "greet", srcs = ["greet.cc"], hdrs = ["greet.h"])\n'
        'cc_binary(name = "hello", srcs = ["main.cc"], deps = [":greet"])\n'
    )
    (directory / "greet.h").write_text("int greet();\n")
    (directory / "greet.cc").write_text('#include "greet.h"\n' + greet)
    (directory / "main.cc").write_text(
        '#include "greet.h"\nint main() { return greet() == 42 ? 0 : 1; }\n'
    )
    (directory / ".bazelrc").write_text(
        f"build --override_repository=rules_cc={rules[0]}\n"
        f"build --override_repository=rules_java={rules[1]}\n"
        # No sandbox: the same action keys, less work per action on a busy machine.
        "build --spawn_strategy=local\n"
        "build --noremote_upload_local_results\n"
        "try-import %workspace%/.bazelrc.user\n"
    )
    return directory


_PROCESSES = re.compile(r"INFO: (\d+) processes?: (.*)\.$", re.MULTILINE)


@dataclass
class BazelRun:
    returncode: int
    output: str
    seconds: float

    def processes(self) -> dict[str, int]:
        """Bazel's summary, e.g. {"remote cache hit": 3, "internal": 4}."""
        match = _PROCESSES.search(self.output)
        assert match, f"no process summary in Bazel's output:\n{self.output}"
        kinds = {}
        for part in match.group(2).split(", "):
            count, _, kind = part.partition(" ")
            kinds[kind] = int(count)
        return kinds

    @property
    def hits(self) -> int:
        return self.processes().get("remote cache hit", 0)

    @property
    def local(self) -> int:
        skipped = ("internal", "remote cache hit")
        return sum(n for kind, n in self.processes().items() if kind not in skipped)


def bazel_build(
    workspace: Path, user_root: Path, output_base: Path, *extra: str, timeout_s: float = 180
) -> BazelRun:
    """``bazel build //:hello`` with its own output base (a builder's empty Bazel state);
    ``user_root`` is shared so Bazel's install base is unpacked once per module."""
    argv = [
        *_startup(user_root, output_base), f"--max_idle_secs={MAX_IDLE_S}",
        "build", "--color=no", "--curses=no", *extra, "//:hello",
    ]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(
        argv, cwd=workspace, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    return BazelRun(done.returncode, done.stdout + done.stderr, time.monotonic() - start)


def bazel_shutdown(user_root: Path, builders: Sequence[tuple[Path, Path]]) -> None:
    """``bazel shutdown`` of every (workspace, output base)'s server, all at once: each
    waits about 2 s for its server's JVM to exit, 16 s one after the other."""
    shutdowns = [
        subprocess.Popen(
            [*_startup(user_root, output_base), "shutdown"],
            cwd=workspace,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for workspace, output_base in builders
        if output_base.exists()
    ]
    for shutdown in shutdowns:
        try:
            shutdown.wait(timeout=60)
        except subprocess.TimeoutExpired:
            shutdown.kill()
            shutdown.wait()


def _startup(user_root: Path, output_base: Path) -> list[str]:
    # No ~/.bazelrc; the system rc stays: Debian's names its install base and JDK there.
    return [
        "bazel", "--nohome_rc",
        f"--output_user_root={user_root}", f"--output_base={output_base}",
    ]  # fmt: skip
