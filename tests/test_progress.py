"""Long work is visible: a slow fetch prints progress lines while it runs.

A real fetch through the real CLI, from a throwaway upstream holding a large random blob;
upload-pack's pack-objects is slowed by a wrapper (git's uploadpack.packObjectsHook, in a
global configuration file named by GIT_CONFIG_GLOBAL), so the fetch takes seconds here as
a big one does on a network, and the heartbeat interval is set to 0.2 s.
"""

from __future__ import annotations

import contextlib
import os
import pty
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.gitrepos import Upstream, git, make_project

THROTTLE = """#!/bin/sh
# pack-objects, its pack passed on in 64 KiB pieces, 0.05 s apart (about 1.3 MiB/s).
"$@" | {python} -c '
import sys, time
while chunk := sys.stdin.buffer.read(65536):
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
    time.sleep(0.05)
'
"""


def _commit_random_blob(upstream: Upstream, size: int) -> str:
    # Random bytes do not compress: the pack is as large as the blob.
    (upstream.path / "weights.bin").write_bytes(os.urandom(size))
    git(upstream.path, "add", "weights.bin")
    git(upstream.path, "commit", "-q", "-m", "a large file")
    sha = git(upstream.path, "rev-parse", "HEAD")
    upstream.commits.append(sha)
    return sha


def _slow_fetches(tmp_path: Path) -> dict[str, str]:
    """The environment that slows every fetch from the throwaway upstreams."""
    hook = tmp_path / "slow-pack-objects"
    hook.write_text(THROTTLE.format(python=os.environ.get("PYTHON", "python3")))
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    # Global configuration: git honours this hook only from protected configuration, and
    # does not pass -c/GIT_CONFIG_COUNT settings on to a local upload-pack.
    config = tmp_path / "gitconfig"
    config.write_text(
        f"[uploadpack]\n\tpackObjectsHook = {hook}\n"
        # index-pack (which writes the incoming pack as it arrives), not unpack-objects.
        "[transfer]\n\tunpackLimit = 1\n"
    )
    return {"XLA_WHEELS_PROGRESS_INTERVAL": "0.2", "GIT_CONFIG_GLOBAL": str(config)}


@pytest.mark.slow
def test_a_slow_fetch_prints_progress_lines(tmp_path: Path, upstreams, run_cli) -> None:
    _commit_random_blob(upstreams["torch"], 3 * 1024 * 1024)
    project = make_project(tmp_path, upstreams)
    result = run_cli("sources", "--bundle", "test-1", root=project, env=_slow_fetches(tmp_path))
    assert result.exit_code == 0, result.stderr
    lines = re.findall(
        r"still fetching torch: \S+, ([0-9.]+) (B|KiB|MiB) received so far", result.stderr
    )
    assert len(lines) >= 2, result.stderr
    # ... with the bytes received so far, growing while the pack arrives.
    assert any(float(amount) > 0 and unit != "B" for amount, unit in lines), lines
    # The fetch and its progress are in the stage's log, and the stage in the timings table.
    sources_log = (project / "out" / "test-1" / "logs" / "sources.log").read_text()
    assert "still fetching torch:" in sources_log
    assert "+ git --git-dir=" in sources_log and " fetch --quiet --no-tags " in sources_log
    assert re.search(r"^  sources +\S+  ran$", result.stderr, re.MULTILINE)


@pytest.mark.slow
def test_credentials_in_a_remote_reach_no_log_terminal_plan_or_error(
    tmp_path: Path, upstreams, run_cli
) -> None:
    project = make_project(tmp_path, upstreams)
    manifest = project / "build" / "bundles" / "test-1.toml"
    secret_remote = "http://builder:s3cret-token@127.0.0.1:9/torch.git"
    manifest.write_text(manifest.read_text().replace(upstreams["torch"].url, secret_remote, 1))
    # One retry (its "retrying" line must be masked too), not the default three's 14 s.
    result = run_cli(
        "sources", "--bundle", "test-1", root=project, env={"XLA_WHEELS_NET_RETRIES": "1"}
    )
    assert result.exit_code == 1, result.stderr  # the fetch kept failing after its retry
    assert "trying again in 2s" in result.stderr  # the retry's line was shown, masked below
    sources_log = (project / "out" / "test-1" / "logs" / "sources.log").read_text()
    fetch = "fetch --quiet --no-tags --update-shallow -- http://<redacted>@127.0.0.1:9/torch.git"
    assert fetch in sources_log
    assert "s3cret-token" not in sources_log
    assert re.search(r"^  sources +\S+  failed$", result.stderr, re.MULTILINE)
    # The terminal (the commands printed before they run, the error) and the plan too.
    assert "http://<redacted>@127.0.0.1:9/torch.git" in result.stderr
    assert "s3cret-token" not in result.stdout + result.stderr
    plan = run_cli("wheels", "--bundle", "test-1", "--dry-run", root=project)
    assert "<redacted>@127.0.0.1:9/torch.git" in plan.stdout + plan.stderr
    assert "s3cret-token" not in plan.stdout + plan.stderr


@pytest.mark.slow
def test_on_a_terminal_git_shows_its_own_progress(tmp_path: Path, upstreams) -> None:
    _commit_random_blob(upstreams["torch"], 3 * 1024 * 1024)
    project = make_project(tmp_path, upstreams)
    controller, terminal = pty.openpty()
    received: list[bytes] = []

    def read_terminal() -> None:
        with contextlib.suppress(OSError):  # EIO once the last writer has gone
            while chunk := os.read(controller, 4096):
                received.append(chunk)

    reader = threading.Thread(target=read_terminal)
    reader.start()
    env = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(tmp_path / "home"),
        "XLA_WHEELS_CACHE": str(tmp_path / "machine-cache"),
        **_slow_fetches(tmp_path),
    }
    # Not tests.clirunner.run_cli: this run's stderr must be a terminal (a pty), which the
    # one runner's captured pipes are not.
    command = [sys.executable, "-m", "xla_wheels", "sources", "--bundle", "test-1"]
    process = subprocess.run(
        [*command, "--root", str(project)], stderr=terminal, env=env, timeout=120, check=False
    )
    os.close(terminal)
    reader.join(timeout=30)
    os.close(controller)
    shown = b"".join(received).decode(errors="replace")
    assert process.returncode == 0, shown
    # git's own meter (LC_ALL=C), redrawn in place; no heartbeat lines in between.
    assert "Receiving objects: 100%" in shown
    assert "still fetching" not in shown
    assert " fetch --progress --no-tags " in shown
