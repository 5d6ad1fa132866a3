"""The gate's run of the one CLI helper, with its reports at hand."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.clirunner import run_cli


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

    def save(self, path: Path) -> None:
        """Keep what ``load`` needs (the reports stay in ``out_dir``)."""
        kept = {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr}
        path.write_text(json.dumps({**kept, "out_dir": str(self.out_dir)}))

    @classmethod
    def load(cls, path: Path) -> GateRun:
        kept = json.loads(path.read_text())
        return cls(kept["exit_code"], kept["stdout"], kept["stderr"], Path(kept["out_dir"]))


def run_gate_cli(
    command: str,
    *args: str,
    out_dir: Path,
    env: dict[str, str] | None = None,
    timeout: float = 1200,
) -> GateRun:
    """``command ARGS --out OUT_DIR`` through :func:`tests.clirunner.run_cli`."""
    result = run_cli(
        command, *args, "--out", str(out_dir), env=env, inherit_env=True, timeout=timeout
    )
    return GateRun(result.exit_code, result.stdout, result.stderr, out_dir)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie waiting for its reaper counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
