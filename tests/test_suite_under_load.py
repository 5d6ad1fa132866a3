"""The suite holds on a busy machine: no test may fail because the machine is slow.

A test asserts behaviour (what was asked, in which order, how often, what the product
said it waited for); speed is measured by the benchmarks (``make bench-*``, the farm's),
never by a test. The guard: a handful of ``make test-fast``'s command-line tests, those
that stood on a wall-clock bound until it became a count or a message, run in a pytest of
their own beside a busy process on every core (started and killed here), and pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT
from xla_host.gate.children import cpu_seconds

#: Tests of the fast tier whose wall-clock bounds became checks of what they stood for:
#: refused before the mirror was asked, the timeout the product named, the connections a
#: server counted, how a stopped process ended.
UNDER_LOAD = (
    "tests/test_validation_before_fetch.py::test_a_bad_patch_header",
    "tests/test_validation_before_fetch.py::test_an_empty_remote",
    "tests/test_validation_before_fetch.py::test_a_commit_the_mirror_does_not_have",
    "tests/test_read_url.py::test_a_server_that_never_answers_is_a_transient_timeout",
    "tests/test_runner.py::test_stop_ends_a_process_and_kills_one_that_ignores_sigterm",
    "tests/test_slice.py::test_a_coordinator_that_never_comes_up_is_named_after_the_slice_timeout",
    "tests/test_gate_children.py::test_checks_side_by_side_stop_every_child_when_one_fails",
)
#: The tests UNDER_LOAD selects (test_a_bad_patch_header and
#: test_a_commit_the_mirror_does_not_have run for two stages each).
SELECTED = len(UNDER_LOAD) + 2


@contextmanager
def busy_cores() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A process spinning on every core this test may use, killed (by its pid) at the end."""
    cores = len(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def _inner_env() -> dict[str, str]:
    # A pytest run of its own: none of this run's xdist worker or run identity.
    return {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}


@pytest.mark.slow
def test_cli_tier_tests_pass_beside_a_busy_process_on_every_core(tmp_path: Path) -> None:
    with busy_cores() as hogs:
        inner = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
             "-m", "not slow and not stock_xla", f"--basetemp={tmp_path / 'inner'}",
             *UNDER_LOAD],
            cwd=REPO_ROOT, env=_inner_env(), capture_output=True, text=True, timeout=3600,
            check=False,
        )  # fmt: skip
        # The load held for the whole run: every hog still spinning, and each has used CPU.
        running = [hog.poll() is None for hog in hogs]
        used = [cpu_seconds(hog.pid) or 0.0 for hog in hogs]
    output = inner.stdout + inner.stderr
    assert inner.returncode == 0, output[-6000:]
    assert re.search(rf"\b{SELECTED} passed\b", inner.stdout), output[-6000:]
    assert all(running) and all(seconds > 0 for seconds in used), (running, used)
