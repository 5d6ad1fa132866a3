"""The one configuration object of the build stage, read once at the CLI edge.

Like ``options.PipelineOptions`` (command line, then environment, then default) and like
JAX's ``build/build.py``, every command of the build is composed from this object, so the
DRY_RUN plan and the real run cannot drift apart.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from xla_wheels.builder.remote_cache import RemoteCache, load_remote_cache
from xla_wheels.errors import UsageError

ENGINES = ("docker", "podman", "buildah")
MODES = ("container", "host")
DEFAULT_IMAGE = "localhost/xla-wheels-builder:latest"

# The gate's CPU checks (src/xla_wheels/gate, exit 0 pass / 1 fail / 2 unusable) run on the
# freshly built wheels in a clean environment: warm restart, its SPMD variant, cache-key
# safety, same numbers, and upstream's own test/test_persistent_cache.py taken from the very
# torch_xla tree being built (device skips lifted on a copy). Placeholders: {python} (the
# clean environment's interpreter), {wheels} (the staging directory), {out} (a report
# directory), {torch_xla_src} (the torch_xla source tree of this build). {builder_python}
# is the image's interpreter, which has the pipeline's own dependencies.
DEFAULT_SHIP_CHECK = (
    "{builder_python} -m xla_wheels gate --python {python} --device CPU "
    "--checks restart,spmd-restart,cache-key,same-numbers "
    "--upstream-tests {torch_xla_src} --out {out}"
)
# What the clean environment installs besides our wheels comes from the normal index
# (numpy, pyyaml, ... that torch and torch_xla require); PIP_INDEX_URL points at a mirror.
DEFAULT_SHIP_PIP_ARGS = ("--find-links", "{wheels}")

# Rough needs of a real torch + torch_xla build (torch objects, Bazel output base, the
# OpenXLA tree): clang/nvcc-free but still about 3-4 GiB per compile job at the peak.
DEFAULT_MIN_DISK_GIB = 80.0
DEFAULT_MEM_PER_JOB_GIB = 4.0
DEFAULT_MEM_BASE_GIB = 4.0


@dataclass(frozen=True)
class BuildConfig:
    mode: str = "container"
    engine: str = "docker"
    image: str = DEFAULT_IMAGE
    jobs: int = 2
    host_python: str = "python3"
    """Interpreter that runs the recipes in host mode (the bundle's Python)."""
    container_python: str = "python3"
    """Interpreter on the builder image's PATH."""
    bazel_disk_cache: Path | None = None
    """Default: <cache>/bazel-disk."""
    remote_cache: RemoteCache = field(default_factory=RemoteCache)
    """Shared compile caches and this builder's role (build/builders.toml + environment)."""
    pip_args: tuple[str, ...] = ()
    """Extra arguments for pip when installing build requirements (index, find-links)."""
    ship_check: str = DEFAULT_SHIP_CHECK
    ship_pip_args: tuple[str, ...] = DEFAULT_SHIP_PIP_ARGS
    compiler_env: tuple[tuple[str, str], ...] = (("CC", "clang"), ("CXX", "clang++"))
    min_disk_gib: float = DEFAULT_MIN_DISK_GIB
    mem_per_job_gib: float = DEFAULT_MEM_PER_JOB_GIB
    mem_base_gib: float = DEFAULT_MEM_BASE_GIB
    host_tools: tuple[str, ...] = ("git", "patch", "bazel", "clang", "clang++")
    remote_timeout: float = 8.0
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Passed to every recipe command (e.g. PIP_INDEX_URL for a mirror)."""
    source_date_epoch: int | None = None
    """SOURCE_DATE_EPOCH for the wheels' dates; None: the torch_xla commit's date."""
    keep_recorded: bool = False
    """A rebuilt wheel whose bytes differ from the recorded one: keep the recorded file."""
    build_tag: str | None = None
    """PEP 427 build tag (a number) given to a rebuilt wheel whose bytes differ."""

    def disk_cache(self, cache_dir: Path) -> Path:
        return self.bazel_disk_cache or cache_dir / "bazel-disk"

    @property
    def python(self) -> str:
        return self.host_python if self.mode == "host" else self.container_python


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("build stage")
    group.add_argument("--mode", choices=MODES, default=None, help="container (default) or host")
    group.add_argument("--engine", choices=ENGINES, default=None, help="container engine")
    group.add_argument("--image", default=None, help=f"builder image (default {DEFAULT_IMAGE})")
    group.add_argument("--jobs", type=int, default=None, help="compile jobs (default: cores)")
    group.add_argument("--host-python", default=None, help="interpreter for BUILD_MODE=host")
    group.add_argument("--container-python", default=None, help="interpreter in the image")
    group.add_argument("--bazel-disk-cache", type=Path, default=None)
    group.add_argument(
        "--bazel-remote-cache",
        default=None,
        help="grpc(s):// or http(s):// URL; overrides build/builders.toml [bazel] remote_cache",
    )
    group.add_argument(
        "--pip-args", default=None, help="extra pip arguments for build requirements (quoted)"
    )
    group.add_argument(
        "--ship-check",
        default=None,
        help="command run on the staged wheels in a clean environment; placeholders "
        "{python} {wheels} {out} {builder_python} {torch_xla_src} (default: the gate's CPU "
        "restart, spmd-restart, cache-key and same-numbers checks and upstream's cache test)",
    )
    group.add_argument("--ship-pip-args", default=None, help="pip arguments for the clean env")
    group.add_argument("--min-disk-gib", type=float, default=None)
    group.add_argument("--mem-per-job-gib", type=float, default=None)
    group.add_argument("--mem-base-gib", type=float, default=None)
    group.add_argument(
        "--host-tools", default=None, help="comma-separated tools BUILD_MODE=host needs"
    )
    group.add_argument("--compiler-env", default=None, help="e.g. 'CC=clang CXX=clang++'")
    group.add_argument(
        "--keep-recorded",
        action="store_true",
        default=None,
        help="when a rebuilt wheel differs from the one wheels.lock records, keep the "
        "recorded file (env KEEP_RECORDED=1)",
    )
    group.add_argument(
        "--build-tag",
        default=None,
        help="PEP 427 build number for a rebuilt wheel that differs from the recorded one "
        "(env BUILD_TAG)",
    )


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def build_config_from_args(args: argparse.Namespace) -> BuildConfig:
    """Command line first, then the environment the Makefile exports, then defaults."""
    mode = args.mode or _env("BUILD_MODE") or "container"
    engine = args.engine or _env("ENGINE") or "docker"
    if mode not in MODES:
        raise UsageError(f"BUILD_MODE={mode} is not one of {', '.join(MODES)}")
    if engine not in ENGINES:
        raise UsageError(f"ENGINE={engine} is not one of {', '.join(ENGINES)}")
    jobs_text = args.jobs or _env("JOBS")
    jobs = int(jobs_text) if jobs_text else (os.cpu_count() or 1)
    if jobs < 1:
        raise UsageError(f"JOBS={jobs} must be at least 1")
    defaults = BuildConfig()
    compiler = args.compiler_env if args.compiler_env is not None else None
    compiler_env = defaults.compiler_env
    if compiler is not None:
        pairs = []
        for item in shlex.split(compiler):
            name, equals, value = item.partition("=")
            if not equals or not name:
                raise UsageError(
                    f"compiler environment entry {item!r} is not NAME=VALUE",
                    fix='write e.g. "CC=clang CXX=clang++"',
                )
            pairs.append((name, value))
        compiler_env = tuple(pairs)
    tools = args.host_tools if args.host_tools is not None else None
    pip_index = _env("PIP_INDEX_URL")
    return BuildConfig(
        mode=mode,
        engine=engine,
        image=args.image or _env("BUILDER_IMAGE") or DEFAULT_IMAGE,
        jobs=jobs,
        host_python=args.host_python or _env("HOST_PYTHON") or defaults.host_python,
        container_python=args.container_python or defaults.container_python,
        bazel_disk_cache=args.bazel_disk_cache,
        remote_cache=load_remote_cache(
            _root(args), os.environ, bazel_cache_override=args.bazel_remote_cache
        ),
        pip_args=tuple(shlex.split(args.pip_args)) if args.pip_args else (),
        ship_check=args.ship_check or _env("SHIP_CHECK") or DEFAULT_SHIP_CHECK,
        ship_pip_args=(
            tuple(shlex.split(args.ship_pip_args))
            if args.ship_pip_args is not None
            else DEFAULT_SHIP_PIP_ARGS
        ),
        compiler_env=compiler_env,
        min_disk_gib=_pick(args.min_disk_gib, defaults.min_disk_gib),
        mem_per_job_gib=_pick(args.mem_per_job_gib, defaults.mem_per_job_gib),
        mem_base_gib=_pick(args.mem_base_gib, defaults.mem_base_gib),
        host_tools=(
            tuple(t for t in tools.split(",") if t) if tools is not None else defaults.host_tools
        ),
        extra_env=(("PIP_INDEX_URL", pip_index),) if pip_index else (),
        source_date_epoch=_epoch(_env("SOURCE_DATE_EPOCH")),
        keep_recorded=bool(getattr(args, "keep_recorded", None))
        or _env("KEEP_RECORDED") not in (None, "0"),
        build_tag=_build_tag(getattr(args, "build_tag", None) or _env("BUILD_TAG")),
    )


def _root(args: argparse.Namespace) -> Path:
    """The project checkout, as ``options.options_from_args`` finds it."""
    root = getattr(args, "root", None)
    return (root or Path(os.environ.get("XLA_WHEELS_ROOT", "."))).resolve()


def _epoch(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.strip().isdigit():
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text} is not a number of seconds since 1970",
            fix="unset it (the torch_xla commit's date is used) or give e.g. "
            "SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)",
        )
    return int(text)


def _build_tag(text: str | None) -> str | None:
    if text is None:
        return None
    if not text.isdigit():
        raise UsageError(
            f"BUILD_TAG={text} is not a number (PEP 427: a build tag starts with a digit; "
            "this pipeline uses plain build numbers)",
            fix="give a number higher than any recorded for this wheel, e.g. BUILD_TAG=1",
        )
    return text


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value
