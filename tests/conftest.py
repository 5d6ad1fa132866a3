"""Shared fixtures. Stage-specific fixtures live next to their tests or below."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import clirunner
from tests.clirunner import CliResult
from tests.gitrepos import Upstream, make_upstreams
from xla_wheels.options import machine_cache


@pytest.fixture
def upstreams(tmp_path: Path) -> dict[str, Upstream]:
    """Throwaway upstream git repositories for torch, torch_xla and openxla."""
    return make_upstreams(tmp_path)


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., CliResult]:
    """:func:`tests.clirunner.run_cli` with a minimal environment and its own cache and home."""

    def run(*args: str, env: dict[str, str] | None = None, **kwargs: Any) -> CliResult:
        isolated = {
            "XLA_WHEELS_CACHE": str(tmp_path / "machine-cache"),
            "HOME": str(tmp_path / "home"),
        }
        return clirunner.run_cli(*args, env={**isolated, **(env or {})}, timeout=300, **kwargs)

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
