"""argparse types of the values both command lines read (numbers in a range, an output
directory): a value is refused at parse time with :mod:`xla_host.values`' reason, and
``example`` is a value that works, for the fix the CLI edge prints."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from xla_host.errors import UsageError
from xla_host.settings import HOST, Cascade, Setting, Table
from xla_host.values import (
    SWITCH_SPELLINGS,
    BadValue,
    check_output_dir,
    parse_amount,
    parse_count,
    parse_switch,
)


class ValueType:
    """An argparse ``type`` from a :mod:`xla_host.values` parser: a value is refused at
    parse time with the parser's reason; ``example`` is a value that works (for the fix)."""

    def __init__(self, parse: Callable[[str], Any], example: str, name: str) -> None:
        self.parse = parse
        self.example = example
        self.__name__ = name  # argparse names the type in some of its messages

    def __call__(self, text: str) -> Any:
        try:
            return self.parse(text)
        except BadValue as bad:
            raise argparse.ArgumentTypeError(f"{text!r} {bad.reason}") from None


def count(low: int, high: int, example: int) -> ValueType:
    """A whole number in ``[low, high]``."""
    return ValueType(
        lambda text: parse_count(text, low=low, high=high, example=example), str(example), "count"
    )


def amount(low: float, high: float, example: float, unit: str) -> ValueType:
    """A finite number of ``unit`` in ``[low, high]``."""
    return ValueType(
        lambda text: parse_amount(text, low=low, high=high, example=example, unit=unit),
        f"{example:g}",
        "amount",
    )


#: A directory the pipeline writes into (``--out``, ``--out-dir``, ``--cache-dir``).
OUTPUT_DIR = ValueType(check_output_dir, "out", "directory")


def machine_cache(environ: Mapping[str, str], variable: str = "XLA_WHEELS_CACHE") -> Path:
    """Per-machine cache (sources, environments, wheel files): survives ``git clean``.

    ``$XLA_WHEELS_CACHE`` (``variable``: the builder names it from its settings table),
    else ``$XDG_CACHE_HOME/xla-wheels``, else ``~/.cache/xla-wheels``. The builder, the
    gate and the host's commands all call this, so they share one cache.
    """
    if value := environ.get(variable):
        return Path(value).expanduser()
    if base := environ.get("XDG_CACHE_HOME"):
        return Path(base).expanduser() / "xla-wheels"
    home = Path(environ["HOME"]) if environ.get("HOME") else Path.home()
    return home / ".cache" / "xla-wheels"


# --- the settings table's rows as flags ---------------------------------------------------


class SwitchAction(argparse.Action):
    """An on/off flag: ``--dry-run`` alone is on; ``--dry-run=VALUE`` is on or off by
    :func:`xla_host.values.parse_switch` (the Makefile passes the user's raw value), and
    any other value is refused at parse time, before anything runs."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("metavar", "yes|no")
        super().__init__(option_strings, dest, nargs="?", **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, self.parse(values))

    def parse(self, values: str | Sequence[Any] | None) -> bool:
        if values is None:
            return True
        try:
            return parse_switch(str(values))
        except BadValue as bad:
            raise argparse.ArgumentError(self, f"{values!r} {bad.reason}") from None


class RefusedSwitchAction(SwitchAction):
    """``--dry-run`` of a subcommand that has no dry run: off is accepted (so that
    ``DRY_RUN=0`` through make works everywhere), on is refused: running for real when
    the user asked for a dry run would act behind their back."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if self.parse(values):
            command = getattr(namespace, "command", None) or parser.prog.split()[-1]
            raise argparse.ArgumentError(self, f"{command} has no dry run")
        setattr(namespace, self.dest, False)


def add_switch(
    parser: argparse.ArgumentParser | Any, flag: str, *, help: str, default: bool | None = False
) -> None:
    """An on/off flag (see :class:`SwitchAction`); ``default`` None when an environment
    variable may give it (the options reader then looks there)."""
    parser.add_argument(
        flag, action=SwitchAction, default=default, help=f"{help} [{SWITCH_SPELLINGS}]"
    )


def value_type(setting: Setting) -> ValueType:
    """The argparse ``type`` of a number setting of the table: its range, its default as
    the example of a value that works."""
    example = setting.default if isinstance(setting.default, float | int) else setting.example
    assert setting.low is not None and setting.high is not None and example is not None
    if setting.kind == "count":
        return count(int(setting.low), int(setting.high), int(example))
    return amount(setting.low, setting.high, example, setting.unit)


_TYPES: dict[str, Callable[[str], Any]] = {"path": Path, "directory": OUTPUT_DIR}

#: A value that works, for the fix, of each kind whose row has no default to show.
_EXAMPLES = {"names": "git,patch", "arguments": "--no-cache-dir", "assignments": "CC=clang"}


def parse_text(setting: Setting, text: str) -> Any:
    """The value of ``setting`` written as ``text`` (a variable's, a config file's, a flag
    argparse left as text, the row's default), by the row's kind and choices: a
    :class:`BadValue` with the reason when it is not one."""
    example = str(setting.default) if setting.default not in (None, "") else ""
    example = example or _EXAMPLES.get(setting.kind, "")
    if setting.kind in ("count", "amount"):
        return value_type(setting).parse(text)
    if setting.kind == "switch":
        return parse_switch(text)
    if setting.kind == "names":
        return tuple(name.strip() for name in text.split(",") if name.strip())
    if setting.kind in ("arguments", "assignments"):
        try:
            words = tuple(shlex.split(text))
        except ValueError as error:  # an unclosed quote
            raise BadValue(f"is not shell-quoted words ({error})", example) from None
        if setting.kind == "arguments":
            return words
        pairs = tuple(word.partition("=") for word in words)
        for word, (name, equals, _) in zip(words, pairs, strict=True):
            if not (name and equals):
                raise BadValue(f"has {word!r}, which is not NAME=VALUE", example)
        return tuple((name, value) for name, _, value in pairs)
    if setting.kind == "path":
        return Path(text).expanduser()
    if setting.kind == "directory":
        return check_output_dir(text)
    if setting.choices and text not in setting.choices:
        raise BadValue(f"is not one of {', '.join(setting.choices)}", setting.choices[0])
    return text


def default_value(key: str, table: Table = HOST) -> Any:
    """The default of the row of ``key`` (a flag, or a variable without one) as the code
    uses it (``"git,patch"`` of a ``names`` row is ``("git", "patch")``): the option
    dataclasses' fields take it from here, the row being the one place it is written."""
    setting = table.by_key(key)
    if setting.default is None:
        raise KeyError(f"{key}: its row of the settings table has no one default")
    if isinstance(setting.default, str):
        return parse_text(setting, setting.default)
    return setting.default


def read_setting(cascade: Cascade, key: str, *, default: bool = True) -> Any:
    """The setting of ``key`` by the one order (:class:`Cascade`), as the code uses it: a
    value argparse already typed as it is, a text parsed by :func:`parse_text`; a text that
    is no such value is a :class:`UsageError` naming the flag and the variable, with a fix
    for where the value came from."""
    setting = cascade.table.by_key(key)
    value, source = cascade.find(key, default=default)
    if not isinstance(value, str):
        return value
    try:
        return parse_text(setting, value)
    except BadValue as bad:
        raise refused(setting, value, source, bad) from None


def refused(setting: Setting, text: str, source: str, bad: BadValue) -> UsageError:
    """A value of ``setting`` that is not one, from ``source`` (its flag, its variable, a
    config file's key): the message names the flag and the variable; the fix changes the
    value where it was given."""
    names = " / ".join(n for n in (setting.flag, setting.env) if n)
    make = f" (make: {setting.make}={shlex.quote(bad.example)})" if setting.make else ""
    if source == setting.flag:
        fix = f"pass {setting.flag} {shlex.quote(bad.example)}{make}"
    elif source == setting.env:
        fix = f"set {setting.env}={shlex.quote(bad.example)}, or unset it"
    else:
        fix = f"write {bad.example!r} in {source}"
    return UsageError(f"{names}: {text!r} (from {source}) {bad.reason}", fix=fix)


def add_setting(
    parser: argparse.ArgumentParser | Any,
    setting: Setting,
    *,
    command: str | None = None,
    kind: Callable[[str], Any] | None = None,
) -> None:
    """The flag of one row of the settings table as subcommand ``command`` takes it, its
    default in its help. A row with an environment variable gets no argparse default: the
    options reader then looks at the environment, then the row's default. ``kind``: the
    type, when it is not the row's own (a fix that depends on the machine)."""
    assert setting.flag is not None
    # The table's commands column is what --help and make help say: a subcommand that
    # takes a flag its row does not list would make both wrong.
    assert (
        not setting.commands or command is None or command in setting.commands
    ), f"{setting.flag} is not a setting of {command} in the settings table"
    per = setting.per(command)
    default = (per.default if per else setting.default) if setting.env is None else None
    help = setting.help_with_default(command)
    if setting.kind == "switch":
        add_switch(parser, setting.flag, default=None if setting.env else False, help=help)
        return
    extra: dict[str, Any] = {}
    if setting.dest:
        extra["dest"] = setting.dest
    if setting.metavar:
        extra["metavar"] = setting.metavar
    if setting.kind in ("repeated", "words"):
        parser.add_argument(setting.flag, action="append", help=help, **extra)
        return
    if kind is None:
        numeric = setting.kind in ("count", "amount")
        kind = value_type(setting) if numeric else _TYPES.get(setting.kind, str)
    parser.add_argument(
        setting.flag,
        type=kind,
        default=default,
        choices=(setting.choices if per is None or per.choices is None else per.choices) or None,
        help=help,
        **extra,
    )


def add_settings(
    parser: argparse.ArgumentParser | Any, command: str, *flags: str, table: Table = HOST
) -> None:
    """The flags of subcommand ``command``, each from its row (of ``table``)."""
    for flag in flags:
        add_setting(parser, table.by_flag(flag), command=command)
