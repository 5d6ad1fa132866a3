"""The pipeline's settings as values: the naming rule, the per-machine cache, the options.

Every setting is read once, at the CLI edge, by :mod:`xla_wheels.cli.settings` (command
line, then environment, then default), into the frozen objects defined here.

Naming rule: a setting spelled ``--NAME`` on the command line is ``XLA_WHEELS_<NAME>`` in
the environment, NAME upper-cased with dashes as underscores and a trailing ``-dir``
dropped: ``--engine`` is ``XLA_WHEELS_ENGINE``, ``--cache-dir`` is ``XLA_WHEELS_CACHE``,
``--dry-run`` is ``XLA_WHEELS_DRY_RUN``. :func:`env_var` is the rule; :data:`ENV_SETTINGS`
lists the flags the environment can give (the others, such as the gate's, are flags
only). Every setting is a row of :mod:`xla_wheels.settings_table`, which docs/settings.md's
settings table is written from.

Read from the environment here besides our own settings, because they belong to other
tools: ``XDG_CACHE_HOME`` and ``HOME`` (where the per-machine cache lives).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from xla_host.arguments import machine_cache as host_machine_cache
from xla_host.net import DEFAULT_NETWORK, NetworkPolicy
from xla_wheels.settings_rows import SETTINGS

ENV_PREFIX = "XLA_WHEELS_"


def env_var(flag: str) -> str:
    """The environment variable of the setting spelled ``flag`` on the command line."""
    name = flag.lstrip("-").removesuffix("-dir")
    return ENV_PREFIX + name.upper().replace("-", "_")


#: Every setting the environment can give with a flag (rows of the settings table).
ENV_SETTINGS: tuple[str, ...] = tuple(s.flag for s in SETTINGS if s.flag and s.env)


#: The ``XLA_WHEELS_*`` names the pipeline reads that are no setting, with the reader.
#: Together with the settings table's this is every name: any other ``XLA_WHEELS_*`` in
#: the environment is refused (a typo of ``XLA_WHEELS_DRY_RUN`` would otherwise run for
#: real). A new setting is a row of the table; a new name of another kind, one entry here.
ENV_OTHER_NAMES: dict[str, str] = {
    "XLA_WHEELS_MAKE_GOAL": "cli.from_make (set by the Makefile)",
    "XLA_WHEELS_MAKE_COMMAND_LINE": "cli.from_make (set by the Makefile)",
    "XLA_WHEELS_SECRETS_FILE": "builder.run_recipe (set inside the build)",
    "XLA_WHEELS_DOCKER_TEST_IMAGE": "tests/test_build_container.py",
    "XLA_WHEELS_ON_MISMATCH": "xla_host.entrypoint (the runtime image's jobs: refuse or warn)",
    "XLA_WHEELS_RECEIPTS_USERNAME": "xla_host.receipt_store (a WebDAV receipt store's account)",
    "XLA_WHEELS_RECEIPTS_PASSWORD": "xla_host.receipt_store (a WebDAV receipt store's account)",
}


def known_environment() -> frozenset[str]:
    """Every ``XLA_WHEELS_*`` name the pipeline reads."""
    return frozenset(s.env for s in SETTINGS if s.env) | frozenset(ENV_OTHER_NAMES)


def machine_cache(environ: Mapping[str, str]) -> Path:
    """Per-machine cache (sources, environments): survives ``git clean`` of the repo; the
    rule is the host side's (``xla_host.arguments.machine_cache``), the variable ours."""
    return host_machine_cache(environ, env_var("--cache-dir"))


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
    network: NetworkPolicy = DEFAULT_NETWORK
    """Time limits and retries of every step that talks to another host."""

    @property
    def lock_path(self) -> Path:
        return self.root / "wheels.lock"

    @property
    def source_cache(self) -> Path:
        return self.cache_dir / "sources"

    @property
    def pip_cache(self) -> Path:
        """pip's cache for the build's steps, and where the pip of clean environments is
        unpacked once (:data:`xla_wheels.venv_check.BUNDLED_PIP_DIR`)."""
        return self.cache_dir / "pip"


@dataclass(frozen=True)
class PublishOptions:
    """Settings of publish, requirements, verify-install and doctor."""

    index_url: str | None
    """The index's simple/ URL; a URL, never a secret (credentials: TWINE_* or keyring)."""
    upload_url: str | None
    python: str | None
    no_deps: bool
    deps_from: str | None


@dataclass(frozen=True)
class SupplyOptions:
    """Settings of the signed attestations (``xla_wheels.attestation``)."""

    signing_key: Path | None
    """The team's private key (PEM): a path, never the key; never printed."""
    public_key: Path | None
    """The team's public key (PEM) that verify-install and doctor verify with."""
    builder_id: str
    """The builder identity written into each attestation (a URI)."""
