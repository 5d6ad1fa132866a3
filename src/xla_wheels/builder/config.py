"""The one configuration object of the build stage and its defaults.

Built once at the CLI edge by ``cli.settings.build_config``: a field named as a build row
of the settings table is that setting (command line, then its ``XLA_WHEELS_*`` variable,
then the row's default, which the field takes through ``default_value``). Like JAX's
``build/build.py``, every command of the build is composed from this object, so the
DRY_RUN plan and the real run cannot drift apart.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from xla_wheels.builder.remote_cache import RemoteCache
from xla_wheels.settings_rows import by_flag, default_of, default_value

# The choices and defaults of the build settings: their rows of the settings table.
ENGINES = by_flag("--engine").choices
MODES = by_flag("--mode").choices
DEFAULT_IMAGE = str(default_of("--image"))

# The gate's CPU checks (src/xla_wheels/gate, exit 0 pass / 1 fail / 2 unusable) run on the
# freshly built wheels in a clean environment: warm restart, its SPMD variant, cache-key
# safety, same numbers, and upstream's own test/test_persistent_cache.py taken from the very
# torch_xla tree being built (device skips lifted on a copy). Placeholders: {python} (the
# clean environment's interpreter), {wheels} (the staging directory), {out} (a report
# directory), {torch_xla_src} (the torch_xla source tree of this build). {builder_python}
# is the image's interpreter; the gate needs only its standard library, and runs from the
# host sources (xla_host), as a training host runs it.
DEFAULT_SHIP_CHECK = (
    "{builder_python} -m xla_host gate --python {python} --device CPU "
    "--checks restart,spmd-restart,cache-key,same-numbers "
    "--upstream-tests {torch_xla_src} --out {out}"
)


def cores() -> int:
    """The default of ``--jobs``, as its row says: the number of cores."""
    return os.cpu_count() or 1


@dataclass(frozen=True)
class BuildConfig:
    mode: str = default_value("--mode")
    engine: str = default_value("--engine")
    image: str = DEFAULT_IMAGE
    jobs: int = field(default_factory=cores)
    host_python: str = default_value("--host-python")
    """Interpreter that runs the recipes in host mode (the bundle's Python)."""
    container_python: str = default_value("--container-python")
    """Interpreter on the builder image's PATH."""
    bazel_disk_cache: Path | None = None
    """Default: <cache>/bazel-disk."""
    remote_cache: RemoteCache = field(default_factory=RemoteCache)
    """Shared compile caches and this builder's role (build/builders.toml + environment)."""
    pip_args: tuple[str, ...] = ()
    """Extra arguments for pip when installing build requirements (index, find-links)."""
    ship_check: str = DEFAULT_SHIP_CHECK
    ship_pip_args: tuple[str, ...] = default_value("--ship-pip-args")
    """What the clean environment installs besides our wheels comes from the normal index
    (numpy, pyyaml, ... that torch and torch_xla require); PIP_INDEX_URL points at a mirror."""
    compiler_env: tuple[tuple[str, str], ...] = default_value("--compiler-env")
    # Rough needs of a real torch + torch_xla build (torch objects, Bazel output base, the
    # OpenXLA tree): clang/nvcc-free but still about 3-4 GiB per compile job at the peak.
    min_disk_gib: float = default_value("--min-disk-gib")
    mem_per_job_gib: float = default_value("--mem-per-job-gib")
    mem_base_gib: float = default_value("--mem-base-gib")
    host_tools: tuple[str, ...] = default_value("--host-tools")
    remote_probe_timeout: float = default_value("--remote-probe-timeout")
    """Seconds the preflight waits for a source remote's ``git ls-remote``."""
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Passed to every recipe command (e.g. PIP_INDEX_URL for a mirror)."""
    source_date_epoch: int | None = None
    """SOURCE_DATE_EPOCH for the wheels' dates; None: the torch_xla commit's date."""
    keep_recorded: bool = False
    """A rebuilt wheel whose bytes differ from the recorded one: keep the recorded file."""
    build_tag: str | None = None
    """PEP 427 build tag (a number) given to a rebuilt wheel whose bytes differ."""


GIB = 1024**3


def mem_total_gib() -> float | None:
    """This machine's memory (Linux ``/proc/meminfo``), None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / GIB
    return None


def jobs_that_fit(
    mem_per_job_gib: float = BuildConfig.mem_per_job_gib,
    mem_base_gib: float = BuildConfig.mem_base_gib,
) -> int:
    """A JOBS value this machine takes, for a fix that can be run as it is: its cores, or
    fewer when its memory holds fewer compile jobs (never less than one)."""
    cores = os.cpu_count() or 1
    total = mem_total_gib()
    if total is None:
        return cores
    return max(1, min(cores, int((total - mem_base_gib) // mem_per_job_gib)))
