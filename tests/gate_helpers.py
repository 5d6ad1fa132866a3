"""Running the gate CLI in a fresh process, as ``make gate`` does, for the gate's tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class GateRun:
    exit_code: int
    stdout: str
    stderr: str
    out_dir: Path

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.out_dir / "report.json").read_text())

    def check(self, name: str) -> dict[str, Any]:
        return next(c for c in self.report["checks"] if c["name"] == name)


def run_gate_cli(
    command: str,
    *args: str,
    out_dir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 1200,
) -> GateRun:
    full_env = {**os.environ, **(env or {})}
    # Works whether or not the package is installed into the test interpreter.
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), full_env.get("PYTHONPATH", "")) if p
    )
    process = subprocess.run(
        [sys.executable, "-m", "xla_wheels", command, *args, "--out", str(out_dir)],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return GateRun(process.returncode, process.stdout, process.stderr, out_dir)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie waiting for its reaper counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
