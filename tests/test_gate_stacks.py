"""Native stacks of a live process, taken with the real gdb (the hang report's evidence)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.missing_tools import skipif_missing
from xla_host.gate.stacks import capture_native_stacks, summarize_stacks


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


@skipif_missing("gdb is not installed" if shutil.which("gdb") is None else None)
def test_stacks_of_every_thread_are_taken_and_the_process_keeps_running(sleeper, tmp_path: Path):
    capture = capture_native_stacks(sleeper.pid, tmp_path / "stacks.txt", timeout_s=120)
    assert capture.error is None, capture.error
    assert capture.path is not None
    text = capture.path.read_text()
    assert summarize_stacks(text)["threads"] >= 1
    assert "#0 " in text  # native frames, not a Python traceback
    assert sleeper.poll() is None  # gdb detached; the gate kills it afterwards, not gdb


def test_without_gdb_the_capture_says_so(sleeper, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    capture = capture_native_stacks(sleeper.pid, tmp_path / "stacks.txt")
    assert capture.path is None
    assert capture.error is not None and capture.error.startswith("gdb is not installed")
