"""The real XLA, torch and LLVM headers ``series-compile`` compiles the series against.

No pinned OpenXLA is installable here, but PyPI's ``tensorflow-cpu`` wheels ship the XLA
headers of the OpenXLA their TensorFlow release was built from (``tensorflow/include``:
``xla/``, ``tsl/``, absl, protobuf with matching ``.pb.h`` files, and under ``external/``
MLIR, stablehlo, shardy, farmhash, re2, highwayhash). They ship no ``llvm/`` headers:
those come from Debian's ``llvm-N-dev`` of the LLVM that MLIR needs (bookworm's LLVM 19 is
too old), pinned below by pool URL and sha256. torch's headers come from the torch 2.9.0
wheel, without its bundled ``google/protobuf`` (torch_xla's Bazel build excludes it too:
it is not the protobuf the ``.pb.h`` files were generated with).

A header set (:data:`HEADER_SETS`, chosen with ``--xla-headers``) is unpacked once per
machine into ``<cache>/series-compile/headers-<set>-<digest>/`` (:func:`ensure_headers`,
made by :func:`xla_host.waitlock.make_once`: a crash leaves nothing a later run uses),
only the include trees the compiles read; the wheels are fetched with pip (the ordinary
client; pip checks the index's hashes) into ``<cache>/series-compile/wheels/``.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from xla_host import log, runner
from xla_host.errors import ToolchainError
from xla_host.net import NetworkPolicy
from xla_host.waitlock import make_once
from xla_wheels.series_checks.toolchain import LLVM_PACKAGE, DebianPackage, download, unpack

SUBDIR = "series-compile"
MARKER = ".complete.json"
#: torch whose headers the series is compiled with: the series' target release.
TORCH_VERSION = "2.9.0"
#: The wheels are platform wheels; only their headers are read, so one tag serves any
#: interpreter that runs this command.
WHEEL_PYTHON = "3.11"
PIP_TIMEOUT_S = 1800.0
SID_POOL = "https://deb.debian.org/debian/pool/main/l"


@dataclass(frozen=True)
class HeaderSet:
    """One ``--xla-headers`` value: a tensorflow-cpu release and the LLVM its MLIR needs."""

    name: str
    tensorflow: str
    llvm_major: str
    llvm: DebianPackage
    note: str
    """How this set stands to the series' pinned OpenXLA, for the report."""


HEADER_SETS: dict[str, HeaderSet] = {
    "tf-2.20": HeaderSet(
        "tf-2.20",
        "2.20.0",
        "21",
        LLVM_PACKAGE,
        "the OpenXLA of TensorFlow 2.20, the nearest published one to the pin 9a9aa0e",
    ),
    "tf-2.21": HeaderSet(
        "tf-2.21",
        "2.21.0",
        "22",
        DebianPackage(
            "llvm-22-dev",
            "1:22.1.8-3",
            f"{SID_POOL}/llvm-toolchain-22/llvm-22-dev_22.1.8-3_amd64.deb",
            "185a4d818b940d3d8f4c8919c794b064d7f857a4c3687daaebd4c00f5aac4554",
        ),
        "a newer OpenXLA than the pin: API drift shows as errors at base and patched alike",
    ),
}
DEFAULT_HEADER_SET = "tf-2.20"

#: What of the wheel's ``tensorflow/include/`` the torch_xla sources reach: TensorFlow's
#: own headers (the bulk) are never included.
_TF_TOP = ("xla/", "tsl/", "absl/", "google/", "Eigen/", "unsupported/", "ml_dtypes/")
_TF_EXTERNAL = (
    "llvm-project/mlir/include/",
    "farmhash_archive/src/",
    "stablehlo/",
    "shardy/",
    "com_googlesource_code_re2/",
    "highwayhash/",
    "ml_dtypes_py/",
    "eigen_archive/",
)
_TF_PREFIX = "tensorflow/include/"
_TORCH_PREFIX = "torch/include/"


@dataclass(frozen=True)
class Headers:
    """An unpacked header set: its include directories, in search order."""

    root: Path
    header_set: HeaderSet
    identity: str
    """What the set was made from (wheel and package hashes): part of every cache key."""

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        xla, ext = self.root / "xla", self.root / "xla" / "external"
        llvm = self.root / "llvm"
        return (
            xla,
            ext / "llvm-project" / "mlir" / "include",
            ext / "farmhash_archive" / "src",
            ext / "stablehlo",
            ext / "shardy",
            ext / "com_googlesource_code_re2",
            ext / "highwayhash",
            llvm / f"llvm-{self.header_set.llvm_major}",
            llvm / f"llvm-c-{self.header_set.llvm_major}",
            self.root / "torch",
            self.root / "torch" / "torch" / "csrc" / "api" / "include",
        )

    @property
    def torchgen(self) -> Path:
        """The torch wheel's ``torchgen`` package (torch_xla's codegen imports it)."""
        return self.root / "python"


def headers_dir_name(header_set: HeaderSet) -> str:
    pins = f"{header_set.tensorflow} {TORCH_VERSION} {header_set.llvm.url} {header_set.llvm.sha256}"
    return f"headers-{header_set.name}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}"


def ensure_headers(cache_dir: Path, header_set: HeaderSet, network: NetworkPolicy) -> Headers:
    """``header_set`` unpacked in the machine cache (fetched and unpacked when missing)."""
    base = cache_dir / SUBDIR
    name = headers_dir_name(header_set)

    def make(staging: Path) -> dict[str, object]:
        wheels = base / "wheels"
        tensorflow = pip_download(f"tensorflow-cpu=={header_set.tensorflow}", wheels)
        torch = pip_download(f"torch=={TORCH_VERSION}", wheels)
        deb = download(header_set.llvm, base / "debs", network)
        log.info(f"unpacking the XLA headers of {tensorflow.name}")
        _unzip(tensorflow, staging / "xla", _tf_member)
        log.info(f"unpacking torch's headers and torchgen from {torch.name}")
        _unzip(torch, staging / "torch", _torch_member)
        _unzip(torch, staging / "python", _torchgen_member)
        with tempfile.TemporaryDirectory(prefix="llvm-", dir=staging) as scratch:
            unpack(deb, Path(scratch))
            include = Path(scratch) / "usr" / "include"
            (staging / "llvm").mkdir()
            for entry in include.iterdir():
                shutil.move(str(entry), staging / "llvm" / entry.name)
        return {
            "header_set": asdict(header_set),
            "tensorflow": _file_record(tensorflow),
            "torch": _file_record(torch),
        }

    root = make_once(base / name, make, marker=MARKER, doing=f"unpacking {name}")
    identity = hashlib.sha256((root / MARKER).read_bytes()).hexdigest()
    return Headers(root, header_set, identity)


def _file_record(path: Path) -> dict[str, str]:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"file": path.name, "sha256": digest.hexdigest()}


def _tf_member(name: str) -> str | None:
    if not name.startswith(_TF_PREFIX):
        return None
    rest = name[len(_TF_PREFIX) :]
    if rest.startswith(_TF_TOP):
        return rest
    if rest.startswith("external/") and rest[len("external/") :].startswith(_TF_EXTERNAL):
        return rest
    return None


def _torch_member(name: str) -> str | None:
    if not name.startswith(_TORCH_PREFIX):
        return None
    rest = name[len(_TORCH_PREFIX) :]
    # Not the protobuf the XLA .pb.h files were generated with.
    return None if rest.startswith("google/") else rest


def _torchgen_member(name: str) -> str | None:
    return name if name.startswith("torchgen/") else None


def _unzip(wheel: Path, dest: Path, rename: Callable[[str], str | None]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                target = rename(info.filename)
                if target is None or info.is_dir() or ".." in Path(target).parts:
                    continue
                info.filename = target
                archive.extract(info, dest)
    except (zipfile.BadZipFile, OSError) as error:
        raise ToolchainError(
            f"cannot unpack {wheel}: {error}", fix=f"delete {wheel} and run again"
        ) from None


def pip_download(requirement: str, dest: Path) -> Path:
    """The wheel of ``requirement`` (one exact pin) in ``dest``, fetched by pip if absent."""
    name, _, version = requirement.partition("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    if found := sorted(dest.glob(f"{stem}*.whl")):
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest) as staging:
        argv = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--python-version", WHEEL_PYTHON,
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64", "--dest", staging, requirement,
        ]  # fmt: skip
        # A failure is CommandFailed (exit 1) with pip's last lines; a hang, StepTimedOut.
        runner.run(argv, echo="terminal", output="capture", timeout=PIP_TIMEOUT_S,
                   timeout_fix="check that PyPI is reachable, then run it again",
                   fix="check that PyPI is reachable (a proxy: set https_proxy)")  # fmt: skip
        wheels = sorted(Path(staging).glob("*.whl"))
        if len(wheels) != 1:
            raise ToolchainError(
                f"pip download {requirement} gave {len(wheels)} wheel(s), not one",
                fix="check the index pip uses (pip config list)",
            )
        # The rename is the commit point: a half-downloaded wheel never has its name.
        target = dest / wheels[0].name
        wheels[0].rename(target)
    return target
