"""``make help``: the targets by purpose, one line each; ``make help TARGET=<target>``: that
target's variables with their defaults, and one example.

Generated from data, never written by hand:

- a target's summary is its ``## `` comment in the Makefile, its purpose its group in
  :data:`TARGET_GROUPS`;
- its variables are the entries of ``MAKE_VARIABLES`` (written from the settings table,
  :mod:`xla_wheels.settings_table`, into the ``make-variables.mk`` the Makefile includes)
  that its recipe reads, through the flag groups it expands (a target without a recipe:
  its prerequisites');
- a variable's text and default are its flag's ``--help`` text in the command the target
  runs (:func:`xla_wheels.cli.help.option_help`); a variable that is no flag nor argument
  of the CLI, its row of the settings table;
- its example is its command's (:data:`xla_wheels.cli.help.EXAMPLES`) written with make
  variables (:func:`make_example`), or, for a target that runs no command, its own
  (:data:`MAKE_ONLY_EXAMPLES`).

The overview is written to ``make-help.txt`` next to this module, every target's entry to
``make-help-targets.txt`` (one paragraph each), which ``make help`` prints or picks from
with cat and awk: so it works on a fresh clone, before ``.venv`` (and the packages most
commands import) exists. ``tests/test_help.py`` fails when those files are not what this
module generates from today's Makefile and CLI; regenerate them with
``make generate``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from xla_host.arguments import SwitchAction
from xla_wheels.cli import build_parser
from xla_wheels.cli.help import EXAMPLES, option_help
from xla_wheels.settings_rows import SETTINGS
from xla_wheels.settings_table import MAKE_FILE

HELP_FILE = Path(__file__).with_name("make-help.txt")
#: ``FLAGS_<COMMAND>``: every make variable of the table that a command's parser takes, as
#: the arguments its target passes (the Makefile includes it: a recipe never lists them).
COMMANDS_FILE = Path(__file__).with_name("make-commands.mk")
#: Every target's full entry, which ``make help TARGET=<target>`` picks out.
TARGETS_FILE = Path(__file__).with_name("make-help-targets.txt")
MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
REGENERATE = "make generate"

#: The targets by purpose, in the order ``make help`` shows them.
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "Start here": ("help", "demo", "venv"),
    "Build (bundle -> sources -> patches -> wheels -> wheels.lock)": (
        "bundles", "diff", "sources", "patch", "patches-check", "series-compile", "patch-export",
        "patch-rebase", "builder-image", "wheels", "lock", "lock-check", "record", "clean",
    ),
    "Publish and install": (
        "publish", "requirements", "verify-install", "doctor", "launch-env", "host-wheel",
    ),
    "Lanes and promotion": (
        "promote", "compare", "rollback", "lanes", "status", "cache-pack", "runtime-image", "jobs",
    ),
    "Supply chain and ABI": ("attest", "rebuild-check", "abi-check"),
    "The gate": ("gate", "bench-restart"),
    "Development": ("test", "test-fast", "lint", "format", "generate", "cache-tools", "docs"),
}  # fmt: skip

#: The examples of the targets that run no subcommand of the CLI. Every other target's
#: example is its command's (:data:`xla_wheels.cli.help.EXAMPLES`), each argument written
#: as the make variable that passes it (:func:`make_example`): one example, written once.
MAKE_ONLY_EXAMPLES: dict[str, str] = {
    "help": "make help TARGET=gate",
    "demo": "make demo DEMO_DIR=/tmp/xla-wheels-demo",
    "venv": "make venv PYTHON_FOR_VENV=python3.12",
    "clean": "make clean",
    "test": "make test PYTEST_ARGS='tests/test_cli.py -q'",
    "test-fast": "make test-fast PYTEST_ARGS='-x'",
    "lint": "make lint",
    "format": "make format",
    "generate": "make generate",
    "cache-tools": "make cache-tools",
    "docs": "make docs",
    "host-wheel": "make host-wheel",
}

#: Make's own names in a recipe that are no variable of the table.
_REFERENCE = re.compile(r"\$\((?:call\s+[a-z_]+,)?([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Target:
    name: str
    summary: str
    commands: tuple[str, ...]
    """The CLI subcommands its recipe runs (``demo``: ``python -m xla_wheels.demo``)."""
    variables: tuple[str, ...]
    runs_python: bool = False
    """Its recipe runs the project's interpreter (``$(PY)``), through a make variable or not."""


@dataclass(frozen=True)
class Makefile:
    table: dict[str, str]
    """MAKE_VARIABLES: name -> flag ('' when not a flag)."""
    targets: tuple[Target, ...]
    defaults: dict[str, str]
    """The variables the Makefile gives a default of its own (``NAME ?= value``)."""


def read_makefile(text: str) -> Makefile:
    """The documented targets of a Makefile, each with what its recipe reads."""
    definitions: dict[str, str] = {}
    defaults: dict[str, str] = {}
    rules: dict[str, tuple[str, list[str]]] = {}
    documented: list[tuple[str, str]] = []
    current: list[str] | None = None
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("\t"):
            if current is not None:
                current.append(line)
            continue
        if match := re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(:=|\?=|=)\s*(.*)$", line):
            definitions[match.group(1)] = match.group(3)
            if match.group(2) == "?=":
                defaults[match.group(1)] = match.group(3).strip()
            current = None
        elif match := re.match(r"^([^\s#.][^:=]*?):(?!=)(.*)$", line):
            prerequisites, _, summary = match.group(2).partition("## ")
            current = []
            rules[match.group(1)] = (prerequisites, current)
            if summary:
                documented.append((match.group(1), summary.strip()))
        elif line.strip() and not line.startswith("#"):
            current = None
    table = dict(entry.partition("=")[::2] for entry in definitions["MAKE_VARIABLES"].split())

    def reads(text: str, seen: set[str]) -> list[str]:
        found: list[str] = []
        for name in _REFERENCE.findall(text):
            if name in seen:
                continue
            seen.add(name)
            if name in table:
                found.append(name)
            elif name in definitions:
                found += reads(definitions[name], seen)
        return found

    targets = []
    for name, summary in documented:
        prerequisites, recipe = rules[name]
        if not recipe:
            # A target that only names prerequisites (venv) reads what they read.
            recipe = [line for p in prerequisites.split() for line in rules.get(p, ("", []))[1]]
        body = "\n".join(recipe)
        commands = re.findall(r"\$\(CLI\)\s+([a-z][a-z-]*)", body)
        if "$(DEMO)" in body:
            commands.append("demo")
        runs_python = any(s in body for s in ("$(PY)", "$(CLI)", "$(DEMO)", "$(MAKE_CHECK)"))
        targets.append(
            Target(name, summary, tuple(commands), tuple(reads(body, set())), runs_python)
        )
    return Makefile(table, tuple(targets), defaults)


def makefile_text(commands: str | None = None) -> str:
    """The Makefile with the files it includes (``make-variables.mk``, ``make-commands.mk``:
    ``commands`` where it is being written anew)."""
    if commands is None:
        commands = COMMANDS_FILE.read_text() if COMMANDS_FILE.is_file() else ""
    return MAKEFILE.read_text() + "\n" + MAKE_FILE.read_text() + "\n" + commands


def flags_variable(command: str) -> str:
    """The make variable of ``command``'s arguments: ``FLAGS_LAUNCH_ENV`` for launch-env."""
    return "FLAGS_" + command.upper().replace("-", "_")


def command_arguments(command: str) -> list[str]:
    """What ``command``'s target passes it: each make variable of the table its parser
    takes, in the parser's order, as make expressions (a flag as ``$(call flag,NAME)``; a
    repeated flag once per word; a positional, named by its metavar, as ``$(call arg,NAME)``)."""
    by_flag = {s.flag: s.make for s in SETTINGS if s.make and s.flag}
    positional_names = {s.make for s in SETTINGS if s.make and not s.flag}
    words = []
    for action in _parser_of(command)._actions:
        if not action.option_strings:
            shown = action.metavar if isinstance(action.metavar, str) else action.dest
            if shown.upper() in positional_names:
                words.append(f"$(call arg,{shown.upper()})")
            continue
        name = next((by_flag[o] for o in action.option_strings if o in by_flag), None)
        if name is None:
            continue
        if isinstance(action, argparse._AppendAction):
            flag = action.option_strings[0]
            words.append(f"$(foreach a,$({name}),{flag} $(call quote,$(a)))")
        else:
            words.append(f"$(call flag,{name})")
    return words


def commands_mk() -> str:
    """``make-commands.mk``: one ``FLAGS_<COMMAND>`` per subcommand of the CLI."""
    from xla_wheels.cli import COMMANDS

    lines = [
        "# Generated from the CLI's parsers by src/xla_wheels/make_help.py: do not edit;",
        f"# {REGENERATE} (tests/test_help.py fails while it is not current).",
        "#",
        "# FLAGS_<COMMAND>: every make variable the command takes, as its target passes them, so",
        "# that no recipe leaves one out (make would ignore it, and the run go on without it).",
    ]
    for command in COMMANDS:
        rows = [f"{flags_variable(command)} ="]
        for word in command_arguments(command):  # whole words: make splits no call
            if len(rows[-1]) + 1 + len(word) > 96:
                rows.append(" ")
            rows[-1] += f" {word}"
        lines.append(" \\\n".join(rows))
    return "\n".join(lines) + "\n"


def _parser_of(command: str) -> argparse.ArgumentParser:
    if command == "demo":
        from xla_wheels.demo import build_parser as demo_parser

        return demo_parser()
    parser = build_parser(command)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def make_example(makefile: Makefile, target: Target) -> str:
    """``target``'s example: a make-only target's own, else its command's CLI example with
    each argument written as the variable of ``target`` that passes it (a positional as its
    metavar, ``diff A B`` as ``A=.. B=..``; a switch as ``VAR=1``)."""
    if target.name in MAKE_ONLY_EXAMPLES:
        return MAKE_ONLY_EXAMPLES[target.name]
    if not target.commands:
        raise LookupError(f"make {target.name} runs no CLI command: give it an example of its own")
    # A target running two commands (publish: publish-lane without INDEX_URL) shows the one
    # it is named after.
    command = target.name if target.name in target.commands else target.commands[0]
    actions = _parser_of(command)._actions
    by_flag = {spelling: action for action in actions for spelling in action.option_strings}
    positionals = [action for action in actions if not action.option_strings]
    words = iter(shlex.split(EXAMPLES[command])[2:])
    assignments = []
    for word in words:
        if word.startswith("-"):
            flag, has_value, value = word.partition("=")
            action = by_flag[flag]
            if not has_value:
                switch = isinstance(action, SwitchAction) or action.nargs == 0
                value = "1" if switch else next(words)
            found = [name for name in target.variables if makefile.table[name] == flag]
        else:
            action, value = positionals.pop(0), word
            shown = action.metavar if isinstance(action.metavar, str) else action.dest
            found = [n for n in target.variables if not makefile.table[n] and n == shown.upper()]
        if len(found) != 1:
            raise LookupError(
                f"make {target.name} has no variable for {word!r} of the example of {command}"
            )
        quoted = shlex.quote(value) if any(c.isspace() or c in "'\"" for c in value) else value
        assignments.append(f"{found[0]}={quoted}")
    return " ".join(["make", target.name, *assignments])


def variable_text(makefile: Makefile, name: str, commands: Sequence[str]) -> str:
    """What variable ``name`` means for a target running ``commands``, its default included."""
    flag = makefile.table[name]
    refused = False
    for command in commands:
        for action in _parser_of(command)._actions:
            shown = action.metavar if isinstance(action.metavar, str) else action.dest
            positional = not action.option_strings and shown.upper() == name
            if flag not in action.option_strings and not (not flag and positional):
                continue
            if action.help == argparse.SUPPRESS:
                refused = True  # this command has no such setting; another may
                continue
            return option_help(action)
    if refused:
        return "this target has no dry run: on is refused, never ignored (default: off)"
    if not flag:  # make's own, or the environment of a tool: its row of the table
        row = next(s for s in SETTINGS if s.make == name)
        return f"{row.help} (default: {makefile.defaults.get(name, row.shown_default)})"
    raise LookupError(
        f"the Makefile passes {name} ({flag or 'no flag'}) to {', '.join(commands) or 'nothing'}"
        ", which has no such argument"
    )


def render(makefile: Makefile) -> str:
    """The text ``make help`` prints: the targets by purpose, one line each."""
    by_name = {target.name: target for target in makefile.targets}
    unlisted = set(by_name) - {name for group in TARGET_GROUPS.values() for name in group}
    if unlisted:
        raise LookupError(f"targets without a group: {sorted(unlisted)}")
    lines = [
        "Usage: make <target> [VARIABLE=value ...]",
        "`make help TARGET=<target>` shows a target's variables, their defaults and an example.",
    ]
    for heading, group_targets in TARGET_GROUPS.items():
        lines += ["", f"{heading}:"]
        lines += [
            f"  make {target.name:<16} {target.summary}"
            for target in (by_name[name] for name in group_targets if name in by_name)
        ]
    return "\n".join(lines) + "\n"


def render_target(makefile: Makefile, target: Target) -> str:
    """What ``make help TARGET=<target>`` prints: its summary, the command it runs, each
    variable it reads with its text and default, and its example; one paragraph (no blank
    line inside), which is how the Makefile finds it in :data:`TARGETS_FILE`."""
    lines = [f"make {target.name:<16} {target.summary}"]
    if target.commands:
        lines.append(f"    runs: {', '.join(_shown_command(c) for c in target.commands)}")
    for name in target.variables:
        lines += _wrapped(name, variable_text(makefile, name, target.commands))
    lines.append(f"    example: {make_example(makefile, target)}")
    if target.commands:
        lines += [
            "    A variable left unset adds no flag: the command then reads its XLA_WHEELS_<NAME>",
            "    environment variable where the text names one, else takes the default shown.",
        ]
    if target.runs_python and "PYTHON_FOR_VENV" not in target.variables:
        lines.append("    It creates .venv first when it is missing, with:")
        lines += _wrapped("PYTHON_FOR_VENV", variable_text(makefile, "PYTHON_FOR_VENV", ()))
    return "\n".join(lines) + "\n"


def render_targets(makefile: Makefile) -> str:
    """Every target's :func:`render_target`, in ``make help``'s order, a blank line between."""
    by_name = {target.name: target for target in makefile.targets}
    order = [name for group in TARGET_GROUPS.values() for name in group if name in by_name]
    return "\n".join(render_target(makefile, by_name[name]) for name in order)


def _wrapped(name: str, text: str) -> list[str]:
    """Variable ``name``'s entry: its text wrapped at 100 columns beside the name."""
    return textwrap.wrap(
        text,
        width=100,
        initial_indent=f"    {name:<18}  ",
        subsequent_indent=" " * 24,
        break_on_hyphens=False,
    )


def _shown_command(command: str) -> str:
    return "python -m xla_wheels.demo" if command == "demo" else f"xla-wheels {command}"


def outputs(root: Path) -> dict[Path, str]:
    """The files this module writes (``make generate``): the commands' make variables
    first, which the targets' variables are then read through."""
    del root  # the Makefile beside this package is the one documented
    commands = commands_mk()
    makefile = read_makefile(makefile_text(commands))
    return {
        COMMANDS_FILE: commands,
        HELP_FILE: render(makefile),
        TARGETS_FILE: render_targets(makefile),
    }
