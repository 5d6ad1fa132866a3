"""Each setting is one row of one table (src/xla_wheels/settings_table.py), and what is
written from it (the Makefile's variable mapping, the environment's names, the flags with
their defaults, the documentation's settings table) is what the rows say today."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.gitrepos import REPO_ROOT, SOURCE_PATH
from xla_host.errors import UsageError
from xla_wheels import settings_table
from xla_wheels.cli import build_parser
from xla_wheels.cli.settings import check_environment
from xla_wheels.options import NetworkPolicy, env_var, known_environment
from xla_wheels.settings_table import GROUPS, SETTINGS, by_flag


def test_the_files_written_from_the_table_are_current() -> None:
    # make-variables.mk (which the Makefile includes) and the README's settings table: a
    # row changed without regenerating them is caught here.
    process = subprocess.run(
        [sys.executable, "-m", "xla_wheels.settings_table", "--check"], cwd=REPO_ROOT,
        text=True, capture_output=True, check=False, timeout=60,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": SOURCE_PATH},
    )  # fmt: skip
    assert process.returncode == 0, process.stdout + process.stderr


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
