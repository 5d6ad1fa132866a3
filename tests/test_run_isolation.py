"""No run installs outside the environment it made, and no recipe outlives its run.

The ship recipe makes a venv and installs the staged wheels into it with that venv's pip.
A venv that lost its ``pyvenv.cfg`` (a second run's ``venv --clear`` racing the first, a
run killed halfway) still has a ``bin/python`` that runs, as the base interpreter: pip
there installs into the base interpreter's ``site-packages``. The recipe refuses before
pip runs (its python's ``sys.prefix`` is not the venv) and pip runs with
``PIP_REQUIRE_VIRTUALENV`` so that it refuses by itself too. A recipe runs in a process
group of its own: a SIGKILL to the run's group ends it too (the parent-death signal).

Real venvs, real pip, a real wheel and real signals to real processes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from tests.missing_tools import skip_missing
from tests.waiting import STOPPED_WITHIN_S
from xla_wheels import venv_check
from xla_wheels.builder import recipes
from xla_wheels.builder.spec import BuildSpec

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "xlawheels_isolation_probe"
#: Generous for a venv with pip on a busy two-core machine; a hang is what it bounds.
TIMEOUT_S = 180.0


def minimal_wheel(directory: Path) -> Path:
    """A real, minimal wheel of one module (what pip needs, nothing else)."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_info = f"{PACKAGE}-1.0.dist-info"
    files = {
        f"{PACKAGE}.py": "WHERE = 'installed'\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    wheel = directory / f"{PACKAGE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return wheel


def _spec(tmp_path: Path, python: str, ship_check: str) -> Path:
    work = tmp_path / "work"
    spec = BuildSpec(
        bundle="isolation",
        python=python,
        torch_src=str(work / "torch"),
        torch_xla_worktree=str(work / "torch_xla"),
        torch_xla_tree=str(work / "torch" / "xla"),
        openxla_src=str(work / "openxla"),
        openxla_revision="0" * 40,
        buildenv=str(work / "buildenv"),
        logs=str(work / "logs"),
        torch_version="2.9.0",
        torch_xla_version="2.9.0",
        torch_stage=str(work / "stage-torch"),
        torch_xla_stage=str(work / "stage-torch_xla"),
        jobs=1,
        knobs={},
        bazel_disk_cache=str(work / "bazel"),
        bazel_output_root=str(work / "bazel-root"),
        ccache_dir=str(work / "ccache"),
        pip_cache_dir=str(work / "pip-cache"),
        pip_args=[],
        compiler_env={},
        extra_env={},
        ship_env=str(work / "ship-env"),
        ship_out=str(work / "ship-check"),
        ship_check=ship_check,
        ship_pip_args=["--no-index", "--no-deps", "--quiet"],
        pipeline_src=[str(REPO / "src"), str(REPO / "host" / "src")],
    )
    path = tmp_path / "spec.json"
    spec.write(path)
    return path


def _python_whose_venvs_lose_their_config(tmp_path: Path) -> Path:
    """The builder's python, except that a venv it makes loses its ``pyvenv.cfg`` right
    after (what a second run's ``venv --clear`` of the same directory does to the first)."""
    script = tmp_path / "python-racing"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            {sys.executable} "$@"; status=$?
            for last; do :; done
            if [ "$1" = -m ] && [ "$2" = venv ]; then rm -f "$last/pyvenv.cfg"; fi
            exit $status
            """
        )
    )
    script.chmod(0o755)
    return script


def _recipe(spec: Path, staging: Path) -> list[str]:
    return [
        sys.executable, "-m", "xla_wheels.builder.run_recipe",
        "--spec", str(spec), "--recipe", "ship", "--staging", str(staging),
    ]  # fmt: skip


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "src"), str(REPO / "host" / "src")])
    return {**os.environ, "PYTHONPATH": path}


def _importable_by(python: Path) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec('{PACKAGE}') is None)"
    return subprocess.run([str(python), "-I", "-c", probe], timeout=60).returncode == 0


@pytest.mark.slow
def test_a_ship_venv_without_its_pyvenv_cfg_is_refused_before_pip_installs_anything(
    tmp_path: Path,
) -> None:
    staging = minimal_wheel(tmp_path / "staging").parent
    python = _python_whose_venvs_lose_their_config(tmp_path)
    spec = _spec(tmp_path, str(python), "{python} -c pass")
    result = subprocess.run(
        _recipe(spec, staging), env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    venv = tmp_path / "work" / "ship-env"
    assert result.returncode == 1, result.stderr
    assert f"is not the venv {venv}" in result.stderr
    assert "pyvenv.cfg is missing" in result.stderr
    assert "nothing was installed" in result.stderr
    assert "-m pip install" not in result.stderr  # the install step never started
    # The interpreter behind the broken venv (the base one) has nothing new.
    assert not _importable_by(venv / "bin" / "python")


@pytest.mark.slow
def test_the_ship_recipes_pip_refuses_by_itself_outside_a_venv(tmp_path: Path) -> None:
    # Should the venv break between the check and the install, pip refuses too. Shown
    # with --dry-run, so that nothing could be installed even if it did not refuse.
    wheel = minimal_wheel(tmp_path / "staging")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=TIMEOUT_S)  # fmt: skip
    venv_check.pip_from_bundle(venv, tmp_path / "unpacked")  # the ship recipe's pip
    (venv / "pyvenv.cfg").unlink()
    assert venv_check.outside_venv(venv / "bin" / "python", venv) is not None
    spec = BuildSpec.read(_spec(tmp_path, sys.executable, "true"))
    (install,) = [s for s in recipes.ship_steps(spec, str(wheel.parent)) if "pip" in s.argv]
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--no-index",
         str(wheel)],
        env={**os.environ, **dict(install.env)},
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode != 0, result.stdout
    assert "Could not find an activated virtualenv" in result.stderr + result.stdout


def _site_packages(python: Path) -> Path:
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-I", "-c", probe], capture_output=True, text=True,
                               check=True, timeout=60).stdout.strip())  # fmt: skip


def test_the_clean_environment_runs_the_bundled_pip_without_installing_it(tmp_path: Path) -> None:
    # The ship recipe's clean environment: made --without-pip, pip then put on its path
    # from ensurepip's wheel (installing it cost 3 CPU-seconds at every ship check),
    # unpacked and compiled once per machine.
    unpacked_in = tmp_path / "pip-cache" / "bundled"
    pythons = []
    for name in ("first", "second"):
        venv = tmp_path / name
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                       timeout=TIMEOUT_S)  # fmt: skip
        done = venv_check.pip_from_bundle(venv, unpacked_in)
        assert done.startswith(f"pip on {venv}'s path from pip-") and str(unpacked_in) in done
        pythons.append(venv / "bin" / "python")
    (unpacked,) = [p for p in unpacked_in.iterdir() if p.is_dir()]  # once for both venvs
    assert (unpacked / ".unpacked").is_file() and list(unpacked.rglob("*.pyc"))
    python = pythons[1]
    site_packages = _site_packages(python)
    assert not (site_packages / "pip").exists()  # not installed into the venv
    version = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True,
                             text=True, check=True, timeout=TIMEOUT_S).stdout  # fmt: skip
    assert str(unpacked) in version
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", str(minimal_wheel(tmp_path / "w"))],
        env={**os.environ, **venv_check.PIP_REQUIRE_VIRTUALENV}, capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    assert (site_packages / f"{PACKAGE}.py").is_file() and _importable_by(python)
    assert not _importable_by(pythons[0])  # the other venv is still clean


@pytest.mark.slow
def test_without_a_bundled_pip_ensurepip_installs_it(tmp_path: Path) -> None:
    # Debian's Python keeps ensurepip's wheels outside the standard library (python3-pip-whl).
    debian = Path("/usr/bin/python3")
    bundled = (
        "import ensurepip, pathlib, sys; "
        "sys.exit(any((pathlib.Path(ensurepip.__file__).parent / '_bundled').glob('pip-*')))"
    )
    if not debian.exists() or subprocess.run([str(debian), "-c", bundled], timeout=60).returncode:
        skip_missing("a Python whose ensurepip bundles no pip wheel (Debian's /usr/bin/python3)")
    venv = tmp_path / "venv"
    subprocess.run([str(debian), "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=TIMEOUT_S)  # fmt: skip
    unpacked_in = tmp_path / "unpacked"
    done = venv_check.pip_from_bundle(venv, unpacked_in)
    assert done == f"pip installed into {venv} by ensurepip"
    assert not unpacked_in.exists()
    assert (_site_packages(venv / "bin" / "python") / "pip").is_dir()


def test_a_good_venv_is_its_own_interpreter(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    assert venv_check.outside_venv(venv / "bin" / "python", venv) is None
    # Another venv's python is not this venv, even though it is a venv.
    assert "is not the venv" in (venv_check.outside_venv(Path(sys.executable), venv) or "")


@pytest.mark.slow
def test_a_sigkill_to_the_runs_group_ends_the_recipe_in_its_own_group(tmp_path: Path) -> None:
    staging = minimal_wheel(tmp_path / "staging").parent
    marker = tmp_path / "check-started"
    # The ship check says who it is, then waits: it must not outlive the run.
    check = (
        '{python} -c "import json, os, time; '
        f"open('{marker}', 'w').write(json.dumps([os.getpid(), os.getpgid(0)])); "
        'time.sleep(600)"'
    )
    spec = _spec(tmp_path, sys.executable, check)
    # The run: a process that starts the recipe in a group of its own, as Engine.call does.
    run = (
        "import sys; from xla_host import runner; "
        f"runner.run({_recipe(spec, staging)!r}, output='inherit', own_group=True, check=False)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", run], env=_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not marker.exists() or not marker.read_text():
            assert parent.poll() is None, "the run ended before its ship check started"
            assert time.monotonic() < deadline, "the ship check never started"
            time.sleep(0.1)
        check_pid, check_group = json.loads(marker.read_text())
        assert check_group != parent.pid  # the recipe's own group, not the run's
        os.killpg(parent.pid, signal.SIGKILL)  # what cannot be caught or passed on
        parent.wait(timeout=STOPPED_WITHIN_S)
        deadline = time.monotonic() + STOPPED_WITHIN_S
        while _alive(check_pid):
            assert time.monotonic() < deadline, "the recipe's ship check outlived its run"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
        if marker.exists() and marker.read_text():
            pid, group = json.loads(marker.read_text())
            if _alive(pid):
                os.killpg(group, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
