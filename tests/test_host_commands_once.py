"""The host commands are written once (xla_host.host_commands): ``xla-host`` and
``xla-wheels`` take the same flags for ``gate``, ``doctor`` and ``launch-env``, with the
same help, defaults and choices, and parse the same words to the same values. The flags
compared are the ones the one definition lists (``host_commands.FLAGS`` and the gate's
``GATE_FLAGS``/``SLICE_FLAGS``), each read from its row of the settings table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from xla_host import host_commands
from xla_host.bundle_source import HELPER_NAME
from xla_host.cli import build_parser as host_parser
from xla_host.gate import arguments as gate_arguments
from xla_host.settings import HOST
from xla_wheels.cli import build_parser as builder_parser

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMANDS = tuple(host_commands.FLAGS)


def _shared_flags(command: str) -> tuple[str, ...]:
    """The flags the one definition gives ``command`` on both command lines."""
    own = host_commands.FLAGS[command]
    if command != "gate":
        return own
    child = ("--device", "--workload", "--child-timeout")
    return (*own, *child, *gate_arguments.GATE_FLAGS, *gate_arguments.SLICE_FLAGS)


def _actions(parser: argparse.ArgumentParser, command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices[command]._actions for o in a.option_strings}


def _both(command: str) -> tuple[dict[str, argparse.Action], dict[str, argparse.Action]]:
    return _actions(host_parser(), command), _actions(builder_parser(command), command)


@pytest.mark.parametrize("command", COMMANDS)
def test_both_command_lines_take_the_host_commands_flags_from_their_rows(command: str) -> None:
    host, builder = _both(command)
    for flag in _shared_flags(command):
        assert flag in host and flag in builder, (command, flag)
        ours, theirs = host[flag], builder[flag]
        for field in ("help", "default", "choices", "dest", "metavar", "nargs"):
            assert getattr(ours, field) == getattr(theirs, field), (command, flag, field)
        assert type(ours) is type(theirs), (command, flag)
        assert getattr(ours.type, "__name__", ours.type) == getattr(
            theirs.type, "__name__", theirs.type
        ), (command, flag)
        if flag in ("--checks",):  # its help names the gate's registry (add_gate_arguments)
            continue
        # The help is the row's own, for this command: the one place it is written.
        row = HOST.by_flag(flag)
        assert str(ours.help).startswith(row.help_with_default(command).split(" [")[0]), flag


def _words(command: str, tmp_path: Path) -> list[str]:
    """A value for each shared flag that takes one: the row's choice, else a number in
    range, else a path."""
    words: list[str] = []
    for flag in _shared_flags(command):
        row = HOST.by_flag(flag)
        if row.kind == "switch":
            words.append(flag)
        elif flag in ("--checks",):
            words += [flag, "restart"]
        elif flag in ("--workload",):
            words += [flag, "small"]
        elif flag == "--device":
            words += [flag, "cpu"]
        elif row.choices:
            words += [flag, row.choices[-1]]
        elif row.kind in ("count", "amount"):
            low = row.low or 0
            words += [flag, str(int(low) + 1)]
        else:
            words += [flag, str(tmp_path / flag.lstrip("-"))]
    return words


@pytest.mark.parametrize("command", COMMANDS)
def test_both_command_lines_give_the_same_values_for_the_same_words(
    command: str, tmp_path: Path
) -> None:
    words = _words(command, tmp_path)
    host = host_parser().parse_args([command, *words])
    builder = builder_parser(command).parse_args([command, *words])
    defaults_host = host_parser().parse_args([command])
    defaults_builder = builder_parser(command).parse_args([command])
    host_actions, _ = _both(command)
    for flag in _shared_flags(command):
        dest = host_actions[flag].dest
        assert vars(host)[dest] == vars(builder)[dest], (command, flag)
        assert vars(defaults_host)[dest] == vars(defaults_builder)[dest], (command, flag)


def test_the_launch_helper_is_one_file_both_command_lines_write() -> None:
    """The helper ships in the host package; the checkout's scripts/ names the same file."""
    in_package = REPO_ROOT / "host" / "src" / "xla_host" / HELPER_NAME
    in_checkout = REPO_ROOT / "scripts" / HELPER_NAME
    assert in_checkout.resolve() == in_package.resolve()
    from importlib import resources

    assert resources.files("xla_host").joinpath(HELPER_NAME).read_bytes() == (
        in_package.read_bytes()
    )
