"""``python -m xla_wheels.cli.make_check``: the make-variable check of a target whose
command is no subcommand of the CLI (``make test``, ``test-fast``, ``lint``).

Every target that runs Python refuses what the CLI refuses on make's command line: a
variable the Makefile does not read (``PYTESTARGS=-x`` would run the whole suite), and a
dry-run switch, which these targets do not have (``DRY_RUN=1`` would run them for real).
The Makefile runs this before the target's tools, through the same make context as the
CLI (``MAKE_CONTEXT``).
"""

from __future__ import annotations

import os
import sys

from xla_wheels.cli import exit_code_of
from xla_wheels.cli.from_make import MakeRun
from xla_wheels.errors import UsageError


def _run() -> int:
    make = MakeRun.from_environ(os.environ)
    if make is None:
        raise UsageError(
            "this check reads the make context the Makefile passes",
            fix="run the make target (`make help` lists them)",
        )
    make.check_command_line()
    make.check_dry_run(honoured=False)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code_of(_run))
