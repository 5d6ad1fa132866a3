"""Bad conditions: each ends in a clear verdict (exit 1) or exit 2, never a traceback or a hang.

Real torch_xla 2.7.0 (whose cache works) is the subject wherever the cache must work for
the condition to mean anything: corrupting a file it wrote, two writers sharing a cache.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.gate_helpers import process_alive, run_gate_cli
from tests.waiting import STOPPED_WITHIN_S
from xla_host.gate import restart
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.target import Target, resolve_target, tpu_present


@pytest.fixture(scope="module")
def target_27(stock_xla_python_27: Path, tmp_path_factory: pytest.TempPathFactory) -> Target:
    return resolve_target(stock_xla_python_27, "CPU", workdir=tmp_path_factory.mktemp("probe"))


def _truncate(cache: Path) -> None:
    for entry in cache.iterdir():
        data = entry.read_bytes()
        entry.write_bytes(data[: len(data) // 2])


def _garbage(cache: Path) -> None:
    for entry in cache.iterdir():
        entry.write_bytes(b"\x00not an executable\xff" * 64)


@pytest.mark.parametrize("corrupt", [_truncate, _garbage], ids=["truncated", "garbage"])
def test_a_corrupted_cache_file_fails_the_first_warm_run_by_name(
    target_27: Target, tmp_path: Path, corrupt: Callable[[Path], None]
):
    config = restart.RestartConfig(read_only_check=False, after_cold=corrupt)
    result = restart.run_restart_check(target_27, config, tmp_path / "runs", tmp_path)
    assert not result.passed
    warm_1 = [r for r in result.reasons if r.startswith("warm-1:")]
    assert any("deserialize failure(s)" in r for r in warm_1), result.reasons
    assert any("XLA compile(s) on a warm start" in r for r in warm_1)
    # torch_xla replaced the bad file: the second warm run loads again. The gate still
    # fails, because a restart that recompiled is exactly what users must not get.
    warm_2 = next(run for run in result.runs if run["name"] == "warm-2")
    assert warm_2["hits"] == result.figures["cold_misses"]


def test_two_writers_on_one_cache_directory_still_give_a_loadable_cache(
    stock_xla_python_27: Path, tmp_path: Path
):
    cache = tmp_path / "shared-cache"
    bystander = tmp_path / "bystander.txt"
    bystander.write_text("not the gate's")
    (tmp_path / "tmp").mkdir()
    # About a loadable cache after two writers, not timing: the ratio gets a loose limit
    # (two concurrent cold compiles on 2 cores make the cold time itself noisy).
    run = run_gate_cli(
        "gate", "--python", str(stock_xla_python_27), "--checks", "restart",
        "--writers", "2", "--xla-cache-dir", str(cache), "--max-warm-ratio", "0.9",
        out_dir=tmp_path / "out", env={"TMPDIR": str(tmp_path / "tmp")},
    )  # fmt: skip
    restart_check = run.check("restart")
    assert [r["name"] for r in restart_check["runs"]][:2] == ["cold-1", "cold-2"]
    assert run.exit_code == 0, restart_check["reasons"]
    # A cache directory the user passed in is theirs: kept, with its entries.
    assert any(cache.iterdir())
    assert bystander.read_text() == "not the gate's"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_cache_directory_that_cannot_be_created_is_exit_2(stock_xla_python_27, tmp_path):
    # Tests run as root, for whom chmod does not deny writes; a path below a regular file
    # cannot be created by anyone (ENOTDIR), which is an honest unwritable directory.
    regular = tmp_path / "regular-file"
    regular.write_text("keep me")
    run = run_gate_cli(
        "gate", "--python", str(stock_xla_python_27), "--checks", "restart",
        "--xla-cache-dir", str(regular / "cache"), out_dir=tmp_path / "out",
    )  # fmt: skip
    assert run.exit_code == 2, run.stderr
    assert "is not writable" in run.stderr
    assert "Not a directory" in run.stderr
    assert "Traceback" not in run.stderr
    assert regular.read_text() == "keep me"


def test_a_python_without_torch_xla_is_exit_2(tmp_path):
    venv = tmp_path / "bare"
    import subprocess

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    run = run_gate_cli("gate", "--python", str(venv / "bin" / "python"), out_dir=tmp_path / "o")
    assert run.exit_code == 2
    assert "torch_xla does not import" in run.stderr
    assert "ModuleNotFoundError" in run.stderr
    assert "Traceback" not in run.stderr
    assert run.report["status"] == "error"


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_torch_xla_whose_import_raises_is_exit_2(stock_xla_python_29, tmp_path):
    fake = tmp_path / "shadow" / "torch_xla"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise ImportError("libtpu.so: cannot open shared object file (deliberately broken)")\n'
    )
    # A real torch, and a torch_xla that raises on import placed ahead of the real one.
    python = _script(
        tmp_path / "python",
        f'#!/bin/sh\nPYTHONPATH="{fake.parent}" exec "{stock_xla_python_29}" "$@"\n',
    )
    run = run_gate_cli("gate", "--python", str(python), out_dir=tmp_path / "o")
    assert run.exit_code == 2
    assert "torch_xla does not import" in run.stderr
    assert "deliberately broken" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_hanging_child_is_killed_with_its_process_group(target_27: Target, tmp_path: Path):
    pidfile = tmp_path / "grandchild.pid"
    # The training child hangs, leaving a grandchild behind that only a process-group kill
    # reaches. The target was probed once for the module: a probe under the hanging
    # interpreter would have to finish inside the same short timeout on a loaded machine.
    python = _script(
        tmp_path / "python",
        "#!/bin/sh\n"
        'case " $* " in *" --mode train "*)\n'
        f'  sleep 600 & echo $! > "{pidfile}"; sleep 600;;\n'
        "esac\n"
        f'exec "{target_27.python}" "$@"\n',
    )
    hanging = dataclasses.replace(target_27, python=python)
    config = restart.RestartConfig(child_timeout_s=5.0)
    result = restart.run_restart_check(hanging, config, tmp_path / "runs", tmp_path)
    assert not result.passed
    assert result.reasons == [
        "cold-1 did not finish: cold-1: timed out after 5s (process group killed)"
    ]
    # The group's signal reaches the grandchild at once, but it dies when next scheduled:
    # a loaded machine may take a moment. Without the group kill it would sleep on (600 s).
    grandchild, deadline = int(pidfile.read_text()), time.monotonic() + STOPPED_WITHIN_S
    while process_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(grandchild)


@pytest.mark.skipif(tpu_present(), reason="this host has TPU chips")
def test_asking_for_a_tpu_on_a_host_without_one_is_exit_2(stock_xla_python_29, tmp_path):
    run = run_gate_cli(
        "gate", "--python", str(stock_xla_python_29), "--device", "TPU", out_dir=tmp_path / "o"
    )
    assert run.exit_code == 2
    assert "GATE_DEVICE=TPU but this host has no TPU chips" in run.stderr
    assert "fix: run on a Cloud TPU VM, or use GATE_DEVICE=CPU" in run.stderr


@pytest.mark.skipif(tpu_present(), reason="this host has TPU chips")
def test_a_tpu_runtime_that_fails_to_start_is_an_environment_error_not_an_import_error(
    stock_xla_python_29, tmp_path, monkeypatch
):
    # Past the host check (as on a host with chips but a broken libtpu): the real probe
    # with PJRT_DEVICE=TPU imports torch_xla, then the runtime cannot start.
    monkeypatch.setattr("xla_host.gate.target.tpu_present", lambda: True)
    with pytest.raises(GateEnvironmentError) as caught:
        resolve_target(stock_xla_python_29, "TPU", workdir=tmp_path, timeout_s=300)
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith("device TPU is not available to torch_xla 2.9.0")
    assert "libtpu" in caught.value.message


def test_an_interpreter_that_does_not_exist_is_exit_2(tmp_path):
    run = run_gate_cli("gate", "--python", str(tmp_path / "nope"), out_dir=tmp_path / "o")
    assert run.exit_code == 2
    assert "is not an executable interpreter" in run.stderr


def test_an_unknown_check_is_a_usage_error(tmp_path):
    run = run_gate_cli("gate", "--python", os.devnull, "--checks", "restart,speed",
                       out_dir=tmp_path / "o")  # fmt: skip
    assert run.exit_code == 2
    assert "unknown check(s) speed" in run.stderr
