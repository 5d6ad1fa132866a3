"""The gate's verdict rules, on child reports written the way child_workload.py writes them.

These exercise the judging functions alone (fast); the same rules are exercised on real
torch_xla 2.7.0 / 2.9.0 runs in test_gate_stock.py.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from xla_host.gate import hbm, restart, workload
from xla_host.gate.children import ChildResult
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.report import render_junit, render_text, write_reports
from xla_host.gate.result import CheckResult
from xla_host.gate.run import CHECKS, GateConfig, side_by_side
from xla_host.gate.target import Target
from xla_host.slice import WRITER_LEASE, claim_writer

CPU_TARGET = Target(Path("/env/bin/python"), "CPU", "2.7.0", "2.7.0", ("CPU:0",), False, None)
TPU_TARGET = Target(Path("/env/bin/python"), "TPU", "2.9.0", "2.9.0", ("TPU:0",), True, 6)
GIB = 1024**3


def child_row(
    tmp_path: Path,
    name: str,
    *,
    misses: int = 0,
    hits: int = 0,
    failures: int = 0,
    compiles: int = 0,
    ready: float = 1.0,
    sync_cpu: float | None = None,
    log_text: str = "",
    ok: bool = True,
    outcomes: dict[str, int] | None = None,
) -> dict[str, Any]:
    log_path = tmp_path / f"{name}.log"
    log_path.write_text(log_text)
    report: dict[str, Any] = {
        "ok": ok,
        "import_s": 5.0,
        "ready_s": ready,
        "ready_cpu_s": ready,
        # The first sync (hash, lookup, compile or load): its CPU time is the timing rule's;
        # by default the whole of ready_s.
        "first_step": {
            "setup_s": 0.0,
            "trace_s": 0.0,
            "sync_s": ready,
            "execute_s": 0.0,
            "sync_cpu_s": ready if sync_cpu is None else sync_cpu,
        },
        "time_to_first_step_s": 5.0 + ready,
        "steady_step_s": 0.1,
        "xla_compiles": compiles,
        "counters": {
            "PersistentCacheMiss": misses,
            "PersistentCacheHit": hits,
            "PersistentCacheDeserializeFailure": failures,
            **(outcomes or {}),
        },
    }
    if not ok:
        report = {"ok": False, "error": "RuntimeError: boom"}
    result = ChildResult(name, 0 if ok else 3, 1.0, report, log_path)
    return restart.summarize(result)


def judge(tmp_path: Path, cold: list, warm: list, reader: Any = None, **kwargs: Any) -> CheckResult:
    config = restart.RestartConfig(**kwargs.pop("config", {}))
    return restart.judge_restart(
        cold,
        warm,
        reader,
        kwargs.pop("after_cold", {"abc123": (100, 1)}),
        kwargs.pop("changes", []),
        config,
        kwargs.pop("baseline", None),
    )


def working_cache(tmp_path: Path, warm_ready: float = 0.2) -> tuple[list, list, dict]:
    cold = [child_row(tmp_path, "cold-1", misses=2, compiles=2, ready=1.0)]
    warm = [child_row(tmp_path, f"warm-{i}", hits=2, ready=warm_ready) for i in (1, 2)]
    reader = child_row(tmp_path, "read-only", hits=2, ready=warm_ready)
    return cold, warm, reader


def test_a_cache_that_loads_everything_fast_passes(tmp_path):
    cold, warm, reader = working_cache(tmp_path)
    result = judge(tmp_path, cold, warm, reader)
    assert result.passed, result.reasons
    assert result.figures["warm_cold_ratio"] == pytest.approx(0.2)
    assert result.figures["cold_misses"] == 2


def test_deserialize_failures_are_named_with_the_log_evidence(tmp_path):
    cold = [child_row(tmp_path, "cold-1", misses=2, compiles=2)]
    log_text = "W0000 deserialize executable: UNIMPLEMENTED: Deserializing not supported.\n"
    warm = [
        child_row(tmp_path, f"warm-{i}", failures=2, compiles=2, ready=0.9, log_text=log_text)
        for i in (1, 2)
    ]
    result = judge(tmp_path, cold, warm)
    assert not result.passed
    text = "\n".join(result.reasons)
    assert "warm-1: 2 deserialize failure(s)" in text
    assert "UNIMPLEMENTED" in text
    assert "loaded 0 of 2 cached executable(s)" in text
    assert "2 XLA compile(s) on a warm start" in text


def test_a_corrupt_entry_on_a_warm_run_fails(tmp_path):
    cold = [child_row(tmp_path, "cold-1", misses=2, compiles=2)]
    corrupt = {"PersistentCacheCorrupt": 1}
    warm = [child_row(tmp_path, f"warm-{i}", hits=2, ready=0.2, outcomes=corrupt) for i in (1, 2)]
    result = judge(tmp_path, cold, warm)
    assert any("warm-1: 1 corrupt cache entr(ies)" in r for r in result.reasons), result.reasons


def test_an_empty_cache_directory_after_the_cold_run_fails(tmp_path):
    cold, warm, reader = working_cache(tmp_path)
    result = judge(tmp_path, cold, warm, reader, after_cold={})
    assert not result.passed
    assert any("wrote no cache entry" in r for r in result.reasons)


def test_partial_loading_fails_even_without_deserialize_failures(tmp_path):
    cold = [child_row(tmp_path, "cold-1", misses=2, compiles=2)]
    warm = [child_row(tmp_path, f"warm-{i}", hits=1, compiles=1, ready=0.2) for i in (1, 2)]
    result = judge(tmp_path, cold, warm)
    assert any("loaded 1 of 2" in r for r in result.reasons)


# The restart verdict as a table: the counters carry the claim (every executable loaded,
# nothing compiled); time is only a sanity bound on the CPU seconds of the first sync,
# which a busy machine does not inflate the way it stretches wall time. Cold: 2 misses,
# 2 compiles, 1.0 s wall to its first step and 1.0 s CPU in its first sync.
RESTART_RULES = [
    # (case, warm hits, warm compiles, warm wall s, warm sync CPU s, a reason to contain)
    ("loaded everything, quick on both clocks", 2, 0, 0.2, 0.2, None),
    # The SPMD control once measured 0.75 of cold on a loaded machine with full reuse.
    ("loaded everything, poor wall ratio under load", 2, 0, 0.9, 0.2, None),
    ("loaded everything, wall slower than cold", 2, 0, 1.5, 0.3, None),
    ("compiled once on a warm start", 2, 1, 0.2, 0.2, "warm-1: 1 XLA compile(s) on a warm start"),
    ("loaded half", 1, 1, 0.2, 0.2, "warm-1: loaded 1 of 2 cached executable(s)"),
    ("no hit, quick anyway", 0, 0, 0.2, 0.2, "warm-1: loaded 0 of 2 cached executable(s)"),
    ("counters fine, sync as costly as cold", 2, 0, 0.2, 0.8, "0.80 of the cold run's 1.00s"),
]


@pytest.mark.parametrize(
    ("hits", "compiles", "wall", "cpu", "reason"),
    [case[1:] for case in RESTART_RULES],
    ids=[case[0] for case in RESTART_RULES],
)
def test_restart_verdict_rules(tmp_path, hits, compiles, wall, cpu, reason):
    cold = [child_row(tmp_path, "cold-1", misses=2, compiles=2, ready=1.0, sync_cpu=1.0)]
    warm = [
        child_row(tmp_path, f"warm-{i}", hits=hits, compiles=compiles, ready=wall, sync_cpu=cpu)
        for i in (1, 2)
    ]
    result = judge(tmp_path, cold, warm, config={"max_warm_ratio": 0.5})
    if reason is None:
        assert result.passed, result.reasons
    else:
        assert not result.passed
        assert any(reason in r for r in result.reasons), result.reasons
    assert result.figures["warm_cold_ratio"] == pytest.approx(wall)
    assert result.figures["warm_cold_sync_cpu_ratio"] == pytest.approx(cpu)


def test_a_warm_sync_that_costs_too_much_cpu_fails_naming_the_figures(tmp_path):
    cold, warm, reader = working_cache(tmp_path, warm_ready=0.8)
    result = judge(tmp_path, cold, warm, reader, config={"max_warm_ratio": 0.5})
    assert not result.passed
    assert result.reasons == [
        "warm-up syncs used 0.80s of CPU, 0.80 of the cold run's 1.00s (limit 0.50): "
        "the warm start still did most of the work a cache saves"
    ]


def test_a_child_without_the_first_sync_cpu_time_fails_rather_than_skipping_the_rule(
    tmp_path,
):
    cold, warm, reader = working_cache(tmp_path)
    del warm[1]["sync_cpu_s"]
    result = judge(tmp_path, cold, warm, reader)
    assert result.reasons == ["warm-2: no CPU time of the warm-up syncs (sync_cpu_s) reported"]


def test_a_warm_restart_slower_than_the_baseline_beyond_tolerance_fails(tmp_path):
    cold, warm, reader = working_cache(tmp_path, warm_ready=0.2)
    result = judge(
        tmp_path, cold, warm, reader, baseline={"warm_ready_s": 0.1},
        config={"baseline_tolerance": 0.5},
    )  # fmt: skip
    assert not result.passed
    assert "slower than the baseline 0.10s beyond 50%" in result.reasons[0]
    within = judge(tmp_path, cold, warm, reader, baseline={"warm_ready_s": 0.15})
    assert within.passed, within.reasons


def test_a_read_only_reader_that_touches_the_cache_fails(tmp_path):
    cold, warm, reader = working_cache(tmp_path)
    result = judge(tmp_path, cold, warm, reader, changes=["removed abc123", "added abc123.tmp"])
    assert not result.passed
    assert result.reasons == [
        "read-only changed the cache directory: removed abc123, added abc123.tmp"
    ]


def test_a_cold_child_that_died_is_the_verdict_not_a_traceback(tmp_path):
    cold = [child_row(tmp_path, "cold-1", ok=False)]
    result = judge(tmp_path, cold, [])
    assert not result.passed
    assert result.reasons == ["cold-1 did not finish: cold-1: RuntimeError: boom"]


def test_snapshot_diff_sees_added_removed_and_rewritten_files(tmp_path):
    (tmp_path / "a").write_bytes(b"1")
    (tmp_path / "b").write_bytes(b"2")
    before = restart.snapshot(tmp_path)
    (tmp_path / "a").unlink()
    (tmp_path / "b").write_bytes(b"22")
    (tmp_path / "c").write_bytes(b"3")
    assert restart.diff_snapshots(before, restart.snapshot(tmp_path)) == [
        "added c",
        "removed a",
        "modified b",
    ]


def test_the_writer_lease_its_refresh_and_a_stale_one_moved_aside_are_not_the_cache(tmp_path):
    # A slice's writer refreshes its lease by write-by-rename while another worker's
    # read-only run snapshots the directory: the refresh's temporary once failed that
    # run ("read-only changed the cache directory: added ..xla-wheels-writer.lease.2xnef").
    lease = claim_writer(tmp_path, "job-1")
    (tmp_path / "entry").write_bytes(b"executable")
    before = restart.snapshot(tmp_path)
    refreshing = tmp_path / f".{WRITER_LEASE}.2xnefsnc"  # filemode.write_by_rename's name
    refreshing.write_text("{}")
    (tmp_path / f"{WRITER_LEASE}.stale-otherhost-7").write_text("{}")
    lease.refresh()
    assert restart.diff_snapshots(before, restart.snapshot(tmp_path)) == []
    (tmp_path / ".entry.tmp").write_bytes(b"x")  # anything else is still seen
    assert restart.diff_snapshots(before, restart.snapshot(tmp_path)) == ["added .entry.tmp"]


def test_a_malformed_baseline_is_an_environment_error(tmp_path):
    path = tmp_path / "b.json"
    path.write_text('{"warm_ready_s": "fast"}')
    with pytest.raises(GateEnvironmentError) as caught:
        restart.load_baseline(path)
    assert caught.value.exit_code == 2
    assert restart.load_baseline(tmp_path / "missing.json") is None


def test_baselines_are_keyed_by_build_device_and_workload(tmp_path):
    target = Target(Path("p"), "TPU", "2.9.0", "2.9.0+gitc04e61c", (), True, 6)
    path = restart.baseline_path(tmp_path, target, "large")
    assert path.name == "2.9.0+gitc04e61c__TPU__large.json"


def test_a_failing_run_is_never_recorded_as_baseline(tmp_path):
    failing = CheckResult("restart", False, ["warm-1: 2 deserialize failure(s)"])
    with pytest.raises(GateEnvironmentError, match="not recording a baseline"):
        restart._record_baseline(tmp_path / "b.json", CPU_TARGET, restart.RestartConfig(), failing)
    assert not (tmp_path / "b.json").exists()


# --- HBM ------------------------------------------------------------------------------

CPU4 = ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
ALLOCATOR_ERROR = "RuntimeError: GetAllocatorStats is not supported: no allocator statistics"


def hbm_report(**fields: Any) -> dict[str, Any]:
    return {"ok": True, "runtime_devices": CPU4, "has_binding": True, **fields}


def test_a_build_without_the_binding_fails_naming_patch_0002():
    result = hbm.judge_hbm(hbm_report(has_binding=False), None, CPU_TARGET)
    assert not result.passed
    assert "0002-runtime-memory-info-binding.patch" in result.reasons[0]


def test_on_cpu_the_allocator_statistics_error_proves_the_routing():
    report = hbm_report(
        before={d: {"ok": False, "error": ALLOCATOR_ERROR} for d in CPU4},
        unknown_device={"ok": False, "error": f"unknown device CPU:101; valid: {', '.join(CPU4)}"},
    )
    result = hbm.judge_hbm(report, None, CPU_TARGET)
    assert result.passed, result.reasons


def test_on_cpu_an_spmd_virtual_device_error_means_the_string_was_not_routed():
    spmd_error = "RuntimeError: MemoryInfo not supported for SPMD virtual device. GetAllocatorStats"
    report = hbm_report(
        before={d: {"ok": False, "error": spmd_error} for d in CPU4},
        unknown_device={"ok": False, "error": "valid devices: CPU:0"},
    )
    result = hbm.judge_hbm(report, None, CPU_TARGET)
    assert not result.passed
    assert len(result.reasons) == 4


def test_an_unknown_device_must_be_refused_with_the_valid_ones_listed():
    report = hbm_report(
        before={d: {"ok": False, "error": ALLOCATOR_ERROR} for d in CPU4},
        unknown_device={"ok": False, "error": "bad device"},
    )
    result = hbm.judge_hbm(report, None, CPU_TARGET)
    assert result.reasons == [
        "the error for an unknown device does not list the valid devices: bad device"
    ]


def _tpu_info(used: int, limit: int = 31 * GIB) -> dict[str, Any]:
    return {"ok": True, "info": {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": used}}


def test_on_v6e_plausible_limits_and_tracked_usage_pass():
    probe = 256 * 1024**2
    report = hbm_report(
        runtime_devices=["TPU:0", "TPU:1"],
        before={d: _tpu_info(GIB) for d in ("TPU:0", "TPU:1")},
        after={d: _tpu_info(GIB + probe) for d in ("TPU:0", "TPU:1")},
        probe_bytes=probe,
        unknown_device={"ok": False, "error": "valid: TPU:0, TPU:1"},
    )
    assert hbm.judge_hbm(report, None, TPU_TARGET).passed


def test_on_v6e_an_implausible_limit_or_unchanged_usage_fails():
    probe = 256 * 1024**2
    report = hbm_report(
        runtime_devices=["TPU:0"],
        before={"TPU:0": _tpu_info(GIB, limit=95 * GIB)},
        after={"TPU:0": _tpu_info(GIB, limit=95 * GIB)},
        probe_bytes=probe,
        unknown_device={"ok": False, "error": "valid: TPU:0"},
    )
    reasons = hbm.judge_hbm(report, None, TPU_TARGET).reasons
    assert "implausible for this chip (expected 16-32 GiB)" in reasons[0]
    assert "bytes_used rose by 0 bytes" in reasons[1]


def _spmd_restart(cold: dict[str, Any]) -> CheckResult:
    warm = {"name": "warm-1", "ok": True, "wall_s": 1.0}
    return CheckResult("spmd-restart", True, [], [], runs=[cold, warm])


def test_the_spmd_cold_runs_queries_serve_the_hbm_check_without_a_child_of_its_own():
    queries = hbm_report(
        before={d: {"ok": False, "error": ALLOCATOR_ERROR} for d in CPU4},
        unknown_device={"ok": False, "error": f"unknown device CPU:101; valid: {', '.join(CPU4)}"},
    )
    cold = {"name": "cold-1", "ok": True, "wall_s": 9.0, "hbm": queries}
    result = hbm.judge_shared_run(_spmd_restart(cold), CPU_TARGET)
    assert result.passed, result.reasons
    # The evidence names the run that made the queries; its data stays in that check's row.
    assert result.runs == [
        {"name": "cold-1", "ok": True, "wall_s": 9.0, "same_run_as": "spmd-restart: cold-1"}
    ]


@pytest.mark.parametrize(
    ("cold", "reason"),
    [
        (
            {"name": "cold-1", "ok": False, "error": "cold-1: exited 3"},
            "the SPMD cold run that makes the queries did not finish: cold-1: exited 3",
        ),
        (
            {"name": "cold-1", "ok": True, "hbm": {"ok": False, "error": "RuntimeError: no"}},
            "the HBM queries did not finish: RuntimeError: no",
        ),
    ],
)
def test_the_hbm_check_fails_when_the_shared_cold_run_made_no_queries(cold, reason):
    result = hbm.judge_shared_run(_spmd_restart(cold), CPU_TARGET)
    assert not result.passed
    assert result.reasons == [reason]


# --- reports --------------------------------------------------------------------------


def test_reports_carry_each_verdict_separately(tmp_path):
    results = [
        CheckResult("restart", False, ["warm-1: 2 deserialize failure(s)"]),
        CheckResult("hbm", True, [], ["4 device(s) routed"]),
    ]
    json_path, junit_path = write_reports(tmp_path, CPU_TARGET, results)
    payload = json.loads(json_path.read_text())
    assert payload["status"] == "fail"
    assert payload["exit_code"] == 1
    assert [c["passed"] for c in payload["checks"]] == [False, True]
    suite = ET.parse(junit_path).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["restart"].find("failure") is not None
    assert cases["hbm"].find("failure") is None
    assert "FAIL] restart" in render_text(CPU_TARGET, results)


def test_an_unusable_environment_is_reported_as_an_error_not_a_failure(tmp_path):
    json_path, _ = write_reports(tmp_path, None, [], error="torch_xla does not import")
    assert json.loads(json_path.read_text())["exit_code"] == 2
    junit = ET.fromstring(render_junit(None, [], "torch_xla does not import"))
    assert junit.find("testsuite/testcase/error") is not None


# --- which checks run side by side (gate/run.py side_by_side) ------------------------------


def _side_by_side_for(config: GateConfig, target: Target) -> bool:
    return side_by_side(config, target)


def _gate_args(tmp_path: Path, **given: Any) -> GateConfig:
    """A gate run's configuration: every check, on the stock environment."""
    settings: dict[str, Any] = {
        "python": tmp_path / "python",
        "device": None,
        "checks": CHECKS,
        "workload": workload.preset("small"),
        "child_timeout_s": 600.0,
        "warm_runs": 2,
        "max_warm_ratio": 0.5,
        "baseline_tolerance": 0.5,
        "baselines_dir": tmp_path / "baselines",
        "record_baseline": False,
        "spmd": False,
        "writers": 1,
        "xla_cache_dir": None,
        "keep_cache": False,
        "upstream_tests": None,
        "upstream_tests_revision": None,
        "out_dir": tmp_path / "out",
        "profile": None,
        "settings": {},
    }
    return GateConfig(**{**settings, **given})


def test_on_cpu_the_checks_run_side_by_side_for(tmp_path):
    assert _side_by_side_for(_gate_args(tmp_path), CPU_TARGET)


@pytest.mark.parametrize(
    "given, why",
    [
        ({"record_baseline": True}, "a recorded baseline is a wall time"),
        ({"xla_cache_dir": Path("/c")}, "one cache directory holds both restart variants"),
    ],
)
def test_checks_run_one_after_the_other_when(tmp_path, given, why):
    assert not _side_by_side_for(_gate_args(tmp_path, **given), CPU_TARGET), why


def test_checks_run_one_after_the_other_on_a_tpu_and_against_a_baseline(tmp_path):
    assert not _side_by_side_for(_gate_args(tmp_path), TPU_TARGET)
    args = _gate_args(tmp_path)
    baseline = restart.baseline_path(args.baselines_dir, CPU_TARGET, "small")
    baseline.parent.mkdir(parents=True)
    baseline.write_text("{}")
    assert not _side_by_side_for(args, CPU_TARGET)
    # Without the restart check no wall time is judged: side by side again.
    assert _side_by_side_for(_gate_args(tmp_path, checks=("spmd-restart", "hbm")), CPU_TARGET)


def test_a_hung_spmd_loader_on_cpu_names_the_known_xla_cpu_hang_and_the_flag():
    spmd = restart.spmd_config(restart.RestartConfig())
    hung = [{"name": "cold-1", "ok": True}, {"name": "warm-1", "ok": False, "timed_out": True}]
    hint = restart.collective_hang_hint(CPU_TARGET, spmd, hung, "")
    assert hint is not None and "XLA_FLAGS=--xla_cpu_use_thunk_runtime=false" in hint
    assert "torch_xla 2.7.0" in hint
    # Not when it did not hang, not off SPMD, not on TPU, not with the flag already set.
    assert restart.collective_hang_hint(CPU_TARGET, spmd, hung[:1], "") is None
    assert restart.collective_hang_hint(CPU_TARGET, restart.RestartConfig(), hung, "") is None
    assert restart.collective_hang_hint(TPU_TARGET, spmd, hung, "") is None
    flags = "--xla_cpu_use_thunk_runtime=false"
    assert restart.collective_hang_hint(CPU_TARGET, spmd, hung, flags) is None
