"""Server programs the tests run, each in a venv of its own in the per-machine cache.

A tool (BuildGrid, WsgiDAV) is pinned in a requirements file beside the tests; its venv is
made once per machine, named by the file's digest (a changed pin makes a new venv), and
never installed into .venv: the pipeline's environment stays what it ships with.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from xla_host.waitlock import make_once
from xla_wheels.options import machine_cache

MARKER = ".complete.json"


def pinned_tool(requirements: Path, name: str, executable: str, *, timeout_s: float) -> Path:
    """``executable`` of the venv holding exactly ``requirements`` (made if missing)."""
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:12]
    venv_name = f"{name}-{digest}-cp{sys.version_info[0]}{sys.version_info[1]}"

    def build(tmp: Path) -> dict[str, object]:
        log = tmp.with_name(tmp.name + ".log")
        with log.open("wb") as handle:
            for argv in (
                [sys.executable, "-m", "venv", str(tmp)],
                [str(tmp / "bin" / "python"), "-m", "pip", "install", "--quiet",
                 "--disable-pip-version-check", "--no-deps", "-r", str(requirements)],
            ):  # fmt: skip
                done = subprocess.run(
                    argv, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout_s
                )
                if done.returncode != 0:
                    raise AssertionError(f"setting up {name} failed: {log.read_text()}")
        log.unlink()
        return {"requirements": requirements.read_text(encoding="utf-8")}

    env = make_once(
        machine_cache(os.environ) / "envs" / venv_name,
        build,
        marker=MARKER,
        doing=f"installing {venv_name}",
        usable=lambda d: (d / "bin" / executable).exists(),
        # In place: a venv's scripts name their interpreter by its absolute path.
        in_place=True,
    )
    return env / "bin" / executable
