"""The one options reader of the pipeline: command line, then environment, then default.

As in cibuildwheel's ``options.py``, every setting is read here, once, at the CLI edge,
from the parsed arguments and an ``environ`` mapping the caller passes in (the CLI passes
``os.environ``, tests pass a dict). Stages receive the frozen objects built here and never
read the environment for a setting themselves.

Naming rule: a setting spelled ``--NAME`` on the command line is ``XLA_WHEELS_<NAME>`` in
the environment, NAME upper-cased with dashes as underscores and a trailing ``-dir``
dropped: ``--engine`` is ``XLA_WHEELS_ENGINE``, ``--cache-dir`` is ``XLA_WHEELS_CACHE``,
``--dry-run`` is ``XLA_WHEELS_DRY_RUN``. :func:`env_var` is the rule; :data:`ENV_SETTINGS`
lists the flags the environment can give (the others, such as the gate's, are flags
only), and the README's settings table lists them with their defaults.

The Makefile's short variables (``BUNDLE``, ``ENGINE``, ``JOBS``, ...) become
command-line flags in one place in the Makefile, which holds no default of its own: the
defaults are here and in the dataclasses below.

The remote compile caches' settings (``XLA_WHEELS_BUILDER_ROLE``,
``XLA_WHEELS_BAZEL_REMOTE_*``, ``XLA_WHEELS_CCACHE_REMOTE_*``, ``XLA_WHEELS_BUILDERS_CONFIG``)
and their credentials are read by :mod:`xla_wheels.builder.remote_cache` from the
``environ`` mapping :func:`build_config` passes it, after ``build/builders.toml``: that
module owns the file, the precedence between file and environment, and the secrets (which
never become flags). ``--bazel-remote-cache`` on the command line overrides both.

Read from the environment besides our own settings, because they belong to other tools:
``XDG_CACHE_HOME`` and ``HOME`` (where the per-machine cache lives) and ``PIP_INDEX_URL``
(pip's own mirror setting, passed on to the build's pip commands).
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from xla_wheels.errors import UsageError

if TYPE_CHECKING:
    from xla_wheels.builder.config import BuildConfig

ENV_PREFIX = "XLA_WHEELS_"


def env_var(flag: str) -> str:
    """The environment variable of the setting spelled ``flag`` on the command line."""
    name = flag.lstrip("-").removesuffix("-dir")
    return ENV_PREFIX + name.upper().replace("-", "_")


#: Every setting the environment can give, with its flag (the README lists the same).
ENV_SETTINGS: tuple[str, ...] = (
    "--root",
    "--cache-dir",
    "--out-dir",
    "--mirror",
    "--dry-run",
    "--progress-interval",
    "--mode",
    "--engine",
    "--image",
    "--jobs",
    "--host-python",
    "--bazel-remote-cache",
    "--ship-check",
    "--keep-recorded",
    "--build-tag",
    "--index-url",
    "--upload-url",
    "--no-deps",
    "--deps-from",
    "--role",
    "--signing-key",
    "--public-key",
    "--builder-id",
)


class Settings:
    """One lookup: the parsed flag if given, else ``XLA_WHEELS_<NAME>``, else None."""

    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self._args = args
        self._environ = environ

    def text(self, flag: str) -> str | None:
        value = getattr(self._args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None and value != "":
            return str(value)
        return self._environ.get(env_var(flag)) or None

    def path(self, flag: str) -> Path | None:
        value = self.text(flag)
        return Path(value).expanduser() if value else None

    def switch(self, flag: str) -> bool:
        value = getattr(self._args, flag.lstrip("-").replace("-", "_"), None)
        if isinstance(value, bool) and value:
            return True
        return _truthy(self._environ.get(env_var(flag)))


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def machine_cache(environ: Mapping[str, str]) -> Path:
    """Per-machine cache (sources, environments): survives ``git clean`` of the repo.

    ``$XLA_WHEELS_CACHE``, else ``$XDG_CACHE_HOME/xla-wheels``, else
    ``~/.cache/xla-wheels``. The pipeline and the gate both call this, so ``make wheels``
    and ``make gate`` share one cache.
    """
    if value := environ.get(env_var("--cache-dir")):
        return Path(value).expanduser()
    if base := environ.get("XDG_CACHE_HOME"):
        return Path(base).expanduser() / "xla-wheels"
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".cache" / "xla-wheels"


@dataclass(frozen=True)
class PipelineOptions:
    root: Path
    """The project checkout: build/bundles, patches/ and wheels.lock live here."""
    cache_dir: Path
    out_dir: Path
    """Per-build work (worktrees, logs): ``out/<bundle>/``; never shipped."""
    mirror: str | None
    """Directory of bare repositories or URL prefix replacing each remote's host."""
    dry_run: bool
    progress_interval: float = 30.0
    """Seconds between heartbeat lines of a long fetch off a terminal (0: none)."""

    @property
    def lock_path(self) -> Path:
        return self.root / "wheels.lock"

    @property
    def source_cache(self) -> Path:
        return self.cache_dir / "sources"


def pipeline_options(args: argparse.Namespace, environ: Mapping[str, str]) -> PipelineOptions:
    settings = Settings(args, environ)
    if not hasattr(args, "dry_run") and _truthy(environ.get(env_var("--dry-run"))):
        # The environment asks for a dry run of a subcommand that has none: running it for
        # real would act behind the user's back.
        raise UsageError(
            f"{getattr(args, 'command', None) or 'this subcommand'} has no dry run, and "
            f"{env_var('--dry-run')} is set",
            fix=f"unset {env_var('--dry-run')} to run it for real",
        )
    root = (settings.path("--root") or Path(".")).resolve()
    if not (root / "build" / "bundles").is_dir():
        raise UsageError(
            f"{root} is not a project checkout (no build/bundles directory)",
            fix="run from the repository root or pass --root",
        )
    return PipelineOptions(
        root=root,
        cache_dir=(settings.path("--cache-dir") or machine_cache(environ)).resolve(),
        out_dir=(settings.path("--out-dir") or root / "out").resolve(),
        mirror=settings.text("--mirror"),
        dry_run=settings.switch("--dry-run"),
        progress_interval=_interval(settings.text("--progress-interval")),
    )


def _interval(text: str | None) -> float:
    if text is None:
        return PipelineOptions.progress_interval
    try:
        return max(float(text), 0.0)
    except ValueError:
        raise UsageError(
            f"progress interval {text!r} is not a number of seconds",
            fix="pass --progress-interval 30 (or 0 for none), or unset "
            + env_var("--progress-interval"),
        ) from None


def build_config(args: argparse.Namespace, environ: Mapping[str, str]) -> BuildConfig:
    """The build stage's settings (``make wheels``, ``make builder-image``)."""
    # Imported here, not at the top: the gate's subcommands read their options from this
    # module too and must not load the build stage's modules.
    from xla_wheels.builder.config import ENGINES, MODES, BuildConfig
    from xla_wheels.builder.remote_cache import load_remote_cache

    settings = Settings(args, environ)
    defaults = BuildConfig()
    mode = settings.text("--mode") or defaults.mode
    engine = settings.text("--engine") or defaults.engine
    if mode not in MODES:
        raise UsageError(
            f"{env_var('--mode')}={mode} is not one of {', '.join(MODES)}",
            fix=f"pass --mode {MODES[0]} or --mode {MODES[1]} (make: BUILD_MODE=)",
        )
    if engine not in ENGINES:
        raise UsageError(
            f"{env_var('--engine')}={engine} is not one of {', '.join(ENGINES)}",
            fix=f"pass --engine {'|'.join(ENGINES)} (make: ENGINE=)",
        )
    jobs_text = settings.text("--jobs")
    try:
        jobs = int(jobs_text) if jobs_text else (os.cpu_count() or 1)
    except ValueError:
        raise UsageError(
            f"jobs {jobs_text!r} is not a number", fix="pass --jobs N (make: JOBS=N)"
        ) from None
    if jobs < 1:
        raise UsageError(f"jobs={jobs} must be at least 1", fix="pass --jobs 1 or more")
    compiler_env = defaults.compiler_env
    if args.compiler_env is not None:
        pairs = []
        for item in shlex.split(args.compiler_env):
            name, equals, value = item.partition("=")
            if not equals or not name:
                raise UsageError(
                    f"compiler environment entry {item!r} is not NAME=VALUE",
                    fix='write e.g. "CC=clang CXX=clang++"',
                )
            pairs.append((name, value))
        compiler_env = tuple(pairs)
    pip_index = environ.get("PIP_INDEX_URL")
    return BuildConfig(
        mode=mode,
        engine=engine,
        image=settings.text("--image") or defaults.image,
        jobs=jobs,
        host_python=settings.text("--host-python") or defaults.host_python,
        container_python=args.container_python or defaults.container_python,
        bazel_disk_cache=args.bazel_disk_cache,
        remote_cache=load_remote_cache(
            (settings.path("--root") or Path(".")).resolve(),
            environ,
            bazel_cache_override=args.bazel_remote_cache or None,
        ),
        pip_args=tuple(shlex.split(args.pip_args)) if args.pip_args else (),
        ship_check=settings.text("--ship-check") or defaults.ship_check,
        ship_pip_args=(
            tuple(shlex.split(args.ship_pip_args))
            if args.ship_pip_args is not None
            else defaults.ship_pip_args
        ),
        compiler_env=compiler_env,
        min_disk_gib=_pick(args.min_disk_gib, defaults.min_disk_gib),
        mem_per_job_gib=_pick(args.mem_per_job_gib, defaults.mem_per_job_gib),
        mem_base_gib=_pick(args.mem_base_gib, defaults.mem_base_gib),
        host_tools=(
            tuple(t for t in args.host_tools.split(",") if t)
            if args.host_tools is not None
            else defaults.host_tools
        ),
        extra_env=(("PIP_INDEX_URL", pip_index),) if pip_index else (),
        # The reproducible-builds standard variable, read as every tool reads it.
        source_date_epoch=_epoch(environ.get("SOURCE_DATE_EPOCH") or None),
        keep_recorded=settings.switch("--keep-recorded"),
        build_tag=_build_tag(settings.text("--build-tag")),
    )


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
            f"build tag {text!r} is not a number (PEP 427: a build tag starts with a digit; "
            "this pipeline uses plain build numbers)",
            fix="give a number higher than any recorded for this wheel, e.g. BUILD_TAG=1",
        )
    return text


def _pick(value: float | None, default: float) -> float:
    return default if value is None else value


@dataclass(frozen=True)
class PublishOptions:
    """Settings of publish, requirements, verify-install and doctor."""

    index_url: str | None
    """The index's simple/ URL; a URL, never a secret (credentials: TWINE_* or keyring)."""
    upload_url: str | None
    python: str | None
    no_deps: bool
    deps_from: str | None
    role: str | None


def publish_options(args: argparse.Namespace, environ: Mapping[str, str]) -> PublishOptions:
    settings = Settings(args, environ)
    return PublishOptions(
        index_url=settings.text("--index-url"),
        upload_url=settings.text("--upload-url"),
        python=getattr(args, "python", None) or None,
        no_deps=settings.switch("--no-deps"),
        deps_from=settings.text("--deps-from"),
        role=settings.text("--role"),
    )


@dataclass(frozen=True)
class SupplyOptions:
    """Settings of the signed attestations (``xla_wheels.supply.attest``)."""

    signing_key: Path | None
    """The team's private key (PEM): a path, never the key; never printed."""
    public_key: Path | None
    """The team's public key (PEM) that verify-install and doctor verify with."""
    builder_id: str
    """The builder identity written into each attestation (a URI)."""


def supply_options(args: argparse.Namespace, environ: Mapping[str, str]) -> SupplyOptions:
    from xla_wheels.supply.attest import DEFAULT_BUILDER_ID

    settings = Settings(args, environ)
    return SupplyOptions(
        signing_key=settings.path("--signing-key"),
        public_key=settings.path("--public-key"),
        builder_id=settings.text("--builder-id") or DEFAULT_BUILDER_ID,
    )
