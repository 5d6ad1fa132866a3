"""Remote compile caches shared by several builders: the model, its reading and its flags.

Two existing engines, one per half of the build, and no cache server of our own:

- torch_xla (Bazel): a remote cache (bazel-remote, BuildBuddy, Buildbarn, Google RBE) and
  optionally a remote executor, given to Bazel through ``.bazelrc.user``, the one file
  torch_xla's ``.bazelrc`` try-imports last (its ``setup.py`` passes no free-form flags).
- torch (CMake): ccache's remote storage (``redis://`` or ``http://``; ccache 4.7 has no
  https), through ``CCACHE_REMOTE_STORAGE`` in the torch recipe's environment.

Policy, from upstream's own ``.bazelrc`` (``--incompatible_strict_action_env``,
``--noremote_upload_local_results`` unless a build is configured to upload): one builder
is the writer (for example the CI builder on main), every other builder reads. A reader
never uploads: Bazel gets ``--remote_upload_local_results=false``, ccache the storage's
``read-only`` attribute. Readers are the default, so a forgotten setting cannot poison
the team's cache with a laptop's build.

Settings (URLs, instance name, role) are rows of the settings table read in its one order
(:class:`xla_host.settings.Cascade`): the flag where there is one, the ``XLA_WHEELS_*``
variable, the row's key in ``build/builders.toml`` (bundle-independent: every bundle of one
builder uses the same caches), the row's default. Credentials come only from the
environment or from files, never from the TOML file, and travel as :class:`Secret` (its
``str`` and ``repr`` are the redaction marker). The plan, the spec file, the logs, the
stage keys and the errors see only the marker; the build process gets the values at run
time (see ``inside``).

The composition half (flags, environment) runs inside the builder too: this module
imports only the standard library and this package's stdlib-only modules.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from xla_host.cache_role import ROLES
from xla_host.errors import ExitCode, PipelineError, UsageError
from xla_host.redact import REDACTED
from xla_host.tables import Field, Table, check_regular, loads_toml, read_regular, read_utf8
from xla_host.values import BadValue, parse_count
from xla_wheels.settings_rows import Cascade, ConfigFile, by_flag, default_of, env_of, file_keys

CONFIG_RELPATH = "build/builders.toml"
BAZEL_SCHEMES = ("grpc", "grpcs", "http", "https")
EXECUTOR_SCHEMES = ("grpc", "grpcs")
CCACHE_SCHEMES = ("redis", "http")

# Environment overrides of the TOML settings (none of them is a credential), and the
# credentials: a value in the environment, or a file holding it (mode 0600). Each is a
# row of the settings table (group "remote-cache"): named there, read here.
ENV_CONFIG = env_of("XLA_WHEELS_BUILDERS_CONFIG")
ENV_ROLE = env_of("XLA_WHEELS_BUILDER_ROLE")
ENV_BAZEL_CACHE = env_of("--bazel-remote-cache")
ENV_BAZEL_EXECUTOR = env_of("XLA_WHEELS_BAZEL_REMOTE_EXECUTOR")
ENV_BAZEL_INSTANCE = env_of("XLA_WHEELS_BAZEL_REMOTE_INSTANCE_NAME")
ENV_BAZEL_TIMEOUT = env_of("--bazel-remote-timeout")
ENV_CCACHE_STORAGE = env_of("XLA_WHEELS_CCACHE_REMOTE_STORAGE")
ENV_CCACHE_USERNAME = env_of("XLA_WHEELS_CCACHE_REMOTE_USERNAME")
ENV_BAZEL_HEADER = env_of("XLA_WHEELS_BAZEL_REMOTE_HEADER")
ENV_BAZEL_HEADER_FILE = env_of("XLA_WHEELS_BAZEL_REMOTE_HEADER_FILE")
ENV_CCACHE_PASSWORD = env_of("XLA_WHEELS_CCACHE_REMOTE_PASSWORD")
ENV_CCACHE_PASSWORD_FILE = env_of("XLA_WHEELS_CCACHE_REMOTE_PASSWORD_FILE")

# How secrets reach the build process: a JSON file (mode 0600 in a 0700 directory of the
# work tree, mounted like the rest of it) named by this variable. A file rather than
# `--env NAME=VALUE`, which would put the value on the engine's command line (`ps`, our
# printed commands) and, for docker, in `docker inspect`.
ENV_SECRETS_FILE = "XLA_WHEELS_SECRETS_FILE"
CCACHE_PASSWORD_KEY = "ccache_remote_password"
_PLACEHOLDER = re.compile(r"\$\{([a-z0-9_]+)\}")
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # RFC 9110 token
# Characters a password cannot hold inside ccache's URL: the userinfo delimiters, the
# attribute separator and whitespace. ccache does not percent-decode the userinfo.
_PASSWORD_FORBIDDEN = set("@:/?#|% \t\r\n")


class RemoteCacheConfigError(PipelineError):
    """builders.toml or a credential is malformed: names the file or variable, never a secret."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class Secret:
    """A credential. Printing, formatting or logging it yields the redaction marker."""

    value: str = field(repr=False)
    source: str
    """Where it came from (a variable name or a file path), for messages."""

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"Secret({REDACTED}, from {self.source})"


@dataclass(frozen=True)
class BazelRemote:
    cache: str | None = None
    """``--remote_cache``: grpc://, grpcs://, http:// or https://."""
    executor: str | None = None
    """``--remote_executor``: grpc:// or grpcs:// (REAPI); None = build locally."""
    instance_name: str | None = None
    """``--remote_instance_name`` (BuildBuddy, Buildbarn and RBE partition by it)."""
    header_names: tuple[str, ...] = ()
    """``--remote_header`` names; their values are secrets."""
    timeout_s: int | None = None
    """``--remote_timeout``: seconds one remote call may take; None: Bazel's own (60)."""

    @property
    def enabled(self) -> bool:
        return bool(self.cache or self.executor)


@dataclass(frozen=True)
class CcacheRemote:
    storage: str | None = None
    """``remote_storage`` URL without credentials, attributes allowed (not read-only)."""
    username: str | None = None
    has_password: bool = False


@dataclass(frozen=True)
class RemoteCacheSettings:
    """What the spec carries into the builder: everything but the credentials."""

    role: str = str(default_of(ENV_ROLE))
    bazel: BazelRemote = field(default_factory=BazelRemote)
    ccache: CcacheRemote = field(default_factory=CcacheRemote)

    @property
    def writer(self) -> bool:
        return self.role == "writer"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RemoteCacheSettings:
        if not data:
            return cls()
        bazel = dict(data["bazel"])
        bazel["header_names"] = tuple(bazel["header_names"])
        return cls(
            role=data["role"], bazel=BazelRemote(**bazel), ccache=CcacheRemote(**data["ccache"])
        )


@dataclass(frozen=True)
class RemoteCache:
    """The settings plus the credentials, as read on the host at the CLI edge."""

    settings: RemoteCacheSettings = field(default_factory=RemoteCacheSettings)
    secrets: tuple[tuple[str, Secret], ...] = ()
    """(key, secret): ``bazel_remote_header_<i>`` and ``ccache_remote_password``."""
    source: str = "defaults"

    def secret_values(self) -> dict[str, str]:
        return {key: secret.value for key, secret in self.secrets}


# --- reading (host side) ---------------------------------------------------------------


def load_remote_cache(
    root: Path,
    environ: Mapping[str, str],
    flags: Mapping[str, object] | None = None,
) -> RemoteCache:
    """The remote caches' settings, each by the settings table's one order
    (:class:`xla_host.settings.Cascade`): its flag, then its variable, then its key in
    ``build/builders.toml`` (or ``$XLA_WHEELS_BUILDERS_CONFIG``), then its row's default;
    the credentials from the environment or the files it names, never from the file.

    A missing default file means no remote cache; a missing file named explicitly is an
    error. ``flags``: the parsed command line by attribute name (``vars(args)``), whose
    ``--bazel-remote-cache`` and ``--bazel-remote-timeout`` come first.
    """
    config = _read_builders_file(root, environ)
    cascade = Cascade(flags or {}, environ, [config])

    def setting(key: str) -> tuple[str | None, str]:
        """The value and where it came from (for messages)."""
        value, where = cascade.find(key)
        return (None if value is None else str(value)), where

    role = _checked_role(*setting(ENV_ROLE))
    cache, executor, instance = (
        _checked_bazel(setting("--bazel-remote-cache"), BAZEL_SCHEMES, "a Bazel remote cache"),
        _checked_bazel(setting(ENV_BAZEL_EXECUTOR), EXECUTOR_SCHEMES, "a Bazel remote executor"),
        setting(ENV_BAZEL_INSTANCE),
    )
    _check_instance(*instance, remote=bool(cache or executor))
    storage, storage_from = setting(ENV_CCACHE_STORAGE)
    if storage:
        _check_ccache_storage(storage, storage_from)
    username = _checked_username(*setting(ENV_CCACHE_USERNAME))
    timeout = _timeout(cascade.find("--bazel-remote-timeout")[0])
    headers = _read_headers(environ)
    if headers and not (cache or executor):
        raise RemoteCacheConfigError(
            f"a Bazel remote header is set ({headers[0][1].source}) but no remote cache",
            fix=f"set [bazel] remote_cache in {CONFIG_RELPATH} (or {ENV_BAZEL_CACHE}), "
            "or unset the header",
        )
    password = _ccache_password(environ, storage, storage_from, username)
    secrets = [
        (f"bazel_remote_header_{index}", secret) for index, (_, secret) in enumerate(headers)
    ]
    settings = RemoteCacheSettings(
        role=role,
        bazel=BazelRemote(
            cache=cache,
            executor=executor,
            instance_name=instance[0],
            header_names=tuple(name for name, _ in headers),
            timeout_s=timeout,
        ),
        ccache=CcacheRemote(storage=storage, username=username, has_password=password is not None),
    )
    if password is not None:
        secrets.append((CCACHE_PASSWORD_KEY, password))
    source = config.source if Path(config.source).is_file() else "defaults"
    return RemoteCache(settings, tuple(secrets), source)


def _read_builders_file(root: Path, environ: Mapping[str, str]) -> ConfigFile:
    """``build/builders.toml`` (or the file ``$XLA_WHEELS_BUILDERS_CONFIG`` names) as the
    cascade's file layer: its tables and keys are the rows' ``file_key``; none of them is a
    credential."""
    explicit = environ.get(ENV_CONFIG) or None
    path = Path(explicit) if explicit else root / CONFIG_RELPATH
    if explicit and not path.exists():
        raise RemoteCacheConfigError(
            f"{ENV_CONFIG}={path}: no such file",
            fix=f"point it at a builders file, or unset it to use {CONFIG_RELPATH}",
        )
    data: dict[str, Any] = {}
    if path.exists():
        text = read_utf8(path, RemoteCacheConfigError, what="builders file")[0]
        try:
            data = loads_toml(text, source=str(path), error=RemoteCacheConfigError)
        except tomllib.TOMLDecodeError as error:
            raise RemoteCacheConfigError(
                f"{path}: not valid TOML: {error}", fix="fix the syntax at that line"
            ) from error
    top = Table(data, source=str(path), error=RemoteCacheConfigError)
    tables = file_keys()
    top.check_keys(tables)
    values: dict[str, object] = {}
    for name, keys in tables.items():
        table = top.table(name, optional=True).read(*(Field(key, str) for key in keys))
        values.update({f"{name}.{key}": value for key, value in table.items()})
    return ConfigFile(str(path), values)


def _checked_role(role: str | None, where: str) -> str:
    if role is None or role not in ROLES:
        raise RemoteCacheConfigError(
            f"{where}: role '{role}' is not one of {', '.join(sorted(ROLES))}",
            fix="one builder is the writer (e.g. CI on main); every other builder reads",
        )
    return role


def _checked_username(username: str | None, where: str) -> str | None:
    if username and not re.fullmatch(r"[A-Za-z0-9._~-]+", username):
        raise RemoteCacheConfigError(
            f"{where}: the user name may hold only letters, digits and . _ ~ -",
            fix="use the cache server's user name (or none for a password-only redis)",
        )
    return username


def _checked_bazel(
    found: tuple[str | None, str], schemes: tuple[str, ...], what: str
) -> str | None:
    value, where = found
    if value:
        _check_url(value, where, schemes, what)
    return value


def _check_instance(instance: str | None, where: str, *, remote: bool) -> None:
    if instance and (not instance.strip() or any(c.isspace() for c in instance)):
        raise RemoteCacheConfigError(
            f"{where}: the instance name contains whitespace",
            fix="write it as the cache server names it, e.g. projects/p/instances/default",
        )
    if instance and not remote:
        raise RemoteCacheConfigError(
            f"{where}: an instance name without a remote cache or executor",
            fix=f"set [bazel] remote_cache (or {ENV_BAZEL_CACHE}), or remove the name",
        )


def _ccache_password(
    environ: Mapping[str, str], storage: str | None, storage_from: str, username: str | None
) -> Secret | None:
    """ccache's remote storage password, checked against the storage it is for."""
    password = _read_secret(environ, ENV_CCACHE_PASSWORD, ENV_CCACHE_PASSWORD_FILE)
    if password is None:
        return None
    if not storage:
        raise RemoteCacheConfigError(
            f"a ccache remote password is set ({password.source}) but no remote storage",
            fix=f"set [ccache] remote_storage in {CONFIG_RELPATH} (or "
            f"{ENV_CCACHE_STORAGE}), or unset the password",
        )
    if not password.value or _PASSWORD_FORBIDDEN & set(password.value):
        raise RemoteCacheConfigError(
            f"the ccache remote password from {password.source} is empty or holds one of "
            "@ : / ? # | % or whitespace, which ccache's URL syntax cannot carry",
            fix="use a password of letters, digits and - . _ ~ + = ! $ & * , ;",
        )
    if storage.startswith("http:") and not username:
        raise RemoteCacheConfigError(
            f"{storage_from}: http basic authentication needs a user name with the password",
            fix=f"set [ccache] remote_username (or {ENV_CCACHE_USERNAME})",
        )
    return password


def _timeout(value: object) -> int | None:
    """``--bazel-remote-timeout`` (checked by argparse) or ``XLA_WHEELS_BAZEL_REMOTE_TIMEOUT``
    by its row's range (the CLI edge has checked it already; a caller that is not the CLI
    gets the same refusal)."""
    if value is None or isinstance(value, int):
        return value
    text = str(value)
    row = by_flag("--bazel-remote-timeout")
    try:
        return parse_count(
            text, low=int(row.low or 0), high=int(row.high or 0), example=int(row.example or 1)
        )
    except BadValue as bad:
        raise RemoteCacheConfigError(
            f"{ENV_BAZEL_TIMEOUT}={text!r} {bad.reason}",
            fix=f"set {ENV_BAZEL_TIMEOUT}={bad.example}, or unset it",
        ) from None


_URL = re.compile(r"(?P<scheme>[a-z+]+)://(?P<rest>[^\s|]+)(?P<attrs>(\|[^\s|]+)*)")


def _check_url(value: str, where: str, schemes: tuple[str, ...], what: str) -> None:
    match = _URL.fullmatch(value)
    if not match or match.group("attrs") or match.group("scheme") not in schemes:
        raise RemoteCacheConfigError(
            f"{where}: '{_strip_userinfo(value)}' is not a URL of {what}",
            fix=f"write {' or '.join(s + '://HOST[:PORT]' for s in schemes)}",
        )
    if "@" in match.group("rest").split("/")[0]:
        raise RemoteCacheConfigError(
            f"{where}: the URL carries credentials, which would be printed in the plan",
            fix=f"remove them from the URL and give them as a header ({ENV_BAZEL_HEADER} or "
            f"{ENV_BAZEL_HEADER_FILE}, e.g. 'Authorization=Basic <base64>')",
        )


def _check_ccache_storage(value: str, where: str) -> None:
    match = _URL.fullmatch(value)
    if not match or match.group("scheme") not in CCACHE_SCHEMES:
        raise RemoteCacheConfigError(
            f"{where}: '{_strip_userinfo(value)}' is not a ccache remote storage URL",
            fix="write redis://HOST[:PORT][/DB] or http://HOST[:PORT]/PATH (ccache 4.7 has "
            "no https: put a TLS proxy on loopback)",
        )
    if "@" in match.group("rest").split("/")[0]:
        raise RemoteCacheConfigError(
            f"{where}: the URL carries credentials, which would be printed in the plan",
            fix=f"remove them from the URL; give the password as {ENV_CCACHE_PASSWORD} or "
            f"{ENV_CCACHE_PASSWORD_FILE} and the user as [ccache] remote_username",
        )
    for attribute in match.group("attrs").split("|")[1:]:
        name = attribute.partition("=")[0]
        if name in ("read-only", "bearer-token"):
            raise RemoteCacheConfigError(
                f"{where}: the attribute '{name}' is set by the pipeline, not the URL",
                fix="read-only follows [builder] role; a bearer token is a credential: use "
                "basic authentication through the password variables",
            )


def _strip_userinfo(value: str) -> str:
    """A URL for an error message: whatever precedes '@' in the authority is dropped."""
    scheme, sep, rest = value.partition("://")
    if not sep:
        return "<not a URL>" if "@" in value else value
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = REDACTED + "@" + authority.rpartition("@")[2]
    return f"{scheme}://{authority}{slash}{path}"


def _read_secret(
    environ: Mapping[str, str], variable: str, file_variable: str, *, lines: bool = False
) -> Secret | None:
    """The value of ``variable``, or the content of the file ``file_variable`` names
    (without its line ends, unless its ``lines`` are wanted as they are)."""
    value, file_name = environ.get(variable), environ.get(file_variable)
    if value and file_name:
        raise RemoteCacheConfigError(
            f"both {variable} and {file_variable} are set", fix="set only one of them"
        )
    if value:
        return Secret(value, variable)
    if file_name:
        text = _read_private_file(Path(file_name), file_variable)
        return Secret(text if lines else text.strip("\r\n"), file_name)
    return None


def _read_private_file(path: Path, variable: str) -> str:
    """The credential file's text. Its type, size and mode are judged from ``stat``
    before it is opened: a FIFO there hung ``wheels --dry-run``, and ``/dev/zero`` was
    read until the kernel's OOM killer stopped the run."""

    def refused(message: str, *, fix: str | None = None) -> RemoteCacheConfigError:
        return RemoteCacheConfigError(f"{variable}={message}", fix=fix)

    what = "credential file"
    try:
        mode = check_regular(path, refused, what=what).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise RemoteCacheConfigError(
                f"{variable}={path}: other users can read it (mode {stat.S_IMODE(mode):04o})",
                fix=f"chmod 600 {path}",
            )
        return read_regular(path, refused, what=what).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise RemoteCacheConfigError(
            f"{variable}={path}: cannot read it ({type(error).__name__})",
            fix="point it at a readable UTF-8 file holding the credential",
        ) from None


def _read_headers(environ: Mapping[str, str]) -> list[tuple[str, Secret]]:
    """``Name=Value`` from the variable, or one per line from the file (# comments)."""
    raw = _read_secret(environ, ENV_BAZEL_HEADER, ENV_BAZEL_HEADER_FILE, lines=True)
    if raw is None:
        return []
    if raw.source == ENV_BAZEL_HEADER:
        lines = [(ENV_BAZEL_HEADER, raw.value)]
    else:
        lines = [
            (f"{raw.source}:{number}", line.strip())
            for number, line in enumerate(raw.value.splitlines(), start=1)
            if line.strip() and not line.strip().startswith("#")
        ]
    headers = []
    for where, line in lines:
        name, equals, header_value = line.partition("=")
        name = name.strip()
        if (
            not equals
            or not _HEADER_NAME.fullmatch(name)
            or not header_value.strip()
            or set('"\\') & set(header_value)
            # A line break would add lines of its own to the rc file (`build --run_under=`).
            or any(ord(char) < 0x20 or ord(char) == 0x7F for char in header_value.strip())
        ):
            # The line may be the secret itself (a pasted token): never echo it.
            raise RemoteCacheConfigError(
                f"{where}: a Bazel remote header must be Name=Value, the value without "
                '", \\ or a control character such as a line break (the line is not shown: '
                "it may hold a credential)",
                fix="write e.g. x-buildbuddy-api-key=<key> or Authorization=Bearer <token>",
            )
        headers.append((name, Secret(header_value.strip(), where)))
    return headers


# --- composition (host and builder) ------------------------------------------------------


def placeholder(key: str) -> str:
    """Where a secret goes in a template; replaced at run time, rendered as the marker."""
    return "${" + key + "}"


def redact_template(text: str) -> str:
    return _PLACEHOLDER.sub(REDACTED, text)


def fill_template(text: str, secrets: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in secrets:
            raise KeyError(f"the credential '{key}' did not reach the builder ({ENV_SECRETS_FILE})")
        return secrets[key]

    return _PLACEHOLDER.sub(value, text)


#: What a word of a Bazel rc file may hold bare: anything else is quoted (:func:`rc_word`).
_RC_BARE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def rc_word(value: str) -> str:
    """``value`` written as one word of a Bazel rc file (``.bazelrc.user``).

    Bazel reads each rc line as a shell-like list of words (``blaze_util::Tokenize``):
    whitespace separates words, ``'`` and ``"`` group, a backslash takes the next
    character as it is (inside quotes too), and ``#`` outside quotes starts a comment. So a
    path with a space, a ``#`` or a quote is double-quoted with ``\\`` and ``"`` escaped;
    non-ASCII characters pass through as UTF-8. A line break cannot be written (the file
    is split into lines first): refused.
    """
    if "\n" in value or "\r" in value:
        raise UsageError(
            f"{value!r} holds a line break, which a Bazel rc file (.bazelrc.user) cannot hold",
            fix="use a work directory (and cache directory) whose path has no line break",
        )
    if _RC_BARE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bazelrc_lines(settings: RemoteCacheSettings, auth_rc: str) -> list[str]:
    """The remote-cache part of ``.bazelrc.user`` (no credentials: see ``bazel_auth_rc``)."""
    lines = [
        # Upstream's .bazelrc already says so; repeated so sharing does not depend on it:
        # without it PATH and LD_LIBRARY_PATH enter every action key, and two builders
        # with different PATHs never share a result.
        "build --incompatible_strict_action_env",
    ]
    bazel = settings.bazel
    if not bazel.enabled:
        return lines
    if bazel.cache:
        lines.append(f"build --remote_cache={rc_word(bazel.cache)}")
    if bazel.executor:
        lines.append(f"build --remote_executor={rc_word(bazel.executor)}")
    if bazel.instance_name:
        lines.append(f"build --remote_instance_name={rc_word(bazel.instance_name)}")
    if bazel.timeout_s is not None:
        # Bazel waits 60 s per call by default: a cache that stopped answering would
        # cost a minute on every action before it builds locally.
        lines.append(f"build --remote_timeout={bazel.timeout_s}")
    # Overrides upstream's `build --noremote_upload_local_results` for the writer only.
    # With a remote executor, remotely executed results are stored by the executor
    # itself; the role governs what this machine's local actions upload.
    lines.append(f"build --remote_upload_local_results={'true' if settings.writer else 'false'}")
    if bazel.header_names:
        lines.append(f"try-import {rc_word(auth_rc)}")
    return lines


def bazel_auth_rc(settings: RemoteCacheSettings) -> str:
    """The template of the private rc file holding ``--remote_header`` lines.

    A file, because setup.py takes no free-form Bazel flags and prints the Bazel command
    line it runs (a flag there would be in the log); written mode 0600 at run time,
    try-imported from ``.bazelrc.user``, removed with the private directory afterwards.
    """
    # Double quotes: Bazel splits rc lines like a shell, and values such as
    # "Bearer <token>" hold a space (values with quotes or backslashes are refused).
    return "".join(
        f'build --remote_header={name}="{placeholder(f"bazel_remote_header_{index}")}"\n'
        for index, name in enumerate(settings.bazel.header_names)
    )


def ccache_env(
    settings: RemoteCacheSettings, base_dir: str
) -> tuple[dict[str, str], dict[str, str]]:
    """(plain environment, templated environment holding a credential) for ccache.

    ``CCACHE_BASEDIR`` rewrites absolute paths under the work tree into relative ones and
    ``CCACHE_NOHASHDIR`` keeps the working directory out of the hash of ``-g`` compiles,
    so builders (and bundles) with different checkout paths share results; the cost is
    that debug info names the directory of the build that filled the cache.
    """
    plain = {"CCACHE_BASEDIR": base_dir, "CCACHE_NOHASHDIR": "1"}
    templated: dict[str, str] = {}
    remote = settings.ccache
    if not remote.storage:
        return plain, templated
    scheme, _, rest = remote.storage.partition("://")
    password = placeholder(CCACHE_PASSWORD_KEY) if remote.has_password else None
    userinfo = ":".join(part for part in (remote.username, password) if part)
    url = f"{scheme}://{userinfo}@{rest}" if userinfo else f"{scheme}://{rest}"
    if not settings.writer:
        # The storage's read-only attribute, not CCACHE_READONLY (which would also freeze
        # the local cache, so a reader's own rebuilds would never hit) nor remote_only
        # (which would drop the local cache and pay the network for every object).
        url += "|read-only"
    (templated if remote.has_password else plain)["CCACHE_REMOTE_STORAGE"] = url
    return plain, templated


def describe(settings: RemoteCacheSettings) -> str:
    """One line for the plan."""
    bazel, storage = settings.bazel, settings.ccache.storage
    named = {"cache": bazel.cache, "executor": bazel.executor, "instance": bazel.instance_name}
    remotes = [f"{label} {value}" for label, value in named.items() if value]
    if bazel.header_names:
        remotes.append(f"headers {', '.join(bazel.header_names)} ({REDACTED})")
    bazel_part = (
        "bazel " + ", ".join(remotes) if bazel.enabled else "bazel: none (local disk cache only)"
    )
    ccache_part = f"ccache {storage}" if storage else "ccache: local only"
    return f"remote caches: role {settings.role}; {bazel_part}; {ccache_part}"


# --- the secrets file (host writes, builder reads) ---------------------------------------


def read_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    name = environ.get(ENV_SECRETS_FILE)
    if not name:
        return {}
    data = json.loads(Path(name).read_text(encoding="utf-8"))
    return {str(key): str(value) for key, value in data.items()}


def write_private_file(path: Path, text: str) -> None:
    """A credential-bearing file only its owner can read (0600, in a 0700 directory),
    written by rename: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # an old one could have a wider mode; O_CREAT keeps it
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)
