"""What the compiled checks of the series are built with, set up once per machine.

- g++ from the machine (Debian: ``apt-get install g++``);
- torch: the headers and libraries (``include/``, ``lib/``) of the stock torch 2.9.0
  environment the gate already builds in the per-machine cache
  (:func:`xla_wheels.stock_envs.ensure_stock_env`), pybind11's headers among them;
- CPython's headers and ``libpython`` of that environment's interpreter (for a check of a
  Python binding, which embeds the interpreter);
- absl, googletest and googlemock: Debian bookworm's ``.deb`` files, pinned below by URL
  and sha256, downloaded into ``<cache>/toolchain/debs/`` and unpacked (only
  ``usr/include`` and ``usr/lib``) into ``<cache>/toolchain/<name>/``. Nothing is
  installed system-wide, and no root is needed;
- LLVM's Support library (``llvm/Support/SHA256.h`` and ``libLLVMSupport.a``, the SHA-256
  the disk key of patch 0003 uses, as XLA's own ``@llvm-project//llvm:Support``): sid's
  ``llvm-21-dev`` (:data:`LLVM_PACKAGE`, the one ``series-compile`` pairs with
  tensorflow-cpu 2.20), unpacked into ``<cache>/toolchain/<name>/`` the same way;
- ccache, when it is on PATH (and ``CCACHE_DISABLE`` is not set): the compile steps go
  through it, with its cache in ``<cache>/ccache-series-checks/`` (:class:`CompilerCache`).

Downloads are verified before they are renamed into place; the root is made by
:func:`xla_host.waitlock.make_once`, so a crash at any point leaves nothing a later run uses.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from xla_host import filemode, log
from xla_host.errors import ToolchainError
from xla_host.net import (
    TIMEOUT_SETTING,
    Failures,
    NetworkPolicy,
    attempts_text,
    host_of,
    http_request,
)
from xla_host.waitlock import make_once

#: The torch whose headers the checks compile against: the series' target release.
TORCH_VERSION = "2.9.0"
DEBIAN_POOL = "https://deb.debian.org/debian/pool/main"
MULTIARCH = "x86_64-linux-gnu"
MARKER = ".complete.json"
#: ccache's directory for the compiled checks, in the machine cache: its own, so that
#: its size limit and statistics are these checks' alone.
COMPILER_CACHE_SUBDIR = "ccache-series-checks"
#: The most that directory may hold (ccache evicts the oldest results beyond it).
COMPILER_CACHE_MAX_SIZE = "2G"
#: The size one pinned .deb is allowed for in its download's time limit (the largest,
#: cc1plus's package, is about 20 MB).
DEB_BYTES_ALLOWANCE = 32 * 1024 * 1024
#: What of a package's ``data.tar`` is unpacked: the headers and the libraries.
_UNPACKED = re.compile(r"(\./)?usr/(include|lib)/")


@dataclass(frozen=True)
class DebianPackage:
    """One ``.deb`` file, pinned by its pool URL and sha256 (from bookworm's Packages)."""

    name: str
    version: str
    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[1]


#: absl's headers (libabsl-dev) link against its shared libraries (libabsl20220623);
#: googletest's and googlemock's are static archives. Versions: bookworm's current ones.
BOOKWORM_PACKAGES: tuple[DebianPackage, ...] = (
    DebianPackage(
        "libabsl-dev",
        "20220623.1-1+deb12u2",
        f"{DEBIAN_POOL}/a/abseil/libabsl-dev_20220623.1-1+deb12u2_amd64.deb",
        "24cdc091cd8e88754401f9d18e3be3d354ef96c453934ff138106fcb0245958b",
    ),
    DebianPackage(
        "libabsl20220623",
        "20220623.1-1+deb12u2",
        f"{DEBIAN_POOL}/a/abseil/libabsl20220623_20220623.1-1+deb12u2_amd64.deb",
        "3fb1a98ff3a1b7b27cd3b2544e033af3bc3419d82f33bbe3f3d5faa07b400eb5",
    ),
    DebianPackage(
        "libgtest-dev",
        "1.12.1-0.2",
        f"{DEBIAN_POOL}/g/googletest/libgtest-dev_1.12.1-0.2_amd64.deb",
        "1dbf34692561ea744d827af133c2266640a2f2cda30abfaa610eed1a7e8609d9",
    ),
    DebianPackage(
        "libgmock-dev",
        "1.12.1-0.2",
        f"{DEBIAN_POOL}/g/googletest/libgmock-dev_1.12.1-0.2_amd64.deb",
        "ffe5958a13f30657cb5e5af4e24bfa6ab6b633391f1a945607799192b52b4530",
    ),
)


#: LLVM for the checks that link its Support library (one pin, shared with series-compile's
#: tf-2.20 header set). bookworm's LLVM is older, but llvm::SHA256 is the same there; sid's
#: is the one the header set needs, so the machine fetches one LLVM package, not two.
LLVM_MAJOR = "21"
LLVM_PACKAGE = DebianPackage(
    "llvm-21-dev",
    "1:21.1.8-14",
    "https://deb.debian.org/debian/pool/main/l/llvm-toolchain-21/llvm-21-dev_21.1.8-14_amd64.deb",
    "d5c158f370423c01846f1cff0bdd0ca0d211049c73fc3faa3d258e638d14f354",
)


@dataclass(frozen=True)
class Prefix:
    """Where a library's headers and libraries are."""

    include: Path
    lib: Path


@dataclass(frozen=True)
class Toolchain:
    compiler: Path
    torch: Path
    """site-packages/torch of a torch 2.9.0 wheel: include/ and lib/."""
    absl: Prefix
    gtest: Prefix
    """googletest and googlemock (one Debian source package, one prefix)."""
    python: PythonLibrary | None = None
    """CPython of the torch environment; None: checks of Python bindings cannot build."""
    compiler_cache: CompilerCache | None = None
    """ccache for the compile steps; None: every source is compiled by g++ itself."""
    llvm: LlvmSupport | None = None
    """LLVM's Support library; None: checks that link it cannot build."""


@dataclass(frozen=True)
class LlvmSupport:
    """LLVM's headers (``llvm/`` and ``llvm-c/``) and its static Support library."""

    include: tuple[Path, ...]
    library: Path


@dataclass(frozen=True)
class CompilerCache:
    """ccache and its directory. It keys a result by the preprocessed source, the command
    line and the compiler, and never stores a failed compile, so a hit gives the object a
    fresh compile would, and a compile error always comes from a real g++ run."""

    executable: Path
    directory: Path


@dataclass(frozen=True)
class PythonLibrary:
    """Where CPython's headers are and which shared library embeds it."""

    include: Path
    lib: Path
    library: str
    """The ``-l`` name, e.g. ``python3.11``."""


def ensure_toolchain(cache_dir: Path, network: NetworkPolicy) -> Toolchain:
    """The toolchain, setting up what is missing in ``cache_dir`` (the machine cache);
    ``network`` bounds the downloads of the Debian packages."""
    compiler = shutil.which("g++")
    if compiler is None:
        raise ToolchainError(
            "g++ is not installed: the compiled checks of the series need a C++17 compiler",
            fix="install it (Debian: apt-get install g++)",
        )
    torch = stock_torch_dir(cache_dir)
    root = ensure_debian_root(cache_dir / "toolchain", BOOKWORM_PACKAGES, network)
    usr = Prefix(root / "usr" / "include", root / "usr" / "lib" / MULTIARCH)
    python = python_library(_torch_python(torch))
    llvm_root = ensure_debian_root(cache_dir / "toolchain", (LLVM_PACKAGE,), network)
    return Toolchain(
        compiler=Path(compiler),
        torch=torch,
        absl=usr,
        gtest=usr,
        python=python,
        compiler_cache=compiler_cache(cache_dir, os.environ),
        llvm=llvm_support(llvm_root),
    )


def llvm_support(root: Path) -> LlvmSupport:
    """Where the unpacked ``llvm-N-dev`` keeps its headers and ``libLLVMSupport.a``."""
    include = root / "usr" / "include"
    library = root / "usr" / "lib" / f"llvm-{LLVM_MAJOR}" / "lib" / "libLLVMSupport.a"
    if not library.is_file():
        raise ToolchainError(
            f"{LLVM_PACKAGE.filename} unpacked without {library.name}",
            fix=f"remove {root} so that it is unpacked again",
        )
    return LlvmSupport((include / f"llvm-{LLVM_MAJOR}", include / f"llvm-c-{LLVM_MAJOR}"), library)


def compiler_cache(cache_dir: Path, environ: Mapping[str, str]) -> CompilerCache | None:
    """ccache from ``environ``'s PATH with its directory under ``cache_dir`` (made here);
    None without ccache, with ccache's own ``CCACHE_DISABLE`` set, or when the directory
    cannot be made (the checks then compile without it: slower, never wrong)."""
    if environ.get("CCACHE_DISABLE", "").lower() not in ("", "0", "false", "disable", "no"):
        return None
    executable = shutil.which("ccache", path=environ.get("PATH"))
    if executable is None:
        return None
    directory = cache_dir / COMPILER_CACHE_SUBDIR
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        log.warning(f"compiling the series' checks without ccache: {error}")
        return None
    return CompilerCache(Path(executable), directory)


def _torch_python(torch: Path) -> Path:
    """The interpreter of the environment whose site-packages holds ``torch``."""
    return torch.parents[3] / "bin" / "python"


_PYTHON_PATHS = (
    "import json, sysconfig; print(json.dumps([sysconfig.get_paths()['include'], "
    "sysconfig.get_config_var('LIBDIR'), sysconfig.get_config_var('LDLIBRARY')]))"
)


def python_library(python: Path) -> PythonLibrary | None:
    """CPython's headers and shared library as ``python`` reports them; None when it was
    built without a shared libpython (a check embedding it cannot link then)."""
    try:
        answer = subprocess.run(
            [str(python), "-c", _PYTHON_PATHS], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if answer.returncode != 0:
        return None
    include, libdir, library = json.loads(answer.stdout)
    match = re.fullmatch(r"lib(?P<name>.+)\.so(\.[\d.]+)?", library or "")
    if not (include and libdir and match and (Path(libdir) / library).exists()):
        return None
    return PythonLibrary(Path(include), Path(libdir), match.group("name"))


def stock_torch_dir(cache_dir: Path) -> Path:
    """site-packages/torch of the cached stock torch 2.9.0 environment (built if missing)."""
    from xla_wheels import stock_envs as envs  # the gate's module pulls in more than this needs

    python = envs.ensure_stock_env(TORCH_VERSION, root=cache_dir)
    candidates = sorted(python.parent.parent.glob("lib/python*/site-packages/torch"))
    if not candidates or not (candidates[0] / "include" / "torch").is_dir():
        raise ToolchainError(
            f"no torch headers (site-packages/torch/include/torch) in the environment of "
            f"{python}",
            fix=f"remove {python.parent.parent} so that it is built again",
        )
    return candidates[0]


# --- Debian packages ------------------------------------------------------------------------


def root_name(packages: tuple[DebianPackage, ...]) -> str:
    """The unpacked root's directory name: changes with any pin."""
    pins = "\n".join(f"{p.url} {p.sha256}" for p in packages)
    return "debian-" + hashlib.sha256(pins.encode()).hexdigest()[:16]


def ensure_debian_root(
    toolchain_dir: Path, packages: tuple[DebianPackage, ...], network: NetworkPolicy
) -> Path:
    """A directory holding ``packages`` unpacked (``usr/include``, ``usr/lib``)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        raise ToolchainError(
            f"the pinned Debian packages are for amd64, this machine is {platform.machine()}",
            fix="run the compiled checks on an x86_64 machine",
        )
    name = root_name(packages)

    def unpack_all(staging: Path) -> dict[str, object]:
        for deb in [download(package, toolchain_dir / "debs", network) for package in packages]:
            unpack(deb, staging)
        return {"packages": [asdict(package) for package in packages]}

    return make_once(toolchain_dir / name, unpack_all, marker=MARKER, doing=f"setting up {name}")


def download(package: DebianPackage, dest_dir: Path, network: NetworkPolicy) -> Path:
    """``dest_dir/<file name>``, downloaded unless a copy with the pinned hash is there."""
    target = dest_dir / package.filename
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == package.sha256:
        return target
    dest_dir.mkdir(parents=True, exist_ok=True)
    cannot = f"cannot download {package.name} {package.version} from {package.url}"
    failures = Failures(
        answered=lambda answer: ToolchainError(
            f"{cannot}: HTTP Error {answer.status}: {answer.reason}", fix=_pin_fix(package)
        ),
        unreadable=lambda reason: ToolchainError(f"{cannot}: {reason}", fix=_pin_fix(package)),
        gave_up=lambda fault, attempts: ToolchainError(
            f"downloading {package.filename}: {host_of(package.url)} {fault.what_happened} "
            f"({attempts_text(attempts)})",
            fix=_pin_fix(package),
        ),
        timeout_fix=f"{_pin_fix(package)}; a slow link: give it longer with {TIMEOUT_SETTING}",
    )
    data = http_request(
        package.url, network, failures, step=f"downloading {package.filename}",
        size=DEB_BYTES_ALLOWANCE, long=True,
    ).body  # fmt: skip
    actual = hashlib.sha256(data).hexdigest()
    if actual != package.sha256:
        raise ToolchainError(
            f"{package.url} has sha256 {actual}, not the pinned {package.sha256}",
            fix=_pin_fix(package),
        )
    filemode.write_by_rename(target, data)  # never a half-written .deb under its name
    return target


def _pin_fix(package: DebianPackage) -> str:
    return (
        "check the network (a proxy: set https_proxy); if Debian has replaced the version, "
        f"pin bookworm's current {package.name} (`apt-cache show {package.name}` on bookworm "
        "gives Filename and SHA256) in src/xla_wheels/series_checks/toolchain.py; old "
        "versions stay at snapshot.debian.org"
    )


def unpack(deb: Path, dest: Path) -> None:
    """Extract ``usr/include`` and ``usr/lib`` of a ``.deb`` (an ar archive) into ``dest``."""
    members = _ar_members(deb.read_bytes())
    data_name = next((name for name in members if name.startswith("data.tar")), None)
    if data_name is None:
        raise ToolchainError(f"{deb} has no data.tar member", fix=f"delete {deb} and run again")
    try:
        with tarfile.open(fileobj=io.BytesIO(members[data_name]), mode="r:*") as tar:
            wanted = [member for member in tar.getmembers() if _UNPACKED.match(member.name)]
            tar.extractall(dest, members=wanted, filter="data")
    except (tarfile.TarError, OSError) as error:
        raise ToolchainError(
            f"cannot unpack {deb} ({data_name}): {error}", fix=f"delete {deb} and run again"
        ) from None


def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of a System V ar archive (a .deb's outer format)."""
    if not data.startswith(b"!<arch>\n"):
        raise ToolchainError("not a Debian package (no ar header)", fix="delete it and run again")
    members: dict[str, bytes] = {}
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = offset + 60
        members[name] = data[start : start + size]
        offset = start + size + (size % 2)  # members are 2-byte aligned
    return members
