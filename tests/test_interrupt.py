"""Ctrl-C during a build step or the ship check: ``error: interrupted``, exit 130, no
traceback, no child process left, dist/ and wheels.lock as they were.

The real CLI in its own process group on the synthetic upstream (BUILD_MODE=host); a
synthetic setup.py (or ship check) that sleeps is the long step; SIGINT goes to the whole
group, as a terminal's Ctrl-C does.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.clirunner import MINIMAL_PATH, REPO_ROOT
from tests.synthetic_upstream import Synthetic, cli_args

HOST = ("--mode", "host", "--host-python", sys.executable)


def _state(root: Path) -> dict[str, str]:
    files = [root / "wheels.lock", *sorted((root / "dist").rglob("*"))]
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if p.is_file()
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _as_from_a_terminal() -> None:
    """SIGINT handled as in a terminal's foreground job. A command started with ``&`` by a
    non-interactive shell (``nohup bash -c '... &'``, as CI runners do) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: the run would never
    see the Ctrl-C this test sends (it failed that way in CI, never in a terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("step", ["build", "ship-check"])
@pytest.mark.slow
def test_ctrl_c_ends_cleanly(step: str, tmp_path: Path, syn: Synthetic) -> None:
    before = _state(syn.root)
    pidfile = tmp_path / "slow-step.pid"
    extra: tuple[str, ...] = ()
    env = {
        "PATH": MINIMAL_PATH,
        "HOME": str(syn.root.parent),
        "PYTHONPATH": str(REPO_ROOT / "src"),
    }
    if step == "build":
        env["SYNTHETIC_SLOW_BUILD_PIDFILE"] = str(pidfile)
    else:
        sleeper = (
            f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(300)"
        )
        extra = ("--ship-check", f'{{python}} -c "{sleeper}"')
    # Not tests.clirunner.run_cli, which waits for the end: this run is interrupted while
    # a step runs, in its own process group, as a terminal's Ctrl-C would.
    process = subprocess.Popen(
        [sys.executable, "-m", "xla_wheels", *cli_args(syn, *HOST, *extra)],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (pidfile.exists() and pidfile.read_text()):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.2)
        slow_pid = int(pidfile.read_text())
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired as late:
            # Say where the run stood when it did not end: the tail of its own stderr.
            shown = late.stderr or b""
            shown = shown.decode(errors="replace") if isinstance(shown, bytes) else shown
            pytest.fail(f"the run did not end within 60 s of Ctrl-C; its stderr:\n{shown[-4000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr
    assert stderr.rstrip().endswith("error: interrupted"), stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-6000:]
    time.sleep(0.5)
    assert not _alive(slow_pid)
    assert not _group_alive(process.pid), "a child of the run outlived it"
    assert _state(syn.root) == before
