"""Which worker a test runs on under ``--dist loadgroup`` (tests/conftest.py): what is made
once (a gate run shared by the whole pytest run, a module's fixtures) is made on one worker,
never once on each."""

from __future__ import annotations

import subprocess
import sys

from tests.gitrepos import REPO_ROOT


def _groups(*modules: str) -> dict[str, str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "tests.worker_groups_report", *modules],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = [line.split(" ", 2)[1:] for line in listed.splitlines() if line.startswith("GROUP ")]
    return {test.split("::")[1]: group for group, test in rows}


def test_a_module_whose_tests_read_a_gate_run_and_share_a_module_fixture_runs_whole_there():
    # test_gate_cache_checks: some tests read gate_27, some the module's own gate run
    # (gate_27_thunks_off), and one test reads both.
    groups = _groups("tests/test_gate_cache_checks.py")
    both = "test_a_receipt_names_the_launch_environment_it_was_judged_under"
    alone = "test_stock_2_7_0_without_the_thunk_runtime_passes_the_spmd_warm_restart"
    assert groups[both] == groups[alone] == "gate_27", groups


def test_the_two_gate_runs_stay_on_their_own_groups_and_free_tests_on_none():
    groups = _groups("tests/test_gate_stock.py", "tests/test_function_length.py")
    assert {group for test, group in groups.items() if "2_9_0" in test} == {"gate_29"}
    assert {group for test, group in groups.items() if "2_7_0" in test} == {"gate_27"}
    assert groups["test_the_rule_counts_lines_and_reads_the_reason"] == "-"
