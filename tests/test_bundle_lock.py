"""Two runs on one bundle: the second refuses at once (exit 5) naming the first run's pid,
and changes nothing; when the first ends (even killed) the lock is gone with it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.gitrepos import SOURCE_PATH
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    make_publish_project,
)
from xla_wheels.cli import COMMANDS, build_parser

HOLDER = """
import sys, time
from pathlib import Path
from xla_wheels.run_lock import bundle_run_lock
with bundle_run_lock(Path(sys.argv[1]), sys.argv[2], "wheels"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def project(tmp_path: Path, fake_wheels: FakeWheels) -> Path:
    return make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])


@pytest.fixture
def holder(project: Path) -> Iterator[subprocess.Popen[str]]:
    """Another run holding the bundle's lock (the lock code the CLI uses, in its own process)."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(project / "out"), BUNDLE],
        stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": SOURCE_PATH},
    )  # fmt: skip
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


#: Every subcommand that writes the bundle's work or products (out/<bundle>, dist/<bundle>,
#: its wheels.lock entry), with the arguments it needs besides --bundle.
WRITERS: dict[str, tuple[str, ...]] = {
    "lock": (),
    "sources": (),
    "patch": (),
    "wheels": (),
    "patch-export": (),
    "patch-rebase": ("--onto", "HEAD"),
    "publish": (),
    "requirements": (),
    "verify-install": (),
    "attest": (),
    "rebuild-check": (),
    "record": ("--wheels", "."),  # the lock comes before the wheels are read
}


def test_the_table_names_every_subcommand_that_writes_a_bundle() -> None:
    declared = set()
    for name in COMMANDS:
        args, _ = build_parser(name).parse_known_args([name])
        if getattr(args, "writes_bundle", False):
            declared.add(name)
    assert declared == set(WRITERS)


@pytest.mark.parametrize("command", list(WRITERS))
@pytest.mark.slow
def test_a_second_run_on_the_bundle_refuses_at_once(
    command: str, project: Path, holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    lock_before = _digest(project / "wheels.lock")
    cache = tmp_path / "machine-cache"
    result = run_cli(
        command, "--bundle", BUNDLE, *WRITERS[command], root=project,
        env={"XLA_WHEELS_CACHE": str(cache)}, timeout=60,
    )  # fmt: skip
    assert result.exit_code == 5, result.output
    assert f"another run is working on bundle {BUNDLE}" in result.stderr
    assert f"pid {holder.pid}, `wheels" in result.stderr
    # Names how to look at the holder, and that a dead one would not have stopped us.
    assert f"fix: wait for it to end; `ps -o pid,etime,args -p {holder.pid}`" in result.stderr
    assert "A run that died releases the lock by itself" in result.stderr
    assert "Traceback" not in result.output
    assert _digest(project / "wheels.lock") == lock_before
    assert not cache.exists()  # refused before anything was fetched


def test_the_lock_goes_with_the_process_that_held_it(
    project: Path, holder: subprocess.Popen[str]
) -> None:
    assert run_cli("lock", "--bundle", BUNDLE, root=project).exit_code == 5
    holder.kill()  # no clean exit: the kernel releases a flock with its last descriptor
    holder.wait()
    again = run_cli("lock", "--bundle", BUNDLE, root=project)
    assert again.exit_code == 0, again.output


def test_the_lock_leaves_no_trace_when_its_run_ends(tmp_path: Path) -> None:
    # A run refused by a check (bad input, a preflight blocker) must write nothing: the
    # lock file and the directories the lock made go with it; a directory that holds
    # anything else stays.
    from xla_host.errors import BundleBusy
    from xla_wheels.run_lock import bundle_run_lock

    out = tmp_path / "out"
    with bundle_run_lock(out, "b", "wheels") as path:
        assert path.read_text().startswith(f"{os.getpid()} wheels")
        # A run takes it once, at the CLI edge: a second take, even in this process, is
        # refused like any other holder's (no per-process state makes it a no-op).
        with pytest.raises(BundleBusy), bundle_run_lock(out, "b", "lock"):
            pass
        assert path.exists()
    assert not out.exists()
    with bundle_run_lock(out, "b", "wheels"):
        (out / "b" / "logs").mkdir()
    assert sorted(p.name for p in (out / "b").iterdir()) == ["logs"]
