"""The restart benchmark reports figures; it does not judge them, so neither do these tests
(timings on a shared 2-core machine are not a pass/fail criterion). They check what it
measured and kept: medians and spread per phase, the ratio, and the cache behaviour."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.gate_helpers import run_gate_cli
from xla_host.gate.bench import render_bench, spread


def test_spread_gives_median_extremes_and_relative_spread():
    assert spread([1.0, 3.0, 2.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "rel_spread": 1.0,
        "n": 3,
    }


def test_bench_restart_on_stock_2_7_0_keeps_medians_and_the_ratio(stock_xla_python_27, tmp_path):
    run = run_gate_cli(
        "bench-restart", "--python", str(stock_xla_python_27), "--rounds", "2",
        out_dir=tmp_path / "bench",
    )  # fmt: skip
    assert run.exit_code == 0, run.stderr
    summary = json.loads((tmp_path / "bench" / "restart.json").read_text())
    assert summary["rounds"] == 2
    assert summary["import_s"]["n"] == 2
    for phase in ("cold", "warm"):
        stats = summary[phase]["time_to_first_step_s"]
        assert stats["min"] <= stats["median"] <= stats["max"]
        # Time to first step includes the import, which is its floor: compared within each
        # child, since the import-only children ran at other moments of a loaded machine.
        for i in range(2):
            report = json.loads((tmp_path / "bench" / "runs" / f"{phase}-{i}.json").read_text())
            assert report["time_to_first_step_s"] > report["import_s"]
    # Every cold sample compiled on an empty cache; every warm sample loaded instead.
    assert all(n >= 1 for n in summary["cold"]["xla_compiles"])
    assert summary["warm"]["xla_compiles"] == [0, 0]
    assert all(hits >= 1 for hits in summary["warm"]["cache_hits"])
    expected_ratio = (
        summary["warm"]["time_to_first_step_s"]["median"]
        / summary["cold"]["time_to_first_step_s"]["median"]
    )
    assert summary["ratio_time_to_first_step"] == pytest.approx(expected_ratio, abs=1e-3)
    assert render_bench(summary).strip() in run.stdout
    # The module key's cost, measured per graph the warm-up steps compile: as many as a
    # cold run compiles.
    lowering = summary["lowering"]
    assert len(lowering["graphs"]) == summary["cold"]["xla_compiles"][0] >= 1
    for graph in lowering["graphs"]:
        assert graph["module"].startswith("sha256:") and graph["hlo_chars"] > 100
    costs = [g["lower_s"] + g["fingerprint_s"] for g in lowering["graphs"]]
    assert lowering["total_s"] == pytest.approx(sum(costs), abs=5e-5)
    assert 0 < lowering["share_of_warm_ready"] < 1
    assert "keying on the lowered module:" in run.stdout


def test_bench_restart_without_torch_xla_is_exit_2(tmp_path):
    run = run_gate_cli("bench-restart", "--python", str(tmp_path / "nope"), out_dir=tmp_path)
    assert run.exit_code == 2
    assert "is not an executable interpreter" in run.stderr
    assert not (Path(tmp_path) / "restart.json").exists()


def test_bench_restart_names_a_log_that_is_still_there(tmp_path):
    # It once named a log in its temporary directory, deleted before the message was read.
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'this interpreter is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    run = run_gate_cli(
        "bench-restart", "--python", str(broken), "--device", "CPU", out_dir=tmp_path / "bench"
    )
    assert run.exit_code == 2, run.stdout + run.stderr
    (named,) = re.findall(r"\(log: ([^)]+)\)", run.stderr)
    assert Path(named).is_file() and "this interpreter is broken" in Path(named).read_text()
    assert Path(named).is_relative_to(tmp_path / "bench")
