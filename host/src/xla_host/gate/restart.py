"""The warm-restart check: a persistent cache counts only if a restart loads it.

One cold process (or several concurrent writers) runs the validation workload with an
empty cache directory, then at least two warm processes and one read-only reader run it
again against that directory. The verdict (``judge_restart``) is a pure function of the
children's reports and the directory snapshots, so it is tested on its own:

* the cold run wrote at least one cache entry;
* every warm run loaded every executable the cold run compiled (hits == cold misses),
  with zero deserialize failures and zero XLA compiles. This is the claim, and it is
  judged by the counters alone: they do not depend on how busy the machine is;
* the CPU time of the warm run's warm-up syncs (``sync_cpu_s``, summed over the steps up
  to the steady state, the first step's alone for a one-graph workload: graph hash, cache lookup,
  and loading the executables where the cold run compiled them; the child's
  ``time.process_time()``, every thread) is at most ``max_warm_ratio`` of the cold run's:
  a sanity bound that a cache which "loads" but still does the work cannot pass, not the
  claim. Two choices make it hold on a loaded two-core machine. CPU time, because another
  process stretches wall time and not CPU time: beside one busy process, stock 2.7.0's
  SPMD control once measured a warm/cold wall ratio of 0.75 (limit 0.50) with every
  executable loaded and nothing compiled. And the sync alone, because the rest of the
  first step (building the model, tracing, the first execution) costs the same warm or
  cold, and under SPMD its threads spin while they wait for each other, longer when the
  machine is busy: measured on stock 2.7.0 SPMD beside a busy process, the whole first
  step's CPU ratio was 0.55-0.69 with full reuse, the sync's 0.02 (0.01 s of 0.55 s).
  The wall ratio of time-to-ready (``warm_cold_ratio``) and each run's ``ready_cpu_s``
  are reported, not judged;
* the warm time-to-ready is not slower than a recorded baseline for this torch_xla
  version / device / workload beyond ``baseline_tolerance``;
* a read-only reader (``XLA_PERSISTENT_CACHE_READ_ONLY=1``, the multi-host policy) loads
  from the cache too and leaves the directory exactly as it found it;
* every run's losses equal the first cold run's bit for bit (a cache that hands back a
  wrong executable fails here even when the counters look perfect);
* no loader hangs. A warm child gets ``hang_factor`` times the cold run's wall time plus
  ``hang_margin_s`` (never more than the child timeout); past that it is a hang, its
  native stacks are taken with gdb before the kill, and no further loader is started.
  On CPU a loader that used no CPU time for ``stall_s`` is a hang at once
  (``children.finish_child``): there the child's own threads compute every step.

The SPMD variant (``spmd-restart``, ``SPMD_NAME``) runs the same check under
``xr.use_spmd()`` with the batch sharded over every device (``CPU_NUM_DEVICES=4`` on CPU),
so each step carries several all-reduces, for at least ``SPMD_MIN_STEPS`` steps.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.gate import recalibration
from xla_host.gate import slice as slices
from xla_host.gate import workload as workloads
from xla_host.gate.check import CompareRow, Declared, Figures, GateRun, figure_row, verdict_row
from xla_host.gate.child_workload import DEFAULT_PROBE_BYTES
from xla_host.gate.children import (
    ChildResult,
    finish_child,
    in_workload_code,
    run_child,
    runtime_env,
    start_child,
)
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target
from xla_host.settings import default_of
from xla_host.slice import is_lease_file
from xla_host.tables import read_regular

NAME = "restart"
SPMD_NAME = "spmd-restart"
#: The SPMD variant runs at least this many steps: a loaded executable whose collectives
#: lost their order can pass several steps before the rendezvous deadlocks (measured on
#: stock 2.7.0: warm runs of five steps finished twice in a row, then one hung).
SPMD_MIN_STEPS = 8
#: Devices of the SPMD variant on CPU (on TPU the host's chips).
SPMD_CPU_DEVICES = 4
#: Committed baselines: ``<torch_xla version>__<device>__<workload>.json``.
DEFAULT_BASELINES_DIR = Path(str(default_of("--baselines-dir")))

Snapshot = dict[str, tuple[int, int]]
Join = Callable[[str, bool, str, Mapping[str, Any]], Mapping[int, Mapping[str, Any]]]
#: What a slice's writer tells the readers of its cold run (its rows' keys the verdict uses).
_REFERENCE_KEYS = ("name", "ok", "misses", "xla_compiles", "sync_cpu_s", "ready_s", "import_s")


@dataclass
class RestartConfig:
    name: str = NAME
    workload: workloads.WorkloadSpec = workloads.DEFAULT
    #: Overrides the workload's step count (the SPMD variant needs SPMD_MIN_STEPS).
    steps: int | None = None
    cpu_devices: int | None = None
    warm_runs: int = int(default_of("--warm-runs"))
    #: The warm-up syncs' CPU time must be at most this fraction of the cold one's
    #: (measured: about 0.02 with full reuse; see the module docstring).
    max_warm_ratio: float = float(default_of("--max-warm-ratio"))
    #: Warm may be this much slower than the recorded baseline (machines differ).
    baseline_tolerance: float = float(default_of("--baseline-tolerance"))
    child_timeout_s: float = float(default_of("--child-timeout"))
    #: Runs under ``xr.use_spmd()``; ``spmd_config`` sets the rest of the variant.
    spmd: bool = False
    writers: int = int(default_of("--writers"))
    read_only_check: bool = True
    cache_dir: Path | None = None
    baselines_dir: Path = DEFAULT_BASELINES_DIR
    record_baseline: bool = False
    #: A loader is hung after hang_factor x the cold run's wall time + hang_margin_s.
    hang_factor: float = 3.0
    hang_margin_s: float = 30.0
    #: On CPU, a loader that used no CPU time for this long is hung (None: bound only).
    #: Measured on stock 2.7.0's SPMD hang: every thread in a futex wait from the first
    #: stuck all-reduce on. Not on TPU, where the host may wait on the chips.
    stall_s: float | None = 15.0
    #: Test hook: runs on the cache directory between the cold and the warm phase.
    after_cold: Callable[[Path], None] | None = None
    #: Where to copy the cache directory as the cold run left it, so the cache checks can
    #: use this cold run instead of their own (``cachekeys.SharedRuns``).
    keep_cold_cache: Path | None = None
    #: SPMD only: the first cold run also makes the HBM check's queries with a tensor of
    #: this size, after its counters are read (``hbm.judge_shared_run``).
    hbm_probe_bytes: int | None = None
    #: ``writer`` or ``reader`` of the cache directory: a reader (a slice's worker other
    #: than 0, or a job that found the writer lease held) runs every child read-only.
    cache_role: str = "writer"
    #: A slice's barrier (``xla_host.gate.slice.Slice.join``): every worker starts each phase
    #: (cold, each warm run, read-only) together; called with the phase, whether this worker can go
    #: on, why not, and what it tells the others; returns what each worker told, by number.
    join: Join | None = None


def spmd_config(config: RestartConfig) -> RestartConfig:
    """The SPMD variant of a restart configuration."""
    return replace(
        config,
        name=SPMD_NAME,
        spmd=True,
        steps=max(config.steps or 0, SPMD_MIN_STEPS),
        cpu_devices=SPMD_CPU_DEVICES,
        # Its timings are not judged against the single-device baseline files.
        record_baseline=False,
        # A given --cache-dir holds the single-device check's cache: a cold run needs its own.
        cache_dir=config.cache_dir / SPMD_NAME if config.cache_dir is not None else None,
    )


def hang_bound_s(cold_wall_s: float, config: RestartConfig) -> float:
    """How long a loader may run before it counts as hung: a multiple of what cold took."""
    return min(config.child_timeout_s, config.hang_factor * cold_wall_s + config.hang_margin_s)


def snapshot(directory: Path) -> Snapshot:
    """Every file under ``directory`` with its size and mtime: what "wrote nothing" means.
    The writer lease is not the cache's: its holder refreshes it while others read."""
    entries: Snapshot = {}
    if not directory.is_dir():
        return entries
    for path in sorted(directory.rglob("*")):
        if not is_lease_file(path.name) and path.is_file():
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


def baseline_path(baselines_dir: Path, target: Target, workload_name: str) -> Path:
    version, name = (
        re.sub(r"[^A-Za-z0-9._+-]", "_", text) for text in (target.torch_xla_version, workload_name)
    )
    return baselines_dir / f"{version}__{target.device}__{name}.json"


def load_baseline(path: Path) -> dict[str, Any] | None:
    try:
        # A baselines directory may be shared: a FIFO there is refused, never opened.
        data = json.loads(read_regular(path, GateEnvironmentError, what="baseline"))
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
    row = result.row()
    if not result.ok:
        row["error"] = result.failure()
    if result.timed_out:
        row["timed_out"] = True
    row.update(result.extra)
    # hbm: the HBM check's queries; *_sharding_spec, output_*: the sharded runs (cachekeys).
    for key in (
        # The workload as the child loaded it (name, source digest, params), or why it
        # cannot be judged (workload.refuse_unjudgeable).
        "workload",
        "workload_problem",
        "has_set_custom_compile_options",
        "loss_hex",
        "hbm",
        "output_sharding_spec",
        "input_sharding_spec",
        "output_hex",
        "output_correct",
    ):
        if key in report:
            row[key] = report[key]
    for key in (
        "import_s",
        "ready_s",
        "ready_cpu_s",
        "time_to_first_step_s",
        "steady_step_s",
        "compile_time_s",
    ):
        if key in report:
            row[key] = round(float(report[key]), 4)
    if "counters" in report:
        row["misses"] = _counter(report, "PersistentCacheMiss")
        row["hits"] = _counter(report, "PersistentCacheHit")
        row["deserialize_failures"] = _counter(report, "PersistentCacheDeserializeFailure")
        # The patched cache's own outcomes (0 on builds without patch 0004).
        row["corrupt"] = _counter(report, "PersistentCacheCorrupt")
        row["load_refused"] = _counter(report, "PersistentCacheLoadRefused")
        row["read_failures"] = _counter(report, "PersistentCacheReadFailure")
        row["write_failures"] = _counter(report, "PersistentCacheWriteFailure")
        row["xla_compiles"] = int(report.get("xla_compiles", 0))
        row["counters"] = report["counters"]
    if report.get("ready") or report.get("first_step"):
        row["breakdown"] = recalibration.run_breakdown(report)
    # The syncs of the warm-up (every graph the first steps bring), else the first step's
    # (a child from before the warm-up was measured, or a stand-in).
    timed = report.get("ready") or report.get("first_step") or {}
    if "sync_cpu_s" in timed:
        row["sync_cpu_s"] = round(float(timed["sync_cpu_s"]), 4)
    if report.get("ready"):
        row["ready_steps"] = int(report["ready"]["steps"])
        row["ready_graphs"] = int(report["ready"]["graphs"])
    row.update(recalibration.run_memory(report))
    row["log_evidence"] = _log_evidence(result)
    return row


_EVIDENCE = re.compile(r"(UNIMPLEMENTED[^\n]{0,120}|[Dd]eserializ[^\n]{0,120})")


def _log_evidence(result: ChildResult) -> list[str]:
    """Distinct lines of the child's log about deserialization (e.g. UNIMPLEMENTED)."""
    try:
        text = result.log_path.read_text(errors="replace")
    except OSError:
        return []
    return list(dict.fromkeys(match.group(1).strip() for match in _EVIDENCE.finditer(text)))[:3]


def judge_restart(
    cold: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    reader: dict[str, Any] | None,
    after_cold: Snapshot,
    reader_changes: list[str] | None,
    config: RestartConfig,
    baseline: dict[str, Any] | None,
    *,
    reference_cold: list[dict[str, Any]] | None = None,
) -> CheckResult:
    """The verdict from the rows of ``summarize`` and the cache directory snapshots.

    ``reference_cold``: on a slice's reader, the writer's cold run, which the loaders'
    hits and CPU time are judged against (the reader's own cold run still has to finish
    and give the same losses)."""
    reasons: list[str] = []
    notes: list[str] = []
    loaders = [*warm, *([reader] if reader else [])]
    reasons += [_unfinished(row) for row in [*cold, *loaders] if not row["ok"]]
    if any(not row["ok"] for row in cold):
        return CheckResult(config.name, False, reasons, notes)

    if not after_cold:
        reasons.append("the cold run wrote no cache entry to the cache directory")
    else:
        notes.append(f"cold run wrote {len(after_cold)} cache file(s)")
    reference = reference_cold or cold
    if reference_cold:
        notes.append("judged against the writer's (worker 0's) cold run")
    expected = max(row["misses"] for row in reference)
    if expected == 0:
        reasons.append("the cold run had no persistent-cache misses: nothing was compiled to cache")

    for row in warm:
        reasons += _loader_reasons(row, expected)
    reasons += same_losses([*cold, *loaders])
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
        warm_reasons, warm_notes = _warm_rules(
            reference, warm, warm_ok, cold_ready, config, baseline, figures
        )
        reasons += warm_reasons
        notes += warm_notes
    if config.read_only_check and reader is not None:
        reasons += _loader_reasons(reader, expected)
        if reader_changes:
            shown = ", ".join(reader_changes[:5])
            reasons.append(f"{reader['name']} changed the cache directory: {shown}")
        figures["read_only_changes"] = len(reader_changes or [])
    hung = [row for row in loaders if row.get("timed_out")]
    if hung:
        figures["hung"] = [row["name"] for row in hung]
        figures["hang_bound_s"] = hung[0].get("hang_bound_s")
    return CheckResult(config.name, not reasons, reasons, notes, figures)


def _loader_reasons(row: dict[str, Any], expected: int) -> list[str]:
    """What is wrong with a finished warm or reader run that should have loaded the
    ``expected`` executables the cold run cached (nothing for an unfinished run: its
    reason is given already)."""
    if not row["ok"]:
        return []
    reasons = []
    name = row["name"]
    if row["deserialize_failures"]:
        evidence = f" ({row['log_evidence'][0]})" if row["log_evidence"] else ""
        reasons.append(f"{name}: {row['deserialize_failures']} deserialize failure(s){evidence}")
    if row.get("corrupt"):
        reasons.append(
            f"{name}: {row['corrupt']} corrupt cache entr(ies) (PersistentCacheCorrupt): "
            "the cold run's writes were damaged or cut short"
        )
    if row["hits"] != expected:
        reasons.append(
            f"{name}: loaded {row['hits']} of {expected} cached executable(s) "
            "(persistent-cache hits != cold misses)"
        )
    if row["xla_compiles"]:
        reasons.append(f"{name}: {row['xla_compiles']} XLA compile(s) on a warm start (want 0)")
    return reasons


def _warm_rules(
    reference: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    warm_ok: list[float],
    cold_ready: float,
    config: RestartConfig,
    baseline: dict[str, Any] | None,
    figures: dict[str, Any],
) -> tuple[list[str], list[str]]:
    """The warm runs' time rules (CPU time against the cold run, wall time against the
    recorded baseline): their reasons and notes; their figures go into ``figures``."""
    notes: list[str] = []
    warm_ready = statistics.median(warm_ok)
    ratio = warm_ready / cold_ready if cold_ready > 0 else float("inf")
    # Reported only: wall time is what a user waits, but load stretches it.
    figures.update({"warm_ready_s": round(warm_ready, 4), "warm_cold_ratio": round(ratio, 3)})
    reasons = _cpu_time_rule(reference, [row for row in warm if row["ok"]], config, figures)
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
    return reasons, notes


def _cpu_time_rule(
    cold: list[dict[str, Any]],
    warm: list[dict[str, Any]],
    config: RestartConfig,
    figures: dict[str, Any],
) -> list[str]:
    """The timing sanity bound: the warm-up syncs' median CPU time against cold's."""
    missing = [row["name"] for row in [*cold, *warm] if "sync_cpu_s" not in row]
    if missing:
        return [f"{', '.join(missing)}: no CPU time of the warm-up syncs (sync_cpu_s) reported"]
    cold_cpu = statistics.median(float(row["sync_cpu_s"]) for row in cold)
    warm_cpu = statistics.median(float(row["sync_cpu_s"]) for row in warm)
    ratio = warm_cpu / cold_cpu if cold_cpu > 0 else float("inf")
    figures.update(
        {
            "cold_sync_cpu_s": round(cold_cpu, 4),
            "warm_sync_cpu_s": round(warm_cpu, 4),
            "warm_cold_sync_cpu_ratio": round(ratio, 3),
        }
    )
    if ratio <= config.max_warm_ratio:
        return []
    return [
        f"warm-up syncs used {warm_cpu:.2f}s of CPU, {ratio:.2f} of the cold run's "
        f"{cold_cpu:.2f}s (limit {config.max_warm_ratio:.2f}): the warm start still did most of "
        "the work a cache saves"
    ]


def _unfinished(row: dict[str, Any]) -> str:
    if not row.get("timed_out") or "hang_bound_s" not in row:
        return f"{row['name']} did not finish: {row['error']}"
    if "stalled_s" in row and in_workload_code(row.get("phase")):
        # Not the runtime: the workload's own code waited (a sleep, a lock, a download).
        text = (
            f"{row['name']} hung in {row['phase']}: it used no CPU time for "
            f"{row['stalled_s']:.0f}s before any step ran (the workload's own code waited: a "
            f"sleep, a lock, a download, a server), killed after {row['wall_s']:.0f}s of its "
            f"{row['hang_bound_s']:.0f}s bound ({row['hang_rule']}); process group killed"
        )
    elif "stalled_s" in row:
        text = (
            f"{row['name']} hung: used no CPU time for {row['stalled_s']:.0f}s (on CPU the "
            "child's own threads compute every step: it waited for something that does not "
            f"come), killed after {row['wall_s']:.0f}s of its {row['hang_bound_s']:.0f}s bound "
            f"({row['hang_rule']}); process group killed"
        )
    else:
        where = f" in {row['phase']}" if row.get("phase") else ""
        text = (
            f"{row['name']} hung{where}: no result within {row['hang_bound_s']:.0f}s "
            f"({row['hang_rule']}); process group killed"
        )
    if "stacks" in row:
        summary = row.get("stacks_summary") or {}
        frames = ", ".join(summary.get("telling_frames", [])) or "no XLA wait frame recognised"
        text += f"; native stacks of {summary.get('threads', '?')} threads in {row['stacks']}"
        text += f" (stuck in: {frames})"
    if "stacks_error" in row:
        text += f"; no native stacks: {row['stacks_error']}"
    return text


def same_losses(rows: list[dict[str, Any]]) -> list[str]:
    """Every finished run's losses must equal the first one's bit for bit (``float.hex``)."""
    finished = [row for row in rows if row["ok"] and row.get("loss_hex") is not None]
    if not finished:
        return []
    reference = finished[0]
    reasons = []
    for row in finished[1:]:
        if row["loss_hex"] != reference["loss_hex"]:
            reasons.append(
                f"{row['name']}: losses {row['loss_hex']} differ from {reference['name']}'s "
                f"{reference['loss_hex']} (a cached executable must give the same numbers)"
            )
    return reasons


def _train_args(config: RestartConfig) -> list[str]:
    args = ["--mode", "train", *config.workload.child_args()]
    if config.spmd:
        args.append("--spmd")
    if config.steps is not None:
        args += ["--steps", str(config.steps)]
    return args


def _prepare_cache_dir(config: RestartConfig, scratch: Path) -> Path:
    if config.cache_dir is None:
        cache = scratch / "cache"
        cache.mkdir(parents=True)
        return cache
    cache = config.cache_dir
    if config.cache_role == "reader":
        # A reader writes nothing there, not even a probe; the writer made it empty.
        if not cache.is_dir():
            raise GateEnvironmentError(
                f"cache directory {cache} does not exist on this reader",
                fix="pass the shared cache directory the writer (worker 0) uses",
            )
        return cache
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkstemp(prefix=".gate-write-probe-", dir=cache)[1])
        probe.unlink()
    except OSError as error:
        raise GateEnvironmentError(
            f"cache directory {cache} is not writable: {error}",
            fix="pass a writable --cache-dir (or none: the gate uses its own temporary one)",
        ) from error
    if any(not is_lease_file(p.name) for p in cache.iterdir()):
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
    reader = config.cache_role == "reader"
    # The writer makes the directory empty before the slice starts; a reader looks after.
    cache = _prepare_cache_dir(config, scratch) if not reader else None
    _join(config, "cold")
    cache = cache or _prepare_cache_dir(config, scratch)
    runs = runs_dir / config.name
    env = runtime_env(
        target.device, cache_dir=cache, read_only=reader, cpu_devices=config.cpu_devices
    )
    train = _train_args(config)
    who = "a reader of the writer's cache" if reader else f"{config.writers} writer(s)"
    cold = _cold_runs(target, config, runs, env, train, who)
    try:
        workloads.refuse_unjudgeable(config.workload.name, cold)
    except GateEnvironmentError:
        # The other workers of a slice stop at the next phase with this worker's reason.
        _join(config, "warm", False, "its workload cannot be judged")
        raise
    cold_ok = all(row["ok"] for row in cold)
    # In a slice the writer's cold run may still be writing when a reader's ends: the
    # warm phase starts (and the cache is looked at) when every worker's cold run is done.
    # The writer tells the readers about its cold run: a reader's own "cold" run started
    # with the writer's and may have found entries the writer had just written (a reader
    # never has a clean cold start), so a reader is judged against the writer's cold run.
    told = {"cold": [{k: r[k] for k in _REFERENCE_KEYS if k in r} for r in cold]}
    heard = _join(config, "warm", cold_ok, "its cold run failed", told if not reader else None)
    writer_cold = [dict(r) for r in heard.get(0, {}).get("cold", [])] if reader else None
    after_cold = snapshot(cache)
    if config.keep_cold_cache is not None:
        shutil.copytree(
            cache, config.keep_cold_cache,
            ignore=lambda _directory, names: [n for n in names if is_lease_file(n)],
        )  # fmt: skip
    if config.after_cold is not None:
        config.after_cold(cache)
    warm: list[dict[str, Any]] = []
    read_only: dict[str, Any] | None = None
    changes: list[str] | None = None
    if cold_ok:
        warm, read_only, changes = _loader_runs(target, config, runs, env, train, cache, cold)
    path = baseline_path(config.baselines_dir, target, config.workload.name)
    baseline = None if config.record_baseline else load_baseline(path)
    result = judge_restart(
        cold, warm, read_only, after_cold, changes, config, baseline, reference_cold=writer_cold
    )
    result.runs = [*cold, *warm, *([read_only] if read_only else [])]
    if config.join is not None or reader:
        result.figures["cache_role"] = config.cache_role
    result.figures.update(recalibration.restart_figures(cold, warm))
    result.notes += recalibration.notes(result.figures)
    hint = collective_hang_hint(target, config, result.runs, env.get("XLA_FLAGS", ""))
    if hint is not None:
        result.notes.append(hint)
    result.figures["baseline_file"] = str(path)
    if config.record_baseline:
        _record_baseline(path, target, config, result)
    result.duration_s = time.monotonic() - began
    return result


def _join(
    config: RestartConfig,
    phase: str,
    ok: bool = True,
    reason: str = "",
    told: Mapping[str, Any] | None = None,
) -> Mapping[int, Mapping[str, Any]]:
    """Meet the slice's other workers at ``phase`` (alone: nothing to wait for); what
    each worker told, by worker."""
    if config.join is None:
        return {}
    return config.join(f"{config.name}:{phase}", ok, reason, told or {})


def _cold_runs(
    target: Target,
    config: RestartConfig,
    runs: Path,
    env: dict[str, str],
    train: list[str],
    who: str,
) -> list[dict[str, Any]]:
    """The cold runs, started together (the writers: one, or more racing), summarized."""
    with log.section(f"{config.name}: cold run ({who}), {config.workload} workload"):
        writer_args = [train] * config.writers
        if config.hbm_probe_bytes is not None:
            writer_args[0] = [*train, "--probe-bytes", str(config.hbm_probe_bytes)]
        started = [
            start_child(target.python, f"cold-{i + 1}", runs, args, env)
            for i, args in enumerate(writer_args)
        ]
        cold = [
            summarize(finish_child(s, f"cold-{i + 1}", config.child_timeout_s))
            for i, s in enumerate(started)
        ]
    return cold


def _loader_runs(
    target: Target,
    config: RestartConfig,
    runs: Path,
    env: dict[str, str],
    train: list[str],
    cache: Path,
    cold: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, list[str] | None]:
    """After a sound cold run: the warm runs (none after one hangs), then the read-only
    reader's run and what it changed in the cache directory, each bounded by the hang
    bound the cold run gives."""
    warm: list[dict[str, Any]] = []
    read_only: dict[str, Any] | None = None
    changes: list[str] | None = None
    cold_wall = max(row["wall_s"] for row in cold)
    bound = hang_bound_s(cold_wall, config)
    margin = config.hang_margin_s
    rule = f"{config.hang_factor:g} x the cold run's {cold_wall:.0f}s + {margin:.0f}s"

    stall_s = config.stall_s if target.device == "CPU" else None

    def loader(name: str, loader_env: dict[str, str]) -> dict[str, Any]:
        child = run_child(
            target.python,
            name,
            runs,
            train,
            loader_env,
            bound,
            stacks_on_timeout=True,
            stall_s=stall_s,
        )
        row = summarize(child)
        if row.get("timed_out"):
            row.update({"hang_bound_s": round(bound, 1), "hang_rule": rule})
        return row

    # Every phase that starts processes starts on every worker together (on a TPU
    # slice every host's process must join the multi-host runtime at once): the
    # "warm" barrier starts warm-1, one barrier each starts the later warm runs.
    phases = [f"warm-{i + 1}" for i in range(1, config.warm_runs)]
    phases += ["read-only"] if config.read_only_check else []
    for i in range(config.warm_runs):
        if i:
            _join(config, phases.pop(0))
        with log.section(f"{config.name}: warm run {i + 1}/{config.warm_runs}"):
            warm.append(loader(f"warm-{i + 1}", env))
        if warm[-1].get("timed_out"):
            log.info(f"{config.name}: warm-{i + 1} hung; no further loader is started")
            break
    hung = any(row.get("timed_out") for row in warm)
    if phases:
        # The others wait at the next phase: a hung warm run stops them there.
        _join(config, phases[0], not hung, "a warm run hung")
    if config.read_only_check and not hung:
        before = snapshot(cache)
        reader_env = runtime_env(
            target.device, cache_dir=cache, read_only=True, cpu_devices=config.cpu_devices
        )
        with log.section(f"{config.name}: read-only reader"):
            read_only = loader("read-only", reader_env)
        changes = diff_snapshots(before, snapshot(cache))
    return warm, read_only, changes


#: The XLA flag that keeps XLA:CPU off the thunk runtime whose loaded executables lose the
#: order of their collectives (gate/README.md, "The SPMD warm restart").
THUNK_RUNTIME_OFF = "--xla_cpu_use_thunk_runtime=false"


def collective_hang_hint(
    target: Target, config: RestartConfig, runs: list[dict[str, Any]], xla_flags: str
) -> str | None:
    """What to do about a hung SPMD loader on CPU, where the user reads the result: the
    known XLA:CPU hang of torch_xla 2.7's OpenXLA (collective thunks rebuilt on load each
    with a resource of their own), and the flag that avoids it. None elsewhere."""
    hung = any(row.get("timed_out") for row in runs)
    if not (hung and config.spmd and target.device == "CPU") or THUNK_RUNTIME_OFF in xla_flags:
        return None
    return (
        f"a loader hung under SPMD on CPU: torch_xla {target.torch_xla_version}'s XLA:CPU "
        "may lose the order of a loaded executable's all-reduces (known on 2.7.x: "
        'gate/README.md, "The SPMD warm restart"); run the gate with '
        f"XLA_FLAGS={THUNK_RUNTIME_OFF} to judge the cache without it. TPU executables do "
        "not use XLA:CPU's thunk runtime"
    )


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
        "workload": config.workload.name,
        "warm_ready_s": result.figures["warm_ready_s"],
        "cold_ready_s": result.figures["cold_ready_s"],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "recorded": time.strftime("%Y-%m-%d"),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    result.notes.append(f"baseline recorded in {path}")


# --- the restart checks, as the gate's registry lists them (xla_host.gate.checks) -------


def _joiner(member: slices.Slice | None) -> Join | None:
    if member is None:
        return None

    def join(
        phase: str, ok: bool, reason: str, told: Mapping[str, Any]
    ) -> Mapping[int, Mapping[str, Any]]:
        arrivals = member.join(phase, ok=ok, reason=reason, payload=told)
        return {worker: arrival.payload for worker, arrival in arrivals.items()}

    return join


def _config_of(run: GateRun) -> RestartConfig:
    config = run.config
    return RestartConfig(
        workload=config.workload,
        warm_runs=config.warm_runs,
        max_warm_ratio=config.max_warm_ratio,
        baseline_tolerance=config.baseline_tolerance,
        child_timeout_s=run.timeout_s,
        spmd=config.spmd,
        writers=config.writers,
        cache_dir=config.xla_cache_dir,
        baselines_dir=config.baselines_dir,
        record_baseline=config.record_baseline,
        cache_role=run.role,
        join=_joiner(run.member),
    )


def _run_in_scratch(run: GateRun, config: RestartConfig) -> CheckResult:
    check_scratch = run.scratch / config.name
    check_scratch.mkdir()
    return run_restart_check(run.target, config, run.runs_dir, check_scratch)


def _judge_restart(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
    config = _config_of(run)
    kept = run.kept_cold_cache
    if run.guests or (run.pack_keep is not None and run.role == "writer"):
        # Its cold run serves the cache checks (two children fewer), or the cache pack.
        config = replace(config, keep_cold_cache=kept)
    result = _run_in_scratch(run, config)
    if run.pack_keep is not None and result.passed and kept.is_dir():
        # Copied before the cache checks run on ``kept``: the pack holds the cold run's
        # entries only.
        shutil.copytree(kept, run.pack_keep / "cache")
    return [result]


def _judge_spmd(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
    config = spmd_config(_config_of(run))
    if run.guests:
        # The HBM queries need an SPMD runtime on every device: its first cold run makes
        # them after its steps, one child fewer (``hbm.judge_shared_run``).
        config = replace(config, hbm_probe_bytes=DEFAULT_PROBE_BYTES)
    return [_run_in_scratch(run, config)]


def _warm_hits(receipt: Figures) -> str:
    runs: list[dict[str, Any]] = list(receipt.figure(NAME, "runs") or [])
    warm = [r for r in runs if str(r.get("name", "")).startswith(("warm", "read-only"))]
    if not warm:
        return "-"
    return " ".join(f"{r.get('hits', '-')}h/{r.get('xla_compiles', '-')}c" for r in warm)


def _memory(receipt: Figures) -> dict[str, Any]:
    memory = receipt.figure(NAME, "memory")
    return memory if isinstance(memory, dict) else {}


def _host_peak(receipt: Figures) -> str:
    value = _memory(receipt).get("host_peak_rss_bytes")
    return "-" if not isinstance(value, int) else f"{value / 1024**2:.0f} MiB"


def _device_peak(receipt: Figures) -> str:
    value = _memory(receipt).get("device_peak_bytes")
    if isinstance(value, dict):
        return " ".join(f"{name} {int(peak) / 1024**2:.0f} MiB" for name, peak in value.items())
    # "not reported: <why>" on CPU: the reason is in the receipt, the table says the fact.
    return "not reported" if value else "-"


def _phase(label: str, run: str, phase: str) -> CompareRow:
    def value(receipt: Figures) -> str:
        found = (receipt.figure(NAME, "breakdown") or {}).get(run, {}).get(phase)
        return "-" if found is None else f"{found:.3f}"

    return CompareRow(label, value)


def _above_floor(receipt: Figures) -> str:
    floor = receipt.figure(NAME, "load_floor") or {}
    if floor.get("above_floor_s") is None:
        return "-"
    return f"{floor['above_floor_s']:.3f} (floor {floor['load_floor_s']:.3f})"


CHECK = Declared(
    names=(NAME,),
    child_runs=("train",),
    judge=_judge_restart,
    compare_rows=(
        verdict_row("restart", NAME),
        figure_row("cold ready s", NAME, "cold_ready_s", "{:.3f}"),
        figure_row("warm ready s", NAME, "warm_ready_s", "{:.3f}"),
        figure_row("warm/cold", NAME, "warm_cold_ratio", "{:.3f}"),
        figure_row("cold misses", NAME, "cold_misses"),
        CompareRow("warm hits/compiles", _warm_hits),
        CompareRow("peak host memory", _host_peak),
        CompareRow("peak device memory", _device_peak),
        _phase("cold compile s", "cold", "compile"),
        _phase("warm import s", "warm", "import"),
        _phase("warm setup s", "warm", "setup"),
        _phase("warm trace s", "warm", "trace"),
        _phase("warm hash+lookup s", "warm", "hash_and_lookup"),
        _phase("warm exe load s", "warm", "executable_load"),
        _phase("warm compile s", "warm", "compile"),
        _phase("warm 1st exec s", "warm", "execute"),
        CompareRow("warm above load floor s", _above_floor),
    ),
)
SPMD_CHECK = Declared(names=(SPMD_NAME,), child_runs=("train",), judge=_judge_spmd)
