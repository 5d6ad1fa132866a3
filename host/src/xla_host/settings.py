"""Every setting of the pipeline, one row each: the one table the rest is written from.

The rows live on the host side because both command lines read them: the builder's
(``xla_wheels.cli``) and the host's (``xla_host.cli``, the gate's flags). The files written
from them (``make-variables.mk``, the documentation's table) are the builder's business
(``xla_wheels.settings_table``).

As cibuildwheel keeps its options in one ``defaults.toml`` with a schema, a setting here
is one :class:`Setting`: its flag, make variable, environment variable, type and range,
default, help, the commands that take it, whether it is a secret, and its group (what it
is for). Written from this table, never by hand:

- the ``XLA_WHEELS_*`` names the environment may give (:data:`xla_wheels.options.ENV_SETTINGS`,
  :func:`xla_wheels.options.known_environment`) and the check of their values before
  any subcommand runs (``cli.settings.check_environment``);
- the flags of the common and network groups with their defaults in ``--help``
  (``cli.arguments.add_common_arguments``), the host's network flags
  (:func:`xla_host.net.add_network_arguments`) and the documented defaults of
  :class:`xla_host.net.NetworkPolicy`;
- the defaults of the option dataclasses (``builder.config.BuildConfig``,
  ``gate.restart.RestartConfig``, :class:`xla_host.net.NetworkPolicy`), each field through
  :func:`default_of` or :func:`xla_host.arguments.default_value` (the value as the code
  uses it: a list's tuple); ``tests/test_settings_defaults.py`` finds a field that repeats
  one, or has one where its row's default is a text;
- the remote-cache reader's variable names (``builder.remote_cache``);
- ``make-variables.mk`` next to this module, which the Makefile includes: the one
  mapping make variable -> flag (``MAKE_VARIABLES``) and each group's flags
  (``NET_FLAGS``); ``tests/test_settings_table.py`` fails when it is not current;
- ``make help``'s text for the variables that are no flag (``make_help``), and the
  settings table of the documentation, between its marker comments.

After changing a row: ``.venv/bin/python -m xla_wheels.settings_table --write`` (and
``.venv/bin/python -m xla_wheels.make_help --write``).

Standard library only, and imports nothing else: every layer of both packages may read it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal[
    "text", "path", "directory", "switch", "count", "amount", "words", "repeated",
    "names", "arguments", "assignments",
]  # fmt: skip
"""``words``: a make variable split into several flags; ``repeated``: a flag given again
for each value; ``names``: comma-separated names, one value; ``arguments``: shell-quoted
words, one value; ``assignments``: shell-quoted ``NAME=VALUE`` words, one value (each read
into a tuple by :func:`xla_host.arguments.parse_text`, its default too)."""

#: What each group is for, in the order ``make help`` and the settings table show them.
GROUPS: dict[str, str] = {
    "common": "where the pipeline works (every subcommand that works on the checkout)",
    "network": "every step that talks to another host (fetch, index, upload, install)",
    "bundle": "which bundle, and whether to change anything",
    "build": "the build stage (make wheels, make rebuild-check, make builder-image)",
    "remote-cache": "the remote compile caches shared by several builders "
    "(after build/builders.toml)",
    "patches": "the patch series (patch-export, patch-rebase, patches-check)",
    "publish": "publish, requirements, verify-install, doctor",
    "lanes": "lanes: promote, rollback, lanes, status, runtime-image, jobs",
    "supply": "signed attestations",
    "gate": "the gate and the restart benchmark",
    "abi": "the ABI check",
    "development": "make's own tooling: the venv, the tests, the demo",
}


@dataclass(frozen=True)
class Per:
    """How one subcommand takes a setting whose meaning or default is its own (``--lane``
    of promote is the target lane, ``preferred`` unless given)."""

    command: str
    help: str = ""
    """What it is for this subcommand; empty: the row's."""
    default: str | None = None
    """The value argparse gives when the flag is absent."""
    default_text: str = ""
    choices: tuple[str, ...] | None = None
    """The values it may take here; None: the row's."""


@dataclass(frozen=True)
class Setting:
    """One setting. ``flag`` None: read from the environment only (or make's own);
    ``make`` None: no make variable; ``env`` None: no ``XLA_WHEELS_*`` variable."""

    group: str
    help: str
    """What it is, for ``--help``, ``make help`` and the settings table (no default)."""
    flag: str | None = None
    make: str | None = None
    env: str | None = None
    kind: Kind = "text"
    low: float | None = None
    high: float | None = None
    unit: str = ""
    default: float | str | None = None
    """The default the code uses, where it is one value (the option dataclasses take it)."""
    default_text: str = ""
    """The default as the user reads it, where it is not just :attr:`default`."""
    example: float | None = None
    """A value that works, for a fix, when the default is no number."""
    commands: tuple[str, ...] = ()
    """The subcommands that take the flag (() for the common and network groups: all
    that work on the checkout)."""
    secret: bool = False
    """A credential: never a flag or make variable, never printed."""
    choices: tuple[str, ...] = ()
    """The values it may take, where they are a few words."""
    per_command: tuple[Per, ...] = ()
    """The subcommands that give it a help or default of their own."""
    dest: str | None = None
    """The attribute the parsed value goes to, where it is not the flag's name."""
    metavar: str | None = None
    file_key: str | None = None
    """Its key (``table.key``) in the config file that may give it, ``build/builders.toml``:
    the cascade's layer after the environment (:class:`Cascade`)."""

    def per(self, command: str | None) -> Per | None:
        return next((p for p in self.per_command if p.command == command), None)

    @property
    def shown_default(self) -> str:
        if self.default_text:
            return self.default_text
        if isinstance(self.default, float | int):
            return f"{self.default:g}"
        return self.default or "none"

    def help_with_default(self, command: str | None = None) -> str:
        """The ``--help`` text (of ``command``): what it is, then where its default comes
        from."""
        source = f"${self.env} or " if self.env else ""
        per = self.per(command)
        if per is None:
            return f"{self.help} (default: {source}{self.shown_default})"
        shown = per.default_text or per.default or "none"
        return f"{per.help or self.help} (default: {source}{shown})"


def _s(group: str, help: str, **fields: object) -> Setting:
    return Setting(group, help, **fields)  # type: ignore[arg-type]


#: The longest waits and most retries a user may ask for: more is a typo, and would look
#: like a hang.
DAY_S = 86400.0

#: The subcommands that take the build stage's flags (cli.stages.add_build_arguments).
BUILDING = ("wheels", "rebuild-check", "builder-image")

# The rows. Order: as make help and the settings table show them, group by group.
SETTINGS: tuple[Setting, ...] = (
    # --- where the pipeline works -------------------------------------------------------
    _s("common", "project checkout", flag="--root", env="XLA_WHEELS_ROOT", kind="path",
       default_text="the current directory"),
    _s("common", "per-machine cache", flag="--cache-dir", env="XLA_WHEELS_CACHE",
       kind="directory", default_text="$XDG_CACHE_HOME/xla-wheels, else ~/.cache/xla-wheels"),
    _s("common", "work directory", flag="--out-dir", env="XLA_WHEELS_OUT", kind="directory",
       default_text="<root>/out"),
    _s("common", "directory of bare repositories or URL prefix that replaces the remotes' "
       "host", flag="--mirror", make="MIRROR", env="XLA_WHEELS_MIRROR",
       default_text="none: the remotes themselves"),
    _s("common", "seconds between 'still fetching' lines when stderr is not a terminal; 0 for "
       "none", flag="--progress-interval", env="XLA_WHEELS_PROGRESS_INTERVAL", kind="amount",
       low=0, high=DAY_S, unit="seconds", default=30),
    # --- network ------------------------------------------------------------------------
    _s("network", "seconds a network step waits for an answer before it counts as timed out; "
       "a transfer gets more by its size", flag="--net-timeout", make="NET_TIMEOUT",
       env="XLA_WHEELS_NET_TIMEOUT", kind="amount", low=1, high=DAY_S, unit="seconds",
       default=60),
    _s("network", "times a network step is tried again after a transient fault (refused, "
       "reset, HTTP 5xx, timed out), with growing pauses", flag="--net-retries",
       make="NET_RETRIES", env="XLA_WHEELS_NET_RETRIES", kind="count", low=0, high=20,
       default=3),
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
       "against", flag="--source", kind="path", make="TORCH_XLA_SRC", commands=("patches-check",),
       default_text="the source cache, fetching if needed"),
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
    _s("publish", "the interpreter to install into or check", flag="--python", make="PYTHON",
       commands=("gate", "bench-restart", "verify-install", "doctor", "abi-check"),
       default_text="per subcommand (see --help)",
       per_command=(
           Per("verify-install", "base interpreter of the venv", default_text="this one"),
           Per("doctor", "the training environment's python", default_text="python3 on PATH"),
           Per("abi-check", "python of an installed environment"),
           Per("gate", "interpreter of the torch_xla environment to judge",
               default_text="the host's: this interpreter; the checkout's: the cached "
               "stock torch_xla environment"),
           Per("bench-restart", "interpreter of the torch_xla environment to time",
               default_text="the cached stock torch_xla environment"),
       )),
    _s("publish", "writer or reader of a shared cache", flag="--role", make="ROLE",
       env="XLA_WHEELS_ROLE", choices=("writer", "reader"), commands=("doctor", "launch-env"),
       default_text="from TPU_WORKER_ID (worker 0 writes)",
       # launch-env's own check names the make variable and both roles in its fix.
       per_command=(Per("launch-env", "writer (the one process per cache directory that "
                        "writes it) or reader (every other worker: the cache read-only)",
                        default_text="none: required", choices=()),)),
    _s("publish", "judge this compilation cache path", flag="--cache-path", make="CACHE_PATH",
       commands=("doctor",), default_text="XLA_PERSISTENT_CACHE_PATH of the host"),
    _s("publish", "a launch profile of the bundle", flag="--profile", make="PROFILE",
       commands=("doctor", "launch-env", "gate", "runtime-image"), default="",
       per_command=(
           Per("doctor", "compare the launch environment with this launch profile of the "
               "bundle (e.g. train): missing, extra and different settings, and which are in "
               "the cache key", default=""),
           Per("launch-env", "launch profile name, e.g. train", default=""),
           Per("gate", "run every check under this launch profile of --bundle (e.g. train); "
               "the receipt records its name and digest", default=""),
           Per("runtime-image", "the launch profile baked into the image (required)",
               default=""),
       )),
    _s("publish", "judge this launch environment (env.sh/env.json of `make launch-env`, or "
       "NAME=value lines) instead of this process's", flag="--env-file", kind="path",
       make="ENV_FILE", commands=("doctor",)),
    _s("publish", "directory to write into", flag="--out", kind="directory", make="OUT",
       commands=("launch-env", "gate", "bench-restart"),
       default_text="<out-dir>/launch/<bundle>/<profile>-<role>",
       per_command=(
           Per("gate", "directory for report.json, junit.xml, child logs and the receipt",
               default="out/gate"),
           Per("bench-restart", "directory the benchmark writes its results into",
               default="out/bench"),
       )),
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
    _s("lanes", "print the same report as JSON (for a dashboard; doctor: the audit stamp on "
       "stdout, the findings on stderr)", flag="--json", make="JSON", kind="switch",
       commands=("status", "doctor", "jobs"), default_text="off"),
    _s("lanes", "the runtime image's name", flag="--tag", make="IMAGE_TAG",
       commands=("runtime-image",), default_text="localhost/xla-wheels-runtime:<bundle>-<lane>"),
    _s("lanes", "the runtime image's base: a Debian/Python image with `python3 -m venv`",
       flag="--base-image", make="RUNTIME_BASE", commands=("runtime-image",),
       default_text="the builder's digest-pinned python:3.13.0-slim-bookworm"),
    _s("lanes", "the host package baked into the runtime image: a wheel "
       "(xla_wheels_host-*.whl) or its source directory", flag="--host-package",
       make="HOST_PACKAGE", kind="path", commands=("runtime-image",),
       default_text="the host wheel the lane's bundle document pins, fetched by hash"),
    _s("lanes", "write the audit stamp to this file too (by rename); the runtime image's "
       "entrypoint reads the same variable", flag="--stamp", make="STAMP",
       env="XLA_WHEELS_STAMP", kind="path", commands=("doctor",),
       default_text="none: stdout only with JSON=1"),
    _s("lanes", "before the job: fetch the lane's signed cache pack for the bundle, "
       "--pack-workload and this host's topology (the lane's URL or directory) and install "
       "it into the profile's persistent cache directory (a writer only; the runtime "
       "image's entrypoint reads the same variable)", flag="--pack-lane",
       env="XLA_WHEELS_PACK_LANE", metavar="URL|DIR", commands=("launch-env",),
       default_text="none: no pack fetched"),
    _s("lanes", "with --pack-lane: the workload whose pack to fetch", flag="--pack-workload",
       env="XLA_WHEELS_PACK_WORKLOAD", metavar="WORKLOAD", commands=("launch-env",),
       default="small"),
    _s("lanes", "with --pack-lane: the lane's ed25519 public key (PEM) the pack's signature "
       "must verify with", flag="--pack-public-key", env="XLA_WHEELS_PACK_PUBLIC_KEY",
       kind="path", metavar="PEM", commands=("launch-env",),
       default_text="none: required with --pack-lane"),
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
    _s("gate", "PJRT device", flag="--device", make="GATE_DEVICE", choices=("CPU", "TPU"),
       commands=("gate", "bench-restart"), default_text="TPU if this host has one, else CPU"),
    _s("gate", "what to time: a preset (small, medium; large is meant for TPU), your own "
       "model as path/to/file.py[:factory] or package.module:factory (protocol: docs/gate.md "
       '"Your own workload")', flag="--workload", make="WORKLOAD", metavar="WORKLOAD",
       commands=("gate", "bench-restart", "cache-pack"), default="small"),
    _s("gate", "the directory a gate run wrote its cache packs into (the gate's --pack)",
       flag="--packs", make="PACKS", kind="directory", commands=("cache-pack",),
       default_text="<out-dir>/gate/packs"),
    _s("gate", "per-child timeout; a hung child's process group is killed",
       flag="--child-timeout", kind="amount", low=1, high=7 * DAY_S, unit="seconds",
       default=600.0, metavar="SECONDS", commands=("gate", "bench-restart")),
    # Its default, every check, is the gate's registry's (xla_host.gate.checks), which
    # sets it and lists the checks in --help: the gate is a layer above this table.
    _s("gate", "the checks to run, comma-separated", flag="--checks", make="CHECKS",
       commands=("gate",), default_text="every check, in the gate's order"),
    _s("gate", "the key-probe check's probes, comma-separated names of key_probes.toml, or "
       "'fast' for its fast subset (the control always runs)", flag="--key-probes",
       make="KEY_PROBES", metavar="NAMES", default_text="every probe", commands=("gate",)),
    _s("gate", "warm restarts", flag="--warm-runs", kind="count", low=2, high=100, default=2,
       commands=("gate",)),
    _s("gate", "warm time-to-ready must be at most this fraction of cold",
       flag="--max-warm-ratio", kind="amount", low=0, high=100, unit="times the cold time",
       default=0.5, commands=("gate",)),
    _s("gate", "allowed slowdown against a recorded baseline, a fraction (0.5: up to 1.5 times it)",
       flag="--baseline-tolerance", kind="amount", low=0, high=100,
       unit="times the baseline", default=0.5, commands=("gate",)),
    _s("gate", "directory of the recorded warm-restart baselines (one per torch_xla version, "
       "device and workload)", flag="--baselines-dir", kind="path",
       default="build/baselines/restart", commands=("gate",)),
    _s("gate", "record this run's warm time as the baseline (only if it passes)",
       flag="--record-baseline", kind="switch", default_text="off", commands=("gate",)),
    _s("gate", "run the restart workload under SPMD", flag="--spmd", kind="switch",
       default_text="off", commands=("gate",)),
    _s("gate", "concurrent cold processes writing the same cache directory",
       flag="--writers", kind="count", low=1, high=64, default=1, commands=("gate",)),
    _s("gate", "empty XLA persistent compilation cache directory to use (a slice's: on the "
       "shared mount)", flag="--xla-cache-dir", kind="path",
       default_text="the gate's own temporary one", commands=("gate",)),
    _s("gate", "keep the gate's temporary cache directory and print its path",
       flag="--keep-cache", kind="switch", default_text="off", commands=("gate",)),
    _s("gate", "also run test/test_persistent_cache.py of this pytorch/xla checkout (work "
       "tree or bare repository) with its device skips lifted", flag="--upstream-tests",
       make="UPSTREAM_TESTS", kind="path", metavar="CHECKOUT", commands=("gate",)),
    _s("gate", "read upstream's test file at this revision", flag="--upstream-tests-revision",
       metavar="REV", default_text="the work tree, else HEAD", commands=("gate",)),
    _s("gate", "also upload the receipt to this store: a directory, an http(s) WebDAV URL or "
       "gs://bucket/prefix (a lane's `receipts` in build/lanes.toml); credentials from "
       "XLA_WHEELS_RECEIPTS_USERNAME/XLA_WHEELS_RECEIPTS_PASSWORD", flag="--receipts",
       metavar="STORE", commands=("gate",)),
    _s("gate", "sign the uploaded receipt (a DSSE envelope) with this ed25519 private key",
       flag="--sign-key", kind="path", metavar="PEM", commands=("gate",)),
    _s("gate", "after a passing restart check, write a cache pack (the cold run's cache "
       "entries and a manifest signed with --pack-key) into this directory, for `cache fetch`",
       flag="--pack", kind="path", metavar="DIR", commands=("gate",)),
    _s("gate", "sign the cache pack's manifest (a DSSE envelope) with this ed25519 private key",
       flag="--pack-key", kind="path", metavar="PEM", commands=("gate",)),
    _s("gate", "this worker's number in a multi-host slice; worker 0 alone writes the cache",
       flag="--worker-id", kind="count", low=0, high=4095, example=0, commands=("gate",),
       default_text="TPU_WORKER_ID where the TPU VM sets it, else no slice"),
    _s("gate", "number of workers (hosts) in the slice", flag="--workers", kind="count",
       low=1, high=4096, example=1, commands=("gate",),
       default_text="the hosts in TPU_WORKER_HOSTNAMES, else no slice"),
    _s("gate", "a fresh directory every worker sees (shared mount) where they meet at each "
       "phase; worker 0 merges the workers' verdicts into its receipt", flag="--slice-dir",
       kind="path", commands=("gate",)),
    _s("gate", "instead of --slice-dir: worker 0 serves the slice's barrier on this address "
       "(its own host name or address) and every worker connects to it",
       flag="--coordinator", metavar="HOST:PORT", commands=("gate",)),
    _s("gate", "how long a worker waits at a phase for a worker that never started (a "
       "started worker that stops beating is named after 10s)", flag="--slice-timeout",
       kind="amount", low=1, high=DAY_S, unit="seconds", default=600.0, metavar="SECONDS",
       commands=("gate",)),
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

_BY_FLAG = {s.flag: s for s in SETTINGS if s.flag}
_BY_ENV = {s.env: s for s in SETTINGS if s.env}
_BY_MAKE = {s.make: s for s in SETTINGS if s.make}


def by_flag(flag: str) -> Setting:
    return _BY_FLAG[flag]


def by_env(name: str) -> Setting:
    return _BY_ENV[name]


def by_key(key: str) -> Setting:
    """The row whose flag is ``key``, else whose variable is ``key`` (a setting without a
    flag)."""
    return _BY_FLAG.get(key) or _BY_ENV[key]


def default_of(key: str) -> float | str:
    """The default of the row whose flag is ``key`` (or, for a setting without a flag,
    whose variable is ``key``), for the option dataclasses: a field takes it from here and
    never repeats the value. A ``KeyError`` naming ``key`` at import when no row has it or
    the row has no one default (its default is a text such as "the number of cores")."""
    row = _BY_FLAG.get(key) or _BY_ENV.get(key)
    if row is None or row.default is None:
        raise KeyError(f"{key}: no row of the settings table with that name and a default")
    return row.default


@dataclass(frozen=True)
class ConfigFile:
    """A config file as one layer of the :class:`Cascade`: its values by the rows'
    :attr:`Setting.file_key` (read and checked by the file's owner), and its path for
    messages."""

    source: str
    values: Mapping[str, object]

    def where(self, key: str) -> str:
        return f"{self.source}: key '{key}'"


class Cascade:
    """The one order in which a setting is read: its flag, then its ``XLA_WHEELS_*``
    variable, then the config files (in the order given), then its row's default.

    ``flags``: the parsed command line by attribute name (``vars(args)``); a flag that is
    absent, None or empty gives way, as an unset or empty variable does. The CLI edge's
    options reader (``xla_wheels.cli.settings.Settings``) and the remote caches' reader
    (``xla_wheels.builder.remote_cache``) both read through this class.
    """

    def __init__(
        self,
        flags: Mapping[str, object],
        environ: Mapping[str, str],
        files: Sequence[ConfigFile] = (),
    ) -> None:
        self._flags = flags
        self._environ = environ
        self._files = files

    def find(self, key: str, *, default: bool = True) -> tuple[object | None, str]:
        """The value of the setting whose row has the flag ``key`` (or, without a flag, the
        variable ``key``) and where it came from, for a message: the flag, the variable,
        ``<file>: key 'table.key'`` or ``default`` (its row's; None without
        ``default``)."""
        row = _BY_FLAG.get(key) or _BY_ENV[key]
        if row.flag:
            value = self._flags.get(row.dest or row.flag.lstrip("-").replace("-", "_"))
            if value is not None and value != "":
                return value, row.flag
        if row.env and (text := self._environ.get(row.env)):
            return text, row.env
        for file in self._files if row.file_key else ():
            value = file.values.get(str(row.file_key))
            if value is not None and value != "":
                return value, file.where(str(row.file_key))
        return (row.default if default else None), "default"


def file_keys() -> dict[str, tuple[str, ...]]:
    """The tables of the config file and the keys each takes, from the rows."""
    tables: dict[str, tuple[str, ...]] = {}
    for setting in SETTINGS:
        if setting.file_key:
            table, _, key = setting.file_key.partition(".")
            tables[table] = (*tables.get(table, ()), key)
    return tables


def env_of(key: str) -> str:
    """The ``XLA_WHEELS_*`` variable of the setting spelled ``key`` on the command line,
    or named ``key`` in the environment (a setting without a flag): a ``KeyError`` at
    import when no row has it, so a reader cannot read a name the table does not hold."""
    env = (_BY_FLAG.get(key) or _BY_ENV[key]).env
    if env is None:
        raise KeyError(f"{key} has no environment variable")
    return env


def where(flag: str) -> str:
    """How a user gives the setting, for a fix: its variable and its make variable."""
    setting = _BY_FLAG[flag]
    make = f" (make: {setting.make}=)" if setting.make else ""
    return f"{setting.env or setting.flag}{make}"


def in_group(group: str) -> Iterator[Setting]:
    return (s for s in SETTINGS if s.group == group)
