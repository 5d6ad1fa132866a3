"""One typed reader for the tables the pipeline reads from files (TOML and JSON).

Bundle manifests, ``wheels.lock``, ``build/lanes.toml``, ``build/builders.toml`` and the
provenance file inside our wheel are all nested tables of a few scalar types. Each
format declares its keys as :class:`Field` specs (type, required or optional, default)
and reads them through one :class:`Table`, so every format reports a problem the same
way: the file, the dotted key, what is wrong, and the fix, as the format's own error
class (a :class:`~xla_wheels.errors.PipelineError` subclass, or anything built as
``error(message, fix=...)``). An unknown key is almost always a typo that would otherwise
be silently ignored, so it is an error with a "did you mean" suggestion.

Standard library only (and ``errors``' own): the provenance reader runs inside the builder
image, which has no pipeline dependencies.
"""

from __future__ import annotations

import codecs
import difflib
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


def read_utf8(path: Path, error: ErrorFactory, *, what: str = "file") -> tuple[str, bytes]:
    """The text and bytes of a file the user edits, or the format's ``error`` in the user's
    terms: a directory says it is a directory, bytes that are not UTF-8 say "save it as
    UTF-8", an unreadable file names the reason. ``FileNotFoundError`` is left to the
    caller, which knows whether a missing file is an error (and what creates it)."""
    if path.is_dir():
        raise error(
            f"{path} is a directory, not a {what}",
            fix=f"move the directory away and put the {what} at {path}",
        )
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as problem:
        raise error(
            f"{path} cannot be read: {problem.strerror}",
            fix=f"make it readable (`ls -l {path}`)",
        ) from None
    if (bom := bom_problem(raw)) is not None:
        raise error(f"{path} {bom}", fix=BOM_FIX)
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError as problem:
        raise error(
            f"{path}: not UTF-8 text (byte {problem.start} cannot be read)",
            fix="save the file as UTF-8 (TOML files are UTF-8)",
        ) from None


BOM_FIX = (
    "save it as UTF-8 without BOM (most editors offer both 'UTF-8' and 'UTF-8 with BOM')"
)


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
