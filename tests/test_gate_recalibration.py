"""Recalibration: each gate run keeps memory and the restart's phases; promotion and
``compare`` use them.

The figures' arithmetic and the memory rule run first on reports and receipts shaped as the
gate writes them (fast); then the receipt of the stock torch_xla 2.7.0 gate on CPU made once
per pytest run (``gate_27``; its cache loads, so the executable-load floor is measured)
feeds the rule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.gate_helpers import GateRun
from xla_host import receipts
from xla_host.gate import child_workload, recalibration
from xla_wheels.release import compare, lanes, policy

MIB = 1024**2
NOT_ON_CPU = "RuntimeError: Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats is not supported"


def child_report(*, compile_s: float, load_s: float | None, rss_mib: int) -> dict[str, Any]:
    return {
        "ok": True,
        "import_s": 4.0,
        "compile_time_s": compile_s,
        "cache_load_time_s": load_s,
        # The sync: 0.05 s of hashing and lookup, plus the compile or the executable load.
        "first_step": {
            "setup_s": 0.1,
            "trace_s": 0.02,
            "sync_s": 0.05 + compile_s + (load_s or 0.0),
            "execute_s": 0.04,
        },
        "host_peak_rss_bytes": rss_mib * MIB,
        "device_memory": {"xla:0": {"not_reported": NOT_ON_CPU}},
    }


def row(name: str, report: dict[str, Any], ready_s: float) -> dict[str, Any]:
    """A run's row as restart.summarize builds it."""
    return {
        "name": name,
        "ok": True,
        "ready_s": ready_s,
        "breakdown": recalibration.run_breakdown(report),
        **recalibration.run_memory(report),
    }


COLD = child_report(compile_s=1.0, load_s=None, rss_mib=850)
WARM = child_report(compile_s=0.0, load_s=0.02, rss_mib=830)


# --- the figures ------------------------------------------------------------------------


def test_a_restart_is_broken_into_phases_that_add_up_to_its_first_step():
    phases = recalibration.run_breakdown(WARM)
    assert phases == pytest.approx(
        {"import": 4.0, "setup": 0.1, "trace": 0.02, "compile": 0.0,
         "executable_load": 0.02, "hash_and_lookup": 0.05, "execute": 0.04}
    )  # fmt: skip
    first = WARM["first_step"]
    step = first["setup_s"] + first["trace_s"] + first["sync_s"] + first["execute_s"]
    assert sum(v for k, v in phases.items() if k != "import" and v is not None) == pytest.approx(
        step
    )


def _step(graphs: int, compile_s: float, ended: float) -> dict[str, Any]:
    """One step's row as the training child records it (child_workload.mode_train)."""
    return {"trace_s": 0.01, "sync_s": 0.02 + compile_s, "sync_cpu_s": 0.01, "execute_s": 0.03,
            "ended": ended, "ended_cpu": ended / 2, "graphs": graphs, "compiles": graphs,
            "loads": 0, "compile_s": compile_s, "load_s": None}  # fmt: skip


def test_time_to_ready_ends_with_the_last_step_that_brought_a_graph_and_its_parts_add_up():
    # AdamW: step 1 compiles (1.0 s), step 2 compiles its second graph (0.5 s), step 3
    # is the steady state. Ready is the end of step 2, and covers both compiles.
    rows = [_step(1, 1.0, 11.2), _step(1, 0.5, 11.9), _step(0, 0.0, 12.0)]
    ready = child_workload.ready_figures(rows, 10.0, 1.0)
    assert (ready["steps"], ready["graphs"], ready["steady_state_step"]) == (2, 2, 3)
    assert ready["ready_s"] == pytest.approx(1.9)
    assert ready["compile_s"] == pytest.approx(1.5) and ready["load_s"] is None
    phases = recalibration.run_breakdown({"import_s": 4.0, "ready": ready})
    assert sum(v for k, v in phases.items() if k != "import" and v is not None) == pytest.approx(
        ready["ready_s"]
    )
    assert phases["compile"] <= ready["ready_s"] and phases["hash_and_lookup"] > 0
    # A run whose last step still brought a graph never reached the steady state.
    assert child_workload.ready_figures(rows[:2], 10.0, 1.0)["steady_state_step"] is None


def test_a_breakdown_that_does_not_add_up_shows_it_instead_of_a_clamped_zero():
    # A compile longer than the sync it belongs to is a measuring error: it must show.
    report = {"import_s": 4.0, "ready": {"setup_s": 0.1, "trace_s": 0.1, "sync_s": 0.5,
              "execute_s": 0.1, "compile_s": 0.6, "load_s": None}}  # fmt: skip
    assert recalibration.run_breakdown(report)["hash_and_lookup"] == pytest.approx(-0.1)


def test_a_build_without_the_load_timer_says_so_instead_of_a_zero_floor():
    figures = recalibration.restart_figures([row("cold-1", COLD, 1.2)], [row("warm-1", COLD, 1.1)])
    assert figures["breakdown"]["warm"]["executable_load"] is None
    assert figures["load_floor"]["load_floor_s"] is None
    assert figures["load_floor"]["why"] == "this build has no PersistentCacheLoad timer"


def test_the_check_keeps_the_largest_host_peak_and_says_cpu_devices_do_not_report():
    cold, warm = [row("cold-1", COLD, 1.2)], [row("warm-1", WARM, 0.25), row("warm-2", WARM, 0.2)]
    figures = recalibration.restart_figures(cold, warm)
    assert figures["memory"]["host_peak_rss_bytes"] == 850 * MIB
    assert figures["memory"]["device_peak_bytes"] == f"not reported: {NOT_ON_CPU}"
    assert figures["load_floor"] == {
        "warm_ready_s": 0.225, "load_floor_s": 0.02, "above_floor_s": 0.205}  # fmt: skip
    assert recalibration.notes(figures)[:2] == [
        f"memory: host peak 850 MiB; device peak: not reported: {NOT_ON_CPU}",
        "warm time-to-ready 0.225s, of which executable load 0.020s (the floor); 0.205s above it",
    ]


def test_a_device_that_reports_its_memory_keeps_its_peak():
    chip = {"bytes_used": 3 * MIB, "bytes_limit": 16 * 1024 * MIB, "peak_bytes_used": 9 * MIB}
    tpu = COLD | {"device_memory": {"TPU:0": chip}}
    figures = recalibration.restart_figures([row("cold-1", tpu, 1.0)], [])
    assert figures["memory"]["device_peak_bytes"] == {"TPU:0": 9 * MIB}


# --- the memory rule ----------------------------------------------------------------------


def receipt(host_mib: int, devices: dict[str, int] | str = "not reported: CPU", **changes: Any):
    memory = {"host_peak_rss_bytes": host_mib * MIB, "device_peak_bytes": devices}
    check = receipts.CheckEvidence("restart", True, (), {"warm_ready_s": 0.2, "memory": memory})
    made = receipts.Receipt(
        kind="gate", bundle="b", created="2025-01-01T00:00:00Z", host="h", device="CPU",
        chip=None, workload="small", versions={}, wheels_match_lock=True, wheels=(),
        problems=(), checks=(check,),
    )  # fmt: skip
    return dataclasses.replace(made, **changes)


def stored(made: receipts.Receipt) -> receipts.StoredReceipt:
    return receipts.StoredReceipt(
        Path("new.json"), made, receipts.canonical_digest(made.payload()), True
    )


RULE = lanes.Policy(max_memory_regression=0.10)


def test_promotion_within_the_memory_tolerance_passes():
    verdict = policy.judge_promotion("b", set(), [stored(receipt(1090))], RULE, receipt(1000))
    assert verdict.passed, verdict.failures


def test_promotion_is_refused_on_a_host_memory_regression():
    verdict = policy.judge_promotion("b", set(), [stored(receipt(1200))], RULE, receipt(1000))
    assert not verdict.passed
    assert [(f.rule, f.detail) for f in verdict.failures] == [
        ("memory", "peak host memory 1200.0 MiB is above the current bundle's 1000.0 MiB "
         "beyond 10% (limit 1100.0 MiB)")
    ]  # fmt: skip


def test_a_device_peak_counts_where_both_receipts_report_it():
    mine = receipt(1000, {"TPU:0": 12 * 1024 * MIB}, device="TPU", chip="v6e")
    theirs = receipt(1000, {"TPU:0": 10 * 1024 * MIB}, device="TPU", chip="v6e")
    verdict = policy.judge_promotion("b", set(), [stored(mine)], RULE, theirs)
    assert [f.detail.split(" memory")[0] for f in verdict.failures] == ["peak device TPU:0"]


def test_memory_on_another_workload_is_not_comparable():
    other = receipt(500, workload="medium")
    verdict = policy.judge_promotion("b", set(), [stored(other)], RULE, receipt(1000))
    assert verdict.failures[0].rule == "memory"
    assert "not comparable" in verdict.failures[0].detail
    assert "workload medium vs small" in verdict.failures[0].detail


def test_a_current_receipt_from_before_memory_was_recorded_is_named():
    old = dataclasses.replace(
        receipt(1000), checks=(receipts.CheckEvidence("restart", True, (), {}),)
    )
    verdict = policy.judge_promotion("b", set(), [stored(receipt(900))], RULE, old)
    assert verdict.failures[0].detail.startswith("peak host memory missing from the current")


def test_the_lanes_file_takes_the_memory_tolerance_and_refuses_a_bad_one(tmp_path: Path):
    (tmp_path / "build").mkdir()
    config = tmp_path / "build" / "lanes.toml"
    head = (
        'publish-lane = "v"\n\n[lanes.v]\npath = "v"\n\n'
        '[lanes.p]\npath = "p"\npromote-from = "v"\n[lanes.p.policy]\n'
    )
    config.write_text(head + "max-memory-regression = 0.05\n")
    assert lanes.load_config(tmp_path).lanes["p"].policy.max_memory_regression == 0.05
    config.write_text(head + 'max-memory-regression = "5%"\n')
    with pytest.raises(lanes.LaneError, match="max-memory-regression': expected int or float"):
        lanes.load_config(tmp_path)
    config.write_text(head + "max-memory-regression = -0.1\n")
    with pytest.raises(lanes.LaneError, match="max-memory-regression': must be a number >= 0"):
        lanes.load_config(tmp_path)


def test_the_shipped_preferred_lane_has_the_memory_rule_and_requires_the_canary():
    shipped = lanes.load_config(Path(__file__).resolve().parents[1]).lanes["preferred"].policy
    assert shipped.max_memory_regression == 0.10
    assert "recompile-canary" in shipped.checks


# --- real stock torch_xla 2.7.0 on CPU ------------------------------------------------------


@pytest.mark.slow
def test_the_receipt_keeps_memory_and_the_restart_breakdown(gate_27: GateRun):
    # The gate fails on 2.7.0 (its SPMD restart hangs): its receipt keeps every check.
    kept = receipts.read_receipt(gate_27.out_dir / "receipt.json")
    assert kept.digest_ok
    restart = kept.receipt.check("restart")
    assert restart is not None and restart.passed, gate_27.stdout + gate_27.stderr
    memory = restart.figures["memory"]
    # torch alone is hundreds of MiB resident; a figure below that was not measured.
    assert 200 * MIB < memory["host_peak_rss_bytes"] < 16 * 1024 * MIB
    assert memory["device_peak_bytes"].startswith("not reported: ")
    assert "GetAllocatorStats" in memory["device_peak_bytes"]
    warm = restart.figures["breakdown"]["warm"]
    assert warm["compile"] == 0.0 and warm["executable_load"] > 0
    assert restart.figures["breakdown"]["cold"]["compile"] > 0
    floor = restart.figures["load_floor"]
    # Each figure is rounded to 4 decimals on its own, so the difference of two rounded
    # figures may differ from the rounded difference by one unit in the last place.
    assert floor["above_floor_s"] == pytest.approx(
        floor["warm_ready_s"] - floor["load_floor_s"], abs=1.5e-4
    )
    runs = restart.figures["runs"]
    assert all(run["host_peak_rss_bytes"] > 200 * MIB for run in runs)
    assert all(set(run["breakdown"]) == set(recalibration.PHASES) for run in runs)
    assert "memory: host peak" in gate_27.stdout


@pytest.mark.slow
def test_a_real_receipt_with_more_memory_is_refused_and_compare_shows_both(gate_27: GateRun):
    real = receipts.read_receipt(gate_27.out_dir / "receipt.json").receipt
    restart = real.check("restart")
    assert restart is not None
    grown = dict(restart.figures["memory"])
    grown["host_peak_rss_bytes"] = int(grown["host_peak_rss_bytes"] * 1.25)
    heavier = dataclasses.replace(
        real, checks=(dataclasses.replace(restart, figures={**restart.figures, "memory": grown}),)
    )
    verdict = policy.judge_promotion(str(real.bundle), set(), [stored(heavier)], RULE, real)
    # This run named no bundle, so the wheels rules refuse it too; the memory rule on its own:
    (memory,) = [f for f in verdict.failures if f.rule == "memory"]
    assert memory.detail.startswith("peak host memory")
    assert "beyond 10%" in memory.detail
    table = compare.render(compare.compare(stored(real), stored(heavier)))
    host_row = next(line for line in table.splitlines() if line.startswith("peak host memory"))
    assert len(host_row.split("MiB")) == 3  # both sides
    assert "warm exe load s" in table and "warm above load floor s" in table
