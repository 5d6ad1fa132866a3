"""``make demo``: every stage of the pipeline, end to end, on a demonstration upstream.

This is NOT PyTorch. A newcomer without a builder host (no Bazel, no TPU, maybe no
network) can still watch the real pipeline work: this module writes the stand-in upstream
the tests build too (:mod:`xla_wheels.stand_in`: three tiny git repositories for torch,
torch_xla and OpenXLA, each a few lines of Python with the build interface the recipes
expect, every file saying it is NOT PyTorch), a project root with two bundle manifests
(``demo`` and ``demo-next``, a newer torch_xla build of the same sources) and a patch
series, and then runs the same CLI subcommands the make targets run, as child processes,
in host mode, and then the TPU host's runbook (docs/on-a-tpu-host.md) against the lane:

First the host package's wheel goes into the project's ``dist/host/`` (what ``make
host-wheel`` makes: :func:`write_host_wheel`); then, each with its log:

1. manifest -> sources -> patch series -> build -> collect and lock: ``wheels``
2. publish into the project's static validation lane: ``publish-lane`` (the wheels, the
   host wheel, the bundle document, ``requirements.txt`` and ``host-requirements.txt``)
3. install by hash into a fresh venv from the lane's simple page: ``verify-install``
4. the host check against the bundle and the lane: ``doctor``
5. a cache-pack signing key, as docs/cache-packs.md makes it (``openssl genpkey``)
6. the runbook's line (b), the host package alone, pasted into a fresh venv against the
   lane served over HTTP on loopback, then that venv's ``xla-host doctor --lane <URL>``
7. ``demo-next`` built, published, and the lane rolled back to ``demo`` (``rollback
   --reason``): the lane's served ``requirements.txt`` names the bundle after each step

Everything is written under one directory (``--dir``, default ``out/demo``), including
the children's HOME, TMPDIR, per-machine cache and pip configuration (none: pip reads no
pip.conf and installs only from the lane or the build's own wheels), so the demo needs
no network and leaves nothing elsewhere. The lane is served by :mod:`http.server` in a
thread of this process on a port of 127.0.0.1 the system picks, only while the demo runs.
Nothing is started that outlives it.

The demonstration torch_xla has the persistent-cache defect in miniature
(``torch_xla.load_cache()`` returns False); the series' patch 0001 fixes it, and the build's
ship check runs it, so the demo passes only for a patched build.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.server
import io
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from xla_host import bundle_document as doc
from xla_host import host_doctor, runner
from xla_host.arguments import RefusedSwitchAction
from xla_host.cache_contract import directory_name
from xla_host.cache_pack import read_public_key
from xla_host.errors import BundleBusy, PipelineError, UsageError
from xla_host.net import NetworkPolicy
from xla_host.wheel_filename import normalize, parse_wheel_name
from xla_wheels.cli import Parser, checked_arguments, exit_code_of
from xla_wheels.gitutil import git_out
from xla_wheels.release import host_wheel
from xla_wheels.release.host_document import HOST_WHEEL_DIR
from xla_wheels.run_lock import LOCK_NAME, bundle_run_lock
from xla_wheels.stand_in import NOTICE, make_stand_in, wheels_flags
from xla_wheels.wheels_lock import read_lock

BUNDLE = "demo"
#: The second bundle: the same sources, a newer torch_xla build; published, then rolled back.
NEXT = "demo-next"
NEXT_XLA_VERSION = "2.9.1"
LANE = "validation"
ROLLBACK_REASON = "demo: demo-next is rolled back to show the install list following"
DEFAULT_DIR = Path("out") / "demo"
#: The checkout the demo runs from: its committed host/ is the host package's source.
CHECKOUT = Path(__file__).resolve().parents[2]
#: Left in the demo directory, so a second run may replace it (and nothing else).
MARKER = ".xla-wheels-demo"
STAGE_TIMEOUT_S = 900.0
#: Seconds a request to the demo's lane server may stall before the server drops it.
SERVE_TIMEOUT_S = 30.0
#: The lane is on loopback: one short attempt (no retries: nothing there is transient).
LOOPBACK = NetworkPolicy(timeout_s=10.0, retries=0, heartbeat_s=0.0)
PYTHON_MINOR = f"{sys.version_info[0]}.{sys.version_info[1]}"

LANES_TOML = """\
# Lanes of the demonstration project (see the main project's build/lanes.toml).
publish-lane = "validation"

[lanes.validation]
description = "demonstration: every published bundle"
path = "dist/lanes/validation"
"""


def make_demo_project(base: Path) -> Path:
    """The three stand-in repositories under ``base/upstream`` and a project root
    ``base/project`` (returned: build/, patches/, then wheels.lock, dist/, out/) whose
    bundles ``demo`` and ``demo-next`` (torch_xla built as a newer version) pin them with a
    two-patch series."""
    stand_in = make_stand_in(base / "upstream", who="demo")
    commits = stand_in.commits
    root = base / "project"
    stand_in.write_series(root / "patches")
    (root / "build" / "bundles").mkdir(parents=True)
    (root / "build" / "lanes.toml").write_text(LANES_TOML)
    for name, xla_version in ((BUNDLE, "2.9.0"), (NEXT, NEXT_XLA_VERSION)):
        (root / "build" / "bundles" / f"{name}.toml").write_text(
            _manifest(name, xla_version, stand_in.repos, commits)
        )
    return root


def _manifest(name: str, xla_version: str, repos: Mapping[str, Path], commits: Mapping[str, str]
              ) -> str:  # fmt: skip
    """A demonstration bundle's manifest: the stand-in repositories at their commits."""
    return f"""\
# {NOTICE.format(who="demo", what="a torch / torch_xla bundle")}
[bundle]
name = "{name}"
description = "DEMONSTRATION upstream written by make demo (NOT PyTorch)"
python = "{PYTHON_MINOR}"

[components.torch]
remote = "{repos["torch"]}"
commit = "{commits["torch"]}"
version = "2.9.0a0"
submodules = false
patches = []

[components.torch_xla]
remote = "{repos["torch_xla"]}"
commit = "{commits["torch_xla"]}"
version = "{xla_version}"
patches = ["torch_xla/0001-load-cache.patch"]

[components.openxla]
remote = "{repos["openxla"]}"
commit = "{commits["openxla"]}"
patches = ["openxla/0001-api.patch"]

[build]
bundle_libtpu = false
tpuvm_mode = true
build_cpp_tests = false
cxx_abi = 1

# The demonstration runs on CPU: its platform, which doctor checks PJRT_DEVICE against.
[profiles.demo.device]
PJRT_DEVICE = "CPU"
"""


@dataclass(frozen=True)
class Stage:
    """One step of the demo: ``run`` writes its output into the open log and returns the
    exit status of what it ran (0: passed)."""

    title: str
    name: str
    """Its log's name (``logs/<n>-<name>.log``) and the command it stands for."""
    command: str
    """What it runs, as the user would type it (shown with the log's path)."""
    run: Callable[[IO[str]], int]
    shows: Callable[[], list[str]] = field(default=lambda: [])
    """Lines said after it passed (what the lane's install list names now)."""
    args: tuple[str, ...] = ()
    """A CLI stage's ``python -m xla_wheels`` arguments (``--root`` included)."""


def doctor_env(directory: Path, root: Path) -> dict[str, str]:
    """The runtime contract doctor checks, as a host would set it (CPU: there is no TPU
    here), with a persistent-cache directory named the way the cache contract asks: after
    the bundle and the full torch_xla version the build just locked."""
    entry = read_lock(root / "wheels.lock").bundles[BUNDLE]
    (torch_xla,) = [
        parse_wheel_name(w.name) for w in entry.wheels or () if w.name.startswith("torch_xla-")
    ]
    cache = directory / "xla-cache" / directory_name(BUNDLE, torch_xla.version, None)
    cache.mkdir(parents=True, exist_ok=True)
    return {
        "PJRT_DEVICE": "CPU",
        "XLA_NO_SPECIAL_SCALARS": "1",
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
    }


def _logged(
    argv: Sequence[str], handle: IO[str], env: Mapping[str, str], *, cwd: Path, step: str
) -> int:
    """``argv`` run with its output in the stage's log (after the command line itself)."""
    handle.write("$ " + shlex.join(argv) + "\n")
    handle.flush()
    result = runner.run(
        argv, cwd=cwd, base_env=env, echo="none", output=handle, step=step,
        timeout=STAGE_TIMEOUT_S,
        own_group=True,  # ended with the demo (SIGTERM to it alone included)
        check=False,
    )  # fmt: skip
    handle.write(f"# exit {result.returncode}\n")
    return result.returncode


@dataclass(frozen=True)
class Demo:
    """Where one demo works: its directory, the project root in it, and the lane as a host
    names it (``--lane``: the URL serving it, or its directory)."""

    directory: Path
    root: Path
    lane_url: str

    @property
    def lane(self) -> Path:
        return self.root / "dist" / "lanes" / LANE

    @property
    def torch_env(self) -> Path:
        """The interpreter of the torch environment verify-install makes (a host's own)."""
        return self.root / "out" / BUNDLE / "verify-install" / "venv" / "bin" / "python"

    @property
    def host_venv(self) -> Path:
        """The fresh venv the runbook's line (b) installs the host package into."""
        return self.directory / "host-venv"

    @property
    def pack_key(self) -> Path:
        return self.directory / "keys" / "pack-key.pem"

    def cli(
        self, title: str, name: str, flags: Mapping[str, str], *switches: str,
        env: Callable[[], Mapping[str, str]] | None = None,
        shows: Callable[[], list[str]] = lambda: [],
    ) -> Stage:  # fmt: skip
        """A stage that runs ``python -m xla_wheels <name>`` on the demo's project."""
        args = [name, *itertools.chain.from_iterable({"--root": str(self.root), **flags}.items()),
                *switches]  # fmt: skip

        def run(handle: IO[str]) -> int:
            extra = env() if env else None
            argv = [sys.executable, "-m", "xla_wheels", *args]
            return _logged(argv, handle, _child_env(self.directory, extra),
                           cwd=self.directory, step=f"demo stage {name}")  # fmt: skip

        return Stage(title, name, f"python -m xla_wheels {name} ...", run, shows, tuple(args))

    def served_list(self) -> list[str]:
        """What the lane's ``requirements.txt``, as a host reads it over HTTP, installs."""
        url = doc.install_urls(self.lane_url)[1]
        raw = doc.install_list(self.lane_url, LOOPBACK) or b""
        text = raw.decode(errors="replace")
        named = _LIST_BUNDLE.search(text)
        pins = " ".join(match.group(1) for match in _LIST_PIN.finditer(text))
        return [f"served {url} names bundle {named.group(1) if named else '(none)'}: {pins}"]


#: The install list's first line names its bundle (xla_wheels.publish.requirements).
_LIST_BUNDLE = re.compile(r"^# Hash-pinned requirements of bundle (\S+) ", re.MULTILINE)
_LIST_PIN = re.compile(r"^(torch-xla==\S+)", re.MULTILINE)


def stages(directory: Path, root: Path, lane_url: str | None = None) -> list[Stage]:
    """The demo's steps, in order: the make targets' CLI subcommands, then the runbook
    against the lane at ``lane_url`` (default: its directory, which ``--lane`` takes too).
    The project's dist/host/ must hold the host wheel (:func:`write_host_wheel`)."""
    demo = Demo(directory, root, lane_url or str(root / "dist" / "lanes" / LANE))
    wheels = {
        "--mode": "host",
        "--host-python": sys.executable,
        **wheels_flags(directory / "cache"),
    }
    lane_index = (demo.lane / "simple").as_uri() + "/"
    return [
        demo.cli(
            "manifest -> sources -> patch series -> build -> collect and lock (make wheels)",
            "wheels",
            {"--bundle": BUNDLE, **wheels},
        ),
        demo.cli(
            "publish to the validation lane: wheels, host wheel, document, install lists "
            "(make publish)",
            "publish-lane",
            {"--bundle": BUNDLE},
            shows=demo.served_list,
        ),
        demo.cli(
            "install by hash into a fresh venv from the lane (make verify-install)",
            "verify-install",
            {"--bundle": BUNDLE, "--index-url": lane_index},
            "--require-provenance",
        ),
        demo.cli(
            "check the installed environment against the bundle and lane (make doctor)",
            "doctor",
            {"--bundle": BUNDLE, "--python": str(demo.torch_env), "--lane": LANE},
            env=lambda: doctor_env(directory, root),
        ),
        Stage(
            "a signing key for cache packs (docs/cache-packs.md)",
            "pack-key",
            "openssl genpkey -algorithm ed25519 ...",
            lambda handle: _pack_key(demo, handle),
        ),
        Stage(
            "runbook (b): the host package alone, by hash, into a fresh venv from the lane "
            "over HTTP",
            "host-install",
            "pip install --require-hashes --no-deps ...",
            lambda handle: _host_install(demo, handle),
        ),
        Stage(
            "runbook: xla-host doctor --lane <URL> from that venv, judging the torch "
            "environment",
            "xla-host-doctor",
            "xla-host doctor --lane ...",
            lambda handle: _host_doctor(demo, handle),
        ),
        demo.cli(
            f"a second bundle, {NEXT}: a newer torch_xla build (make wheels BUNDLE={NEXT})",
            "wheels",
            {"--bundle": NEXT, **wheels},
        ),
        demo.cli(
            f"publish {NEXT} (make publish BUNDLE={NEXT})",
            "publish-lane",
            {"--bundle": NEXT},
            shows=demo.served_list,
        ),
        demo.cli(
            f'roll the lane back to {BUNDLE} (make rollback LANE={LANE} TO={BUNDLE} REASON="…")',
            "rollback",
            {"--lane": LANE, "--to": BUNDLE, "--reason": ROLLBACK_REASON},
            shows=demo.served_list,
        ),
    ]


def _pack_key(demo: Demo, handle: IO[str]) -> int:
    """The key pair that signs the gate's cache packs, made the way docs/cache-packs.md
    says; the public half read back as the pack commands read it (``--key``)."""
    private, public = demo.pack_key, demo.pack_key.with_suffix(".pub.pem")
    private.parent.mkdir(mode=0o700)
    env = _child_env(demo.directory, None)
    for argv in (
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)],
        ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
    ):
        if shutil.which(argv[0]) is None:
            raise PipelineError(
                "the demo makes a cache-pack key with openssl, which is not on PATH",
                fix="install openssl (Debian: apt-get install openssl), then run make demo again",
            )
        if status := _logged(argv, handle, env, cwd=demo.directory, step="demo pack key"):
            return status
    key = read_public_key(public)
    handle.write(f"pack key {public} (ed25519, key id {key.keyid}); private half {private}\n")
    return 0


def _host_env(demo: Demo, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A host's environment: the demo's (no proxy for the lane on loopback, while it is
    served), without the checkout on PYTHONPATH: a host has none."""
    env = _child_env(demo.directory, extra)
    env.pop("PYTHONPATH", None)
    return env


def _host_install(demo: Demo, handle: IO[str]) -> int:
    """The runbook's line (b), as doctor prints it with this lane's URLs, run by pip into a
    fresh venv; then what that venv holds."""
    simple, _, host_list = doc.install_urls(demo.lane_url)
    line = host_doctor.install_line(simple, host_list, host_only=True)
    handle.write(f"runbook (b): {line}\n")
    env = _host_env(demo)
    python = demo.host_venv / "bin" / "python"
    venv = [sys.executable, "-m", "venv", "--without-pip", str(demo.host_venv)]
    words = shlex.split(line)
    pip = [sys.executable, "-m", "pip", "--python", str(python), *words[1:], "--no-cache-dir"]
    for argv in (venv, pip):
        if status := _logged(argv, handle, env, cwd=demo.directory, step="demo host install"):
            return status
    listed = runner.run(
        [str(python), "-I", "-c", "import importlib.metadata as m; print(' '.join(sorted("
         "f'{d.metadata[\"Name\"]} {d.version}' for d in m.distributions())))"],
        base_env=env, echo="none", timeout=STAGE_TIMEOUT_S, step="demo host venv listing",
    )  # fmt: skip
    handle.write(f"installed in {demo.host_venv}: {listed.stdout.strip()}\n")
    return 0


def _host_doctor(demo: Demo, handle: IO[str]) -> int:
    """``xla-host doctor`` from the host venv against the lane's URL, judging the torch
    environment verify-install made (the host's own, beside which the host package lives)."""
    xla_host = demo.host_venv / "bin" / "xla-host"
    argv = [str(xla_host), "doctor", "--lane", demo.lane_url, "--bundle", BUNDLE,
            "--python", str(demo.torch_env)]  # fmt: skip
    env = _host_env(demo, doctor_env(demo.directory, demo.root))
    return _logged(argv, handle, env, cwd=demo.directory, step="demo xla-host doctor")


# --- the host package's wheel ---------------------------------------------------------
#
# `make host-wheel` (xla_wheels.release.host_wheel) builds it with setuptools 80.9.0, which
# host/pyproject.toml pins and pip fetches from the index into an isolated build
# environment: the demo, offline, cannot. It writes the same package itself, with the
# standard library: the files of the committed host/ setuptools would take (the packages
# under src/, their package-data), the metadata host/pyproject.toml declares, the version
# by make host-wheel's own rule (host_wheel.host_version) and its date (the last commit
# that changed host/), so one host/ gives the same bytes.


def write_host_wheel(checkout: Path, dest: Path) -> Path:
    """The host package's wheel of ``checkout``'s committed ``host/``, into ``dest`` (the
    comment above); its path."""
    version = host_wheel.host_version(checkout)
    epoch = int(git_out(["log", "-1", "--format=%ct", "HEAD", "--", host_wheel.HOST_DIR],
                        cwd=checkout))  # fmt: skip
    files = _committed(checkout, host_wheel.HOST_DIR)
    config = tomllib.loads(files["pyproject.toml"].decode())
    project = config["project"]
    package_data = config.get("tool", {}).get("setuptools", {}).get("package-data", {})
    members = {
        path.removeprefix("src/"): data
        for path, data in files.items()
        if path.startswith("src/")
        and _packaged(PurePosixPath(path).relative_to("src"), package_data)
    }
    name = normalize(project["name"]).replace("-", "_")
    members.update(_dist_info(f"{name}-{version}.dist-info", project, version, members))
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"{name}-{version}-py3-none-any.whl"
    when = time.gmtime(max(epoch, 315532800))[:6]  # a zip holds no time before 1980
    staged = target.with_name(f".{target.name}.part")
    with zipfile.ZipFile(staged, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in sorted(members.items()):
            member = zipfile.ZipInfo(path, date_time=when)
            member.external_attr = 0o644 << 16
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, data)
    staged.replace(target)
    return target


def _dist_info(
    info: str, project: Mapping[str, Any], version: str, members: Mapping[str, bytes]
) -> dict[str, bytes]:
    """The ``.dist-info`` files of a wheel of ``members`` (as setuptools writes them; its
    WHEEL names the demo as the generator), RECORD included."""
    scripts = "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items())
    top_level = sorted({path.split("/", 1)[0] for path in members})
    files = {
        f"{info}/METADATA": _metadata(project, version).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: xla-wheels make demo\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{scripts}".encode(),
        f"{info}/top_level.txt": "".join(f"{top}\n" for top in top_level).encode(),
    }
    record = "".join(
        f"{path},sha256={_digest(data)},{len(data)}\n"
        for path, data in sorted({**members, **files}.items())
    )
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    return files


def _committed(checkout: Path, directory: str) -> dict[str, bytes]:
    """The files of ``directory`` as HEAD has them (never the working tree's edits),
    relative to it."""
    try:
        archive = subprocess.run(
            ["git", "archive", "--format=tar", "HEAD", directory],
            cwd=checkout, capture_output=True, check=True, timeout=STAGE_TIMEOUT_S,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        raise PipelineError(
            f"the demo cannot read the committed {directory}/ of {checkout}: {error}",
            fix="run make demo from a git checkout of the project",
        ) from None
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for entry in tar.getmembers():
            handle = tar.extractfile(entry) if entry.isfile() else None
            if handle is not None:
                files[entry.name.removeprefix(f"{directory}/")] = handle.read()
    return files


def _packaged(path: PurePosixPath, package_data: Mapping[str, Sequence[str]]) -> bool:
    """Whether setuptools puts ``path`` (under src/) into the wheel: a module, or a file
    its package's package-data patterns take (``**/`` reaching any depth)."""
    if path.suffix == ".py":
        return True
    inside = PurePosixPath(*path.parts[1:])
    return any(
        inside.match(pattern.removeprefix("**/"))
        if pattern.startswith("**/")
        else str(inside) == pattern
        for pattern in package_data.get(path.parts[0], ())
    )


def _metadata(project: Mapping[str, Any], version: str) -> str:
    """Core metadata 2.4 of ``project`` (host/pyproject.toml's table)."""
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project['description']}",
        f"License-Expression: {project['license']}",
        f"Requires-Python: {project['requires-python']}",
        *(f"Requires-Dist: {dependency}" for dependency in project.get("dependencies", ())),
    ]
    return "\n".join(lines) + "\n"


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@contextmanager
def serving(directory: Path, log_path: Path) -> Iterator[str]:
    """``directory`` over HTTP on 127.0.0.1, a port the system picks (so always a free
    one), by :mod:`http.server` in a thread of this process: yields its root URL and stops
    it on leaving. A request that stalls is dropped after :data:`SERVE_TIMEOUT_S`."""
    with log_path.open("a") as log:

        class Handler(http.server.SimpleHTTPRequestHandler):
            timeout = SERVE_TIMEOUT_S

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(directory), **kwargs)

            def log_message(self, format: str, *args: Any) -> None:
                log.write(f"{self.address_string()} {format % args}\n")
                log.flush()

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, name="demo lane", daemon=True)
        thread.start()
        try:
            with _no_proxy_for_loopback():
                yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


@contextmanager
def _no_proxy_for_loopback() -> Iterator[None]:
    """A lane on loopback is reached directly: a configured HTTP proxy (urllib's and pip's
    ``http_proxy``) would be asked for 127.0.0.1 otherwise, and cannot reach it. The
    demo reaches no other host, so the bypass replaces the user's while it runs."""
    names = ("no_proxy", "NO_PROXY")
    saved = {name: value for name, value in os.environ.items() if name in names}
    os.environ.update(dict.fromkeys(names, "127.0.0.1"))
    try:
        yield
    finally:
        for name in names:
            os.environ.pop(name, None)
        os.environ.update(saved)


def _child_env(directory: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PIP_", "XLA_WHEELS_", "XLA_", "PJRT_", "TPU_", "TWINE_"))
    }
    return {
        **env,
        # Everything the children write goes under the demo directory.
        "HOME": str(directory / "home"),
        "TMPDIR": str(directory / "tmp"),
        "XLA_WHEELS_CACHE": str(directory / "cache"),
        # No pip.conf: pip installs only from the lane or the build's own wheels.
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
        ),
        **(extra or {}),
    }


#: What the demo's path cannot hold: it is written into TOML strings (the manifests,
#: lanes.toml) and environment files, where a quote or a backslash ends or escapes it and
#: a tab or line break is refused late, with a fix about the file instead of the path.
_UNWRITABLE = frozenset('"\\') | {chr(n) for n in (*range(0x20), 0x7F)}


def _check_characters(directory: Path) -> None:
    found = sorted({char for char in str(directory) if char in _UNWRITABLE})
    if found:
        names = ", ".join(ascii(char) for char in found)
        raise UsageError(
            f"DEMO_DIR {str(directory)!a} holds {names}, which the demo cannot write "
            "into its manifests and environment files",
            fix="name a directory whose path has no double quote, backslash, tab or line "
            "break: `make demo DEMO_DIR=<dir>`",
        )


def _check_directory(directory: Path) -> list[Path]:
    """What a previous demo left in ``directory`` (to be replaced); a directory that holds
    anything else is refused. The lock file of a running demo is neither."""
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise UsageError(
            f"{directory} is not a directory",
            fix="name an empty or new directory: `make demo DEMO_DIR=<dir>`",
        )
    previous = [child for child in directory.iterdir() if child.name != LOCK_NAME]
    if previous and not (directory / MARKER).is_file():
        raise UsageError(
            f"{directory} exists and is not a previous demo's directory (no {MARKER})",
            fix="name an empty or new directory: `make demo DEMO_DIR=<dir>`",
        )
    return previous


def _one_demo_at_a_time(directory: Path) -> ExitStack:
    """The lock the pipeline's runs take (:mod:`xla_wheels.run_lock`), on the demo
    directory: a second demo there would delete the first one's files under it."""
    held = ExitStack()
    try:
        held.enter_context(bundle_run_lock(directory.parent, directory.name, "make demo"))
    except BundleBusy:
        holder = (directory / LOCK_NAME).read_text(errors="replace").strip() or "unknown"
        raise BundleBusy(
            f"another demo is running in {directory} (pid and command: {holder})",
            fix="wait for it to finish, or give this one a directory of its own: "
            "`make demo DEMO_DIR=<dir>`",
        ) from None
    return held


def _prepare(directory: Path) -> None:
    # Checked again under the lock: the directory may have changed while we waited.
    for child in _check_directory(directory):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text("written by `make demo`; removed by the next run\n")
    (directory / "home").mkdir()
    (directory / "tmp").mkdir()


def run_demo(directory: Path) -> int:
    """Generate the demonstration project under ``directory`` and run every stage (0: all
    passed; a stage that fails raises)."""
    _check_characters(directory)
    directory = directory.resolve()
    # Refused before the lock is taken, which would write into a directory not ours.
    _check_directory(directory)
    with _one_demo_at_a_time(directory):
        return _run_stages(directory)


def _run_stages(directory: Path) -> int:
    _prepare(directory)
    started = time.monotonic()
    print(f"== demo: a DEMONSTRATION upstream (NOT PyTorch) in {directory}/upstream", flush=True)
    root = make_demo_project(directory)
    print(f"   project root {root} (bundles {BUNDLE} and {NEXT}, patches/, build/lanes.toml)")
    wheel = write_host_wheel(CHECKOUT, root / HOST_WHEEL_DIR)
    print(f"   host wheel {wheel} (make host-wheel's package, of the committed host/)")
    logs = directory / "logs"
    logs.mkdir()
    lane = root / "dist" / "lanes" / LANE
    with serving(lane, logs / "lane-http.log") as lane_url:
        print(f"   lane {LANE} served at {lane_url} (http.server on loopback, while the demo "
              f"runs; requests: {logs / 'lane-http.log'})", flush=True)  # fmt: skip
        plan = stages(directory, root, lane_url)
        for number, stage in enumerate(plan, 1):
            _run_stage(number, len(plan), stage, logs / f"{number}-{stage.name}.log")
    print(f"== demo: every stage passed in {time.monotonic() - started:.0f}s. Where to look:")
    for line in _where(directory, root, logs):
        print(f"   {line}")
    return 0


def _run_stage(number: int, count: int, stage: Stage, log_path: Path) -> None:
    print(f"== [{number}/{count}] {stage.title}", flush=True)
    print(f"   {stage.command} (log: {log_path})", flush=True)
    begun = time.monotonic()
    with log_path.open("w") as handle:
        status = stage.run(handle)
    for line in _summary(log_path):
        print(f"   {line}")
    if status != 0:
        raise PipelineError(
            f"demo stage {number} ({stage.name}) failed with exit {status}; "
            f"its output is in {log_path}",
            fix=f"read {log_path}: the error:/fix: lines at its end name the cause",
        )
    for line in stage.shows():
        print(f"   {line}")
    print(f"   done in {time.monotonic() - begun:.1f}s", flush=True)


def _where(directory: Path, root: Path, logs: Path) -> list[str]:
    """The summary's lines: where each step's output is."""
    lane = root / "dist" / "lanes" / LANE
    bundles = root / "build" / "bundles"
    return [
        f"{bundles / (BUNDLE + '.toml')}, {bundles / (NEXT + '.toml')}   the manifests",
        f"{root / 'patches'}/   the patch series",
        f"{root / 'out' / BUNDLE / 'src'}/   the patched sources",
        f"{root / 'dist' / BUNDLE}/, {root / 'dist' / NEXT}/   the wheels, and "
        f"{root / 'wheels.lock'}",
        f"{root / HOST_WHEEL_DIR}/   the host wheel",
        f"{lane}/   the lane: simple/, bundles/ (the documents), requirements.txt, "
        f"host-requirements.txt; its history in {root / 'lanes.lock'}",
        f"{root / 'out' / BUNDLE / 'verify-install' / 'report.json'}   the install check",
        f"{directory / 'keys'}/   the cache-pack key (pack-key.pem, pack-key.pub.pem)",
        f"{directory / 'host-venv'}/   the fresh venv of the runbook's line (b)",
        f"{logs}/   each stage's full output (N-<stage>.log) and the lane's requests",
        f"operate the demo's project from here: python -m xla_wheels lanes --root {root} "
        "(docs/operating.md)",
    ]


def _summary(log_path: Path) -> list[str]:
    """The lines of a stage's output worth showing here: its checks, results and timings
    (the progress and the commands stay in the log)."""
    checks = ("ok ", "FAIL ", "WARN ", "error:", "fix:", "copied ", "skipped ")
    results = (
        "lane ",
        "collect: ",
        "verify-install ",
        "doctor",
        "host wheel ",
        "pack key ",
        "runbook ",
        "installed ",
        "rollback",
        "install list ",
    )
    timings = (" ran", " reused", " skipped")  # the build's stage timings
    lines = (line.strip() for line in log_path.read_text(errors="replace").splitlines())
    shown = [text for text in lines if text.startswith(checks + results) or text.endswith(timings)]
    # A stage that prints each check as it happens ("ok  install: ...") and again in its
    # closing table ("ok  install  ...") shows it once: the table's line, in its place.
    # Only verdict lines are merged: two equal fix: lines belong to two different checks.
    keys = [
        _check_key(text) if text.startswith(VERDICTS) else str(n) for n, text in enumerate(shown)
    ]
    last = {key: number for number, key in enumerate(keys)}
    return [text for number, text in enumerate(shown) if last[keys[number]] == number]


VERDICTS = ("ok ", "FAIL ", "WARN ")


def _check_key(line: str) -> str:
    """A check line as words, whether its name ends in a colon or in padding."""
    return " ".join(line.replace(":", " ", 1).split())


def build_parser() -> argparse.ArgumentParser:
    """The demo's command line (``make help`` reads DEMO_DIR's text from it)."""
    parser = Parser(
        prog="python -m xla_wheels.demo",
        description="Run every stage of the pipeline on a demonstration upstream (NOT torch).",
    )
    parser.set_defaults(command="demo")
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"the one directory the demo writes (default: {DEFAULT_DIR})",
    )
    # The demo has no dry run: asked for one, it refuses rather than replace DEMO_DIR.
    parser.add_argument(
        "--dry-run", action=RefusedSwitchAction, default=False, help=argparse.SUPPRESS
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    return exit_code_of(lambda: _checked_run(arguments))


def _checked_run(arguments: list[str]) -> int:
    # The checks every make target's command makes before anything runs (make variables,
    # switches, the environment; the demo has no dry run, so DRY_RUN=1 is refused).
    args = checked_arguments(build_parser, arguments)
    return run_demo(args.dir)


if __name__ == "__main__":
    sys.exit(main())
