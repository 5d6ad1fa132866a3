"""What a user reads in ``xla-wheels <command> --help``.

Each subcommand's help is its one-line summary (the CLI's command table), more plain
words where the summary is not enough (:data:`DETAILS`), its options each with its default
(:class:`UserHelpFormatter`) and one example (:data:`EXAMPLES`). Module docstrings are
written for developers and are never shown here.

Standard library only: the gate's subcommands build their parser with it.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from xla_host.arguments import SwitchAction

#: One working command per subcommand, shown last in its --help; ``make help`` shows the
#: same example with make variables (:func:`xla_wheels.make_help.make_example`).
EXAMPLES: dict[str, str] = {
    "bundles": "xla-wheels bundles",
    "diff": "xla-wheels diff v6e-2.9 v6e-2.11",
    "sources": "xla-wheels sources --bundle v6e-2.11",
    "patch": "xla-wheels patch --bundle v6e-2.11",
    "wheels": "xla-wheels wheels --bundle v6e-2.11",
    "builder-image": "xla-wheels builder-image --engine podman",
    "patches-check": "xla-wheels patches-check --bundle v6e-2.11 --source ../pytorch-xla",
    "series-compile": "xla-wheels series-compile --bundle v6e-2.9 --xla-headers tf-2.20",
    "patch-export": "xla-wheels patch-export --bundle v6e-2.11 --component torch_xla",
    "patch-rebase": "xla-wheels patch-rebase --bundle v6e-2.11 --onto <commit>",
    "lock": "xla-wheels lock --bundle v6e-2.11",
    "lock-check": "xla-wheels lock-check",
    "record": "xla-wheels record --bundle v6e-2.11 --wheels /srv/fleet/v6e-2.11/",
    "launch-env": "xla-wheels launch-env --bundle v6e-2.11 --profile train --role writer",
    "gate": "xla-wheels gate --device CPU --checks restart,cache-key",
    "bench-restart": "xla-wheels bench-restart --rounds 5",
    "cache": "xla-wheels cache fetch --pack <pack>.xlapack.tar --into /mnt/xla-cache"
    " --key lane-key.pub.pem --bundle v6e-2.11",
    "publish": (
        "xla-wheels publish --bundle v6e-2.11 --index-url https://pypi.example/simple/ --dry-run"
    ),
    "requirements": "xla-wheels requirements --bundle v6e-2.11",
    "verify-install": "xla-wheels verify-install --bundle v6e-2.11",
    "doctor": "xla-wheels doctor --bundle v6e-2.11 --role writer",
    "abi-check": "xla-wheels abi-check --stock 2.8.0:2.9.0",
    "publish-lane": "xla-wheels publish-lane --bundle v6e-2.11",
    "promote": "xla-wheels promote --bundle v6e-2.11 --lane preferred --dry-run",
    "compare": "xla-wheels compare v6e-2.9 v6e-2.11",
    "lane-requirements": "xla-wheels lane-requirements --lane preferred",
    "lanes": "xla-wheels lanes --history",
    "status": "xla-wheels status --json",
    "cache-pack": (
        "xla-wheels cache-pack --bundle v6e-2.11 --lane validation --workload small"
        " --public-key pack-key.pub.pem"
    ),
    "runtime-image": (
        "xla-wheels runtime-image --bundle v6e-2.11 --lane preferred --profile train"
        " --engine podman --dry-run"
    ),
    "jobs": "xla-wheels jobs --wheel torch_xla-2.9.0+p1a2b3c4d-cp311-cp311-linux_x86_64.whl"
    " --stamps /mnt/job-stamps",
    "rollback": (
        "xla-wheels rollback --lane preferred --to v6e-2.10"
        ' --reason "v6e-2.11 hangs at step 0" --dry-run'
    ),
    "attest": "xla-wheels attest --bundle v6e-2.11 --signing-key team-key.pem",
    "rebuild-check": "xla-wheels rebuild-check --bundle v6e-2.11",
}

#: What a summary line leaves out, for the subcommands that need more.
DETAILS: dict[str, str] = {
    "gate": (
        "Each check runs in fresh processes of the environment under test. Without "
        "--python, a stock torch 2.9.0 + torch_xla 2.9.0 environment is built once per "
        "machine (in the per-machine cache) and judged, so the persistent-cache defect "
        "shows in one command.\n\n"
        "Exit 0: every selected check passed; 1: a check failed (the verdict says which "
        "and why); 2: the environment cannot be judged (no torch_xla, no such device)."
    ),
    "bench-restart": (
        "Without --python, the stock torch_xla 2.9.0 environment of the per-machine cache "
        "is measured (built on first use)."
    ),
    "launch-env": (
        "Writes into --out: env.sh (export lines a POSIX shell sources), env.json (the "
        "same environment with the bundle, profile, its digest and role) and "
        "xla_launch_profile.py (the helper that applies env.json before torch_xla is "
        "imported), so the directory is all a host needs.\n\n"
        "Exit 0: written; 2: an unknown bundle, profile or role (the fix names the valid "
        "ones)."
    ),
    "patch-rebase": "Exit 3: stopped at a conflict; resolve it, then run again with --continue.",
    "abi-check": (
        "Give one pair: --python of an installed environment, or --torch-wheel with "
        "--torch-xla-wheel, or --bundle (its locked wheels), or --extension with "
        "--torch-lib-dir, or --stock.\n\n"
        "Exit 0: nothing missing; 1: missing symbols, named; 2: the pair cannot be read."
    ),
}


class UserHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default: the one its help text states, else the
    parser's (``(default: none)`` when it has none, ``off`` for a switch). The description
    and the example keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        # --help and --version have no value, hence no default.
        if "default" in text.lower() or argparse.SUPPRESS in (text, action.default):
            return text
        return f"{text} (default: {_default_words(action)})".lstrip()


def _default_words(action: argparse.Action) -> str:
    default = action.default
    # A switch left unset is off (its environment variable, where it has one, says so in
    # its own help).
    if default is False or (default is None and isinstance(action, SwitchAction)):
        return "off"
    if default is None or default == "" or default == []:
        return "none"
    if default is True:
        return "on"
    return "%(default)s"


def subcommand_help(name: str, summary: str) -> dict[str, Any]:
    """``add_parser`` keywords for subcommand ``name``: its description, example and
    formatter."""
    paragraphs = [summary[:1].upper() + summary[1:] + "."]
    paragraphs += DETAILS.get(name, "").split("\n\n") if name in DETAILS else []
    description = "\n\n".join(textwrap.fill(p, width=88) for p in paragraphs)
    return {
        "description": description,
        "epilog": f"example:\n  {EXAMPLES[name]}",
        "formatter_class": UserHelpFormatter,
    }


def option_help(action: argparse.Action, prog: str = "xla-wheels") -> str:
    """``action``'s help as --help prints it, default included, on one line."""
    formatter = UserHelpFormatter(prog)
    return " ".join(formatter._expand_help(action).split())
