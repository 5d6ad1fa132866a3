"""Ctrl-C during a build step or the ship check: ``error: interrupted``, exit 130, no
traceback, no child process left, dist/ and wheels.lock as they were. SIGTERM and SIGHUP
sent to the CLI alone (``kill <pid>``, make's SIGTERM, a closed terminal) end it the same
way, with 143 and 129: no lock file, no orphan, no stage committed half-done; and a stage
an earlier run left without its SBOM is built again, never reused.

The real CLI in its own session on the synthetic upstream (BUILD_MODE=host); a synthetic
setup.py (or ship check) that sleeps is the long step; SIGINT goes to the whole group, as
a terminal's Ctrl-C does; SIGTERM and SIGHUP to the CLI's pid only.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from tests.clirunner import MINIMAL_PATH, run_cli
from tests.gitrepos import SOURCE_PATH
from tests.synthetic_upstream import Synthetic, cli_args
from tests.waiting import STOPPED_WITHIN_S
from xla_wheels.builder.spec import built_wheel, stage_wheel
from xla_wheels.wheel_stamp import sbom_path_in

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


def _as_from_a_terminal() -> None:
    """SIGINT handled as in a terminal's foreground job. A command started with ``&`` by a
    non-interactive shell (``nohup bash -c '... &'``, as CI runners do) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler: the run would never
    see the Ctrl-C this test sends (it failed that way in CI, never in a terminal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _session_alive(sid: int) -> list[str]:
    """Every process still in session ``sid`` (a child's own process group included)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended while we looked
        if int(fields[3]) == sid and fields[0] != "Z":
            left.append(stat.parent.name)
    return left


def _env(syn: Synthetic) -> dict[str, str]:
    return {
        "PATH": MINIMAL_PATH,
        "HOME": str(syn.root.parent),
        "PYTHONPATH": SOURCE_PATH,
    }


def _start_until_slow_step(
    syn: Synthetic, step: str, pidfile: Path
) -> tuple[subprocess.Popen[str], int]:
    """The CLI in its own session, running until the slow ``step`` (the torch_xla
    recipe's setup.py, or the ship check) has started; returns it and the step's pid."""
    extra: tuple[str, ...] = ()
    env = _env(syn)
    if step == "build":
        env["SYNTHETIC_SLOW_BUILD_PIDFILE"] = str(pidfile)
    else:
        sleeper = (
            f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(300)"
        )
        extra = ("--ship-check", f'{{python}} -c "{sleeper}"')
    # Not tests.clirunner.run_cli, which waits for the end: this run is interrupted while
    # a step runs, in its own session (so that what it leaves behind can be found).
    process = subprocess.Popen(
        [sys.executable, "-m", "xla_wheels", *cli_args(syn, *HOST, *extra)],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (pidfile.exists() and pidfile.read_text()):
        if process.poll() is not None:
            pytest.fail(f"the run ended before the slow step: {process.communicate()}")
        if time.monotonic() > deadline:
            _end(process)
            pytest.fail("the slow step never started")
        time.sleep(0.2)
    return process, int(pidfile.read_text())


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _stderr_after(process: subprocess.Popen[str], what: str) -> str:
    try:
        _, stderr = process.communicate(timeout=STOPPED_WITHIN_S)
    except subprocess.TimeoutExpired as late:
        # Say where the run stood when it did not end: the tail of its own stderr.
        shown = late.stderr or b""
        shown = shown.decode(errors="replace") if isinstance(shown, bytes) else shown
        _end(process)
        ended = f"the run did not end within {STOPPED_WITHIN_S:.0f} s of {what}"
        pytest.fail(f"{ended}; its stderr:\n{shown[-4000:]}")
    return stderr


def _orphans(process: subprocess.Popen[str]) -> list[str]:
    """What the ended run left running in its session, once what it stopped had time to
    end (it polls: a run that left nothing behind returns at once)."""
    deadline = time.monotonic() + STOPPED_WITHIN_S
    while (left := _session_alive(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # not the next test's problem
        with suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return left


@pytest.mark.parametrize("step", ["build", "ship-check"])
@pytest.mark.slow
def test_ctrl_c_ends_cleanly(step: str, tmp_path: Path, syn: Synthetic) -> None:
    before = _state(syn.root)
    process, slow_pid = _start_until_slow_step(syn, step, tmp_path / "slow-step.pid")
    try:
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        stderr = _stderr_after(process, "Ctrl-C")
    finally:
        _end(process)
    assert process.returncode == 130, stderr
    assert stderr.rstrip().endswith("error: interrupted"), stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-6000:]
    time.sleep(0.5)
    assert not _alive(slow_pid)
    assert not _orphans(process), "a child of the run outlived it"
    assert _state(syn.root) == before


def _torch_xla_stages(syn: Synthetic) -> list[Path]:
    return sorted((syn.cache / "stages").glob("torch_xla-*"))


@pytest.mark.slow
def test_sigterm_during_the_torch_xla_recipe_leaves_nothing_half_done(
    tmp_path: Path, syn: Synthetic
) -> None:
    before = _state(syn.root)
    process, slow_pid = _start_until_slow_step(syn, "build", tmp_path / "slow-step.pid")
    try:
        os.kill(process.pid, signal.SIGTERM)  # `kill <pid>`: the CLI alone, not its group
        stderr = _stderr_after(process, "SIGTERM")
    finally:
        _end(process)
    assert process.returncode == 143, stderr[-3000:]
    assert stderr.rstrip().endswith("error: interrupted by SIGTERM"), stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-6000:]
    assert not _alive(slow_pid), "the recipe's setup.py outlived the run"
    assert not _orphans(process), "a child of the run outlived it"
    assert not (syn.root / "out" / "syn" / ".lock").exists()
    assert _state(syn.root) == before
    assert [stage_wheel(d) for d in _torch_xla_stages(syn)] == [None] * len(_torch_xla_stages(syn))

    # The next run builds torch_xla (torch's stage was finished, SBOM included: reused).
    again = run_cli(*cli_args(syn, *HOST), env=_env(syn), timeout=600)
    assert again.exit_code == 0, again.stderr[-3000:]
    assert "build: torch stage cached" in again.stderr
    assert "build: torch_xla stage cached" not in again.stderr
    (stage,) = _torch_xla_stages(syn)
    wheel = stage_wheel(stage)
    assert wheel is not None and sbom_path_in(wheel)


@pytest.mark.slow
def test_sighup_during_the_ship_check_ends_the_run_like_ctrl_c(
    tmp_path: Path, syn: Synthetic
) -> None:
    """Another signal in another stage: the terminal closed while the ship check ran."""
    before = _state(syn.root)
    process, slow_pid = _start_until_slow_step(syn, "ship-check", tmp_path / "slow-step.pid")
    try:
        os.kill(process.pid, signal.SIGHUP)
        stderr = _stderr_after(process, "SIGHUP")
    finally:
        _end(process)
    assert process.returncode == 129, stderr[-3000:]
    assert stderr.rstrip().endswith("error: interrupted by SIGHUP"), stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-6000:]
    assert not _alive(slow_pid), "the ship check outlived the run"
    assert not _orphans(process), "a child of the run outlived it"
    assert not (syn.root / "out" / "syn" / ".lock").exists()
    assert not list((syn.root / "dist").glob("syn/*.whl"))
    assert _state(syn.root) == before


@pytest.mark.slow
def test_a_stage_left_without_its_sbom_is_built_again_not_reused(
    tmp_path: Path, syn: Synthetic
) -> None:
    """A recipe no longer outlives its run: its CLI killed by SIGKILL (which no handler
    sees), the recipe, in a process group of its own, ends too (the parent-death signal)
    and leaves no stage. A stage a recipe finished without the SBOM the host adds after
    it (a run that ended between the two) must not be taken as cached either (it would
    stop on, or lock, a wheel without its SBOM): the next run builds it again, to the
    bytes wheels.lock already records."""
    first = run_cli(*cli_args(syn, *HOST), env=_env(syn), timeout=600)
    assert first.exit_code == 0, first.stderr[-3000:]
    locked = _state(syn.root)
    (stage,) = _torch_xla_stages(syn)
    shutil.rmtree(stage)  # so that the next run runs the torch_xla recipe again
    go = tmp_path / "go"
    with (tmp_path / "killed-run.log").open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "xla_wheels", *cli_args(syn, *HOST)],
            env={**_env(syn), "SYNTHETIC_BUILD_WAITS_FOR": str(go)},
            stdout=output, stderr=output, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 300
            while not (go.with_name("go.pid").exists() and process.poll() is None):
                assert process.poll() is None, (tmp_path / "killed-run.log").read_text()
                assert time.monotonic() < deadline, "the recipe never started"
                time.sleep(0.2)
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            deadline = time.monotonic() + STOPPED_WITHIN_S  # the step's grace included
            while _session_alive(process.pid):
                assert time.monotonic() < deadline, "the recipe outlived its killed run"
                time.sleep(0.2)
        finally:
            _end(process)
            _orphans(process)
    assert built_wheel(stage) is None  # nothing half-built is left as a stage

    # The recipe alone, as a run that ended between the recipe and its SBOM step leaves it
    # (on fresh worktrees, as every run's patch stage makes them).
    patched = run_cli(
        "patch", "--root", str(syn.root), "--bundle", "syn", "--cache-dir", str(syn.cache),
        env=_env(syn), timeout=600,
    )  # fmt: skip
    assert patched.exit_code == 0, patched.stderr[-3000:]
    spec = next((syn.root / "out").rglob("build-spec.json"))
    recipe = subprocess.run(
        [sys.executable, "-m", "xla_wheels.builder.run_recipe", "--spec", str(spec),
         "--recipe", "torch_xla"],
        env=_env(syn), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert recipe.returncode == 0, recipe.stderr[-3000:]
    wheel = built_wheel(stage)
    assert wheel is not None and sbom_path_in(wheel) is None, "the recipe left no wheel"
    assert stage_wheel(stage) is None

    again = run_cli(*cli_args(syn, *HOST), env=_env(syn), timeout=600)
    assert again.exit_code == 0, again.stderr[-3000:]
    assert f"build: torch_xla stage {stage} is not reused: its wheel has no" in again.stderr
    assert "build: torch_xla stage cached" not in again.stderr
    rebuilt = stage_wheel(stage)
    assert rebuilt is not None and sbom_path_in(rebuilt)
    assert _state(syn.root) == locked  # the same bytes: dist/ and wheels.lock unchanged


def _wait_for(path: Path, process: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 300
    while not (path.exists() and path.read_text()):
        if process.poll() is not None:
            pytest.fail(f"it ended before {what}: exit {process.returncode}")
        if time.monotonic() > deadline:
            _end(process)
            pytest.fail(f"{what} never started")
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_to_make_ends_the_cli_it_runs(tmp_path: Path, syn: Synthetic) -> None:
    """make passes its SIGTERM to the shell of the recipe, not to the CLI that shell runs
    (dash does not exec it); the CLI must end with that shell, not write dist/ and
    wheels.lock after make has gone. A real make and a recipe shaped as the Makefile's
    (variable assignments and quoted values: a shell runs it)."""
    before = _state(syn.root)
    pidfile = tmp_path / "slow-step.pid"
    command = shlex.join([sys.executable, "-m", "xla_wheels", *cli_args(syn, *HOST)])
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"wheels:\n\t@SYNTHETIC_SLOW_BUILD_PIDFILE='{pidfile}' {command}\n")
    make = subprocess.Popen(
        ["make", "--no-print-directory", "-f", str(makefile), "wheels"],
        env={**_env(syn), "PATH": os.environ["PATH"]}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(pidfile, make, "the torch_xla recipe")
        slow_pid = int(pidfile.read_text())
        os.kill(make.pid, signal.SIGTERM)  # make alone, as `kill <make's pid>` does
        stderr = _stderr_after(make, "SIGTERM to make")
    finally:
        _end(make)
    assert make.returncode != 0
    assert not _orphans(make), f"the CLI outlived make: {stderr[-2000:]}"
    assert not _alive(slow_pid)
    assert "error: interrupted by SIGTERM" in stderr, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-6000:]
    assert not (syn.root / "out" / "syn" / ".lock").exists()
    assert _state(syn.root) == before


@pytest.mark.slow
def test_sigterm_to_the_demo_ends_its_cli_run_with_it(tmp_path: Path) -> None:
    """The demo runs each stage as a CLI child: SIGTERM to the demo alone ends that child
    (and what it started) too; nothing writes into the demo's project once it has gone."""
    demo_dir = tmp_path / "demo"
    env = {**_env_plain(), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    demo = subprocess.Popen(
        [sys.executable, "-m", "xla_wheels.demo", "--dir", str(demo_dir)],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # Signalled once the wheels stage has run its first build command.
        while not any("+ " in p.read_text() for p in demo_dir.glob("logs/*-wheels.log")):
            assert demo.poll() is None, demo.communicate()
            assert time.monotonic() < deadline, "the demo's wheels stage never started"
            time.sleep(0.1)
        os.kill(demo.pid, signal.SIGTERM)
        stderr = _stderr_after(demo, "SIGTERM to the demo")
    finally:
        _end(demo)
    assert demo.returncode == 143, stderr[-3000:]
    assert stderr.rstrip().endswith("error: interrupted by SIGTERM"), stderr[-2000:]
    assert not _orphans(demo), "a stage of the demo outlived it"
    at_exit = _files(demo_dir)
    time.sleep(3)
    assert _files(demo_dir) == at_exit, "something wrote into the demo after it ended"


def _files(directory: Path) -> dict[str, tuple[int, int]]:
    """Each file under ``directory`` with its size and modification time."""
    found = {}
    for path in directory.rglob("*"):
        with suppress(OSError):
            if path.is_file() and not path.is_symlink():
                info = path.stat()
                found[str(path)] = (info.st_size, info.st_mtime_ns)
    return found


def _env_plain() -> dict[str, str]:
    return {"PATH": MINIMAL_PATH, "PYTHONPATH": SOURCE_PATH}
