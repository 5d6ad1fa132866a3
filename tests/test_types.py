"""The source type-checks: mypy over ``src`` and ``host/src`` (pyproject's ``[tool.mypy]``).

A test rather than a step of ``make test`` before the suite: run by a worker beside the
others, its 10 CPU-seconds fill a moment another test spends waiting (a server, a
timeout) instead of holding up the whole run. ``make lint`` runs mypy alone.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.clirunner import REPO_ROOT


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_source() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert process.returncode == 0, process.stdout + process.stderr
    assert "Success: no issues found" in process.stdout
