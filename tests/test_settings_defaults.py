"""A setting's default is written once, in its row of the settings table
(host/src/xla_host/settings.py): an option dataclass's field for that setting takes it from
the row (``default_of("--flag")``) and never repeats the value."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.gitrepos import SOURCE_DIRS
from xla_wheels.settings_rows import SETTINGS, Setting, default_of, default_value

#: The calls that read a default from its row.
_FROM_THE_ROW = ("default_of", "default_value", "by_flag")


def _rows_by_field_name(*, with_default: bool = True) -> dict[str, Setting]:
    """A field names the setting of a row by the flag's attribute name, with ``_s`` where
    the field is in seconds (``child_timeout_s`` is ``--child-timeout``): the rows with one
    default (``with_default``), else those whose default is only a text (the number of
    cores)."""
    rows: dict[str, Setting] = {}
    for setting in SETTINGS:
        if not setting.flag or (setting.default == "") or (setting.default is None) == with_default:
            continue  # "": no default to repeat
        name = setting.dest or setting.flag.lstrip("-").replace("-", "_")
        rows[name] = rows[f"{name}_s"] = setting
    return rows


def _module_of(path: Path, source_dir: Path) -> str:
    parts = path.relative_to(source_dir).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _assignments(tree: ast.Module) -> dict[str, ast.expr]:
    return {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _imports(tree: ast.Module, module: str) -> dict[str, str]:
    """The module each imported name of ``tree`` stands for (``workloads`` ->
    ``xla_host.gate.workload``), for following a default to where it is written."""
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name
    return names


def _source_of(name: str) -> tuple[ast.Module, str] | None:
    for source_dir in SOURCE_DIRS:
        for candidate in (name.replace(".", "/") + ".py", name.replace(".", "/") + "/__init__.py"):
            path = source_dir / candidate
            if path.is_file():
                return ast.parse(path.read_text(encoding="utf-8")), name
    return None


def _reads_the_row(expression: ast.expr, tree: ast.Module, module: str, depth: int = 0) -> bool:
    """Whether ``expression`` (a field's default), or a module constant it names (followed
    across modules), is read from a row of the settings table."""
    calls = {
        node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        for node in ast.walk(expression)
        if isinstance(node, ast.Call)
    }
    if calls & set(_FROM_THE_ROW):
        return True
    if depth > 3:
        return False
    return any(_follows_to_the_row(node, tree, module, depth) for node in ast.walk(expression))


def _follows_to_the_row(node: ast.AST, tree: ast.Module, module: str, depth: int) -> bool:
    """Whether ``node`` names a constant (of this module, imported, or ``module.NAME``)
    written from a row."""
    assignments, imports = _assignments(tree), _imports(tree, module)
    if isinstance(node, ast.Name) and node.id in assignments:
        return _reads_the_row(assignments[node.id], tree, module, depth + 1)
    if isinstance(node, ast.Name) and node.id in imports:
        where, _, constant = imports[node.id].rpartition(".")
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        where, constant = imports.get(node.value.id, ""), node.attr
    else:
        return False
    found = _source_of(where)
    return (
        bool(found)
        and constant in _assignments(found[0])
        and _reads_the_row(_assignments(found[0])[constant], *found, depth + 1)
    )


def _as_row_value(value: Any) -> Any:
    """A field's default as a row writes it: a path as its text, a named object (a
    workload preset) by its name."""
    if isinstance(value, Path):
        return value.as_posix()
    if not isinstance(value, str | int | float | bool) and isinstance(
        getattr(value, "name", None), str
    ):
        return value.name
    return value


def _copied_defaults() -> Iterator[str]:
    rows, without = _rows_by_field_name(), _rows_by_field_name(with_default=False)
    for source_dir in SOURCE_DIRS:
        for path in sorted(source_dir.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module = _module_of(path, source_dir)
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                if not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
                    continue
                # An option dataclass (one that takes a default from the rows): a field
                # named as a row without one default is that setting, not another meaning.
                if any(_reads_the_row(s, tree, module) for s in cls.body if _has_value(s)):
                    for statement in cls.body:
                        yield from _made_up_default(statement, without, f"{module}.{cls.name}")
                for statement in cls.body:
                    if not (
                        isinstance(statement, ast.AnnAssign)
                        and isinstance(statement.target, ast.Name)
                        and statement.value is not None
                        and statement.target.id in rows
                    ):
                        continue
                    setting = rows[statement.target.id]
                    fields = dataclasses.fields(getattr(importlib.import_module(module), cls.name))
                    default = next(f.default for f in fields if f.name == statement.target.id)
                    if default != default_value(str(setting.flag)) and (
                        _as_row_value(default) != setting.default
                    ):
                        continue  # another meaning, or a default of its own
                    if not _reads_the_row(statement.value, tree, module):
                        yield (
                            f"{module}.{cls.name}.{statement.target.id} = "
                            f"{ast.unparse(statement.value)} repeats the default of "
                            f"{setting.flag} ({setting.default!r})"
                        )


def _has_value(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.AnnAssign) and statement.value is not None


def _made_up_default(statement: ast.stmt, rows: dict[str, Setting], where: str) -> Iterator[str]:
    """A field of a setting whose row writes no one default (its default is a text, such as
    "the number of cores") with a literal default of its own: a second answer, which the
    row does not give. None (decided later, as the row's text says) and a factory are
    not."""
    if (
        isinstance(statement, ast.AnnAssign)
        and isinstance(statement.target, ast.Name)
        and statement.target.id in rows
        and isinstance(statement.value, ast.Constant)
        and statement.value.value not in (None, "", False)
    ):
        setting = rows[statement.target.id]
        yield (
            f"{where}.{statement.target.id} = {ast.unparse(statement.value)}, while the row "
            f"of {setting.flag} says {setting.shown_default!r}"
        )


def test_no_option_dataclass_repeats_a_rows_default() -> None:
    copies = list(_copied_defaults())
    assert not copies, (
        "write it as default_of(FLAG) (xla_host.settings) or default_value(FLAG)\n"
        "(xla_host.arguments), the row being the one place; where the row's default is a\n"
        "text, as None or a default_factory computing it:\n" + "\n".join(copies)
    )


def test_default_of_is_the_rows_value_and_refuses_a_row_without_one() -> None:
    assert default_of("--warm-runs") == 2
    assert default_of("--image") == "localhost/xla-wheels-builder:latest"
    for flag in ("--jobs", "--no-such-flag"):  # the number of cores: no one value
        try:
            default_of(flag)
        except KeyError as error:
            assert flag in str(error)
        else:
            raise AssertionError(f"default_of({flag}) gave a value")


def test_one_cascade_reads_the_flag_then_the_environment_then_the_file_then_the_default(
    tmp_path: Path,
) -> None:
    """The order every setting is read in, written once (``Cascade``): the remote caches'
    reader and the CLI's options reader both go through it."""
    from xla_wheels.settings_rows import Cascade, ConfigFile

    builders = ConfigFile(str(tmp_path / "builders.toml"), {"bazel.remote_cache": "grpc://file"})
    variable = {"XLA_WHEELS_BAZEL_REMOTE_CACHE": "grpc://env"}
    flag = {"bazel_remote_cache": "grpc://flag"}
    key = "--bazel-remote-cache"
    assert Cascade(flag, variable, [builders]).find(key) == ("grpc://flag", key)
    assert Cascade({}, variable, [builders]).find(key) == (
        "grpc://env",
        "XLA_WHEELS_BAZEL_REMOTE_CACHE",
    )
    assert Cascade({"bazel_remote_cache": ""}, {}, [builders]).find(key) == (
        "grpc://file",
        f"{tmp_path / 'builders.toml'}: key 'bazel.remote_cache'",
    )
    assert Cascade({}, {}, []).find(key) == (None, "default")
    # An empty flag, variable or key gives way; the row's default comes last.
    role = "XLA_WHEELS_BUILDER_ROLE"
    empty = ConfigFile("builders.toml", {"builder.role": ""})
    assert Cascade({}, {role: ""}, [empty]).find(role) == ("reader", "default")
    assert Cascade({}, {}, [ConfigFile("b", {"builder.role": "writer"})]).find(role)[0] == "writer"
    assert Cascade({}, {}, []).find("--warm-runs", default=False) == (None, "default")
