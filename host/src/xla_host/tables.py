"""One typed reader for the tables the pipeline reads from files (TOML and JSON).

Bundle manifests, ``wheels.lock``, ``build/lanes.toml``, ``build/builders.toml`` and the
provenance file inside our wheel are all nested tables of a few scalar types. Each
format declares its keys as :class:`Field` specs (type, required or optional, default)
and reads them through one :class:`Table`, so every format reports a problem the same
way: the file, the dotted key, what is wrong, and the fix, as the format's own error
class (a :class:`~xla_host.errors.PipelineError` subclass, or anything built as
``error(message, fix=...)``). An unknown key is almost always a typo that would otherwise
be silently ignored, so it is an error with a "did you mean" suggestion.

Standard library only (and ``errors``' own): the provenance reader runs inside the builder
image, which has no pipeline dependencies.
"""

from __future__ import annotations

import codecs
import difflib
import json
import os
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ErrorFactory = Callable[..., Exception]
"""Builds the format's exception: called as ``error(message, fix=fix)``."""


@dataclass(frozen=True)
class Field:
    """One key of a table: its type, whether it must be there, and its default."""

    key: str
    kind: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    items: type | None = None
    """For a list: the type every entry must have."""


def kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _has_kind(value: object, kind: type | tuple[type, ...]) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is a subclass of int; a knob written `cxx_abi = true` is a mistake.
    if isinstance(value, bool) and bool not in kinds:
        return False
    return isinstance(value, kinds)


def suggestion(key: str, allowed: Iterable[str]) -> str | None:
    """The allowed key closest to a mistyped one, if any is close."""
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    return close[0] if close else None


MAX_FILE_BYTES = 8 << 20
"""The largest file the pipeline reads as a whole (manifests, ``wheels.lock``, lanes,
builders, receipts, patches, keys, env files): 8 MiB, hundreds of times any real one, so
a wrong path (a disk image, a log) is refused at once instead of filling memory."""

MAX_DEPTH = 32
"""The deepest nesting of tables and arrays a file may have; real ones nest under 10."""

_SPECIAL = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _special(mode: int) -> str:
    return next((name for test, name in _SPECIAL if test(mode)), "a special file")


def kind_of(mode: int) -> str:
    """What a ``stat`` mode that is not a regular file's names ("a FIFO (named pipe)")."""
    return _special(mode)


def check_regular(
    path: Path, error: ErrorFactory, *, what: str = "file", limit: int = MAX_FILE_BYTES
) -> os.stat_result:
    """``path``'s ``stat`` if it is a regular file (or a link to one) of at most ``limit``
    bytes, else the format's ``error``, decided before anything opens it: opening a FIFO
    waits for a writer forever, a device may never end. ``FileNotFoundError`` is left to
    the caller, which knows whether a missing file is an error."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as problem:
        raise error(
            f"{path} cannot be read: {problem.strerror}",
            fix=f"make it readable (`ls -ld {path}`)",
        ) from None
    if not stat.S_ISREG(status.st_mode):
        kind = _special(status.st_mode)
        if stat.S_ISDIR(status.st_mode):
            fix = f"move the directory away and put the {what} at {path}"
        else:
            fix = f"put a regular {what} at {path} (`ls -l {path}` shows what is there)"
        raise error(f"{path} is {kind}, not a {what}", fix=fix)
    if status.st_size > limit:
        raise error(
            f"{path} is {status.st_size} bytes, more than a {what} may be " f"({limit >> 20} MiB)",
            fix=f"check that {path} is the {what} you meant (a {what} is small text)",
        )
    return status


def read_regular(
    path: Path, error: ErrorFactory, *, what: str = "file", limit: int = MAX_FILE_BYTES
) -> bytes:
    """The bytes of ``path`` after :func:`check_regular`. Opened without blocking and
    checked again once open, so a FIFO put there after the ``stat`` cannot hang the run."""
    check_regular(path, error, what=what, limit=limit)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as problem:
        raise error(
            f"{path} cannot be read: {problem.strerror}",
            fix=f"make it readable (`ls -l {path}`)",
        ) from None
    with os.fdopen(descriptor, "rb") as handle:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise error(f"{path} changed while it was read", fix="run the same command again")
        try:
            raw = handle.read(limit + 1)
        except OSError as problem:
            raise error(
                f"{path} cannot be read: {problem.strerror}",
                fix=f"make it readable (`ls -l {path}`)",
            ) from None
    if len(raw) > limit:
        raise error(
            f"{path} is more than {limit >> 20} MiB, more than a {what} may be",
            fix=f"check that {path} is the {what} you meant (a {what} is small text)",
        )
    return raw


def _too_deep(source: str, error: ErrorFactory, fix: str | None) -> Exception:
    return error(
        f"{source}: tables or arrays nested more than {MAX_DEPTH} levels deep",
        fix=fix or f"write it with at most {MAX_DEPTH} levels of nesting (real files need few)",
    )


def _check_depth(data: object, source: str, error: ErrorFactory, fix: str | None) -> None:
    # Iterative, so a deep value cannot overflow the stack here either.
    pending: list[tuple[object, int]] = [(data, 1)]
    while pending:
        value, depth = pending.pop()
        children: Iterable[object] = ()
        if isinstance(value, Mapping):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise _too_deep(source, error, fix)
        pending.extend((child, depth + 1) for child in children)


def loads_toml(
    text: str, *, source: str, error: ErrorFactory, fix: str | None = None
) -> dict[str, Any]:
    """``tomllib.loads`` within :data:`MAX_DEPTH` (else the format's ``error`` naming
    ``source``, never a ``RecursionError``). ``TOMLDecodeError`` is left to the caller,
    which says what fixes its format."""
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(source, error, fix) from None
    _check_depth(data, source, error, fix)
    return data


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # A literal no writer of ours makes (json.dumps writes Infinity): 1e400, which a
        # later int() would raise OverflowError on.
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def loads_json(
    text: str | bytes, *, source: str, error: ErrorFactory, fix: str | None = None
) -> Any:
    """``json.loads`` within :data:`MAX_DEPTH`, as :func:`loads_toml`, for a file anyone
    may have written (a lane's index, a pack's manifest, a key record): a number literal
    out of a float's range (``1e400``) is a ``ValueError``, which is left to the caller
    with every other one."""
    try:
        data = json.loads(text, parse_float=_finite)
    except RecursionError:
        raise _too_deep(source, error, fix) from None
    _check_depth(data, source, error, fix)
    return data


def read_utf8(path: Path, error: ErrorFactory, *, what: str = "file") -> tuple[str, bytes]:
    """The text and bytes of a file the user edits, or the format's ``error`` in the user's
    terms: a directory, FIFO or device says what it is (refused before it is opened, see
    :func:`check_regular`), bytes that are not UTF-8 say "save it as UTF-8", an unreadable
    file names the reason. ``FileNotFoundError`` is left to the caller, which knows
    whether a missing file is an error (and what creates it)."""
    raw = read_regular(path, error, what=what)
    if (bom := bom_problem(raw)) is not None:
        raise error(f"{path} {bom}", fix=BOM_FIX)
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError as problem:
        raise error(
            f"{path}: not UTF-8 text (byte {problem.start} cannot be read)",
            fix="save the file as UTF-8 (TOML files are UTF-8)",
        ) from None


BOM_FIX = "save it as UTF-8 without BOM (most editors offer both 'UTF-8' and 'UTF-8 with BOM')"


def bom_problem(raw: bytes) -> str | None:
    """What is wrong when ``raw`` starts with a byte-order mark, which a TOML parser reports
    only as "Invalid statement (line 1, column 1)"."""
    return "starts with a byte-order mark (BOM)" if raw.startswith(codecs.BOM_UTF8) else None


class Table:
    """A table being read, which knows its file and dotted key for error messages.

    ``fix``, when given, is the fix of every error in the format (a generated file is
    repaired as a whole, e.g. ``wheels.lock`` from git); otherwise each problem names
    its own.
    """

    def __init__(
        self,
        data: Mapping[str, Any],
        *,
        source: str,
        error: ErrorFactory,
        where: str = "",
        fix: str | None = None,
    ) -> None:
        self.data = data
        self.source = source
        self.error = error
        self.where = where
        self.format_fix = fix

    def dotted(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, problem: str, fix: str) -> Exception:
        prefix = f"{self.source}: " if self.source else ""
        return self.error(
            f"{prefix}key '{self.dotted(key)}': {problem}", fix=self.format_fix or fix
        )

    def check_keys(self, allowed: Iterable[str]) -> None:
        """Every key is one of ``allowed`` (else "did you mean")."""
        allowed = set(allowed)
        for key in self.data:
            if key not in allowed:
                close = suggestion(key, allowed)
                hint = f"; did you mean '{close}'?" if close else ""
                raise self.fail(
                    key,
                    f"unknown key{hint}",
                    (f"rename it to '{close}', or remove it" if close else "remove it")
                    + f"; keys here: {', '.join(sorted(allowed)) or '(none)'}",
                )

    def read(self, *fields: Field, ignored: Iterable[str] = ()) -> dict[str, Any]:
        """The values of ``fields`` (defaults where absent), after checking every key.

        ``ignored`` keys are accepted and not read (retired fields of older files).
        """
        self.check_keys([field.key for field in fields] + list(ignored))
        return {
            field.key: self.get(
                field.key, field.kind, field.default, field.items, required=field.required
            )
            for field in fields
        }

    def get(
        self,
        key: str,
        kind: type | tuple[type, ...],
        default: Any = None,
        items: type | None = None,
        *,
        required: bool = False,
    ) -> Any:
        """The value of ``key`` if it has type ``kind``; ``default`` when absent (an error
        when ``required``).

        A JSON ``null`` is absent (TOML has no null): an optional field written as null.
        """
        value = self.data.get(key)
        if value is None:
            if not required:
                return default
            if kind is dict:
                raise self.fail(key, "missing table", f"add a [{self.dotted(key)}] table")
            where = f" to [{self.where}]" if self.where else ""
            raise self.fail(key, "missing", f"add '{key} = ...'{where}")
        if not _has_kind(value, kind):
            raise self.fail(
                key,
                f"expected {kind_name(kind)}, got {type(value).__name__} {value!r}",
                f"write it as type {kind_name(kind)}",
            )
        if items is not None:
            for index, entry in enumerate(value):
                if not _has_kind(entry, items):
                    raise self.fail(
                        key,
                        f"entry {index} is not a {items.__name__}: {entry!r}",
                        f"write every entry as type {items.__name__}",
                    )
        return value

    def table(self, key: str, *, optional: bool = False) -> Table:
        """The sub-table ``key`` (an empty one when absent and ``optional``)."""
        if optional and key not in self.data:
            return self._child({}, key)
        return self._child(self.get(key, dict, required=True), key)

    def tables(self, key: str) -> dict[str, Table]:
        """Each entry of a table of tables (``[lanes.<name>]``), by name; absent: none."""
        parent = self.table(key, optional=True)
        return {str(name): parent.table(str(name)) for name in parent.data}

    def rows(self, key: str) -> list[Table] | None:
        """An array of tables (``[[wheels]]``), each readable; ``None`` when absent."""
        if self.data.get(key) is None:
            return None
        rows = self.get(key, list, required=True)
        children = []
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise self.fail(
                    f"{key}[{index}]",
                    f"expected a table, got {type(row).__name__}",
                    "write a table",
                )
            children.append(self._child(row, f"{key}[{index}]"))
        return children

    def _child(self, data: Mapping[str, Any], key: str) -> Table:
        return Table(
            data, source=self.source, error=self.error, where=self.dotted(key), fix=self.format_fix
        )
