"""The list of subcommand registrations, in the order ``--help`` shows them.

Each stage module owns its own subcommands; adding one is one line here.
"""

from __future__ import annotations

from xla_wheels import patch_cli, stage_commands
from xla_wheels.abi import cli as abi_cli
from xla_wheels.cli import Register
from xla_wheels.gate import cli as gate_cli
from xla_wheels.publish import cli as publish_cli
from xla_wheels.release import cli as release_cli

REGISTRATIONS: list[Register] = [
    stage_commands.register,
    patch_cli.register,
    gate_cli.register,
    publish_cli.register,
    abi_cli.register,
    release_cli.register,
]
