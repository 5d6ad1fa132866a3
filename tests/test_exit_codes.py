"""The one exit-code table: every error's code is a row of it, and what is written from
it (the table of docs/exit-codes.md, ``xla-wheels --help``) is current."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.clirunner import run_cli
from tests.gitrepos import REPO_ROOT
from xla_host import signals
from xla_host.errors import MEANINGS, ExitCode
from xla_wheels import exit_codes


def test_every_pipeline_error_takes_its_code_from_the_table() -> None:
    classes = exit_codes.error_classes()
    assert len(classes) > 40  # every module was imported, not only errors.py
    off_table = [cls.__name__ for cls in classes if not isinstance(cls.exit_code, ExitCode)]
    assert off_table == []


def test_every_code_has_a_meaning() -> None:
    assert set(MEANINGS) == set(ExitCode)
    assert all(MEANINGS[code] for code in ExitCode)


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGHUP, ExitCode.SIGHUP), (signal.SIGINT, ExitCode.SIGINT),
     (signal.SIGTERM, ExitCode.SIGTERM)],
)  # fmt: skip
def test_a_signal_ends_a_run_with_its_row_of_the_table(sig: int, code: ExitCode) -> None:
    interrupt = KeyboardInterrupt() if sig == signal.SIGINT else signals.Terminated(sig)
    assert signals.exit_code(interrupt) == code


def test_the_readme_table_is_current() -> None:
    readme = (REPO_ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    assert exit_codes.readme_table() in readme, (
        "the exit-code table of docs/exit-codes.md is stale: run " "`make generate`"
    )


def test_the_cli_help_ends_with_the_table() -> None:
    result = run_cli("--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith(exit_codes.help_epilog())
    for code in ExitCode:
        assert f"  {int(code):>3}  " in result.stdout


def test_output_piped_into_a_reader_that_left_ends_quietly_with_sigpipes_row() -> None:
    # `xla-wheels lanes | head -1`: the reader is gone before the first write, so the
    # command's write fails with EPIPE; it ends silently with the shell's code for it.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        ended = subprocess.run(
            [sys.executable, "-m", "xla_wheels", "lanes"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert ended.returncode == ExitCode.SIGPIPE, ended.stderr
    assert ended.stderr == ""
