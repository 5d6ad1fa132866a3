"""Shared fixtures. Stage-specific fixtures live next to their tests or below."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(tmp_path: Path):
    """Run ``python -m xla_wheels ARGS`` in a fresh process with its own cache directory."""

    def run(*args: str, root: Path | None = None, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> CliResult:
        command = [sys.executable, "-m", "xla_wheels", *args]
        if root is not None:
            command += ["--root", str(root)]
        full_env = {
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "XLA_WHEELS_CACHE": str(tmp_path / "machine-cache"),
            "HOME": str(tmp_path / "home"),
            **(env or {}),
        }
        process = subprocess.run(command, cwd=cwd or REPO_ROOT, env=full_env, text=True,
                                 capture_output=True, timeout=300, check=False)
        return CliResult(process.returncode, process.stdout, process.stderr)

    return run
