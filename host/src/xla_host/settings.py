"""The host's settings, one row each, and the table's machinery (:class:`Setting`,
:class:`Table`, :class:`Cascade`).

The host wheel carries only the rows its commands read (the gate, doctor, launch-env,
cache; the network and progress settings they share with the builder). The builder adds
its own rows (``xla_wheels.settings_rows``), which makes the one table of the pipeline;
the files written from it (``make-variables.mk``, the documentation's table) are the
builder's business (``xla_wheels.settings_table``).

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
- ``make-variables.mk`` (in ``src/xla_wheels``), which the Makefile includes: the one
  mapping make variable -> flag (``MAKE_VARIABLES``); ``tests/test_settings_table.py``
  fails when it is not current;
- ``make-commands.mk`` (``make_help``, from the parsers these rows make): each command's
  make variables as its target passes them (``FLAGS_<COMMAND>``);
- ``make help``'s text for the variables that are no flag (``make_help``), and the
  settings table of the documentation, between its marker comments.

After changing a row: ``make generate``.

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


#: The cache role rule past --role and XLA_WHEELS_ROLE (xla_host.cache_role), as help says it.
_ROLE_RULE = (
    "reader if XLA_PERSISTENT_CACHE_READ_ONLY=1, else by TPU_WORKER_ID (worker 0 writes), "
    "else writer"
)

#: The longest waits and most retries a user may ask for: more is a typo, and would look
#: like a hang.
DAY_S = 86400.0

# The host's rows: those its commands read (the gate, doctor, launch-env, cache). The
# builder adds its own (xla_wheels.settings_rows) to make the one table the docs show.
# Order: as make help and the settings table show them, group by group.
SETTINGS: tuple[Setting, ...] = (
    # --- where the pipeline works -------------------------------------------------------
    _s("common", "seconds between 'still fetching' lines when stderr is not a terminal; 0 for "
       "none", flag="--progress-interval", env="XLA_WHEELS_PROGRESS_INTERVAL", kind="amount",
       low=0, high=DAY_S, unit="seconds", default=30),
    # launch-env's default --out is under it, on both command lines.
    _s("common", "work directory", flag="--out-dir", env="XLA_WHEELS_OUT", kind="directory",
       default_text="<root>/out (xla-host: out in the current directory)"),
    # --- network ------------------------------------------------------------------------
    _s("network", "seconds a network step waits for an answer before it counts as timed out; "
       "a transfer gets more by its size", flag="--net-timeout", make="NET_TIMEOUT",
       env="XLA_WHEELS_NET_TIMEOUT", kind="amount", low=1, high=DAY_S, unit="seconds",
       default=60),
    _s("network", "times a network step is tried again after a transient fault (refused, "
       "reset, HTTP 5xx, timed out), with growing pauses", flag="--net-retries",
       make="NET_RETRIES", env="XLA_WHEELS_NET_RETRIES", kind="count", low=0, high=20,
       default=3),
    # --- publish ------------------------------------------------------------------------
    # The rest of the rule (xla_host.cache_role) is its default: its text, the docs' copy.
    _s("publish", "writer or reader of a shared cache", flag="--role", make="ROLE",
       env="XLA_WHEELS_ROLE", choices=("writer", "reader"),
       commands=("doctor", "launch-env", "gate"),
       default_text=_ROLE_RULE,
       # launch-env's own check (the rule's) names the make variable and both roles.
       per_command=(Per("launch-env", "writer (the one process per cache directory that "
                        "writes it) or reader (every other worker: the cache read-only)",
                        default_text=_ROLE_RULE, choices=()),)),
    _s("publish", "the interpreter to install into or check", flag="--python", make="PYTHON",
       commands=("gate", "bench-restart", "verify-install", "doctor", "abi-check", "launch-env"),
       default_text="per subcommand (see --help)",
       per_command=(
           Per("verify-install", "base interpreter of the venv", default_text="this one"),
           # Each command line's own: a host's xla-host runs in the training environment,
           # a builder's xla-wheels in the checkout's .venv, which is not one.
           Per("doctor", "the training environment's python",
               default_text="xla-host: this interpreter; xla-wheels: python3 on PATH"),
           Per("launch-env", "the training environment's python, whose torch_xla a cache "
               "pack (--pack-lane) must match", default_text="this interpreter"),
           Per("abi-check", "python of an installed environment"),
           Per("gate", "interpreter of the torch_xla environment to judge",
               default_text="the host's: this interpreter; the checkout's: the cached "
               "stock torch_xla environment"),
           Per("bench-restart", "interpreter of the torch_xla environment to time",
               default_text="the cached stock torch_xla environment"),
       )),
    _s("publish", "judge this compilation cache path", flag="--cache-path", make="CACHE_PATH",
       commands=("doctor",), default_text="XLA_PERSISTENT_CACHE_PATH of the host"),
    _s("publish", "keep the cache entries written within this many days (cache size and "
       "cache prune)", flag="--recent-days", kind="amount", low=0, high=3650, unit="days",
       default=7.0, metavar="DAYS", commands=("cache size", "cache prune")),
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
       default_text="<out-dir>/launch/<bundle>/<profile>-<role> (<out-dir>: xla-wheels' "
       "--out-dir, else $XLA_WHEELS_OUT, else out)",
       per_command=(
           Per("gate", "directory for report.json, junit.xml, child logs and the receipt",
               default="out/gate"),
           Per("bench-restart", "directory the benchmark writes its results into",
               default="out/bench"),
       )),
    # --- lanes --------------------------------------------------------------------------
    _s("lanes", "print the same report as JSON (for a dashboard; doctor: the audit stamp on "
       "stdout, the findings on stderr)", flag="--json", make="JSON", kind="switch",
       commands=("status", "doctor", "jobs"), default_text="off"),
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
    # --- gate ---------------------------------------------------------------------------
    _s("gate", "PJRT device", flag="--device", make="GATE_DEVICE", choices=("CPU", "TPU"),
       commands=("gate", "bench-restart"), default_text="TPU if this host has one, else CPU"),
    _s("gate", "what to time: a preset (small, medium; large is meant for TPU), your own "
       "model as path/to/file.py[:factory] or package.module:factory (protocol: docs/gate.md "
       '"Your own workload")', flag="--workload", make="WORKLOAD", metavar="WORKLOAD",
       commands=("gate", "bench-restart", "cache-pack"), default="small"),
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
       "XLA_WHEELS_RECEIPTS_USERNAME/XLA_WHEELS_RECEIPTS_PASSWORD (WebDAV) or Application "
       "Default Credentials (gs://)", flag="--receipts",
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
)  # fmt: skip


class Table:
    """A table of rows and the lookups by them: the host's (:data:`HOST`, what the host
    wheel carries) and the builder's, which extends it with its own rows
    (``xla_wheels.settings_rows``)."""

    def __init__(self, rows: tuple[Setting, ...]) -> None:
        self.rows = rows
        self._by_flag = {s.flag: s for s in rows if s.flag}
        self._by_env = {s.env: s for s in rows if s.env}

    def extended(self, rows: Sequence[Setting]) -> Table:
        """This table with ``rows`` added, group by group in :data:`GROUPS`' order."""
        order = list(GROUPS)
        return Table(tuple(sorted((*self.rows, *rows), key=lambda s: order.index(s.group))))

    def by_flag(self, flag: str) -> Setting:
        return self._by_flag[flag]

    def by_env(self, name: str) -> Setting:
        return self._by_env[name]

    def by_key(self, key: str) -> Setting:
        """The row whose flag is ``key``, else whose variable is ``key`` (a setting without
        a flag)."""
        return self._by_flag.get(key) or self._by_env[key]

    def default_of(self, key: str) -> float | str:
        """The default of the row whose flag is ``key`` (or, for a setting without a flag,
        whose variable is ``key``), for the option dataclasses: a field takes it from here
        and never repeats the value. A ``KeyError`` naming ``key`` at import when no row
        has it or the row has no one default (its default is a text such as "the number
        of cores")."""
        row = self._by_flag.get(key) or self._by_env.get(key)
        if row is None or row.default is None:
            raise KeyError(f"{key}: no row of the settings table with that name and a default")
        return row.default

    def file_keys(self) -> dict[str, tuple[str, ...]]:
        """The tables of the config file and the keys each takes, from the rows."""
        tables: dict[str, tuple[str, ...]] = {}
        for setting in self.rows:
            if setting.file_key:
                table, _, key = setting.file_key.partition(".")
                tables[table] = (*tables.get(table, ()), key)
        return tables

    def env_of(self, key: str) -> str:
        """The ``XLA_WHEELS_*`` variable of the setting spelled ``key`` on the command
        line, or named ``key`` in the environment (a setting without a flag): a
        ``KeyError`` at import when no row has it, so a reader cannot read a name the
        table does not hold."""
        env = self.by_key(key).env
        if env is None:
            raise KeyError(f"{key} has no environment variable")
        return env

    def where(self, flag: str) -> str:
        """How a user gives the setting, for a fix: its variable and its make variable."""
        setting = self._by_flag[flag]
        make = f" (make: {setting.make}=)" if setting.make else ""
        return f"{setting.env or setting.flag}{make}"

    def in_group(self, group: str) -> Iterator[Setting]:
        return (s for s in self.rows if s.group == group)


#: The host's table; the functions below are its lookups.
HOST = Table(SETTINGS)
by_flag = HOST.by_flag
by_env = HOST.by_env
by_key = HOST.by_key
default_of = HOST.default_of
file_keys = HOST.file_keys
env_of = HOST.env_of
where = HOST.where
in_group = HOST.in_group


@dataclass(frozen=True)
class ConfigFile:
    """A config file as one layer of the :class:`Cascade`: its values by the rows'
    :attr:`Setting.file_key` (read and checked by the file's owner), and its path for
    messages."""

    source: str
    values: Mapping[str, object]

    def where(self, key: str) -> str:
        return f"{self.source}: key '{key}'"


#: Kinds whose empty text on the command line is a value, the empty list: ``--host-tools ""``
#: or ``--compiler-env ""`` asks for none, not for the row's default (a stand-in build runs
#: with no compilers set that way). An empty variable stays unset, as for every kind.
EMPTY_IS_A_LIST = frozenset({"names", "arguments", "assignments"})


class Cascade:
    """The one order in which a setting is read: its flag, then its ``XLA_WHEELS_*``
    variable, then the config files (in the order given), then its row's default.

    ``flags``: the parsed command line by attribute name (``vars(args)``); a flag that is
    absent, None or empty gives way, as an unset or empty variable does. ``table``: whose
    rows (the builder passes its own, which holds the host's). The CLI edge's options
    reader (``xla_wheels.cli.settings.Settings``) and the remote caches' reader
    (``xla_wheels.builder.remote_cache``) both read through this class.
    """

    def __init__(
        self,
        flags: Mapping[str, object],
        environ: Mapping[str, str],
        files: Sequence[ConfigFile] = (),
        table: Table = HOST,
    ) -> None:
        self._flags = flags
        self._environ = environ
        self._files = files
        self.table = table

    def find(self, key: str, *, default: bool = True) -> tuple[object | None, str]:
        """The value of the setting whose row has the flag ``key`` (or, without a flag, the
        variable ``key``) and where it came from, for a message: the flag, the variable,
        ``<file>: key 'table.key'`` or ``default`` (its row's; None without
        ``default``)."""
        row = self.table.by_key(key)
        if row.flag:
            value = self._flags.get(row.dest or row.flag.lstrip("-").replace("-", "_"))
            if value is not None and (value != "" or row.kind in EMPTY_IS_A_LIST):
                return value, row.flag
        if row.env and (text := self._environ.get(row.env)):
            return text, row.env
        for file in self._files if row.file_key else ():
            value = file.values.get(str(row.file_key))
            if value is not None and value != "":
                return value, file.where(str(row.file_key))
        return (row.default if default else None), "default"
