"""Which of torch's shared libraries a Bazel target links, read from the tree's BUILD files.

A check program stands for one Bazel target of the tree (``CheckProgram.link_target``): a
``cc_test`` such as ``//torch_xla/csrc/runtime:cache_test``, or ``//:_XLAC.so`` for functions
that are only linked into the extension. The program is linked with exactly the torch
libraries that target declares, directly or through the tree's own targets it depends on,
so a library the BUILD file forgets fails to link here as it does in Bazel: GNU ld and gold
refuse a symbol of ``libc10`` reached only through ``libtorch_cpu``'s ``DT_NEEDED``
("DSO missing from command line").

The reader understands what torch_xla's BUILD files use: top-level rule calls with
``name = "..."`` and ``deps = <lists of labels>`` (every string of the ``deps`` expression
counts except a ``select()``'s conditions, so a ``select()`` counts all its branches), and
the macros of ``bazel/rules_def.bzl`` whose ``native.*`` call adds ``deps = deps + [...]``.
External labels (``@repo//...``) are leaves; of those, only ``@torch//`` libraries are
linked from here (absl and googletest come from the program's own fields, as Debian's
libraries, not Bazel's).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

#: ``@torch//`` labels that are shared libraries (``bazel/torch.BUILD``'s ``cc_import``s),
#: in link order: a library before the libraries it needs.
TORCH_LIBRARIES: dict[str, str] = {
    "@torch//:libtorch_python": "torch_python",
    "@torch//:libtorch": "torch",
    "@torch//:libtorch_cpu": "torch_cpu",
    "@torch//:libc10": "c10",
}

MACROS_FILE = "bazel/rules_def.bzl"


class BuildFileError(Exception):
    """A target or BUILD file the reader cannot find or read (reported per program)."""


@dataclass(frozen=True)
class Rule:
    kind: str
    name: str
    deps: tuple[str, ...]


_STRING = re.compile(r'"([^"\\]*)"')


def _labels(expression: str) -> tuple[str, ...]:
    """The string literals of an expression, except dict keys (a select()'s conditions)."""
    labels = []
    for match in _STRING.finditer(expression):
        if not expression[match.end() :].lstrip().startswith(":"):
            labels.append(match.group(1))
    return tuple(labels)


def _strip_comments(text: str) -> str:
    # Labels and names hold no '#'; a '#' inside another string would only shorten a
    # line that names no dependency.
    return "\n".join(line.split("#", 1)[0] for line in text.split("\n"))


def _calls(text: str) -> list[tuple[str, str]]:
    """Top-level ``kind(...)`` calls: (kind, the text between the parentheses)."""
    calls = []
    for match in re.finditer(r"^(\w+(?:\.\w+)?)\(", text, re.MULTILINE):
        depth, i, in_string = 1, match.end(), False
        while i < len(text) and depth:
            char = text[i]
            if char == '"':
                in_string = not in_string
            elif not in_string:
                depth += {"(": 1, ")": -1}.get(char, 0)
            i += 1
        calls.append((match.group(1), text[match.end() : i - 1]))
    return calls


def _argument(body: str, name: str) -> str | None:
    """The text of keyword argument ``name`` of a call body, up to its top-level comma."""
    match = re.search(rf"(?:^|[\s,(]){name}\s*=", body)
    if match is None:
        return None
    depth, i, in_string = 0, match.end(), False
    while i < len(body):
        char = body[i]
        if char == '"':
            in_string = not in_string
        elif not in_string:
            if char in "([{":
                depth += 1
            elif char in ")]}":
                depth -= 1
            elif char == "," and depth == 0:
                break
        i += 1
    return body[match.end() : i]


def parse_build(text: str) -> dict[str, Rule]:
    """The rules of a BUILD file by name (calls without a literal ``name`` are skipped)."""
    rules: dict[str, Rule] = {}
    for kind, body in _calls(_strip_comments(text)):
        name = _argument(body, "name")
        names = _STRING.findall(name or "")
        if len(names) != 1:
            continue
        deps = _labels(_argument(body, "deps") or "")
        rules[names[0]] = Rule(kind, names[0], tuple(deps))
    return rules


def parse_macros(text: str) -> dict[str, tuple[str, ...]]:
    """macro name -> the labels its ``deps = deps + [...]`` adds (bazel/rules_def.bzl)."""
    macros: dict[str, tuple[str, ...]] = {}
    text = _strip_comments(text)
    for match in re.finditer(r"^def (\w+)\(", text, re.MULTILINE):
        following = text[match.end() :]
        end = re.search(r"^def \w+\(", following, re.MULTILINE)
        body = following[: end.start() if end else len(following)]
        added = re.search(r"deps\s*=\s*deps\s*\+\s*\[([^\]]*)\]", body)
        macros[match.group(1)] = tuple(_STRING.findall(added.group(1))) if added else ()
    return macros


def split_label(label: str, package: str) -> tuple[str, str] | None:
    """(package, name) of a label of the tree; None for an external (``@repo``) label."""
    if label.startswith("@"):
        return None
    if label.startswith(":"):
        return package, label[1:]
    if label.startswith("//"):
        path, _, name = label[2:].partition(":")
        return path, name or path.rsplit("/", 1)[-1]
    return package, label  # a bare name is a target of the same package


def external_deps(tree: Path, target: str) -> frozenset[str]:
    """The external labels ``target`` (``//package:name``) depends on, through the tree's
    own targets, macros' added dependencies included."""
    located = split_label(target, "")
    if located is None:
        raise BuildFileError(f"{target} is not a target of the tree")
    macros_path = tree / MACROS_FILE
    macros = parse_macros(macros_path.read_text(encoding="utf-8")) if macros_path.is_file() else {}
    packages: dict[str, dict[str, Rule]] = {}
    found: set[str] = set()
    seen: set[tuple[str, str]] = set()
    queue = deque([located])
    while queue:
        package, name = queue.popleft()
        if (package, name) in seen:
            continue
        seen.add((package, name))
        if package not in packages:
            build = tree / package / "BUILD"
            if not build.is_file():
                build = tree / package / "BUILD.bazel"
            if not build.is_file():
                raise BuildFileError(f"no BUILD file for //{package} (needed by {target})")
            packages[package] = parse_build(build.read_text(encoding="utf-8"))
        rule = packages[package].get(name)
        if rule is None:
            raise BuildFileError(f"//{package}:{name} is not defined in {package or '.'}/BUILD")
        for label in (*rule.deps, *macros.get(rule.kind, ())):
            local = split_label(label, package)
            if local is None:
                found.add(label)
            else:
                queue.append(local)
    return frozenset(found)


def torch_libraries(tree: Path, target: str) -> tuple[str, ...]:
    """The torch libraries (``-l`` names, in link order) ``target`` declares."""
    declared = external_deps(tree, target)
    return tuple(lib for label, lib in TORCH_LIBRARIES.items() if label in declared)
