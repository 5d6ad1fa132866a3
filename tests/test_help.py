"""Help written for the user: `make help` and every subcommand's `--help`.

`make help` is an overview that fits a screen: the targets by purpose, one line each.
`make help TARGET=<target>` names each variable that target reads with its default, and
one example. Both work before `.venv` exists. Each subcommand's `--help` says what it
does in plain words (no rST markup from internal docstrings), lists every option with its
default and ends with an example.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.gitrepos import REPO_ROOT
from xla_wheels.cli import COMMANDS, build_parser
from xla_wheels.cli.help import EXAMPLES
from xla_wheels.make_help import (
    MAKE_ONLY_EXAMPLES,
    TARGET_GROUPS,
    make_example,
    makefile_text,
    read_makefile,
)

#: Sphinx/rST markup of internal docstrings: never in what a user reads.
MARKUP = re.compile(r"``|:class:|:func:|:data:|:meth:|:mod:|:attr:")


def _make(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", *argv], cwd=REPO_ROOT, text=True,
        capture_output=True, check=False, env={"PATH": os.environ["PATH"]}, timeout=60,
    )  # fmt: skip


def _help_targets() -> list[str]:
    """The targets the Makefile documents (a `## summary` after the rule)."""
    text = (REPO_ROOT / "Makefile").read_text()
    return re.findall(r"^([a-z][a-z-]*):[^\n]*## ", text, re.MULTILINE)


def _make_variables() -> list[str]:
    """The names of MAKE_VARIABLES, as make itself reads the table."""
    process = _make("--eval", "print-table: ; @echo $(MAKE_VARIABLES)", "print-table")
    assert process.returncode == 0, process.stderr
    return [entry.partition("=")[0] for entry in process.stdout.split()]


def _variables_passed(target: str, names: list[str]) -> set[str]:
    """The variables whose value `make -n target` puts into the commands it would run: every
    variable is given a value of its own, nothing runs."""
    process = _make("-n", target, *(f"{name}=@@{name}@@" for name in names))
    assert process.returncode == 0, process.stderr
    return {name for name in names if f"@@{name}@@" in process.stdout}


def _variable_entries(block: list[str]) -> dict[str, str]:
    """A target's variables: `    NAME  text`, continued on deeper-indented lines."""
    entries: dict[str, str] = {}
    name = None
    for line in block[1:]:
        if match := re.match(r"^    ([A-Z][A-Z0-9_]*)  +(.*)$", line):
            name = match.group(1)
            entries[name] = match.group(2)
        elif name is not None and line.startswith("      "):
            entries[name] += " " + line.strip()
        else:
            name = None
    return entries


@pytest.fixture(scope="module")
def make_help() -> str:
    process = _make("help")
    assert process.returncode == 0, process.stderr
    return process.stdout


@pytest.fixture(scope="module")
def blocks() -> dict[str, list[str]]:
    """`make help TARGET=<target>`'s lines, for every documented target."""
    found = {}
    for target in _help_targets():
        process = _make("help", f"TARGET={target}")
        assert process.returncode == 0, (target, process.stderr)
        found[target] = process.stdout.splitlines()
    return found


def test_make_help_is_an_overview_that_fits_a_screen(make_help: str) -> None:
    lines = make_help.splitlines()
    assert len(lines) < 60, len(lines)
    assert max(len(line) for line in lines) <= 100
    # Every target on one line of its own, under the heading of its purpose, in that order.
    shown = [line.split()[1] for line in lines if line.startswith("  make ")]
    grouped = [target for group in TARGET_GROUPS.values() for target in group]
    assert shown == [t for t in grouped if t in _help_targets()]
    assert sorted(shown) == sorted(_help_targets())
    for heading, targets in TARGET_GROUPS.items():
        after = lines[lines.index(f"{heading}:") + 1 :][: len(targets)]
        assert [line.split()[1] for line in after] == list(targets), heading
    # It says how to see a target's variables, and shows none itself.
    assert "make help TARGET=<target>" in make_help
    assert "(default:" not in make_help and "example:" not in make_help


def test_make_help_of_a_target_shows_its_variables_defaults_and_example() -> None:
    process = _make("help", "TARGET=gate")
    assert process.returncode == 0, process.stderr
    lines = process.stdout.splitlines()
    assert lines[0].startswith("make gate ")
    assert lines[1] == "    runs: xla-wheels gate"
    entries = _variable_entries(lines)
    assert {"PYTHON", "GATE_DEVICE", "WORKLOAD", "CHECKS", "BUNDLE", "PROFILE"} <= set(entries)
    assert "default: small" in entries["WORKLOAD"]
    assert "default: TPU if this host has one, else CPU" in entries["GATE_DEVICE"]
    assert "    example: make gate GATE_DEVICE=CPU CHECKS=restart,cache-key" in lines
    # Only the gate: no other target's entry comes along.
    assert not [line for line in lines[1:] if line.startswith("make ")]


def test_make_help_of_an_unknown_target_names_it_and_the_fix() -> None:
    process = _make("help", "TARGET=gates")
    assert process.returncode == 2
    assert process.stdout == ""
    assert "error: make help TARGET=gates: no such target" in process.stderr
    assert "fix: make help (lists the targets)" in process.stderr


def test_make_help_lists_every_target_with_the_variables_it_passes(
    blocks: dict[str, list[str]],
) -> None:
    names = [name for name in _make_variables() if name != "PYTHON_FOR_VENV"]
    assert {"BUNDLE", "DRY_RUN", "JOBS", "INDEX_URL"} <= set(names)
    targets = _help_targets()
    assert {"wheels", "gate", "publish", "verify-install", "doctor", "help"} <= set(targets)
    shown_anywhere: set[str] = set()
    for target in targets:
        entries = _variable_entries(blocks[target])
        shown_anywhere |= set(entries)
        missing = _variables_passed(target, names) - set(entries)
        assert not missing, f"make help TARGET={target} does not name {sorted(missing)}"
    # Every variable of the table is some target's, the interpreter .venv is made with
    # (which every target running the CLI may need) included.
    assert set(names) <= shown_anywhere
    assert "PYTHON_FOR_VENV" in _variable_entries(blocks["wheels"])


def test_every_variable_make_help_names_has_its_default(blocks: dict[str, list[str]]) -> None:
    seen = 0
    for target, block in blocks.items():
        for name, text in _variable_entries(block).items():
            assert "default" in text, f"make help TARGET={target}: {name} has no default: {text}"
            seen += 1
    assert seen > 50  # the targets' variables, not an empty list, were checked


def test_every_target_has_an_example_of_itself(blocks: dict[str, list[str]]) -> None:
    for target in _help_targets():
        examples = [line.strip() for line in blocks[target] if "example:" in line]
        assert len(examples) == 1, f"make help TARGET={target}: {examples}"
        assert examples[0].startswith(f"example: make {target}"), examples[0]


def test_make_help_promises_nothing_it_does_not_show(
    make_help: str, blocks: dict[str, list[str]]
) -> None:
    # The old footer sent the reader to "the CLI flags above", which it did not show.
    for text in [make_help, *("\n".join(block) for block in blocks.values())]:
        assert "above" not in text
        assert MARKUP.search(text) is None


def test_make_help_works_before_the_venv_exists(tmp_path) -> None:
    venv = tmp_path / "no-venv-yet"
    process = _make("help", f"VENV={venv}")
    assert process.returncode == 0, process.stderr
    assert "make wheels" in process.stdout
    process = _make("help", "TARGET=wheels", f"VENV={venv}")
    assert process.returncode == 0, process.stderr
    assert "    example: make wheels BUNDLE=" in process.stdout
    assert not venv.exists()


def test_every_cli_example_parses_with_the_clis_own_parser() -> None:
    assert set(EXAMPLES) == set(COMMANDS)
    for name, example in EXAMPLES.items():
        words = shlex.split(example)
        assert words[:2] == ["xla-wheels", name], example
        try:
            build_parser(name).parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"the example of {name} does not parse: {example}")


def test_a_make_example_is_its_commands_example_in_the_variables_the_target_reads() -> None:
    # One example per command, written once (cli/help.py); make help writes it with make's
    # variables, and make turns those back into the very same command.
    makefile = read_makefile(makefile_text())
    derived = 0
    for target in makefile.targets:
        words = shlex.split(make_example(makefile, target))
        assert words[:2] == ["make", target.name]
        assert {w.partition("=")[0] for w in words[2:]} <= set(target.variables), words
        if target.name in MAKE_ONLY_EXAMPLES:
            continue
        derived += 1
        command = target.name if target.name in target.commands else target.commands[0]
        process = _make("-n", *words[1:])
        assert process.returncode == 0, process.stderr
        line = next(x for x in process.stdout.splitlines() if f"-m xla_wheels {command}" in x)
        run = shlex.split(line)
        passed = run[run.index("xla_wheels") + 1 :]
        example = shlex.split(EXAMPLES[command])[1:]
        parser = build_parser(command)
        through_make, direct = parser.parse_args(passed), parser.parse_args(example)
        assert vars(through_make) == vars(direct), (target.name, passed, example)
    assert derived > 20
    by_name = {target.name: target for target in makefile.targets}
    assert make_example(makefile, by_name["promote"]) == (
        "make promote BUNDLE=v6e-2.11 LANE=preferred DRY_RUN=1"
    )
    assert make_example(makefile, by_name["diff"]) == "make diff A=v6e-2.9 B=v6e-2.11"


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(name)
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def _help_of(*argv: str) -> str:
    process = subprocess.run(
        [sys.executable, "-m", "xla_wheels", *argv, "--help"], cwd=REPO_ROOT, text=True,
        capture_output=True, check=False, timeout=120,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO_ROOT / "src")},
    )  # fmt: skip
    assert process.returncode == 0, process.stderr
    return process.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_help_is_written_for_the_user(name: str) -> None:
    text = _help_of(name)
    assert text.startswith(f"usage: xla-wheels {name}"), text[:200]
    assert MARKUP.search(text) is None, MARKUP.search(text)
    # It ends with one example of itself.
    examples = [line for line in text.splitlines() if line.lower().startswith("example")]
    assert len(examples) == 1, text
    assert f"xla-wheels {name}" in text.split(examples[0], 1)[1]
    for action in _subparser(name)._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        shown = action.option_strings or [action.metavar or action.dest]
        for spelling in shown:
            assert spelling in text, f"{name} --help does not show {spelling}"
        assert action.help and "default" in action.help.lower() + _formatted(
            name, action
        ), f"{name} --help: {'/'.join(shown)} does not say its default"


def _formatted(name: str, action: argparse.Action) -> str:
    # The option's help as --help prints it (the formatter may add the default).
    formatter = _subparser(name)._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def test_top_level_help_ends_with_an_example() -> None:
    text = _help_of()
    assert MARKUP.search(text) is None
    assert "example" in text.lower() and "xla-wheels wheels --bundle" in text


def test_the_exit_codes_page_says_where_make_puts_the_commands_exit_code(tmp_path) -> None:
    # Through make every failure is exit 2; the documented exit codes did not say so.
    readme = " ".join((REPO_ROOT / "docs" / "exit-codes.md").read_text().split())
    contract = readme[readme.index("Exit codes, for every subcommand") :][:8000]
    assert "Through make, the exit status is make's: 2 whenever the command fails" in contract
    assert "`make: *** [Makefile:NN: wheels] Error 5`" in contract
    # And it is so: a bundle another run holds is the CLI's 5, make's 2, "Error 5" last.
    from xla_wheels.run_lock import bundle_run_lock

    with bundle_run_lock(tmp_path / "out", "v6e-2.9", "the other run"):
        process = subprocess.run(
            ["make", "--no-print-directory", "lock", "BUNDLE=v6e-2.9"], cwd=REPO_ROOT,
            text=True, capture_output=True, check=False, timeout=60,
            env={"PATH": os.environ["PATH"], "XLA_WHEELS_OUT": str(tmp_path / "out"),
                 "XLA_WHEELS_CACHE": str(tmp_path / "cache")},
        )  # fmt: skip
    assert process.returncode == 2, process.stderr
    last = process.stderr.splitlines()[-1]
    assert re.fullmatch(r"make: \*\*\* \[Makefile:\d+: lock\] Error 5", last), process.stderr
