"""The one options reader of the pipeline: command line, then environment, then the config
files, then default (:class:`xla_host.settings.Cascade`'s order).

As in cibuildwheel's ``options.py``, every setting is read here, once, at the CLI edge,
from the parsed arguments and an ``environ`` mapping the caller passes in (the CLI passes
``os.environ``, tests pass a dict). Stages receive the frozen objects built here (their types
live low, in :mod:`xla_wheels.options`) and never read the environment for a setting
themselves. A flag's environment variable follows :mod:`xla_wheels.options`' naming rule
(``--cache-dir`` is ``XLA_WHEELS_CACHE``).

The Makefile's short variables (``BUNDLE``, ``ENGINE``, ``JOBS``, ...) become
command-line flags in one place in the Makefile, which holds no default of its own: the
defaults are the rows', which the option dataclasses (``options``, ``builder.config``)
take through ``default_of``.

The remote compile caches' settings (``XLA_WHEELS_BUILDER_ROLE``,
``XLA_WHEELS_BAZEL_REMOTE_*``, ``XLA_WHEELS_CCACHE_REMOTE_*``, ``XLA_WHEELS_BUILDERS_CONFIG``)
and their credentials are read by :mod:`xla_wheels.builder.remote_cache` from the
``environ`` mapping and flags :func:`build_config` passes it: that module owns
``build/builders.toml`` (the file layer of the same cascade) and the secrets (which never
become flags). ``--bazel-remote-cache`` on the command line overrides both.

Read from the environment besides our own settings, because it belongs to another tool:
``PIP_INDEX_URL`` (pip's own mirror setting, passed on to the build's pip commands).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xla_host.arguments import read_setting, value_type
from xla_host.errors import UsageError
from xla_host.net import NetworkPolicy
from xla_host.values import (
    REMOTE_RULE,
    WHOLE_NUMBER,
    BadValue,
    check_output_dir,
    check_remote,
    check_url,
    digits_hint,
    parse_count,
    parse_switch,
)
from xla_wheels.cli.arguments import NET_RETRIES, NET_TIMEOUT, PROGRESS_INTERVAL
from xla_wheels.cli.from_make import closest
from xla_wheels.disk_faults import existing
from xla_wheels.options import (
    ENV_PREFIX,
    PipelineOptions,
    PublishOptions,
    SupplyOptions,
    env_var,
    known_environment,
    machine_cache,
)
from xla_wheels.settings_rows import SETTINGS, Cascade, ConfigFile, by_flag

#: The most compile jobs one builder may ask for: more is a typo (JOBS=1e9), not a machine.
MAX_JOBS = int(by_flag("--jobs").high or 0)

if TYPE_CHECKING:
    from xla_wheels.builder.config import BuildConfig


class Settings:
    """One lookup: the parsed flag if given, else ``XLA_WHEELS_<NAME>``, else the config
    files' key, else None (the caller's default is built from the row): the order of
    :class:`xla_host.settings.Cascade`, which this reads through."""

    def __init__(
        self,
        args: argparse.Namespace,
        environ: Mapping[str, str],
        files: Sequence[ConfigFile] = (),
    ) -> None:
        self._args = args
        self._environ = environ
        self._cascade = Cascade(vars(args), environ, files)

    def value(self, flag: str) -> Any:
        """The flag's value as the code uses it, else the variable's, else the config
        files', else its row's default (:func:`xla_host.arguments.read_setting`): a text
        that is no such value is refused naming the flag and the variable."""
        return read_setting(self._cascade, flag)

    def text(self, flag: str) -> str | None:
        value = self._cascade.find(flag, default=False)[0]
        return None if value is None else str(value)

    def path(self, flag: str) -> Path | None:
        value = self.text(flag)
        return Path(value).expanduser() if value else None

    def switch(self, flag: str) -> bool:
        """The flag's value when given (on or off), else the environment's, else off."""
        value = getattr(self._args, flag.lstrip("-").replace("-", "_"), None)
        if isinstance(value, bool):
            return value
        return env_switch(self._environ, flag)


def env_switch(environ: Mapping[str, str], flag: str) -> bool:
    """``XLA_WHEELS_<NAME>`` as a switch: unset is off; a value not in the documented
    spellings is a :class:`UsageError`, never a silent "off"."""
    name = env_var(flag)
    text = environ.get(name)
    if text is None:
        return False
    try:
        return parse_switch(text)
    except BadValue as bad:
        raise UsageError(
            f"{name}={text!r} {bad.reason} (the variable of {flag})",
            fix=f"set {name}=1 or {name}=0, or unset it",
        ) from None


def refuse_dry_run(command: str) -> None:
    """The environment asks for a dry run of ``command``, which has none: running it for
    real would act behind the user's back."""
    raise UsageError(
        f"{command} has no dry run, and {env_var('--dry-run')} is set",
        fix=f"unset {env_var('--dry-run')} to run it for real",
    )


def env_number(environ: Mapping[str, str], flag: str, parse: Callable[[str], float]) -> None:
    """Check ``XLA_WHEELS_<NAME>`` with ``parse`` (a :mod:`xla_host.values` parser)."""
    name = env_var(flag)
    text = environ.get(name)
    if text:
        try:
            parse(text)
        except BadValue as bad:
            raise UsageError(
                f"{name}={text!r} {bad.reason} (the variable of {flag})",
                fix=f"set {name}={bad.example}, or unset it",
            ) from None


def check_environment(environ: Mapping[str, str]) -> None:
    """Every ``XLA_WHEELS_*`` switch and number of the environment, whichever subcommand
    runs: a value that is not understood is refused (exit 2) before anything runs, and so
    is a name the pipeline does not read (a typo of a known one would be ignored)."""
    known = known_environment()
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            guess = closest(name, known, prefix=ENV_PREFIX)
            raise UsageError(
                f"{name} is not a setting of this pipeline"
                + (f" (did you mean {guess}?)" if guess else ""),
                fix=(f"rename it to {guess}, or unset {name}" if guess else f"unset {name}")
                + " (docs/settings.md, 'Settings: flags, environment, defaults', lists them)",
            )
    # The switches and numbers of the settings table, read by this subcommand or not.
    for setting in SETTINGS:
        if setting.env is None or setting.flag is None:
            continue
        if setting.kind == "switch":
            env_switch(environ, setting.flag)
        elif setting.flag == "--jobs":  # its fix proposes what fits this machine
            env_number(environ, setting.flag, _jobs)
        elif setting.kind in ("count", "amount"):
            env_number(environ, setting.flag, value_type(setting).parse)
        elif setting.kind in ("names", "arguments", "assignments") and setting.env in environ:
            read_setting(Cascade({}, environ), setting.flag)


def _jobs(text: str) -> int:
    # Imported here: every subcommand checks XLA_WHEELS_JOBS, the gate's too, which load
    # nothing of the build stage otherwise. The example is what fits this machine.
    from xla_wheels.builder.config import jobs_that_fit

    return parse_count(text, low=1, high=MAX_JOBS, example=jobs_that_fit())


def _number(settings: Settings, flag: str, parse: Callable[[str], float], default: float) -> float:
    """The flag's number, else the environment's, else ``default``: already checked where
    it entered (a flag by its argparse type, the environment by :func:`check_environment`
    before the subcommand runs)."""
    text = settings.text(flag)
    return default if text is None else parse(text)


def _a_directory(flag: str, path: Path) -> Path:
    """``path`` resolved, refused when it, or the nearest part of it that exists, is not a
    directory (a file named where the run makes its directories): before anything runs,
    dry run too, rather than a NotADirectoryError half way."""
    path = path.resolve()
    there = existing(path)
    if not there.is_dir():
        where = f"{path} cannot be made: {there}" if there != path else str(path)
        raise UsageError(
            f"{env_var(flag)} / {flag}: {where} is a file, not a directory",
            fix=f"set {env_var(flag)} (or pass {flag}) to a directory, or move {there} away",
        )
    return path


def pipeline_options(args: argparse.Namespace, environ: Mapping[str, str]) -> PipelineOptions:
    settings = Settings(args, environ)
    if not getattr(args, "has_dry_run", False) and settings.switch("--dry-run"):
        refuse_dry_run(getattr(args, "command", None) or "this subcommand")
    root = (settings.path("--root") or Path(".")).resolve()
    if not (root / "build" / "bundles").is_dir():
        raise UsageError(
            f"{root} is not a project checkout (no build/bundles directory)",
            fix="run from the repository root or pass --root",
        )
    # The network steps' time limits and retries (``xla_host.net``); the progress
    # interval paces their ``still waiting`` lines and a long fetch's heartbeat.
    policy = NetworkPolicy()
    return PipelineOptions(
        root=root,
        cache_dir=_a_directory(
            "--cache-dir", _outside_git(settings, "--cache-dir") or machine_cache(environ)
        ),
        out_dir=_a_directory("--out-dir", _outside_git(settings, "--out-dir") or root / "out"),
        mirror=_checked(
            settings, "--mirror", "MIRROR", check_remote, REMOTE_RULE, "/srv/git-mirrors"
        ),
        dry_run=settings.switch("--dry-run"),
        network=NetworkPolicy(
            timeout_s=_number(settings, "--net-timeout", NET_TIMEOUT.parse, policy.timeout_s),
            retries=int(_number(settings, "--net-retries", NET_RETRIES.parse, policy.retries)),
            heartbeat_s=_number(
                settings, "--progress-interval", PROGRESS_INTERVAL.parse, policy.heartbeat_s
            ),
        ),
    )


def build_config(args: argparse.Namespace, environ: Mapping[str, str]) -> BuildConfig:
    """The build stage's settings (``make wheels``, ``make builder-image``): each field
    named as a row of the build (its flag's attribute name) is that setting, read by the
    one cascade (flag, ``XLA_WHEELS_*``, ``build/builders.toml`` where its row has a key,
    the row's default); the rows are the only place a default is written. A new build
    setting is its row and its field: nothing here."""
    # Imported here, not at the top: the gate's subcommands read their options from this
    # module too and must not load the build stage's modules.
    from xla_wheels.builder.config import BuildConfig, cores
    from xla_wheels.builder.remote_cache import load_remote_cache

    settings = Settings(args, environ)
    # The fields read otherwise: checked for what they reach (the image reference), a
    # default fitted to this machine (jobs), several rows and builders.toml (the remote
    # caches), or no row (pip's own and the reproducible-builds variables).
    explicit: dict[str, Any] = {
        "image": _checked(settings, "--image", "BUILDER_IMAGE", _image, IMAGE_RULE)
        or settings.value("--image"),
        "jobs": int(_number(settings, "--jobs", _jobs, cores())),
        "remote_cache": load_remote_cache(
            (settings.path("--root") or Path(".")).resolve(), environ, vars(args)
        ),
        "build_tag": _build_tag(settings.text("--build-tag")),
        "extra_env": (("PIP_INDEX_URL", pip),) if (pip := environ.get("PIP_INDEX_URL")) else (),
        # The reproducible-builds standard variable, read as every tool reads it.
        "source_date_epoch": _epoch(environ.get("SOURCE_DATE_EPOCH") or None),
    }
    read = {
        field.name: settings.value(_BUILD_ROWS[field.name])
        for field in dataclasses.fields(BuildConfig)
        if field.name in _BUILD_ROWS and field.name not in explicit
    }
    # None: the row gives no one value (its default is a text); the field's own applies.
    return BuildConfig(**{name: v for name, v in read.items() if v is not None}, **explicit)


#: The build's rows by the attribute name of their flag, which names a field of
#: ``BuildConfig`` (``--host-tools``: ``host_tools``).
_BUILD_ROWS = {
    (s.dest or s.flag.lstrip("-").replace("-", "_")): s.flag
    for s in SETTINGS
    if s.flag and "wheels" in s.commands
}


def _epoch(text: str | None) -> int | None:
    if text is None:
        return None
    if not WHOLE_NUMBER.fullmatch(text.strip()):
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text} is not a number of seconds since 1970{digits_hint(text)}",
            fix="unset it (the torch_xla commit's date is used) or give e.g. "
            "SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)",
        )
    return int(text)


def _build_tag(text: str | None) -> str | None:
    if text is None:
        return None
    if not WHOLE_NUMBER.fullmatch(text):
        raise UsageError(
            f"build tag {text!r} is not a number (PEP 427: a build tag starts with a digit; "
            f"this pipeline uses plain build numbers){digits_hint(text)}",
            fix="give a number higher than any recorded for this wheel, e.g. BUILD_TAG=1",
        )
    return text


def _outside_git(settings: Settings, flag: str) -> Path | None:
    """A directory the run writes into, from its flag (checked by argparse) or its
    ``XLA_WHEELS_*`` variable, checked here the same way (:func:`check_output_dir`)."""
    text = settings.text(flag)
    if text is None:
        return None
    try:
        return check_output_dir(text)
    except BadValue as bad:
        raise UsageError(
            f"{flag} ({env_var(flag)}) {text!r} {bad.reason}",
            fix=f"give a directory outside .git, e.g. {env_var(flag)}=out",
        ) from None


def _checked(
    settings: Settings,
    flag: str,
    make_name: str,
    check: Callable[[str], str],
    rule: str,
    example: str | None = None,
) -> str | None:
    """The flag's text value, else the environment's, checked for what it is: each of
    these reaches a command line (git's remote, the container engine's image, twine's
    and pip's index), where a value read as an option would run something else."""
    text = settings.text(flag)
    if text is None:
        return None
    try:
        return check(text)
    except BadValue as bad:
        raise UsageError(
            f"{flag} ({env_var(flag)}, make: {make_name}=) {text!r} {bad.reason}",
            fix=f"give {rule}, e.g. {make_name}={example or bad.example}",
        ) from None


#: A container image reference: [registry[:port]/]path[:tag][@digest].
IMAGE_RULE = "an image reference such as registry.example/xla-wheels-builder:1"
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")


def _image(text: str) -> str:
    if _IMAGE.fullmatch(text) is None:
        raise BadValue(
            "is not an image reference (a letter or digit first; letters, digits and "
            "'._/:@+-' after; no spaces)",
            "xla-wheels-builder:latest",
        )
    return text


def _index_url(text: str) -> str:
    return check_url(text, ("http", "https", "file"), "http://127.0.0.1:8080/simple/")


def _upload_url(text: str) -> str:
    return check_url(text, ("http", "https"), "http://127.0.0.1:8080/")


def publish_options(args: argparse.Namespace, environ: Mapping[str, str]) -> PublishOptions:
    settings = Settings(args, environ)
    return PublishOptions(
        index_url=_checked(
            settings, "--index-url", "INDEX_URL", _index_url, "the index's simple/ page URL"
        ),
        upload_url=_checked(
            settings, "--upload-url", "UPLOAD_URL", _upload_url, "the index's upload URL"
        ),
        python=getattr(args, "python", None) or None,
        no_deps=settings.switch("--no-deps"),
        deps_from=settings.text("--deps-from"),
    )


def supply_options(args: argparse.Namespace, environ: Mapping[str, str]) -> SupplyOptions:
    from xla_wheels.attestation import DEFAULT_BUILDER_ID

    settings = Settings(args, environ)
    return SupplyOptions(
        signing_key=settings.path("--signing-key"),
        public_key=settings.path("--public-key"),
        builder_id=settings.text("--builder-id") or DEFAULT_BUILDER_ID,
    )
