"""``python -m xla_wheels.cli.make_check``: the make-variable check of a target whose
command is no subcommand of the CLI (``make test``, ``test-fast``, ``lint``, ``docs``).

Every target that runs Python refuses what the CLI refuses on make's command line: a
variable the Makefile does not read (``PYTESTARGS=-x`` would run the whole suite), and a
dry-run switch, which these targets do not have (``DRY_RUN=1`` or ``XLA_WHEELS_DRY_RUN=1``
would run them for real).
The Makefile runs this before the target's tools, through the same make context as the
CLI (``MAKE_CONTEXT``).
"""

from __future__ import annotations

import os
import sys

from xla_host.errors import UsageError
from xla_wheels.cli import exit_code_of
from xla_wheels.cli.from_make import MakeRun
from xla_wheels.cli.settings import check_environment, env_switch, refuse_dry_run


def _run() -> int:
    make = MakeRun.from_environ(os.environ)
    if make is None:
        raise UsageError(
            "this check reads the make context the Makefile passes",
            fix="run the make target (`make help` lists them)",
        )
    make.check_command_line()
    make.check_dry_run(honoured=False)
    # The environment as the CLI checks it, and its dry run: these targets have none.
    check_environment(os.environ)
    if env_switch(os.environ, "--dry-run"):
        refuse_dry_run(f"make {make.goal}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code_of(_run))
