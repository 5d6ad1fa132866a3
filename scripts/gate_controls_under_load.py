"""Run the gate's two passing controls N times each beside a CPU hog; print every verdict.

The controls (CPU, stock torch_xla 2.7.0 from the per-machine cache, built on first use):

* ``restart``: the small-workload warm restart, whose verdict includes a warm/cold
  time-to-ready ratio;
* ``spmd-restart`` with ``XLA_FLAGS=--xla_cpu_use_thunk_runtime=false``: the SPMD positive
  control (without the flag stock 2.7.0 hangs on a warm SPMD restart).

Both must pass every time. A verdict that flips while another process keeps a core busy
is a verdict about the machine's load, not about the build. The hog is one busy-looping
process per ``--hogs`` (default 1: half of a two-core machine), started before each gate
run and killed after it.

    .venv/bin/python scripts/gate_controls_under_load.py [--runs 10] [--hogs 1] [--out DIR]

Exit 0 when every run of both controls passed, 1 otherwise. The summary (one line per
run: control, verdict, warm/cold wall ratio (reported) and first-sync CPU ratio (judged),
load average) goes to stdout and ``DIR/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from xla_wheels import stock_envs as envs
from xla_wheels.options import machine_cache

CONTROLS: dict[str, tuple[list[str], dict[str, str]]] = {
    "restart": (["--checks", "restart"], {}),
    "spmd-restart-thunks-off": (
        ["--checks", "spmd-restart"],
        {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false"},
    ),
}


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


def run_control(python: Path, name: str, index: int, out: Path, hogs: int) -> dict[str, Any]:
    args, extra_env = CONTROLS[name]
    report_dir = out / f"{name}-{index:02d}"
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    running = start_hogs(hogs)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "xla_wheels", "gate", "--python", str(python), *args,
             "--out", str(report_dir)],
            env={**os.environ, **extra_env},
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    finally:
        stop_hogs(running)
    check_name = args[1]
    row: dict[str, Any] = {
        "control": name,
        "run": index,
        "exit_code": done.returncode,
        "wall_s": round(time.monotonic() - began, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    try:
        report = json.loads((report_dir / "report.json").read_text())
        check = next(c for c in report["checks"] if c["name"] == check_name)
    except (OSError, ValueError, StopIteration, KeyError) as error:
        row.update({"passed": False, "reasons": [f"no report: {error}", done.stderr[-500:]]})
        return row
    row.update(
        {
            "passed": bool(check["passed"]),
            "warm_cold_ratio": check["figures"].get("warm_cold_ratio"),
            "warm_cold_sync_cpu_ratio": check["figures"].get("warm_cold_sync_cpu_ratio"),
            "max_warm_ratio": check["figures"].get("max_warm_ratio"),
            "reasons": check["reasons"],
        }
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hogs", type=int, default=1, help="busy-looping processes beside")
    parser.add_argument("--out", type=Path, default=Path("out/gate-controls"))
    parser.add_argument("--python", type=Path, help="default: cached stock torch_xla 2.7.0")
    args = parser.parse_args(argv)
    python = args.python or envs.ensure_stock_env("2.7.0", root=machine_cache(os.environ))
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for index in range(1, args.runs + 1):
        for name in CONTROLS:
            row = run_control(python, name, index, args.out, args.hogs)
            rows.append(row)
            verdict = "PASS" if row["passed"] else "FAIL"
            print(
                f"{row['control']:<24} run {index:2d}  {verdict}"
                f"  wall ratio {row.get('warm_cold_ratio')}"
                f"  sync CPU ratio {row.get('warm_cold_sync_cpu_ratio')} (judged)"
                f"  wall {row['wall_s']}s  load {row['load_before']}->{row['load_after']}"
                + ("" if row["passed"] else f"  {row['reasons']}"),
                flush=True,
            )
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    for name in CONTROLS:
        mine = [row for row in rows if row["control"] == name]
        passed = sum(row["passed"] for row in mine)
        ratios = [row["warm_cold_ratio"] for row in mine if row.get("warm_cold_ratio") is not None]
        worst = max(ratios) if ratios else None
        print(f"{name}: {passed}/{len(mine)} passed, worst warm/cold ratio {worst}")
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
