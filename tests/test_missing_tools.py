"""In CI (``CI=true``) a test that skips for a missing tool fails; one that skips for
something that cannot exist on these machines (a docker daemon) still skips, saying so.

Each case runs pytest itself on a small test file, with the suite's own hook
(``tests/conftest.py``) loaded as a plugin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.gitrepos import REPO_ROOT

CASES = """
from tests.missing_tools import skip_impossible, skip_missing, skipif_missing


def test_needs_a_tool_this_machine_lacks():
    skip_missing("frobnicate is not installed (apt-get install frobnicate)")


@skipif_missing("frobnicate is not installed")
def test_marked_as_needing_it():
    pass


@skipif_missing(None)
def test_marked_with_nothing_missing():
    pass


def test_needs_a_daemon_these_machines_cannot_run():
    skip_impossible("a docker daemon", "docker info failed")
"""


def _pytest(tmp_path: Path, ci: str | None) -> dict[str, tuple[str, str]]:
    """Each test's outcome and message in a run of CASES, with CI set to ``ci`` (None:
    unset), read from pytest's JUnit XML."""
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    junit = tmp_path / "junit.xml"
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-n", "0", "-q", "--rootdir", str(tmp_path), "-c", os.devnull,
         f"--junitxml={junit}", str(tmp_path / "test_cases.py")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert junit.is_file(), process.stdout + process.stderr
    outcomes = {}
    for case in ElementTree.parse(junit).iter("testcase"):
        found = [child for child in case if child.tag in ("failure", "skipped", "error")]
        # A skipif mark fails in setup, which JUnit calls an error: failed all the same.
        outcome = (
            {"failure": "failed", "error": "failed"}.get(found[0].tag, found[0].tag)
            if found
            else "passed"
        )
        outcomes[case.attrib["name"]] = (outcome, found[0].get("message", "") if found else "")
    assert len(outcomes) == 4, process.stdout + process.stderr
    return outcomes


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_outside_ci_a_missing_tool_skips(tmp_path: Path, ci: str | None) -> None:
    outcomes = {name: outcome for name, (outcome, _) in _pytest(tmp_path, ci).items()}
    assert outcomes == {
        "test_needs_a_tool_this_machine_lacks": "skipped",
        "test_marked_as_needing_it": "skipped",
        "test_marked_with_nothing_missing": "passed",
        "test_needs_a_daemon_these_machines_cannot_run": "skipped",
    }


def test_in_ci_a_missing_tool_fails_and_an_impossible_one_still_skips(tmp_path: Path) -> None:
    outcomes = _pytest(tmp_path, "true")
    assert {name: outcome for name, (outcome, _) in outcomes.items()} == {
        "test_needs_a_tool_this_machine_lacks": "failed",
        "test_marked_as_needing_it": "failed",
        "test_marked_with_nothing_missing": "passed",
        "test_needs_a_daemon_these_machines_cannot_run": "skipped",
    }
    # The failure names the tool; the skip says why it cannot be had here.
    assert (
        "frobnicate is not installed (apt-get install frobnicate)"
        in (outcomes["test_needs_a_tool_this_machine_lacks"][1])
    )
    assert outcomes["test_needs_a_daemon_these_machines_cannot_run"][1] == (
        "a docker daemon cannot exist on these machines: docker info failed"
    )
