"""Every command of the CLI starts in a fraction of a second.

The suite runs the CLI hundreds of times, and users run it in loops (``make lock-check``
in a hook). One import at the top of ``sbom.py`` once made every command take 1.4 s to
start: the CycloneDX validator pulls in jsonschema's format checkers, and
``rfc3987_syntax`` builds a grammar on import. Only the commands that read an SBOM need
them, so they are imported there.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.clirunner import REPO_ROOT
from xla_wheels.cli import COMMANDS

#: Imported only by the commands that use them, never while a command starts (its parser
#: built, its module loaded): each took 10-80 ms of every start (``python -X importtime``),
#: and the suite starts the command lines over a thousand times. importlib.metadata: only
#: ``--version`` reads the host package's installed version; it was a third of the start.
HEAVY_AT_START = (
    "jsonschema", "rfc3987_syntax", "cyclonedx", "importlib.metadata", "elftools",
    "securesystemslib", "cryptography", "packaging", "http.client", "ssl", "urllib.request",
)  # fmt: skip

#: Builds each command's parser in a child forked from one interpreter (a fresh start
#: each, at the cost of a fork) and prints what each loaded of ``HEAVY_AT_START``.
_PROBE = """
import json, os, sys
heavy = sys.argv[1:]
under = tuple(h + "." for h in heavy)
def loaded():
    return sorted(m for m in sys.modules if m in heavy or m.startswith(under))
def probe(name, build):
    pid = os.fork()
    if pid == 0:
        build()
        print(json.dumps([name, loaded()]), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
from xla_wheels.cli import COMMANDS, build_parser
from xla_host import cli as host_cli
print(json.dumps(["(both command lines imported)", loaded()]), flush=True)
for name in COMMANDS:
    probe("xla-wheels " + name, lambda: build_parser(name))
probe("xla-host", host_cli.build_parser)
"""


def test_no_command_of_either_command_line_loads_a_heavy_library_to_start() -> None:
    process = subprocess.run(
        [sys.executable, "-c", _PROBE, *HEAVY_AT_START],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT, timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    loaded = dict(json.loads(line) for line in process.stdout.splitlines())
    assert len(loaded) == len(COMMANDS) + 2, process.stderr  # every command was probed
    assert {name: modules for name, modules in loaded.items() if modules} == {}


def test_the_command_line_really_starts_without_them() -> None:
    # The same, measured on a real start: python -X importtime names every import.
    process = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xla_wheels", "wheels", "--help"],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+([\w.]+)$", process.stderr, re.M))
    assert "xla_wheels.pipeline" in imported  # the measurement saw the CLI's imports
    assert sorted(m for m in imported if m.startswith(HEAVY_AT_START)) == []


def test_the_host_command_reads_its_version_only_when_asked() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "xla_host", "--version"],
        capture_output=True, text=True, check=True, cwd=REPO_ROOT,
    ).stdout  # fmt: skip
    from importlib import metadata

    assert shown == f"xla-host {metadata.version('xla-wheels-host')}\n"
