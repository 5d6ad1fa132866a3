"""The builder's rows of the settings table, and the whole table: the host's rows
(:mod:`xla_host.settings`, which the host wheel carries, only those its commands read)
with these added, group by group.

Every module of the builder reads settings through this module's names (``SETTINGS``,
``by_flag``, ``Cascade``, ``add_settings``, ``default_value``, ...), which look in the
whole table; the host's modules read :mod:`xla_host.settings`, which holds only its own.
A row used by a host command goes there; any other, here. The docs' one table
(``docs/settings.md``) and ``make-variables.mk`` are written from the whole table
(``xla_wheels.settings_table``).

After changing a row: ``make generate``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from xla_host import arguments as host_arguments
from xla_host import settings as host_settings
from xla_host.settings import GROUPS, ConfigFile, Per, Setting, Table

__all__ = [
    "BUILDING", "GROUPS", "SETTINGS", "TABLE", "Cascade", "ConfigFile", "Per", "Setting",
    "add_settings", "by_env", "by_flag", "by_key", "default_of", "default_value", "env_of",
    "file_keys", "in_group", "where",
]  # fmt: skip


def _s(group: str, help: str, **fields: object) -> Setting:
    return Setting(group, help, **fields)  # type: ignore[arg-type]


#: The subcommands that take the build stage's flags (cli.stages.add_build_arguments).
BUILDING = ("wheels", "rebuild-check", "builder-image")

# The builder's rows. Order: as make help and the settings table show them, group by group
# (the host's rows of a group come first).
ROWS: tuple[Setting, ...] = (
    # --- where the pipeline works -------------------------------------------------------
    _s("common", "project checkout", flag="--root", env="XLA_WHEELS_ROOT", kind="path",
       default_text="the current directory"),
    _s("common", "per-machine cache", flag="--cache-dir", env="XLA_WHEELS_CACHE",
       kind="directory", default_text="$XDG_CACHE_HOME/xla-wheels, else ~/.cache/xla-wheels"),
    _s("common", "directory of bare repositories or URL prefix that replaces the remotes' "
       "host", flag="--mirror", make="MIRROR", env="XLA_WHEELS_MIRROR",
       default_text="none: the remotes themselves"),
    # --- bundle -------------------------------------------------------------------------
    _s("bundle", "bundle name (build/bundles/<name>.toml)", flag="--bundle", make="BUNDLE",
       default_text="(required; gate, bench-restart: none, the receipt goes to out/)"),
    _s("bundle", "print what would be done and change nothing", flag="--dry-run",
       make="DRY_RUN", env="XLA_WHEELS_DRY_RUN", kind="switch", default_text="off",
       commands=("sources", "patch", "wheels", "builder-image", "lock", "record", "patch-export",
                 "patch-rebase", "publish", "publish-lane", "promote", "rollback",
                 "runtime-image", "cache-pack")),
    _s("bundle", "the bundles to compare", make="A", commands=("diff", "compare"),
       default_text="(required)"),
    _s("bundle", "the second bundle", make="B", commands=("diff", "compare"),
       default_text="diff: A's parent; compare: (required)"),
    # --- build --------------------------------------------------------------------------
    _s("build", "where the recipes run: in the builder image, or on this host", flag="--mode",
       make="BUILD_MODE", env="XLA_WHEELS_MODE", choices=("container", "host"),
       commands=BUILDING, default="container"),
    _s("build", "container engine", flag="--engine", make="ENGINE", env="XLA_WHEELS_ENGINE",
       choices=("docker", "podman", "buildah"),
       commands=(*BUILDING, "runtime-image"), default="docker"),
    _s("build", "builder image", flag="--image", make="BUILDER_IMAGE", env="XLA_WHEELS_IMAGE",
       commands=BUILDING,
       default="localhost/xla-wheels-builder:latest"),
    _s("build", "compile jobs", flag="--jobs", make="JOBS", env="XLA_WHEELS_JOBS", kind="count",
       low=1, high=4096, commands=BUILDING,
       default_text="the number of cores"),
    _s("build", "interpreter for --mode host", flag="--host-python", make="HOST_PYTHON",
       env="XLA_WHEELS_HOST_PYTHON", commands=BUILDING, default="python3"),
    _s("build", "command run on the staged wheels in a clean environment; placeholders "
       "{python} {wheels} {out} {builder_python} {torch_xla_src}",
       flag="--ship-check", env="XLA_WHEELS_SHIP_CHECK", commands=BUILDING,
       default_text="the gate's CPU restart, spmd-restart, cache-key and same-numbers checks "
       "and upstream's cache test"),
    _s("build", "when a rebuilt wheel differs from the one wheels.lock records, keep the "
       "recorded file",
       flag="--keep-recorded", make="KEEP_RECORDED", env="XLA_WHEELS_KEEP_RECORDED",
       kind="switch", commands=BUILDING, default_text="off"),
    _s("build", "PEP 427 build number for a rebuilt wheel that differs from the recorded one",
       flag="--build-tag", make="BUILD_TAG", env="XLA_WHEELS_BUILD_TAG", commands=BUILDING,
       default_text="none: such a wheel is refused"),
    _s("build", "directory of wheels built elsewhere (a stock control, a builder fleet's "
       "output) to record as the bundle's, checked by name, tags, RECORD, SHA256SUMS when "
       "present, and provenance", flag="--wheels", make="WHEELS", kind="path",
       commands=("record",), default_text="none: required"),
    _s("build", "interpreter in the image", flag="--container-python",
       env="XLA_WHEELS_CONTAINER_PYTHON", commands=BUILDING, default="python3"),
    _s("build", "Bazel's disk cache directory", flag="--bazel-disk-cache", kind="path",
       env="XLA_WHEELS_BAZEL_DISK_CACHE", commands=BUILDING,
       default_text="bazel-disk in the per-machine cache"),
    _s("build", "extra pip arguments for build requirements (quoted)", flag="--pip-args",
       env="XLA_WHEELS_PIP_ARGS", kind="arguments", commands=BUILDING, default="",
       default_text="none"),
    _s("build", "pip arguments for the ship check's clean environment (quoted)",
       flag="--ship-pip-args", env="XLA_WHEELS_SHIP_PIP_ARGS", kind="arguments",
       commands=BUILDING, default="--find-links '{wheels}'"),
    _s("build", "seconds the preflight waits for a source remote's `git ls-remote` when the "
       "source cache lacks a pinned commit (a slow proxy: give it longer)",
       flag="--remote-probe-timeout", env="XLA_WHEELS_REMOTE_PROBE_TIMEOUT", kind="amount",
       low=1, high=3600, unit="s", default=8.0, commands=BUILDING),
    _s("build", "free disk the build needs before it starts", flag="--min-disk-gib",
       env="XLA_WHEELS_MIN_DISK_GIB", kind="amount", low=0, high=100_000, unit="GiB",
       default=80.0, commands=BUILDING),
    _s("build", "memory one compile job needs: the preflight refuses more jobs than fit",
       flag="--mem-per-job-gib", env="XLA_WHEELS_MEM_PER_JOB_GIB", kind="amount", low=0,
       high=100_000, unit="GiB", default=4.0, commands=BUILDING),
    _s("build", "memory the build needs besides its jobs", flag="--mem-base-gib",
       env="XLA_WHEELS_MEM_BASE_GIB", kind="amount", low=0, high=100_000, unit="GiB",
       default=4.0, commands=BUILDING),
    _s("build", "comma-separated tools --mode host needs", flag="--host-tools",
       env="XLA_WHEELS_HOST_TOOLS", kind="names", commands=BUILDING,
       default="git,patch,bazel,clang,clang++"),
    _s("build", "compilers of the build, quoted NAME=VALUE pairs", flag="--compiler-env",
       env="XLA_WHEELS_COMPILER_ENV", kind="assignments", commands=BUILDING,
       default="CC=clang CXX=clang++"),
    _s("build", "Dockerfile ARGs as NAME=VALUE words, each passed as --build-arg: "
       "BASE_IMAGE, LLVM_APT_BASE, BAZELISK_BASE_URL point the build at mirrors",
       flag="--build-arg", make="BUILD_ARGS", kind="words", metavar="NAME=VALUE",
       commands=("builder-image",), default_text="none"),
    _s("build", "the reproducible-builds timestamp of the wheels, seconds since 1970",
       make="SOURCE_DATE_EPOCH", commands=("wheels", "rebuild-check"),
       default_text="the torch_xla commit's date"),
    # --- remote compile caches ----------------------------------------------------------
    _s("remote-cache", "grpc(s):// or http(s):// URL of the Bazel remote cache",
       flag="--bazel-remote-cache", env="XLA_WHEELS_BAZEL_REMOTE_CACHE",
       file_key="bazel.remote_cache", commands=BUILDING,
       default_text="build/builders.toml [bazel] remote_cache, else none (local disk cache "
       "only)"),
    _s("remote-cache", "seconds Bazel waits for one call to the remote cache or executor "
       "(Bazel's --remote_timeout): a cache that does not answer costs this much per call",
       flag="--bazel-remote-timeout", make="BAZEL_REMOTE_TIMEOUT",
       env="XLA_WHEELS_BAZEL_REMOTE_TIMEOUT", kind="count", low=1, high=3600, example=10,
       commands=BUILDING, default_text="Bazel's own, 60"),
    _s("remote-cache", "grpc(s):// URL of a Bazel remote executor",
       env="XLA_WHEELS_BAZEL_REMOTE_EXECUTOR", file_key="bazel.remote_executor",
       default_text="build/builders.toml [bazel] remote_executor, else none"),
    _s("remote-cache", "Bazel's --remote_instance_name",
       env="XLA_WHEELS_BAZEL_REMOTE_INSTANCE_NAME", file_key="bazel.remote_instance_name",
       default_text="build/builders.toml [bazel] remote_instance_name, else none"),
    _s("remote-cache", "Bazel remote headers, one NAME=VALUE a line",
       env="XLA_WHEELS_BAZEL_REMOTE_HEADER", secret=True),
    _s("remote-cache", "a file (mode 0600) holding the Bazel remote headers",
       env="XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE"),
    _s("remote-cache", "ccache's remote storage URL, redis:// or http://",
       env="XLA_WHEELS_CCACHE_REMOTE_STORAGE", file_key="ccache.remote_storage",
       default_text="build/builders.toml [ccache] remote_storage, else none"),
    _s("remote-cache", "ccache's remote storage user", env="XLA_WHEELS_CCACHE_REMOTE_USERNAME",
       file_key="ccache.remote_username",
       default_text="build/builders.toml [ccache] remote_username, else none"),
    _s("remote-cache", "ccache's remote storage password",
       env="XLA_WHEELS_CCACHE_REMOTE_PASSWORD", secret=True),
    _s("remote-cache", "a file (mode 0600) holding ccache's remote storage password",
       env="XLA_WHEELS_CCACHE_REMOTE_PASSWORD_FILE"),
    _s("remote-cache", "this builder's role: the writer uploads, readers never do",
       env="XLA_WHEELS_BUILDER_ROLE", file_key="builder.role", default="reader",
       default_text="build/builders.toml [builder] role, else reader"),
    _s("remote-cache", "the builders file", env="XLA_WHEELS_BUILDERS_CONFIG",
       default_text="<root>/build/builders.toml"),
    # --- patches ------------------------------------------------------------------------
    _s("patches", "git checkout (bare or not) holding the pinned commit, to check the series "
       "against", flag="--source", kind="path", make="TORCH_XLA_SRC",
       commands=("patches-check", "series-compile"),
       default_text="the source cache, fetching if needed"),
    _s("patches", "the XLA headers series-compile compiles against: a tensorflow-cpu wheel's "
       "(tf-2.20: the nearest to the pinned OpenXLA; tf-2.21: newer)", flag="--xla-headers",
       make="XLA_HEADERS", commands=("series-compile",), choices=("tf-2.20", "tf-2.21"),
       default="tf-2.20"),
    _s("patches", "the component whose series it is", flag="--component",
       make="COMPONENT", commands=("patch-export", "patch-rebase", "patches-check"),
       choices=("torch", "torch_xla", "openxla"), default="torch_xla"),
    _s("patches", "overwrite patch files edited by hand since the patch stage applied them",
       flag="--force", make="FORCE", kind="switch", commands=("patch-export",),
       default_text="off"),
    _s("patches", "the commit to carry the series onto", flag="--onto", make="ONTO",
       commands=("patch-rebase",)),
    _s("patches", "continue a rebase after resolving a conflict", flag="--continue",
       make="CONTINUE", kind="switch", commands=("patch-rebase",), default_text="off"),
    # --- publish ------------------------------------------------------------------------
    _s("publish", "where wheels are", flag="--dist-dir", kind="path",
       commands=("publish", "requirements", "verify-install"), default_text="<root>/dist"),
    _s("publish", "the index's simple/ URL; credentials: TWINE_USERNAME/TWINE_PASSWORD or "
       "keyring, never in the URL", flag="--index-url", make="INDEX_URL",
       env="XLA_WHEELS_INDEX_URL", commands=("publish", "verify-install"),
       default_text="none: a static index in dist/<bundle>/simple/"),
    _s("publish", "twine's --repository-url", flag="--upload-url", make="UPLOAD_URL",
       env="XLA_WHEELS_UPLOAD_URL", commands=("publish",),
       default_text="the index URL without its trailing simple/"),
    _s("publish", "install only our wheels, with pip --no-deps", flag="--no-deps", make="NO_DEPS",
       env="XLA_WHEELS_NO_DEPS", kind="switch", commands=("verify-install",),
       default_text="off"),
    _s("publish", "python of an environment whose packages (torch) the import may use",
       flag="--deps-from", make="DEPS_FROM",
       env="XLA_WHEELS_DEPS_FROM", commands=("verify-install",)),
    _s("publish", "fail when the installed torch_xla has no provenance file",
       flag="--require-provenance", kind="switch", commands=("verify-install",),
       default_text="off"),
    _s("publish", "where requirements writes", flag="--output", kind="path",
       commands=("requirements",), default_text="dist/<bundle>/requirements.txt"),
    _s("publish", "resolve the public wheels again even if wheels.lock has them",
       flag="--refresh", make="REFRESH", kind="switch", commands=("requirements",),
       default_text="off"),
    _s("publish", "platform tag of the hosts, repeatable", flag="--platform", kind="repeated",
       commands=("requirements", "lane-requirements"),
       default_text="the tags a TPU VM accepts: manylinux_2_35..2_17 and linux, x86_64"),
    # --- lanes --------------------------------------------------------------------------
    _s("lanes", "the lane", flag="--lane", make="LANE",
       commands=("publish-lane", "promote", "lane-requirements", "doctor", "rollback", "lanes",
                 "runtime-image", "cache-pack"),
       default_text="per subcommand: the publish lane of build/lanes.toml, preferred, every "
       "lane, none",
       per_command=(
           Per("publish-lane", default_text="publish-lane of build/lanes.toml"),
           Per("promote", "target lane", default="preferred"),
           Per("rollback", default="preferred"),
           Per("lane-requirements", "only this lane",
               default_text="every lane with a current bundle"),
           Per("lanes", "only this lane's history", default_text="every lane"),
           Per("doctor", "the lane this host belongs to"),
           Per("runtime-image", "the lane whose index the image installs from",
               default="preferred"),
           Per("cache-pack", "the lane the pack is published into, beside the bundle",
               default_text="publish-lane of build/lanes.toml"),
       )),
    _s("lanes", "lane to copy from", flag="--from", dest="source", commands=("promote",),
       default_text="the lane's promote-from"),
    _s("lanes", "the bundle the lane served before and returns to", flag="--to", make="TO",
       commands=("rollback",)),
    _s("lanes", "why (kept in lanes.lock's history with who and when)", flag="--reason",
       make="REASON", commands=("rollback",), default_text="none: required"),
    _s("lanes", "resolve the runtime closure now (as `requirements` does) instead of reading "
       "it from wheels.lock", flag="--resolve", kind="switch", commands=("lane-requirements",),
       default_text="off"),
    _s("lanes", "simple/ URL serving the public runtime wheels", flag="--public-index",
       commands=("lane-requirements",), default="https://pypi.org/simple/"),
    _s("lanes", "print the lanes' history (newest last) instead", flag="--history",
       make="HISTORY", kind="switch", commands=("lanes",), default_text="off"),
    _s("lanes", "the runtime image's name", flag="--tag", make="IMAGE_TAG",
       commands=("runtime-image",), default_text="localhost/xla-wheels-runtime:<bundle>-<lane>"),
    _s("lanes", "the runtime image's base: a Debian/Python image with `python3 -m venv`",
       flag="--base-image", make="RUNTIME_BASE", commands=("runtime-image",),
       default_text="the builder's digest-pinned python:3.13.0-slim-bookworm"),
    _s("lanes", "the host package baked into the runtime image: a wheel "
       "(xla_wheels_host-*.whl) or its source directory", flag="--host-package",
       make="HOST_PACKAGE", kind="path", commands=("runtime-image",),
       default_text="the host wheel the lane's bundle document pins, fetched by hash"),
    _s("lanes", "a wheel: its file name or sha256", flag="--wheel", make="WHEEL",
       commands=("jobs",), default_text="(required)"),
    _s("lanes", "a directory of job stamps (searched recursively for *.json)",
       flag="--stamps", make="STAMPS", kind="path", commands=("jobs",),
       default_text="(required)"),
    # --- supply chain -------------------------------------------------------------------
    _s("supply", "the team's private key, a PEM file: a path, never the key; its content is "
       "never printed",
       flag="--signing-key", make="SIGNING_KEY", env="XLA_WHEELS_SIGNING_KEY", kind="path",
       commands=("attest",), default_text="none (make attest refuses to run without it)"),
    _s("supply", "the team's public key (PEM): verify each locked wheel's signed attestation",
       flag="--public-key", make="PUBLIC_KEY", env="XLA_WHEELS_PUBLIC_KEY", kind="path",
       commands=("verify-install", "doctor", "cache-pack"),
       default_text="none: no signature check (doctor with LANE=: that lane's "
       "signing-public-key)",
       per_command=(
           Per("cache-pack", "the public key (PEM) the pack's signature must verify with "
               "(the half of the gate's --pack-key)", default_text="(required)"),
       )),
    _s("supply", "the builder identity written into each attestation (a URI)",
       flag="--builder-id", make="BUILDER_ID", env="XLA_WHEELS_BUILDER_ID",
       commands=("attest",), default="urn:xla-wheels:builder:unnamed"),
    # --- gate ---------------------------------------------------------------------------
    _s("gate", "the directory a gate run wrote its cache packs into (the gate's --pack)",
       flag="--packs", make="PACKS", kind="directory", commands=("cache-pack",),
       default_text="<out-dir>/gate/packs"),
    _s("gate", "where the locked wheel files are, to compare with what is installed",
       flag="--wheel-dir", kind="path", commands=("gate", "bench-restart"),
       default_text="the checkout's: <root>/dist/<bundle>; the host's: fetched from the "
       "lane into the per-machine cache"),
    _s("gate", "restart rounds", flag="--rounds", make="ROUNDS", kind="count", low=1,
       high=1000, default=5, commands=("bench-restart",)),
    _s("gate", "more flags of the gate command, e.g. --record-baseline", make="GATE_ARGS",
       kind="words", commands=("gate",)),
    # --- ABI check ----------------------------------------------------------------------
    _s("abi", "a torch .whl", flag="--torch-wheel", make="TORCH_WHEEL", kind="path",
       commands=("abi-check",), default_text="none (exactly one pair)"),
    _s("abi", "a torch_xla .whl", flag="--torch-xla-wheel", make="TORCH_XLA_WHEEL",
       kind="path", commands=("abi-check",), default_text="none (exactly one pair)"),
    _s("abi", "an _XLAC .so file", flag="--extension", make="XLAC", kind="path",
       commands=("abi-check",), default_text="none (exactly one pair)"),
    _s("abi", "torch's lib/ dir", flag="--torch-lib-dir", make="TORCH_LIB_DIR", kind="path",
       commands=("abi-check",), default_text="none (exactly one pair)"),
    _s("abi", "stock PyPI releases, libraries extracted once per machine (e.g. 2.8.0:2.9.0)",
       flag="--stock", make="STOCK", metavar="TORCH:TORCH_XLA", commands=("abi-check",),
       default_text="none (exactly one pair)"),
    # --- development --------------------------------------------------------------------
    _s("development", "where the demo writes", flag="--dir", make="DEMO_DIR",
       commands=("demo",)),
    _s("development", "more pytest arguments: test files, -k, -x", make="PYTEST_ARGS",
       kind="words"),
    _s("development", "interpreter .venv is created with, Python 3.11 or newer",
       make="PYTHON_FOR_VENV", default_text="python3"),
    _s("development", "the target make help shows in full: its variables with their defaults "
       "and an example", make="TARGET", default_text="none: one line per target"),
)  # fmt: skip

#: The whole table: the host's rows and the builder's.
TABLE: Table = host_settings.HOST.extended(ROWS)
SETTINGS = TABLE.rows
by_flag = TABLE.by_flag
by_env = TABLE.by_env
by_key = TABLE.by_key
default_of = TABLE.default_of
file_keys = TABLE.file_keys
env_of = TABLE.env_of
where = TABLE.where
in_group = TABLE.in_group


class Cascade(host_settings.Cascade):
    """:class:`xla_host.settings.Cascade` over the whole table."""

    def __init__(
        self,
        flags: Mapping[str, object],
        environ: Mapping[str, str],
        files: Sequence[ConfigFile] = (),
    ) -> None:
        super().__init__(flags, environ, files, TABLE)


def add_settings(parser: argparse.ArgumentParser | Any, command: str, *flags: str) -> None:
    """The flags of subcommand ``command``, each from its row of the whole table."""
    host_arguments.add_settings(parser, command, *flags, table=TABLE)


def default_value(key: str) -> Any:
    """:func:`xla_host.arguments.default_value` from the whole table."""
    return host_arguments.default_value(key, TABLE)
