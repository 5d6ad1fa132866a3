"""The gate on real stock wheels from PyPI, on CPU: the evidence that keeps it honest.

torch_xla 2.9.0 writes its persistent cache but cannot load it (DeserializeExecutable is
UNIMPLEMENTED on the CPU client): the restart check must fail naming the deserialize
failures. torch_xla 2.7.0 predates the OpenXLA API change and loads its cache: the
restart check must pass. Neither has the 0002 binding, so the HBM check fails on both,
as its own verdict. Each gate runs once per pytest run (``gate_29``, ``gate_27``:
tests/conftest.py, shared with test_gate_cache_checks.py and test_gate_canary.py); the
tests read their reports.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

# --- stock torch_xla 2.9.0: the defect ------------------------------------------------


def test_make_gate_without_arguments_judges_stock_2_9_0(gate_29, stock_xla_python_29):
    target = gate_29.report["target"]
    assert target["torch_xla_version"] == "2.9.0"
    assert target["device"] == "CPU"
    assert Path(target["python"]) == stock_xla_python_29


def test_stock_2_9_0_fails_the_gate_with_exit_1(gate_29):
    assert gate_29.exit_code == 1, gate_29.stderr
    assert "gate verdict: FAIL" in gate_29.stdout
    assert "Traceback" not in gate_29.stderr


def test_stock_2_9_0_restart_verdict_names_the_deserialize_failures(gate_29):
    restart = gate_29.check("restart")
    assert not restart["passed"]
    reasons = "\n".join(restart["reasons"])
    assert "warm-1: " in reasons and "deserialize failure(s)" in reasons
    assert "UNIMPLEMENTED" in reasons
    warm = [run for run in restart["runs"] if run["name"].startswith("warm-")]
    assert len(warm) == 2
    assert all(run["deserialize_failures"] > 0 for run in warm)
    assert all(run["hits"] == 0 for run in warm)
    # Every warm start recompiled everything the cold start compiled.
    assert all(run["xla_compiles"] == restart["figures"]["cold_xla_compiles"] for run in warm)


def test_stock_2_9_0_wrote_cache_files_that_prove_nothing(gate_29):
    figures = gate_29.check("restart")["figures"]
    assert figures["cache_files"] >= 1
    assert figures["cold_misses"] >= 1


def test_stock_2_9_0_hbm_verdict_stands_on_its_own_and_names_patch_0002(gate_29):
    hbm = gate_29.check("hbm")
    assert not hbm["passed"]
    assert hbm["reasons"] == [
        "torch_xla._XLAC._xla_runtime_memory_info is missing: this build lacks "
        "patches/torch_xla/0002-runtime-memory-info-binding.patch"
    ]
    assert hbm["figures"]["runtime_devices"] == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    # What users have without the patch: the virtual device is all SPMD offers.
    assert "SPMD virtual device" in hbm["figures"]["stock_memory_info_under_spmd"]
    # The SPMD restart check's cold run made the queries: no HBM child of its own.
    assert [run["same_run_as"] for run in hbm["runs"]] == ["spmd-restart: cold-1"]
    assert not (gate_29.out_dir / "runs" / "hbm").exists()


def test_stock_2_9_0_junit_reports_each_failed_check_of_the_report(gate_29):
    # The two failures stock 2.9.0 is known for (its cache never loads on a restart, plain
    # or SPMD) and the four checks that cannot pass without a loaded cache.
    suite = ET.parse(gate_29.out_dir / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    failed = {name for name, case in cases.items() if case.find("failure") is not None}
    assert failed == {"restart", "spmd-restart", "cache-key", "same-numbers", "key-probe", "hbm"}
    verdicts = {check["name"]: check["passed"] for check in gate_29.report["checks"]}
    assert failed == {name for name, passed in verdicts.items() if not passed}


def test_stock_2_9_0_spmd_warm_restart_fails_on_deserialize_failures_not_a_hang(gate_29):
    check = gate_29.check("spmd-restart")
    assert not check["passed"]
    assert "hung" not in check["figures"]
    warm = [run for run in check["runs"] if run["name"].startswith("warm-")]
    assert warm and all(run["deserialize_failures"] > 0 and run["hits"] == 0 for run in warm)


def test_stock_2_9_0_cannot_prove_key_safety_or_same_numbers(gate_29):
    # Its cache never loads, so "must hit" variants fail and nothing loaded is compared.
    key = gate_29.check("cache-key")
    assert any(r.startswith("warm-same (nothing changed): must hit") for r in key["reasons"])
    numbers = gate_29.check("same-numbers")
    assert any("no warm run loaded" in r for r in numbers["reasons"])


def test_the_gate_leaves_no_temporary_directory_behind(gate_29):
    tmpdir = gate_29.out_dir.parent / "tmp"
    assert list(tmpdir.iterdir()) == []


# --- stock torch_xla 2.7.0: the working control -----------------------------------------


def test_stock_2_7_0_passes_the_restart_check(gate_27):
    check = gate_27.check("restart")
    assert check["passed"], gate_27.stdout + gate_27.stderr
    assert gate_27.report["target"]["torch_xla_version"] == "2.7.0"
    assert "[PASS] restart" in gate_27.stdout
    # The whole gate fails on 2.7.0 (its SPMD warm restart hangs, it lacks the 0002
    # binding): exit 1, never 2. Exit 0 of a passing gate: test_gate_cache_checks.py's
    # thunk-runtime-off control.
    assert gate_27.exit_code == 1


def test_stock_2_7_0_warm_runs_load_every_executable_without_compiling(gate_27):
    restart = gate_27.check("restart")
    cold_misses = restart["figures"]["cold_misses"]
    assert cold_misses >= 1
    loaders = [run for run in restart["runs"] if not run["name"].startswith("cold-")]
    assert [run["name"] for run in loaders] == ["warm-1", "warm-2", "warm-3", "read-only"]
    for run in loaders:
        assert run["hits"] == cold_misses, run
        assert run["deserialize_failures"] == 0, run
        assert run["xla_compiles"] == 0, run


def test_stock_2_7_0_warm_restart_is_within_the_ratio(gate_27):
    # The judged ratio is of the first sync's CPU time (restart.py): the wall ratio varies
    # with the load.
    figures = gate_27.check("restart")["figures"]
    assert figures["warm_cold_sync_cpu_ratio"] <= figures["max_warm_ratio"]
    assert figures["warm_sync_cpu_s"] < figures["cold_sync_cpu_s"]


def test_stock_2_7_0_read_only_reader_leaves_the_cache_untouched(gate_27):
    assert gate_27.check("restart")["figures"]["read_only_changes"] == 0
