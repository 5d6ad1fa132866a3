"""Shared fixtures. Stage-specific fixtures live next to their tests or below."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT, Upstream, make_upstreams
from xla_wheels.options import machine_cache


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def upstreams(tmp_path: Path) -> dict[str, Upstream]:
    """Throwaway upstream git repositories for torch, torch_xla and openxla."""
    return make_upstreams(tmp_path)


@pytest.fixture
def run_cli(tmp_path: Path):
    """Run ``python -m xla_wheels ARGS`` in a fresh process with its own cache directory."""

    def run(
        *args: str,
        root: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> CliResult:
        command = [sys.executable, "-m", "xla_wheels", *args]
        if root is not None:
            command += ["--root", str(root)]
        full_env = {
            "PATH": "/usr/bin:/bin:/usr/local/bin",
            "XLA_WHEELS_CACHE": str(tmp_path / "machine-cache"),
            "HOME": str(tmp_path / "home"),
            **(env or {}),
        }
        process = subprocess.run(
            command,
            cwd=cwd or REPO_ROOT,
            env=full_env,
            text=True,
            capture_output=True,
            timeout=300,
            check=False,
        )
        return CliResult(process.returncode, process.stdout, process.stderr)

    return run


# --- Stock torch_xla environments (the gate's real evidence) --------------------------
# Built once per machine from PyPI by the project's own code (xla_wheels.gate.envs) and
# cached under <the per-machine cache>/envs/ (options.machine_cache); the first session pays
# about 1.5 minutes and 7 GB each, later sessions reuse them.


@pytest.fixture(scope="session")
def stock_xla_python_29() -> Path:
    """Python of a venv with stock torch 2.9.0 + torch_xla 2.9.0 (persistent cache broken)."""
    from xla_wheels.gate import envs

    return envs.ensure_stock_env("2.9.0", root=machine_cache(os.environ))


@pytest.fixture(scope="session")
def stock_xla_python_27() -> Path:
    """Python of a venv with stock torch 2.7.0 + torch_xla 2.7.0 (persistent cache works)."""
    from xla_wheels.gate import envs

    return envs.ensure_stock_env("2.7.0", root=machine_cache(os.environ))
