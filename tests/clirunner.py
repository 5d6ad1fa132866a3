"""The one way the tests run the command line: ``python -m xla_wheels`` in a fresh process.

A fresh process is the real CLI edge (argument parsing, the options reader, error ->
exit code). The differences between tests are parameters: ``root`` appends ``--root``;
``inherit_env`` starts from this process's environment (for children that need the
shell's PATH, proxies and the per-machine cache: pip, twine, the gate's environments)
instead of a minimal one; either way no credential and no ``XLA_WHEELS_*`` setting of the
developer's shell leaks in, except the per-machine cache location.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _inherited() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("TWINE_", "XLA_WHEELS_")) or name == "XLA_WHEELS_CACHE"
    }


def run_cli(
    *args: str,
    root: Path | None = None,
    env: dict[str, str] | None = None,
    inherit_env: bool = False,
    cwd: Path = REPO_ROOT,
    timeout: float = 900,
    umask: int = -1,
) -> CliResult:
    """``python -m xla_wheels ARGS [--root ROOT]``; ``env`` is added last; ``umask``
    (not -1) is the child's, for tests of the modes of what it writes."""
    command = [sys.executable, "-m", "xla_wheels", *args]
    if root is not None:
        command += ["--root", str(root)]
    full_env = _inherited() if inherit_env else {"PATH": MINIMAL_PATH}
    full_env.update(env or {})
    # Works whether or not the package is installed into the test interpreter.
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT / "src"), full_env.get("PYTHONPATH", "")) if p
    )
    process = subprocess.run(
        command, cwd=cwd, env=full_env, text=True, capture_output=True, timeout=timeout,
        check=False, umask=umask,
    )  # fmt: skip
    return CliResult(process.returncode, process.stdout, process.stderr)
