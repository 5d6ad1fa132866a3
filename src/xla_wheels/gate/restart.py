"""The warm-restart check: a persistent cache counts only if a restart loads it.

One cold process (or several concurrent writers) runs the validation workload with an
empty cache directory, then at least two warm processes and one read-only reader run it
again against that directory. The verdict (``judge_restart``) is a pure function of the
children's reports and the directory snapshots, so it is tested on its own:

* the cold run wrote at least one cache entry;
* every warm run loaded every executable the cold run compiled (hits == cold misses),
  with zero deserialize failures and zero XLA compiles;
* the warm time-to-ready (first step finished, import excluded) is at most
  ``max_warm_ratio`` of the cold one, and not slower than a recorded baseline for this
  torch_xla version / device / workload beyond ``baseline_tolerance``;
* a read-only reader (``XLA_PERSISTENT_CACHE_READ_ONLY=1``, the multi-host policy) loads
  from the cache too and leaves the directory exactly as it found it.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xla_wheels import log
from xla_wheels.gate.children import ChildResult, finish_child, run_child, runtime_env, start_child
from xla_wheels.gate.errors import GateEnvironmentError
from xla_wheels.gate.result import CheckResult
from xla_wheels.gate.target import Target

NAME = "restart"
#: Committed baselines: ``<torch_xla version>__<device>__<workload>.json``.
DEFAULT_BASELINES_DIR = Path("build") / "baselines" / "restart"

Snapshot = dict[str, tuple[int, int]]


@dataclass
class RestartConfig:
    workload: str = "small"
    warm_runs: int = 2
    #: Warm time-to-ready must be at most this fraction of cold. Measured here on CPU:
    #: about 0.2 for a working cache, about 0.8-1.0 for a broken one.
    max_warm_ratio: float = 0.5
    #: Warm may be this much slower than the recorded baseline (machines differ).
    baseline_tolerance: float = 0.5
    child_timeout_s: float = 600.0
    spmd: bool = False
    writers: int = 1
    read_only_check: bool = True
    cache_dir: Path | None = None
    baselines_dir: Path = DEFAULT_BASELINES_DIR
    record_baseline: bool = False
    #: Test hook: runs on the cache directory between the cold and the warm phase.
    after_cold: Callable[[Path], None] | None = None


def snapshot(directory: Path) -> Snapshot:
    """Every file under ``directory`` with its size and mtime: what "wrote nothing" means."""
    entries: Snapshot = {}
    if not directory.is_dir():
        return entries
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            stat = path.stat()
            entries[str(path.relative_to(directory))] = (stat.st_size, stat.st_mtime_ns)
    return entries


def diff_snapshots(before: Snapshot, after: Snapshot) -> list[str]:
    changes = [f"added {name}" for name in sorted(after.keys() - before.keys())]
    changes += [f"removed {name}" for name in sorted(before.keys() - after.keys())]
    changes += [
        f"modified {name}"
        for name in sorted(before.keys() & after.keys())
        if before[name] != after[name]
    ]
    return changes


def baseline_path(baselines_dir: Path, target: Target, workload: str) -> Path:
    version = re.sub(r"[^A-Za-z0-9._+-]", "_", target.torch_xla_version)
    return baselines_dir / f"{version}__{target.device}__{workload}.json"


def load_baseline(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise GateEnvironmentError(
            f"baseline {path} is unreadable: {error}",
            fix="fix the file or record it again with --record-baseline",
        ) from error
    if not isinstance(data, dict) or not isinstance(data.get("warm_ready_s"), int | float):
        raise GateEnvironmentError(
            f"baseline {path} has no numeric warm_ready_s",
            fix="record it again with --record-baseline",
        )
    return data


def _counter(report: dict[str, Any], name: str) -> int:
    return int(report.get("counters", {}).get(name, 0))


def summarize(result: ChildResult) -> dict[str, Any]:
    """The row of one child in the report: timings, counters, and the evidence files."""
    report = result.report or {}
    row: dict[str, Any] = {
        "name": result.name,
        "ok": result.ok,
        "wall_s": round(result.wall_s, 3),
        "log": str(result.log_path),
    }
    if not result.ok:
        row["error"] = result.failure()
    for key in ("import_s", "ready_s", "time_to_first_step_s", "steady_step_s", "compile_time_s"):
        if key in report:
            row[key] = round(float(report[key]), 4)
    if "counters" in report:
        row["misses"] = _counter(report, "PersistentCacheMiss")
        row["hits"] = _counter(report, "PersistentCacheHit")
        row["deserialize_failures"] = _counter(report, "PersistentCacheDeserializeFailure")
        row["xla_compiles"] = int(report.get("xla_compiles", 0))
        row["counters"] = report["counters"]
    row["log_evidence"] = _log_evidence(result)
    return row


_EVIDENCE = re.compile(r"(UNIMPLEMENTED[^\n]{0,120}|[Dd]eserializ[^\n]{0,120})")


def _log_evidence(result: ChildResult) -> list[str]:
    """Distinct lines of the child's log about deserialization (e.g. UNIMPLEMENTED)."""
    try:
        text = result.log_path.read_text(errors="replace")
    except OSError:
        return []
    seen: list[str] = []
    for match in _EVIDENCE.finditer(text):
        line = match.group(1).strip()
        if line not in seen:
            seen.append(line)
    return seen[:3]


def judge_restart(
    cold: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    reader: dict[str, Any] | None,
    after_cold: Snapshot,
    reader_changes: list[str] | None,
    config: RestartConfig,
    baseline: dict[str, Any] | None,
) -> CheckResult:
    """The verdict from the rows of ``summarize`` and the cache directory snapshots."""
    reasons: list[str] = []
    notes: list[str] = []
    broken = [row for row in [*cold, *warm, *([reader] if reader else [])] if not row["ok"]]
    reasons += [f"{row['name']} did not finish: {row['error']}" for row in broken]
    if any(not row["ok"] for row in cold):
        return CheckResult(NAME, False, reasons, notes)

    if not after_cold:
        reasons.append("the cold run wrote no cache entry to the cache directory")
    else:
        notes.append(f"cold run wrote {len(after_cold)} cache file(s)")
    expected = max(row["misses"] for row in cold)
    if expected == 0:
        reasons.append("the cold run had no persistent-cache misses: nothing was compiled to cache")

    def judge_loader(row: dict[str, Any]) -> None:
        if not row["ok"]:
            return
        name = row["name"]
        if row["deserialize_failures"]:
            evidence = f" ({row['log_evidence'][0]})" if row["log_evidence"] else ""
            reasons.append(
                f"{name}: {row['deserialize_failures']} deserialize failure(s){evidence}"
            )
        if row["hits"] != expected:
            reasons.append(
                f"{name}: loaded {row['hits']} of {expected} cached executable(s) "
                "(persistent-cache hits != cold misses)"
            )
        if row["xla_compiles"]:
            reasons.append(f"{name}: {row['xla_compiles']} XLA compile(s) on a warm start (want 0)")

    for row in warm:
        judge_loader(row)
    cold_ready = statistics.median(row["ready_s"] for row in cold)
    warm_ok = [row["ready_s"] for row in warm if row["ok"]]
    figures: dict[str, Any] = {
        "cold_ready_s": round(cold_ready, 4),
        "cold_import_s": round(statistics.median(row["import_s"] for row in cold), 4),
        "cold_misses": expected,
        "cold_xla_compiles": max(row["xla_compiles"] for row in cold),
        "cache_files": len(after_cold),
        "max_warm_ratio": config.max_warm_ratio,
    }
    if warm_ok:
        warm_ready = statistics.median(warm_ok)
        ratio = warm_ready / cold_ready if cold_ready > 0 else float("inf")
        figures.update({"warm_ready_s": round(warm_ready, 4), "warm_cold_ratio": round(ratio, 3)})
        if ratio > config.max_warm_ratio:
            reasons.append(
                f"warm time-to-ready {warm_ready:.2f}s is {ratio:.2f} of cold {cold_ready:.2f}s "
                f"(limit {config.max_warm_ratio:.2f})"
            )
        if baseline is not None:
            limit = float(baseline["warm_ready_s"]) * (1 + config.baseline_tolerance)
            figures.update(
                {
                    "baseline_warm_ready_s": baseline["warm_ready_s"],
                    "baseline_limit_s": round(limit, 4),
                }
            )
            if warm_ready > limit:
                reasons.append(
                    f"warm time-to-ready {warm_ready:.2f}s is slower than the baseline "
                    f"{float(baseline['warm_ready_s']):.2f}s beyond {config.baseline_tolerance:.0%}"
                )
            else:
                notes.append(f"within {config.baseline_tolerance:.0%} of the recorded baseline")
        else:
            notes.append("no baseline recorded for this build/device/workload")
    if config.read_only_check and reader is not None:
        judge_loader(reader)
        if reader_changes:
            shown = ", ".join(reader_changes[:5])
            reasons.append(f"{reader['name']} changed the cache directory: {shown}")
        figures["read_only_changes"] = len(reader_changes or [])
    return CheckResult(NAME, not reasons, reasons, notes, figures)


def _train_args(config: RestartConfig) -> list[str]:
    return ["--mode", "train", "--workload", config.workload, *(["--spmd"] if config.spmd else [])]


def _prepare_cache_dir(config: RestartConfig, scratch: Path) -> Path:
    if config.cache_dir is None:
        cache = scratch / "cache"
        cache.mkdir(parents=True)
        return cache
    cache = config.cache_dir
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkstemp(prefix=".gate-write-probe-", dir=cache)[1])
        probe.unlink()
    except OSError as error:
        raise GateEnvironmentError(
            f"cache directory {cache} is not writable: {error}",
            fix="pass a writable --cache-dir (or none: the gate uses its own temporary one)",
        ) from error
    if any(cache.iterdir()):
        raise GateEnvironmentError(
            f"cache directory {cache} is not empty: a cold run needs an empty cache",
            fix="pass an empty --cache-dir",
        )
    return cache


def run_restart_check(
    target: Target, config: RestartConfig, runs_dir: Path, scratch: Path
) -> CheckResult:
    """Run cold, warm and read-only children and judge them.

    Child reports and logs go to ``runs_dir`` (kept as evidence); the cache directory is
    created in ``scratch``, the caller's own temporary directory, unless one is configured.
    """
    began = time.monotonic()
    cache = _prepare_cache_dir(config, scratch)
    runs = runs_dir / "restart"
    env = runtime_env(target.device, cache_dir=cache)
    with log.section(f"restart: cold run ({config.writers} writer(s)), {config.workload} workload"):
        started = [
            start_child(target.python, f"cold-{i + 1}", runs, _train_args(config), env)
            for i in range(config.writers)
        ]
        cold = [
            summarize(finish_child(s, f"cold-{i + 1}", config.child_timeout_s))
            for i, s in enumerate(started)
        ]
    after_cold = snapshot(cache)
    if config.after_cold is not None:
        config.after_cold(cache)
    warm: list[dict[str, Any]] = []
    reader: dict[str, Any] | None = None
    changes: list[str] | None = None
    if all(row["ok"] for row in cold):
        for i in range(config.warm_runs):
            with log.section(f"restart: warm run {i + 1}/{config.warm_runs}"):
                warm.append(
                    summarize(
                        run_child(
                            target.python,
                            f"warm-{i + 1}",
                            runs,
                            _train_args(config),
                            env,
                            config.child_timeout_s,
                        )
                    )
                )
        if config.read_only_check:
            before = snapshot(cache)
            reader_env = runtime_env(target.device, cache_dir=cache, read_only=True)
            with log.section("restart: read-only reader"):
                reader = summarize(
                    run_child(
                        target.python,
                        "read-only",
                        runs,
                        _train_args(config),
                        reader_env,
                        config.child_timeout_s,
                    )
                )
            changes = diff_snapshots(before, snapshot(cache))
    path = baseline_path(config.baselines_dir, target, config.workload)
    baseline = None if config.record_baseline else load_baseline(path)
    result = judge_restart(cold, warm, reader, after_cold, changes, config, baseline)
    result.runs = [*cold, *warm, *([reader] if reader else [])]
    result.figures["baseline_file"] = str(path)
    if config.record_baseline:
        _record_baseline(path, target, config, result)
    result.duration_s = time.monotonic() - began
    return result


def _record_baseline(
    path: Path, target: Target, config: RestartConfig, result: CheckResult
) -> None:
    if not result.passed or "warm_ready_s" not in result.figures:
        # A baseline of a broken cache would make the broken timing the standard.
        raise GateEnvironmentError(
            f"not recording a baseline: the restart check failed ({'; '.join(result.reasons)})",
            fix="record baselines only from a build whose cache works",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "torch_xla_version": target.torch_xla_version,
        "torch_version": target.torch_version,
        "device": target.device,
        "workload": config.workload,
        "warm_ready_s": result.figures["warm_ready_s"],
        "cold_ready_s": result.figures["cold_ready_s"],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "recorded": time.strftime("%Y-%m-%d"),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    result.notes.append(f"baseline recorded in {path}")
