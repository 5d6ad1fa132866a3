"""Every command of the CLI starts in a fraction of a second.

The suite runs the CLI hundreds of times, and users run it in loops (``make lock-check``
in a hook). One import at the top of ``sbom.py`` once made every command take 1.4 s to
start: the CycloneDX validator pulls in jsonschema's format checkers, and
``rfc3987_syntax`` builds a grammar on import. Only the commands that read an SBOM need
them, so they are imported there.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.clirunner import REPO_ROOT

#: Imported only by the commands that use them, never at start (importlib.metadata: only
#: ``--version`` reads the host package's installed version; it was a third of the start).
HEAVY_AT_START = ("jsonschema", "rfc3987_syntax", "cyclonedx.validation", "importlib.metadata")


def test_the_cli_imports_no_schema_validator_at_start() -> None:
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
