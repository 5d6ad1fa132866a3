"""Each setting is one row of one table (host/src/xla_host/settings.py), and what is
written from it (the Makefile's variable mapping, the environment's names, the flags with
their defaults, the documentation's settings table) is what the rows say today."""

from __future__ import annotations

import argparse
import os
import subprocess

from tests.gitrepos import REPO_ROOT
from xla_host.errors import UsageError
from xla_host.net import NetworkPolicy
from xla_wheels import settings_table
from xla_wheels.cli import build_parser
from xla_wheels.cli.settings import check_environment
from xla_wheels.options import env_var, known_environment
from xla_wheels.settings_rows import GROUPS, SETTINGS, by_flag


def test_the_makefile_reads_its_variables_from_the_table() -> None:
    process = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "t: ; @echo $(MAKE_VARIABLES)", "t"],
        cwd=REPO_ROOT, text=True, capture_output=True, check=True, timeout=60,
        env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    expected = {f"{s.make}={s.flag or ''}" for s in SETTINGS if s.make}
    assert set(process.stdout.split()) == expected


def test_every_row_is_whole_and_follows_the_naming_rule() -> None:
    names = [key for s in SETTINGS for key in (s.flag, s.make, s.env) if key]
    assert len(names) == len(set(names)), "a flag, make variable or environment name twice"
    for setting in SETTINGS:
        assert setting.group in GROUPS and setting.help
        if setting.flag and setting.env:
            assert setting.env == env_var(setting.flag)
        if setting.secret:  # a credential never travels as a flag or a make variable
            assert setting.flag is None and setting.make is None
        if setting.kind in ("count", "amount"):
            assert setting.low is not None and setting.high is not None


def test_every_environment_name_of_the_table_is_known_and_checked() -> None:
    assert {s.env for s in SETTINGS if s.env} <= known_environment()
    # A number of the table in the environment is checked before any subcommand runs.
    for setting in SETTINGS:
        if setting.env and setting.kind in ("count", "amount"):
            try:
                check_environment({setting.env: "1e9"})
            except UsageError as error:
                assert setting.env in str(error)
            else:
                raise AssertionError(f"{setting.env}=1e9 was accepted")


def test_the_flags_help_shows_the_tables_default() -> None:
    parser = build_parser("sources")
    sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    helps = {o: a.help for a in sub.choices["sources"]._actions for o in a.option_strings}
    for flag in ("--net-timeout", "--net-retries", "--progress-interval", "--root"):
        setting = by_flag(flag)
        assert helps[flag] == setting.help_with_default()
        assert f"${setting.env} or {setting.shown_default})" in str(helps[flag])


def test_the_network_policys_defaults_are_the_tables() -> None:
    policy = NetworkPolicy()
    assert policy.timeout_s == by_flag("--net-timeout").default
    assert policy.retries == by_flag("--net-retries").default
    assert policy.heartbeat_s == by_flag("--progress-interval").default


def test_the_documentation_table_has_every_row() -> None:
    table = settings_table.settings_markdown()
    for setting in SETTINGS:
        assert (setting.make or setting.flag or setting.env or "") in table
    assert sum(1 for line in table.splitlines() if line.startswith("| ")) == (
        1 + len(GROUPS) + len(SETTINGS)  # the header, a line per group, a line per row
    )


def test_the_build_flags_choices_and_defaults_are_the_tables() -> None:
    from xla_wheels.builder.config import BuildConfig

    parser = build_parser("wheels")
    sub = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    actions = {o: a for a in sub.choices["wheels"]._actions for o in a.option_strings}
    for flag, value in (("--engine", BuildConfig().engine), ("--mode", BuildConfig().mode)):
        setting = by_flag(flag)
        assert tuple(actions[flag].choices or ()) == setting.choices and value == setting.default
        assert actions[flag].help == setting.help_with_default()
    assert BuildConfig().image == by_flag("--image").default
    timeout = by_flag("--bazel-remote-timeout")
    assert actions["--bazel-remote-timeout"].help == timeout.help_with_default()


def _flags_of(command: str) -> dict[str, argparse.Action]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices[command]._actions for o in a.option_strings}


def test_each_subcommand_takes_the_flags_its_rows_name_and_no_other_row() -> None:
    """The commands column (in --help, make help and docs/settings.md) is what the parsers
    take: a row's flag is on each subcommand it names, and on none it does not name."""
    from xla_wheels.cli import COMMANDS

    for command in COMMANDS:
        # A hidden flag (--dry-run where there is none) is refused, not taken.
        taken = {o: a for o, a in _flags_of(command).items() if a.help != argparse.SUPPRESS}
        for setting in SETTINGS:
            if not setting.flag or not setting.commands:
                continue
            named = command in setting.commands
            assert (setting.flag in taken) == named, (setting.flag, command)
            if named:
                # (a switch's help goes on with the spellings it takes)
                assert str(taken[setting.flag].help).startswith(setting.help_with_default(command))


def test_a_subcommands_own_default_and_help_come_from_its_row() -> None:
    lane = by_flag("--lane")
    for command, default in (("promote", "preferred"), ("rollback", "preferred"),
                             ("publish-lane", None), ("lanes", None)):  # fmt: skip
        action = _flags_of(command)["--lane"]
        assert action.default == default and action.help == lane.help_with_default(command)
    assert "(default: preferred)" in str(_flags_of("promote")["--lane"].help)
    assert _flags_of("promote")["--from"].dest == "source"
    assert _flags_of("patch-rebase")["--component"].default == by_flag("--component").default


def test_the_rows_facts_are_the_codes() -> None:
    """Where a row repeats a value the code keeps (a default of the build's options, the
    components, the roles), the two agree."""
    import shlex

    from xla_host.cache_role import ROLES
    from xla_wheels.builder.config import BuildConfig
    from xla_wheels.bundle import COMPONENT_NAMES

    config = BuildConfig()
    assert by_flag("--container-python").default == config.container_python
    for flag, value in (("--min-disk-gib", config.min_disk_gib),
                        ("--mem-per-job-gib", config.mem_per_job_gib),
                        ("--mem-base-gib", config.mem_base_gib)):  # fmt: skip
        assert by_flag(flag).default == value
    # Written once, as the flag takes it: the row's text is the value the build uses.
    assert by_flag("--ship-pip-args").default == shlex.join(config.ship_pip_args)
    assert by_flag("--host-tools").default == ",".join(config.host_tools)
    pairs = shlex.join(f"{k}={v}" for k, v in config.compiler_env)
    assert by_flag("--compiler-env").default == pairs
    assert by_flag("--component").choices == COMPONENT_NAMES
    assert by_flag("--role").choices == tuple(ROLES)
    # The gate's: the restart check's limits, the devices, the checks, the slice's waits.
    from pathlib import Path

    from xla_host.gate import slice as slices
    from xla_host.gate.restart import DEFAULT_BASELINES_DIR, RestartConfig
    from xla_host.gate.run import CHECKS
    from xla_host.gate.target import DEVICES
    from xla_host.gate.workload import DEFAULT

    assert by_flag("--max-warm-ratio").default == RestartConfig.max_warm_ratio
    assert by_flag("--baseline-tolerance").default == RestartConfig.baseline_tolerance
    assert Path(str(by_flag("--baselines-dir").default)) == DEFAULT_BASELINES_DIR
    assert by_flag("--device").choices == DEVICES
    # The checks: the gate's registry's, set by the gate's parser; the row holds no copy.
    assert by_flag("--checks").default is None
    from xla_wheels.cli import build_parser

    assert build_parser("gate").parse_args(["gate"]).checks == ",".join(CHECKS)
    assert by_flag("--workload").default == DEFAULT.name
    assert by_flag("--slice-timeout").default == slices.JOIN_TIMEOUT_S
    assert f"named after {slices.DEAD_AFTER_S:g}s" in by_flag("--slice-timeout").help
