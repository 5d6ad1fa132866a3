"""Stock wheels' shared libraries from PyPI, extracted once per machine.

The controls of the ABI check are real PyPI releases: torch_xla 2.9.0 with torch 2.9.0
(nothing missing) and with torch 2.8.0 (five ``c10`` symbols missing). A Linux torch wheel
is about 900 MB, so each is downloaded once (``pip download --no-deps``), the few shared
libraries the check reads are extracted, and the wheel is deleted: the cache keeps only
``torch/lib/{libc10,libtorch,libtorch_cpu,libtorch_python}.so`` (~460 MB per torch) and
``_XLAC*.so`` (~305 MB), under ``${XLA_WHEELS_CACHE:-~/.cache/xla-wheels}/abi-libs/``.
Each entry is made by :func:`xla_host.waitlock.make_once` (one maker, the others wait).
"""

from __future__ import annotations

import shutil
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from xla_host import log, runner
from xla_host.waitlock import make_once
from xla_wheels.abi.pairs import EXTENSION, TORCH_LIB_DIR, AbiInputError, PairFiles

MARKER = "xla-wheels-abi-libs.json"
#: The torch libraries any released ``_XLAC`` names in DT_NEEDED (checked: 2.7-2.9).
TORCH_LIBRARIES = ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so")
DOWNLOAD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class StockWheel:
    project: str
    """``torch`` or ``torch_xla``."""
    version: str
    python_version: str = "3.11"
    platform: str = "manylinux_2_28_x86_64"
    """The tag of torch's and torch_xla's Linux x86_64 wheels on PyPI since 2.6."""

    @property
    def name(self) -> str:
        tag = "cp" + self.python_version.replace(".", "")
        return f"{self.project}-{self.version}-{tag}-{self.platform}"


def ensure_stock_libraries(wheel: StockWheel, *, root: Path) -> Path:
    """The directory holding the wheel's extracted libraries, building it first if needed.

    ``root`` is the per-machine cache (the CLI passes ``options.machine_cache``).
    """

    def build(tmp: Path) -> dict[str, object]:
        with log.section(f"extract the shared libraries of {wheel.name} (once per machine)"):
            return _build(wheel, tmp)

    return make_once(
        root / "abi-libs" / wheel.name, build, marker=MARKER, doing=f"extracting {wheel.name}"
    )


def _build(wheel: StockWheel, tmp: Path) -> dict[str, object]:
    download = tmp / "download"
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--python-version", wheel.python_version,
        "--platform", wheel.platform, f"{wheel.project}=={wheel.version}", "-d", str(download),
    ]  # fmt: skip
    started = time.monotonic()
    try:
        runner.run(
            argv,
            timeout=DOWNLOAD_TIMEOUT_S,
            error=lambda result: AbiInputError(
                f"pip download of {wheel.project}=={wheel.version} failed: "
                f"{result.stderr.strip()[-500:]}",
                fix="check that PyPI is reachable and the version exists for "
                f"Python {wheel.python_version} on {wheel.platform}",
            ),
        )
    except (OSError, runner.StepTimedOut) as error:
        reason = error.message if isinstance(error, runner.StepTimedOut) else error
        raise AbiInputError(
            f"pip download of {wheel.project}=={wheel.version} failed: {reason}",
            fix="check that PyPI is reachable",
        ) from None
    files = sorted(download.glob("*.whl"))
    if len(files) != 1:
        raise AbiInputError(f"pip download left {len(files)} wheels in {download}")
    libraries = {f"{TORCH_LIB_DIR}/{name}" for name in TORCH_LIBRARIES}
    with zipfile.ZipFile(files[0]) as archive:
        extracted = [
            member
            for member in archive.namelist()
            if (EXTENSION.match(member) if wheel.project == "torch_xla" else member in libraries)
        ]
        for member in extracted:
            archive.extract(member, tmp)
    shutil.rmtree(download)  # keep only the libraries: a torch wheel is ~900 MB
    if not extracted:
        raise AbiInputError(f"{files[0].name} holds none of the libraries the check reads")
    return {
        "wheel": files[0].name,
        "spec": asdict(wheel),
        "members": extracted,
        "download_s": round(time.monotonic() - started, 1),
    }


def stock_pair(torch: str, torch_xla: str, *, root: Path) -> PairFiles:
    """The cached files of stock ``torch_xla==torch_xla`` next to stock ``torch==torch``."""
    xla_dir = ensure_stock_libraries(StockWheel("torch_xla", torch_xla), root=root)
    torch_dir = ensure_stock_libraries(StockWheel("torch", torch), root=root)
    extensions = [p for p in xla_dir.iterdir() if EXTENSION.match(p.name)]
    if len(extensions) != 1:
        raise AbiInputError(f"{xla_dir} holds {len(extensions)} _XLAC extensions, not one")
    return PairFiles(
        extension=extensions[0],
        torch_lib_dir=torch_dir / TORCH_LIB_DIR,
        torch_label=f"stock torch {torch} (PyPI)",
        torch_xla_label=f"stock torch_xla {torch_xla} (PyPI)",
    )
